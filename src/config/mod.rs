//! Client configuration: node URLs, timeouts, safety mode; validation with errors that name
//! the problem.
//!
//! Architecture invariant: a password never leaves [`NodeUrl`] in text. `Display` and `Debug`
//! of every configuration and error type print `***` in its place.

use std::time::Duration;

mod error;
mod test_switches;
mod tls;
mod url;

pub use error::ConfigError;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub use test_switches::CopyEvent;
#[cfg(feature = "test-util")]
pub(crate) use test_switches::{CopyHook, RecordHook};
pub(crate) use tls::{hint as tls_hint, Tls, TlsConnector};
pub use url::NodeUrl;

/// Environment variable holding comma-separated node URLs.
pub const NODES_ENV: &str = "REDQUORUM_NODES";

/// Environment variable holding the path of a PEM file of CA certificates that
/// [`Config::from_env`] trusts for `rediss://` nodes (instead of the system's roots).
pub const CACERT_ENV: &str = "REDQUORUM_CACERT";
/// Environment variable holding the path of a PEM client certificate (mutual TLS).
pub const CERT_ENV: &str = "REDQUORUM_CERT";
/// Environment variable holding the path of the PEM private key of [`CERT_ENV`].
pub const KEY_ENV: &str = "REDQUORUM_KEY";
/// Environment variable holding the server name a node's certificate must carry.
pub const SNI_ENV: &str = "REDQUORUM_SNI";
/// Environment variable pinning the cluster's id ([`Config::with_cluster_id`]).
pub const CLUSTER_ENV: &str = "REDQUORUM_CLUSTER";
/// Environment variable attesting that every node runs `appendfsync always`
/// ([`Config::with_fsync_always_attested`]): set and not `0`, `false`, `no`, `off` or empty.
pub const ATTEST_FSYNC_ENV: &str = "REDQUORUM_ATTEST_FSYNC_ALWAYS";

/// Every environment variable [`Config::from_env`] reads, with the CLI option that reads the
/// same variable: one table for both (the CLI's `--help` names each).
pub const ENV_VARS: &[(&str, &str)] = &[
    (NODES_ENV, "--nodes"),
    (CLUSTER_ENV, "--cluster"),
    (ATTEST_FSYNC_ENV, "--attest-fsync-always"),
    (CACERT_ENV, "--cacert"),
    (CERT_ENV, "--cert"),
    (KEY_ENV, "--key"),
    (SNI_ENV, "--sni"),
];

/// The largest number of nodes a client accepts.
pub const MAX_NODES: usize = 63;

/// Whether nodes that fail a safety check may count toward a majority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SafetyMode {
    /// Default. A node that fails a safety check, or whose `appendfsync` cannot be verified
    /// (unless attested), does not count toward any majority.
    #[default]
    Strict,
    /// Development only: findings are reported and logged, but every reachable node votes.
    /// The guarantees of this crate do not hold in this mode.
    Permissive,
}

/// Configuration of a [`Client`](crate::Client).
///
/// Build it with [`Config::from_urls`] or [`Config::from_env`], adjust it with the `with_*`
/// setters (each states its default), and [`validate`](Config::validate) it (the client does
/// so when it is built).
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) nodes: Vec<NodeUrl>,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) recheck_interval: Duration,
    pub(crate) safety: SafetyMode,
    pub(crate) attest_fsync_always: bool,
    pub(crate) amnesia_protection: bool,
    pub(crate) quorum_override: Option<usize>,
    pub(crate) server_clock_leases: bool,
    /// A lock contender watches a held lease for its TTL plus drift before taking it over
    /// (test switch).
    pub(crate) takeover_wait: bool,
    /// A lost reply counts as applied (test switch).
    pub(crate) lost_replies_counted: bool,
    /// A vote that may change a node is sent with the deadline its builder asked for, even
    /// above the node timeout (test switch).
    pub(crate) unbounded_vote_deadlines: bool,
    /// A holder's release counts a node where it deleted nothing as one where it deleted its
    /// copy (test switch).
    pub(crate) release_counts_foreign_copies: bool,
    /// A lock attempt dropped mid-round releases the round (off: test switch).
    pub(crate) undo_dropped_rounds: bool,
    /// A lock round that was not granted is rolled back where its grant is untouched, rather
    /// than folded (off: test switch).
    pub(crate) rollback_undone_rounds: bool,
    /// Repair re-reads every fence floor from every source after its scans (test switch).
    pub(crate) floor_recheck: bool,
    /// Repair restores the newest lease copy even where its sources disagree on the holder
    /// (test switch; the safe rule restores a blocker there).
    pub(crate) newest_lease_restore: bool,
    /// Test-only: IDs from a spare block are returned without validating them.
    pub(crate) unvalidated_spares: bool,
    /// A copy reads its sources behind the incarnation it planned on (test switch).
    pub(crate) copy_checks: bool,
    /// A copy's writes check the repairer's claim (test switch).
    pub(crate) copy_claimed: bool,
    /// Test-only: called at a copy's pause points.
    #[cfg(feature = "test-util")]
    pub(crate) copy_hook: Option<CopyHook>,
    /// A job's completion record (and begin mark) is checked against the job's lease on each
    /// node and counted only within the lease's validity (off: test switch).
    pub(crate) fenced_records: bool,
    /// A job's run marks the period begun on a majority, and a reader ignores a record below
    /// the highest begin mark (off: test switch).
    pub(crate) begun_marks: bool,
    /// Test-only: called just before a job's completion record is sent.
    #[cfg(feature = "test-util")]
    pub(crate) record_hook: Option<RecordHook>,
    /// A repair writes a new marker epoch and restores beats by maximum (test switch).
    pub(crate) repair_epochs: bool,
    /// TEST ONLY (false outside tests): a repair that finds blank nodes sets a cluster up on
    /// them, as every client did before issue 28.
    pub(crate) implicit_set_up: bool,
    /// A re-run of an interrupted node-list change resumes it (test switch).
    pub(crate) change_resumes: bool,
    /// A running client follows a change of its node list (test switch).
    pub(crate) live_follow: bool,
    pub(crate) cluster_identity: bool,
    pub(crate) cluster_pin: Option<String>,
    /// Adopt exactly this cluster (by id) where a node holds its descriptor: the old list's
    /// client of a resumed node-list change works in the old cluster even after a node holds
    /// the successor's descriptor. Never set by users.
    pub(crate) adopt_as: Option<String>,
    pub(crate) tls: tls::Tls,
}

/// Smallest duration accepted anywhere.
const MIN_DURATION: Duration = Duration::from_millis(1);

impl Config {
    /// Parse a list of node URLs. Errors on an empty list, a malformed URL, an unsupported
    /// scheme, a duplicate (same scheme, host, port, database and user) or more than
    /// [`MAX_NODES`] nodes.
    pub fn from_urls<I, S>(urls: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut nodes: Vec<NodeUrl> = Vec::new();
        for (index, raw) in urls.into_iter().enumerate() {
            let url = NodeUrl::parse(raw.as_ref(), index)?;
            if let Some(first) = nodes.iter().position(|n| *n == url) {
                return Err(ConfigError::DuplicateUrl {
                    first,
                    second: index,
                    url: url.redacted().to_string(),
                });
            }
            nodes.push(url);
        }
        if nodes.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if nodes.len() > MAX_NODES {
            return Err(ConfigError::TooManyNodes {
                count: nodes.len(),
                max: MAX_NODES,
            });
        }
        Ok(Config {
            nodes,
            node_timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(250),
            operation_timeout: Duration::from_secs(5),
            recheck_interval: Duration::from_secs(30),
            safety: SafetyMode::Strict,
            attest_fsync_always: false,
            amnesia_protection: true,
            quorum_override: None,
            server_clock_leases: false,
            takeover_wait: true,
            lost_replies_counted: false,
            unbounded_vote_deadlines: false,
            release_counts_foreign_copies: false,
            undo_dropped_rounds: true,
            rollback_undone_rounds: true,
            floor_recheck: true,
            newest_lease_restore: false,
            unvalidated_spares: false,
            copy_checks: true,
            copy_claimed: true,
            #[cfg(feature = "test-util")]
            copy_hook: None,
            fenced_records: true,
            begun_marks: true,
            #[cfg(feature = "test-util")]
            record_hook: None,
            repair_epochs: true,
            implicit_set_up: false,
            change_resumes: true,
            live_follow: true,
            cluster_identity: true,
            cluster_pin: None,
            adopt_as: None,
            tls: tls::Tls::default(),
        })
    }

    /// Parse a comma-separated list of node URLs (empty items are ignored).
    pub fn from_list(list: &str) -> Result<Config, ConfigError> {
        Config::from_urls(list.split(',').map(str::trim).filter(|s| !s.is_empty()))
    }

    /// Read every variable of [`ENV_VARS`], as the CLI does: the node list from
    /// [`NODES_ENV`] (`REDQUORUM_NODES`), the cluster pin from [`CLUSTER_ENV`], the fsync
    /// attestation from [`ATTEST_FSYNC_ENV`], and the TLS settings from [`CACERT_ENV`],
    /// [`CERT_ENV`], [`KEY_ENV`] and [`SNI_ENV`] (see [`with_tls_env`](Config::with_tls_env)),
    /// each where it is set and not empty.
    ///
    /// # Errors
    /// As [`from_list`](Config::from_list), [`with_cluster_id`](Config::with_cluster_id) and
    /// [`with_tls_env`](Config::with_tls_env); [`ConfigError::EnvMissing`] when
    /// `REDQUORUM_NODES` is not set; [`ConfigError::EnvNotUnicode`] when a variable is not
    /// UTF-8.
    pub fn from_env() -> Result<Config, ConfigError> {
        let var = |name: &str| match std::env::var(name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::EnvNotUnicode),
        };
        let mut config = match var(NODES_ENV)? {
            Some(list) => Config::from_list(&list)?.with_tls_env()?,
            None => return Err(ConfigError::EnvMissing),
        };
        if let Some(id) = var(CLUSTER_ENV)? {
            config = config.with_cluster_id(&id)?;
        }
        if let Some(v) = var(ATTEST_FSYNC_ENV)? {
            let off = ["0", "false", "no", "off"]
                .iter()
                .any(|f| v.trim().eq_ignore_ascii_case(f));
            config = config.with_fsync_always_attested(!off);
        }
        Ok(config)
    }

    /// Apply the TLS settings named by [`CACERT_ENV`], [`CERT_ENV`] with [`KEY_ENV`], and
    /// [`SNI_ENV`], each where it is set and not empty.
    ///
    /// # Errors
    /// As the setters; a certificate without its key (or a key without its certificate) is
    /// [`ConfigError::TlsSetting`]; a variable that is not UTF-8 is too.
    pub fn with_tls_env(self) -> Result<Config, ConfigError> {
        fn var(name: &'static str) -> Result<Option<String>, ConfigError> {
            match std::env::var(name) {
                Ok(v) if v.trim().is_empty() => Ok(None),
                Ok(v) => Ok(Some(v)),
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::TlsSetting {
                    setting: name,
                    reason: "not valid UTF-8".into(),
                }),
            }
        }
        let mut config = self;
        if let Some(ca) = var(CACERT_ENV)? {
            config = config.with_ca_file(ca)?;
        }
        match (var(CERT_ENV)?, var(KEY_ENV)?) {
            (Some(cert), Some(key)) => config = config.with_client_cert(cert, key)?,
            (None, None) => {}
            (Some(_), None) => {
                return Err(ConfigError::TlsSetting {
                    setting: CERT_ENV,
                    reason: format!(
                        "is set but {KEY_ENV} is not: a client certificate needs its key"
                    ),
                })
            }
            (None, Some(_)) => {
                return Err(ConfigError::TlsSetting {
                    setting: KEY_ENV,
                    reason: format!(
                        "is set but {CERT_ENV} is not: a client key needs its certificate"
                    ),
                })
            }
        }
        if let Some(name) = var(SNI_ENV)? {
            config = config.with_server_name(&name)?;
        }
        Ok(config)
    }

    /// Trust only the CA certificates in this PEM file for `rediss://` nodes (by default the
    /// system's roots are trusted, and the file named by `SSL_CERT_FILE`). The file is read
    /// and checked now.
    ///
    /// # Errors
    /// [`ConfigError::TlsFile`] naming the setting and the path when the file cannot be read,
    /// holds no certificate, or holds one that is not a usable CA certificate;
    /// [`ConfigError::TlsSetting`] when this build has no TLS.
    pub fn with_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
        self.tls.ca = Some(tls::ca_file(path.as_ref())?);
        Ok(self)
    }

    /// Present this client certificate (PEM, the chain from the leaf) with its PEM private key
    /// to `rediss://` nodes: mutual TLS, for nodes run with `tls-auth-clients yes`. Both files
    /// are read and checked now, the key against the certificate too.
    ///
    /// # Errors
    /// [`ConfigError::TlsFile`] naming the setting and the path when a file cannot be read,
    /// holds no certificate or key, or the key does not fit the certificate;
    /// [`ConfigError::TlsSetting`] when this build has no TLS.
    pub fn with_client_cert(
        mut self,
        cert: impl AsRef<std::path::Path>,
        key: impl AsRef<std::path::Path>,
    ) -> Result<Self, ConfigError> {
        self.tls.client = Some(tls::client_cert(cert.as_ref(), key.as_ref())?);
        Ok(self)
    }

    /// Verify that every `rediss://` node's certificate is issued for `name` (and send it as
    /// the TLS server name), instead of the host in the node's URL: for nodes reached by an
    /// address their certificate does not name (an IP address, a tunnel). The connection
    /// still goes to the URL's host and port.
    ///
    /// # Errors
    /// [`ConfigError::TlsSetting`] when `name` is empty or not a DNS name or IP address, or
    /// when this build has no TLS.
    pub fn with_server_name(mut self, name: &str) -> Result<Self, ConfigError> {
        self.tls.server_name = Some(tls::server_name(name)?);
        Ok(self)
    }

    /// Deadline for one request to one node, connecting included. Default 250 ms.
    /// A node that does not answer in time counts as unknown for that operation. Every
    /// request that may change a node is held to it, however large (a unit or list write
    /// too): a repair waits this long for writes in flight, and a reply counted later could be
    /// a write it missed. Only reads whose reply grows with the data (a pool's units and
    /// lists) may take up to the operation timeout.
    pub fn with_node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }

    /// Deadline for opening a connection to a node. Default 250 ms; at most the node timeout.
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Overall deadline of an operation that retries (an ID allocation, waiting for a lock).
    /// Default 5 s; at least the node timeout.
    pub fn with_operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d;
        self
    }

    /// How often each node's safety findings are refreshed while it is in use. Default 30 s.
    /// Nodes are also re-checked on every reconnect.
    pub fn with_recheck_interval(mut self, d: Duration) -> Self {
        self.recheck_interval = d;
        self
    }

    /// Strict (default) or permissive safety mode. See [`SafetyMode`].
    pub fn with_safety(mut self, mode: SafetyMode) -> Self {
        self.safety = mode;
        self
    }

    /// The operator states that every node runs `appendfsync always`, for deployments where
    /// the client's ACL user may not run `CONFIG GET`. Default false: an unverifiable fsync
    /// policy excludes the node in strict mode.
    pub fn with_fsync_always_attested(mut self, attested: bool) -> Self {
        self.attest_fsync_always = attested;
        self
    }

    /// Pin the cluster this client belongs to (its id, 16 hex digits, as `redquorum cluster
    /// show` prints it). The client then refuses nodes of any other cluster (except the one
    /// that directly replaced it by `cluster change`), and never sets up a new cluster on
    /// blank nodes unless its own node list yields this id: recommended in production, where a
    /// service given a list of new, empty nodes would otherwise start a fresh cluster.
    ///
    /// # Errors
    /// [`ConfigError::ClusterMismatch`] when `id` is not 16 hex digits.
    pub fn with_cluster_id(mut self, id: &str) -> Result<Self, ConfigError> {
        let id = id.trim().to_ascii_lowercase();
        if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ConfigError::ClusterMismatch(format!(
                "cluster id {id:?} is not 16 hex digits (see `redquorum cluster show`)"
            )));
        }
        self.cluster_pin = Some(id);
        Ok(self)
    }

    /// The majority of these nodes (`n / 2 + 1`; only the `test-util` feature can lower it).
    pub(crate) fn majority(&self) -> crate::quorum::Majority {
        #[cfg(feature = "test-util")]
        if let Some(needed) = self.quorum_override {
            return crate::quorum::Majority::unsafe_quorum_for_tests(self.nodes.len(), needed);
        }
        crate::quorum::Majority::of(self.nodes.len())
    }

    /// This configuration with the node list `names` (of a successor of its cluster that
    /// this client follows): each node spelled as the descriptor names it, with this
    /// configuration's password when every configured URL carries the same one (or none).
    pub(crate) fn following(&self, names: &[String]) -> Result<Config, ConfigError> {
        let secrets: std::collections::BTreeSet<Option<&str>> =
            self.nodes.iter().map(NodeUrl::secret).collect();
        let secret = match secrets.len() {
            1 => secrets.into_iter().next().flatten(),
            _ => None,
        };
        let nodes = names
            .iter()
            .enumerate()
            .map(|(i, name)| NodeUrl::from_name(name, secret, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut config = self.clone();
        config.nodes = nodes;
        config.validate()?;
        Ok(config)
    }

    /// The nodes' names as a cluster descriptor lists them ([`NodeUrl::name`]), in order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|u| u.name().to_string()).collect()
    }

    /// The configured nodes, in order.
    pub fn nodes(&self) -> &[NodeUrl] {
        &self.nodes
    }

    /// The per-node deadline.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The connect deadline.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The overall operation deadline.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The safety mode.
    pub fn safety(&self) -> SafetyMode {
        self.safety
    }

    /// Check every duration against its range and against the others, and that TLS settings
    /// are given only with `rediss://` nodes.
    ///
    /// # Errors
    /// [`ConfigError::DurationOutOfRange`], [`ConfigError::Contradiction`] or
    /// [`ConfigError::TlsSetting`], naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.is_set() {
            if let Some((index, plain)) = self.nodes.iter().enumerate().find(|(_, n)| !n.is_tls()) {
                return Err(ConfigError::TlsSetting {
                    setting: "node URLs",
                    reason: format!(
                        "TLS settings are given but node {index} ({plain}) is redis://: use \
                         rediss:// for every node (a plain connection would ignore them)"
                    ),
                });
            }
        }
        let ranges = [
            ("node_timeout", self.node_timeout, Duration::from_secs(60)),
            (
                "connect_timeout",
                self.connect_timeout,
                Duration::from_secs(60),
            ),
            (
                "operation_timeout",
                self.operation_timeout,
                Duration::from_secs(3600),
            ),
            (
                "recheck_interval",
                self.recheck_interval,
                Duration::from_secs(3600),
            ),
        ];
        for (name, value, max) in ranges {
            if value < MIN_DURATION || value > max {
                return Err(ConfigError::DurationOutOfRange {
                    name,
                    value,
                    min: MIN_DURATION,
                    max,
                });
            }
        }
        if self.connect_timeout > self.node_timeout {
            return Err(ConfigError::Contradiction(format!(
                "connect_timeout ({:?}) exceeds node_timeout ({:?}): a connect is part of a \
                 request, so it could never finish within the per-node deadline",
                self.connect_timeout, self.node_timeout
            )));
        }
        if self.operation_timeout < self.node_timeout {
            return Err(ConfigError::Contradiction(format!(
                "operation_timeout ({:?}) is shorter than node_timeout ({:?}): not even one \
                 round could wait for a slow node",
                self.operation_timeout, self.node_timeout
            )));
        }
        Ok(())
    }

    /// Warnings that do not make the configuration invalid (an even node count).
    pub fn warnings(&self) -> Vec<String> {
        let n = self.nodes.len();
        let mut out = Vec::new();
        if n.is_multiple_of(2) {
            out.push(format!(
                "{n} nodes: an even count tolerates no more failures ({}) than {} nodes do, and \
                 needs one more node for a majority",
                (n - 1) / 2,
                n - 1
            ));
        }
        if n < 3 {
            out.push(format!("{n} node(s): no failure can be tolerated"));
        }
        if !self.amnesia_protection {
            out.push("amnesia protection is OFF (test-only switch): a wiped node can break every guarantee".into());
        }
        if let Some(q) = self.quorum_override {
            out.push(format!(
                "quorum overridden to {q} of {n} (test-only switch): majorities may not intersect"
            ));
        }
        if !self.cluster_identity {
            out.push("cluster identity is not checked (test-only switch): a client with another node list can count majorities that do not intersect".into());
        }
        if self.unbounded_vote_deadlines {
            out.push(
                "writing votes may count replies later than the node timeout (test-only \
                 switch): a repair may miss a write in flight"
                    .into(),
            );
        }
        if self.lost_replies_counted {
            out.push(
                "lost replies count as applied (test-only switch): majorities may be imaginary"
                    .into(),
            );
        }
        if !self.undo_dropped_rounds {
            out.push("a lock attempt dropped mid-round leaves its grants behind (test-only switch): a free lock looks held for its TTL".into());
        }
        if !self.rollback_undone_rounds {
            out.push("a lock round that was not granted is folded, not rolled back (test-only switch): a holder whose grant missed a node may never get its copy there".into());
        }
        if self.release_counts_foreign_copies {
            out.push("a release counts copies it did not delete (test-only switch): a deposed holder is told it still held the lease".into());
        }
        if !self.takeover_wait {
            out.push("lock contenders take over held leases without waiting (test-only switch): two holders at once".into());
        }
        if self.newest_lease_restore {
            out.push("a repair restores the newest lease copy where its sources disagree (test-only switch): a wiped node can admit two holders".into());
        }
        if self.unvalidated_spares {
            out.push("IDs from spare blocks are returned without a validating read (test-only switch): real-time order can break".into());
        }
        if self.server_clock_leases {
            out.push("leases expire on the nodes' wall clocks (test-only switch): one node's clock step or lost copy can admit two holders".into());
        }
        if self.safety == SafetyMode::Permissive {
            out.push("permissive safety mode: unsafe nodes vote; no guarantee holds".into());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lists_are_named() {
        assert_eq!(
            Config::from_urls(Vec::<String>::new()).expect_err("empty"),
            ConfigError::NoNodes
        );
        assert_eq!(
            Config::from_list(" , ").expect_err("blank"),
            ConfigError::NoNodes
        );
        let dup = Config::from_urls(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001/0"])
            .expect_err("dup");
        assert!(
            matches!(
                dup,
                ConfigError::DuplicateUrl {
                    first: 0,
                    second: 1,
                    ..
                }
            ),
            "{dup}"
        );
        let scheme = Config::from_urls(["http://127.0.0.1:7001"]).expect_err("scheme");
        assert!(
            matches!(scheme, ConfigError::UnsupportedScheme { .. }),
            "{scheme}"
        );
        let nohost = Config::from_urls(["redis://"]).expect_err("no host");
        assert!(
            matches!(nohost, ConfigError::MalformedUrl { .. }),
            "{nohost}"
        );
        let db = Config::from_urls(["redis://h:1/abc"]).expect_err("db");
        assert!(db.to_string().contains("database"), "{db}");
        let too_many: Vec<String> = (0..64).map(|p| format!("redis://h:{}", 1000 + p)).collect();
        assert!(matches!(
            Config::from_urls(too_many),
            Err(ConfigError::TooManyNodes { .. })
        ));
    }

    #[test]
    fn contradictory_and_absurd_timeouts_are_rejected_with_their_values() {
        let base = Config::from_urls(["redis://h:1", "redis://h:2", "redis://h:3"]).expect("valid");
        assert!(base.validate().is_ok());
        let e = base
            .clone()
            .with_connect_timeout(Duration::from_secs(2))
            .validate()
            .expect_err("connect > node");
        assert!(
            e.to_string()
                .contains("connect_timeout (2s) exceeds node_timeout (250ms)"),
            "{e}"
        );
        let e = base
            .clone()
            .with_operation_timeout(Duration::from_millis(100))
            .validate()
            .expect_err("op < node");
        assert!(e.to_string().contains("operation_timeout (100ms)"), "{e}");
        let e = base
            .clone()
            .with_node_timeout(Duration::ZERO)
            .validate()
            .expect_err("zero");
        assert!(
            matches!(
                e,
                ConfigError::DurationOutOfRange {
                    name: "node_timeout",
                    ..
                }
            ),
            "{e}"
        );
        let e = base
            .with_operation_timeout(Duration::from_secs(86_400 * 365))
            .validate()
            .expect_err("a year");
        assert!(
            matches!(
                e,
                ConfigError::DurationOutOfRange {
                    name: "operation_timeout",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn even_node_count_is_allowed_with_a_warning() {
        let cfg = Config::from_urls(["redis://h:1", "redis://h:2", "redis://h:3", "redis://h:4"])
            .expect("valid");
        assert!(cfg.validate().is_ok());
        let w = cfg.warnings();
        assert!(w.iter().any(|w| w.contains("even count")), "{w:?}");
    }
}
