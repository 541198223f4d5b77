//! Client configuration: node URLs, timeouts, safety mode; validation with errors that name
//! the problem.
//!
//! Architecture invariant: a password never leaves [`NodeUrl`] in text. `Display` and `Debug`
//! of every configuration and error type print `***` in its place.

use std::time::Duration;

mod tls;
mod url;

pub(crate) use tls::{hint as tls_hint, Tls};
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
    /// A repair writes a new marker epoch and restores beats by maximum (test switch).
    pub(crate) repair_epochs: bool,
    /// TEST ONLY (false outside tests): a repair that finds blank nodes sets a cluster up on
    /// them, as every client did before issue 28.
    pub(crate) implicit_set_up: bool,
    /// A re-run of an interrupted node-list change resumes it (test switch).
    pub(crate) change_resumes: bool,
    pub(crate) cluster_identity: bool,
    pub(crate) cluster_pin: Option<String>,
    /// Adopt exactly this cluster (by id) where a node holds its descriptor: the old list's
    /// client of a resumed node-list change works in the old cluster even after a node holds
    /// the successor's descriptor. Never set by users.
    pub(crate) adopt_as: Option<String>,
    pub(crate) tls: tls::Tls,
}

/// TEST ONLY: where a copy (of a repair or a node-list change) calls the hook of
/// [`Config::with_copy_hook_for_tests`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub enum CopyEvent {
    /// The sources and targets are fixed (after the census, the seal and the claims), before
    /// the first page is read.
    Started,
    /// A page was read from every source and merged, before it is written.
    PageRead,
    /// A node-list change sealed the old nodes it reached (before it settles and counts them).
    Sealed,
    /// A node-list change marked one more node of the new list for the new cluster.
    Marked,
    /// `cluster init` decided to mark blank nodes (under its claims), before it marks them.
    InitDecided,
}

/// The test-only copy hook (see [`Config::with_copy_hook_for_tests`]).
#[cfg(feature = "test-util")]
#[derive(Clone)]
pub(crate) struct CopyHook(pub(crate) std::sync::Arc<CopyHookFn>);

/// The function a [`CopyHook`] calls.
#[cfg(feature = "test-util")]
type CopyHookFn = dyn Fn(CopyEvent) -> futures::future::BoxFuture<'static, ()> + Send + Sync;

#[cfg(feature = "test-util")]
impl std::fmt::Debug for CopyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CopyHook")
    }
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
            floor_recheck: true,
            newest_lease_restore: false,
            unvalidated_spares: false,
            copy_checks: true,
            copy_claimed: true,
            #[cfg(feature = "test-util")]
            copy_hook: None,
            repair_epochs: true,
            implicit_set_up: false,
            change_resumes: true,
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
    /// A node that does not answer in time counts as unknown for that operation.
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

    /// TEST ONLY: switch off node-amnesia protection (marker check, quarantine, repair and
    /// the per-process high-water mark), so a test can show that its checker catches the
    /// violations this protection prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_amnesia_protection_disabled_for_tests(mut self) -> Self {
        self.amnesia_protection = false;
        self
    }

    /// TEST ONLY: count `needed` nodes as a quorum instead of a majority (for example N/2),
    /// so a test can show that its checker catches split-brain. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_unsafe_quorum_for_tests(mut self, needed: usize) -> Self {
        self.quorum_override = Some(needed);
        self
    }

    /// TEST ONLY: let lease keys expire on the nodes' wall clocks again (Redis `PEXPIRE`), never
    /// re-create a missing copy on extension, and do not restore lease keys in repair: the
    /// classic Redlock behaviour, so a test can show the double holders that a node's clock
    /// step or a lost copy causes with it. A repair's claim on a node then also expires on
    /// that node's wall clock (a dead repairer's claim outlives a backward step). Never use it
    /// in production.
    #[cfg(feature = "test-util")]
    pub fn with_server_clock_leases_for_tests(mut self) -> Self {
        self.server_clock_leases = true;
        self
    }

    /// TEST ONLY: a repair restores the newest copy of a lease (highest token) even where its
    /// sources hold different holders' copies, the rule before 2026-11-24, so a test can show
    /// the two holders it admits when a contender that never held the lease releases the
    /// restored copy. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_newest_lease_restore_for_tests(mut self) -> Self {
        self.newest_lease_restore = true;
        self
    }

    /// TEST ONLY: an ID generator returns IDs from its spare block without the majority read
    /// that shows no higher ID was returned before the call, so a test can show the
    /// real-time order it breaks when another process wrote above the spare. Never use it in
    /// production.
    #[cfg(feature = "test-util")]
    pub fn with_unvalidated_spares_for_tests(mut self) -> Self {
        self.unvalidated_spares = true;
        self
    }

    /// TEST ONLY: a lock contender takes over a held lease as soon as it sees it, without
    /// watching it unchanged for its TTL plus drift, so a test can show the two holders that
    /// the wait prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_takeover_wait_for_tests(mut self) -> Self {
        self.takeover_wait = false;
        self
    }

    /// TEST ONLY: the tally of every operation's fan-out counts a lost reply (a timeout, or a
    /// connection that broke after the request may have been sent) as applied, so a test can
    /// show what counting only real replies prevents. The fan-out's own early stop and the
    /// client's node probes still count real replies only. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_lost_replies_counted_for_tests(mut self) -> Self {
        self.lost_replies_counted = true;
        self
    }

    /// TEST ONLY: a repair (or a change of the node list) does not re-read the fence floors
    /// after its scans, so a test can show the token that a lock release during the copy
    /// makes it miss. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_floor_recheck_for_tests(mut self) -> Self {
        self.floor_recheck = false;
        self
    }

    /// TEST ONLY: a repair's (or a node-list change's) copy reads its sources blind, without
    /// checking in the same transaction that each is still the incarnation (run_id, marker,
    /// last repair) its census found, so a test can show the accepted values that a source
    /// emptied by FLUSHALL during the copy makes it lose. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_blind_copy_reads_for_tests(mut self) -> Self {
        self.copy_checks = false;
        self
    }

    /// TEST ONLY: a copy's page writes do not check that the target still carries the
    /// repairer's claim, so a test can show what a repairer that lost its claim brings back
    /// (a unit removed and collected meanwhile). Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_unclaimed_copy_writes_for_tests(mut self) -> Self {
        self.copy_claimed = false;
        self
    }

    /// TEST ONLY: a repair that finds blank nodes (every node answering, none marked, none
    /// holding data) sets a cluster up on them, as every client did before issue 28: after
    /// every node lost its data, a running client's IDs then start again from 1 without the
    /// operator's `cluster init`, which a test can show.
    #[cfg(feature = "test-util")]
    pub fn with_implicit_set_up_for_tests(mut self) -> Self {
        self.implicit_set_up = true;
        self
    }

    /// TEST ONLY: a repair (and a set-up) writes the node's marker without an epoch, and
    /// restores a beat only where the node lacks it, from the first source holding it: the
    /// rules before issue 27. A node FLUSHALLed (run_id kept) and repaired then shows the very
    /// marker it had, so a leader's watch counts straight through the loss, and a beat can go
    /// back to a value the leader saw earlier: a test can show the double owner this gives.
    #[cfg(feature = "test-util")]
    pub fn with_repeatable_beats_for_tests(mut self) -> Self {
        self.repair_epochs = false;
        self
    }

    /// TEST ONLY: re-running an interrupted node-list change does not resume it (the old
    /// list's client takes whatever cluster its nodes show for the one to replace), so a
    /// test can show the trap the resumption removes: a change stopped after marking fewer
    /// than a majority of the new list is refused, or seals for a bogus second successor; and
    /// a completed change stamps no old node done, so a stale re-run after the new nodes were
    /// wiped copies the old cluster's frozen state onto them again.
    #[cfg(feature = "test-util")]
    pub fn with_unresumable_changes_for_tests(mut self) -> Self {
        self.change_resumes = false;
        self
    }

    /// TEST ONLY: call `hook` at a copy's pause points ([`CopyEvent`]) and wait for the future
    /// it returns, so a test can fault a node at exactly that moment (a FLUSHALL of a source
    /// after the census; a repairer paused between a page's read and its write).
    #[cfg(feature = "test-util")]
    pub fn with_copy_hook_for_tests(
        mut self,
        hook: impl Fn(CopyEvent) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.copy_hook = Some(CopyHook(std::sync::Arc::new(hook)));
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

    /// TEST ONLY: adopt whatever cluster descriptor the nodes hold even when it lists another
    /// number of nodes, and repair nodes the descriptor does not list: a client with another
    /// node list then counts majorities over another set of servers, so a test can show the
    /// broken order this protection prevents. It also lets two URLs to one server both vote
    /// in a fan-out that starts before their probes are compared. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_cluster_identity_for_tests(mut self) -> Self {
        self.cluster_identity = false;
        self
    }

    /// The majority of these nodes (`n / 2 + 1`; only the `test-util` feature can lower it).
    pub(crate) fn majority(&self) -> crate::quorum::Majority {
        #[cfg(feature = "test-util")]
        if let Some(needed) = self.quorum_override {
            return crate::quorum::Majority::unsafe_quorum_for_tests(self.nodes.len(), needed);
        }
        crate::quorum::Majority::of(self.nodes.len())
    }

    /// This configuration with the node list of cluster `d`, a successor of its cluster that
    /// this client follows: each node spelled as the descriptor names it, with this
    /// configuration's password when every configured URL carries the same one (or none).
    pub(crate) fn following(&self, d: &crate::Descriptor) -> Result<Config, ConfigError> {
        let secrets: std::collections::BTreeSet<Option<&str>> =
            self.nodes.iter().map(NodeUrl::secret).collect();
        let secret = match secrets.len() {
            1 => secrets.into_iter().next().flatten(),
            _ => None,
        };
        let nodes = d
            .nodes
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
        if self.lost_replies_counted {
            out.push(
                "lost replies count as applied (test-only switch): majorities may be imaginary"
                    .into(),
            );
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

/// A configuration problem, named precisely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The node list is empty.
    #[error("no nodes configured: give at least one redis:// URL (or set {NODES_ENV})")]
    NoNodes,
    /// More nodes than [`MAX_NODES`].
    #[error("{count} nodes configured; at most {max} are supported")]
    TooManyNodes {
        /// Nodes given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A URL that does not parse or has an invalid part.
    #[error("node {index}: malformed URL {url}: {reason}")]
    MalformedUrl {
        /// Position in the list.
        index: usize,
        /// The URL with its password redacted.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A scheme other than `redis` or `rediss`.
    #[error("node {index}: unsupported scheme {scheme:?} in {url}: use redis:// or rediss://")]
    UnsupportedScheme {
        /// Position in the list.
        index: usize,
        /// The URL with its password redacted.
        url: String,
        /// The scheme found.
        scheme: String,
    },
    /// The same node twice.
    #[error("nodes {first} and {second} are the same URL {url}: each node must be listed once")]
    DuplicateUrl {
        /// Position of the first occurrence.
        first: usize,
        /// Position of the duplicate.
        second: usize,
        /// The URL with its password redacted.
        url: String,
    },
    /// A duration outside its allowed range.
    #[error("{name} = {value:?} is outside the allowed range {min:?}..={max:?}")]
    DurationOutOfRange {
        /// Setting name.
        name: &'static str,
        /// The value given.
        value: Duration,
        /// Smallest allowed.
        min: Duration,
        /// Largest allowed.
        max: Duration,
    },
    /// The nodes belong to a cluster with another node list (or to unrelated clusters), or
    /// the cluster's node timeout is shorter than this client's.
    #[error("refused: {0}")]
    ClusterMismatch(String),
    /// No cluster is set up on the nodes (blank nodes, or a majority of them lost their data;
    /// `redquorum cluster init` sets one up), or `cluster init` cannot set one up: the reason
    /// says why and what to do.
    #[error("{0}")]
    ClusterSetUp(String),
    /// Two settings that cannot both hold.
    #[error("contradictory timeouts: {0}")]
    Contradiction(String),
    /// `REDQUORUM_NODES` is not set.
    #[error(
        "no nodes configured: {NODES_ENV} is not set (expected comma-separated redis:// URLs)"
    )]
    EnvMissing,
    /// A TLS file that cannot be used.
    #[error("{setting}: {path}: {reason}")]
    TlsFile {
        /// The setting, with its CLI option and environment variable.
        setting: &'static str,
        /// The file's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A TLS setting that cannot be used (or TLS settings that do not fit the nodes).
    #[error("{setting}: {reason}")]
    TlsSetting {
        /// The setting.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `REDQUORUM_NODES` is not valid Unicode.
    #[error("{NODES_ENV} is not valid UTF-8")]
    EnvNotUnicode,
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
