//! Node safety checks: typed findings about each node's configuration, and the verdict on
//! whether the node may vote.
//!
//! The guarantees are documented on `NodeReport`.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::quorum::NodeId;

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// For information; never excludes the node.
    Info,
    /// Worth a look; never excludes the node.
    Warning,
    /// Breaks an assumption of the guarantees: in strict mode the node does not vote.
    Unsafe,
}

/// One observation about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// The node could not be reached or did not answer the check.
    Unreachable(String),
    /// `aof_enabled:0`: writes are not logged, a restart loses them.
    AofDisabled,
    /// `aof_last_write_status` is not `ok` (disk full, I/O error).
    AofWriteFailing(String),
    /// `appendfsync` is not `always`: an acknowledged write can be lost on a crash.
    FsyncNotAlways(String),
    /// `appendfsync` could not be read (CONFIG not permitted); not attested by the operator.
    FsyncUnverified(String),
    /// `appendfsync` could not be read, but the operator attested `always`.
    FsyncAttested,
    /// `no-appendfsync-on-rewrite yes`: fsync silently stops during AOF rewrites.
    NoFsyncOnRewrite,
    /// `maxmemory-policy` is not `noeviction`: keys (locks, counters) can be evicted.
    EvictionPolicy(String),
    /// This URL reaches the same server (same `run_id`) as an earlier node; only the
    /// earlier one is counted.
    SameServerAs(NodeId),
    /// The server restarted since the client last saw it (`run_id` changed).
    Restarted {
        /// The `run_id` seen before.
        previous: String,
        /// The `run_id` now.
        current: String,
    },
    /// The server is older than Redis 7.0, the oldest version this crate is tested with.
    OldVersion(String),
    /// The node may have lost data (its marker is missing) or restarted since it was last
    /// verified (its marker names another run_id). It does not vote until it is repaired:
    /// raised to the values read from a majority of the other nodes.
    Quarantined(String),
    /// The node belongs to another cluster than this client's, or this client's node list
    /// is not the cluster's (the reason names both lists). It never votes for this client.
    OtherCluster(String),
}

impl Finding {
    /// The severity of this finding.
    pub fn severity(&self) -> Severity {
        match self {
            Finding::Unreachable(_)
            | Finding::AofDisabled
            | Finding::AofWriteFailing(_)
            | Finding::FsyncNotAlways(_)
            | Finding::FsyncUnverified(_)
            | Finding::NoFsyncOnRewrite
            | Finding::EvictionPolicy(_)
            | Finding::SameServerAs(_)
            | Finding::Quarantined(_)
            | Finding::OtherCluster(_) => Severity::Unsafe,
            Finding::OldVersion(_) => Severity::Warning,
            Finding::FsyncAttested | Finding::Restarted { .. } => Severity::Info,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Unreachable(e) => write!(f, "unreachable: {e}"),
            Finding::AofDisabled => {
                f.write_str("AOF disabled (appendonly no): acknowledged writes are lost on restart")
            }
            Finding::AofWriteFailing(s) => write!(f, "last AOF write failed ({s})"),
            Finding::FsyncNotAlways(p) => write!(
                f,
                "appendfsync {p}: acknowledged writes can be lost on a crash (need always)"
            ),
            Finding::FsyncUnverified(e) => write!(
                f,
                "appendfsync unverified ({e}); attest it or allow CONFIG GET"
            ),
            Finding::FsyncAttested => {
                f.write_str("appendfsync always attested by the operator (not verified)")
            }
            Finding::NoFsyncOnRewrite => {
                f.write_str("no-appendfsync-on-rewrite yes: fsync stops during AOF rewrites")
            }
            Finding::EvictionPolicy(p) => write!(
                f,
                "maxmemory-policy {p}: keys can be evicted (need noeviction)"
            ),
            Finding::SameServerAs(n) => write!(f, "same server as {n} (same run_id): counted once"),
            Finding::Restarted { previous, current } => {
                write!(
                    f,
                    "restarted (run_id {} -> {})",
                    short(previous),
                    short(current)
                )
            }
            Finding::OldVersion(v) => write!(f, "Redis {v} is older than 7.0"),
            Finding::Quarantined(why) => write!(f, "quarantined until repaired: {why}"),
            Finding::OtherCluster(why) => write!(f, "not in this client's cluster: {why}"),
        }
    }
}

fn short(run_id: &str) -> &str {
    run_id.get(..8).unwrap_or(run_id)
}

/// What one node reported about itself, as parsed from `INFO` and `CONFIG GET`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `redis_version`: the Redis version the server is compatible with (Redis's own version;
    /// Valkey 8 reports `7.2.4` here, its own version in
    /// [`server_version`](Self::server_version)). The [`Finding::OldVersion`] check reads it.
    pub version: Option<String>,
    /// The server's own name: INFO's `server_name` (`valkey`), else `redis` when INFO has
    /// `redis_version` (Redis has no `server_name`). See [`server_label`](Self::server_label).
    pub server: Option<String>,
    /// The server's own version: `<server_name>_version` (`valkey_version`, e.g. `8.0.1`),
    /// else `redis_version`.
    pub server_version: Option<String>,
    /// `run_id`: changes on every restart.
    pub run_id: Option<String>,
    /// `aof_enabled`.
    pub aof_enabled: Option<bool>,
    /// `aof_last_write_status`.
    pub aof_last_write_status: Option<String>,
    /// `maxmemory_policy`.
    pub maxmemory_policy: Option<String>,
    /// `appendfsync`, or why it could not be read.
    pub appendfsync: Result<String, String>,
    /// `no-appendfsync-on-rewrite`, if it could be read.
    pub no_appendfsync_on_rewrite: Option<bool>,
    /// The node marker (`rq:marker`): the run_id of the incarnation last verified to hold
    /// every value a majority accepted. `None`: missing (new or wiped node).
    pub marker: Option<String>,
    /// The cluster descriptor the node holds (`rq:cluster`, JSON), if any.
    pub cluster: Option<String>,
    /// Round trip of a PING.
    pub latency: Duration,
    /// The node's wall clock (`server_time_usec`) minus this client's wall clock at the middle
    /// of the probe's round trip, in milliseconds. Information for operators only: no safety
    /// decision reads a node's clock (see [`clock_skews`]).
    pub clock_offset_ms: Option<i64>,
}

/// Each node's clock offset against the median offset of the nodes that answered, in
/// milliseconds (`None` for a node without a probe). A node whose clock stepped shows here;
/// redquorum's guarantees do not depend on it.
pub fn clock_skews(probes: &[Option<&Probe>]) -> Vec<Option<i64>> {
    let mut offsets: Vec<i64> = probes
        .iter()
        .filter_map(|p| p.and_then(|p| p.clock_offset_ms))
        .collect();
    if offsets.is_empty() {
        return vec![None; probes.len()];
    }
    offsets.sort_unstable();
    let median = offsets[offsets.len() / 2];
    probes
        .iter()
        .map(|p| p.and_then(|p| p.clock_offset_ms).map(|o| o - median))
        .collect()
}

impl Probe {
    /// Parse the text of `INFO` (any sections) into a probe; CONFIG values are filled in
    /// separately.
    pub fn from_info(info: &str) -> Probe {
        let fields: HashMap<&str, &str> = info
            .lines()
            .filter_map(|l| l.trim_end_matches('\r').split_once(':'))
            .collect();
        let (server, server_version) = server_identity(&fields);
        Probe {
            version: fields.get("redis_version").map(|s| s.to_string()),
            server,
            server_version,
            run_id: fields.get("run_id").map(|s| s.to_string()),
            aof_enabled: fields.get("aof_enabled").map(|s| *s == "1"),
            aof_last_write_status: fields.get("aof_last_write_status").map(|s| s.to_string()),
            maxmemory_policy: fields.get("maxmemory_policy").map(|s| s.to_string()),
            appendfsync: Err("not read".into()),
            no_appendfsync_on_rewrite: None,
            marker: None,
            cluster: None,
            latency: Duration::ZERO,
            clock_offset_ms: None,
        }
    }

    /// The server and its own version, as `check` shows them: `redis 7.0.15`, `valkey 8.0.1`
    /// (`?` for a version the server did not report); `None` when INFO named no server.
    pub fn server_label(&self) -> Option<String> {
        let server = self.server.as_deref()?;
        Some(format!(
            "{server} {}",
            self.server_version.as_deref().unwrap_or("?")
        ))
    }

    /// The findings this probe supports on its own (without comparing with other nodes or
    /// with an earlier probe). `attested` is the operator's statement that fsync is `always`.
    /// The marker (quarantine) and the cluster are judged by the client, which knows the
    /// cluster it adopted.
    pub fn findings(&self, attested: bool) -> Vec<Finding> {
        let mut out = Vec::new();
        match self.aof_enabled {
            Some(true) => {}
            Some(false) => out.push(Finding::AofDisabled),
            None => out.push(Finding::Unreachable(
                "INFO persistence lacks aof_enabled".into(),
            )),
        }
        match self.aof_last_write_status.as_deref() {
            Some("ok") | None => {}
            Some(other) => out.push(Finding::AofWriteFailing(other.to_string())),
        }
        match &self.appendfsync {
            Ok(p) if p == "always" => {}
            Ok(p) => out.push(Finding::FsyncNotAlways(p.clone())),
            Err(_) if attested => out.push(Finding::FsyncAttested),
            Err(e) => out.push(Finding::FsyncUnverified(e.clone())),
        }
        if self.no_appendfsync_on_rewrite == Some(true) {
            out.push(Finding::NoFsyncOnRewrite);
        }
        match self.maxmemory_policy.as_deref() {
            Some("noeviction") => {}
            Some(p) => out.push(Finding::EvictionPolicy(p.to_string())),
            None => out.push(Finding::EvictionPolicy("unknown".into())),
        }
        if let Some(v) = &self.version {
            let major: u32 = v
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major < 7 {
                out.push(Finding::OldVersion(v.clone()));
            }
        }
        out
    }
}

/// The server's own name and version from INFO's fields, by field, never by a message: a
/// server that names itself (`server_name:valkey`) gives its version in `<name>_version`
/// (`valkey_version:8.0.1`; its `redis_version` is a compatibility string); Redis names
/// itself nowhere and gives `redis_version`.
fn server_identity(fields: &HashMap<&str, &str>) -> (Option<String>, Option<String>) {
    let field = |name: &str| {
        fields
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    match field("server_name") {
        Some(name) => {
            let version = field(&format!("{name}_version")).or_else(|| field("redis_version"));
            (Some(name), version)
        }
        None => {
            let version = field("redis_version");
            (version.as_ref().map(|_| "redis".to_string()), version)
        }
    }
}

/// Node safety checks: typed findings about each node's configuration, and the verdict on
/// whether the node may vote.
///
/// The promises of this crate assume every voting node persists each write before replying
/// (`appendonly yes`, `appendfsync always`, the last AOF write succeeded), never evicts keys
/// (`maxmemory-policy noeviction`), is counted once, and keeps its data across restarts. This
/// module turns what a node reports (`INFO`, `CONFIG GET`) into [`Finding`]s. Parsing and
/// judging are pure functions; the I/O lives in the (private) `node` module.
///
/// Architecture invariant: a setting that could not be read is reported as unverified, never
/// as OK; in strict mode an unverified fsync policy excludes the node unless the operator
/// attested it.
///
/// One node's row in a safety check.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeReport {
    /// Which node.
    pub node: NodeId,
    /// Its URL, password redacted.
    pub url: String,
    /// What it reported, if it answered.
    pub probe: Option<Probe>,
    /// Everything found, most serious first.
    pub findings: Vec<Finding>,
    /// Whether the node counts toward majorities under the client's safety mode.
    pub votes: bool,
}

impl NodeReport {
    /// Reachable and free of unsafe findings.
    pub fn is_safe(&self) -> bool {
        self.probe.is_some()
            && !self
                .findings
                .iter()
                .any(|f| f.severity() == Severity::Unsafe)
    }

    /// The most serious findings, as one line.
    pub fn summary(&self) -> String {
        if self.findings.is_empty() {
            return "ok".into();
        }
        self.findings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Mark later nodes that share a `run_id` with an earlier node. Pure: takes each node's
/// `run_id` (None when unknown) and returns, per node, the earlier node it duplicates.
pub(crate) fn duplicate_servers(run_ids: &[Option<&str>]) -> Vec<Option<NodeId>> {
    run_ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let id = (*id)?;
            run_ids[..i]
                .iter()
                .position(|other| *other == Some(id))
                .map(NodeId)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAFE_INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abcdef0123456789\r\n# Persistence\r\naof_enabled:1\r\naof_last_write_status:ok\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n";

    fn safe_probe() -> Probe {
        let mut p = Probe::from_info(SAFE_INFO);
        p.appendfsync = Ok("always".into());
        p.no_appendfsync_on_rewrite = Some(false);
        p.marker = p.run_id.clone();
        p
    }

    #[test]
    fn a_safe_node_has_no_findings() {
        assert_eq!(safe_probe().findings(false), vec![]);
        assert_eq!(safe_probe().version.as_deref(), Some("7.0.15"));
        assert_eq!(safe_probe().run_id.as_deref(), Some("abcdef0123456789"));
    }

    /// What Valkey 8.0.1 answers to `INFO server persistence memory` (abridged, the fields in
    /// their order).
    const VALKEY_INFO: &str = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\nredis_git_sha1:00000000\r\nserver_mode:standalone\r\nrun_id:0123456789abcdef\r\n# Persistence\r\naof_enabled:1\r\naof_last_write_status:ok\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n";

    #[test]
    fn the_server_is_named_by_its_own_fields() {
        let redis = safe_probe();
        assert_eq!(redis.server.as_deref(), Some("redis"));
        assert_eq!(redis.server_version.as_deref(), Some("7.0.15"));
        assert_eq!(redis.server_label().as_deref(), Some("redis 7.0.15"));

        let valkey = Probe::from_info(VALKEY_INFO);
        assert_eq!(valkey.server.as_deref(), Some("valkey"));
        assert_eq!(valkey.server_version.as_deref(), Some("8.0.1"));
        assert_eq!(valkey.server_label().as_deref(), Some("valkey 8.0.1"));
        // The compatibility version stays what the version check reads: 7.2 is new enough.
        assert_eq!(valkey.version.as_deref(), Some("7.2.4"));
        let mut valkey = valkey;
        valkey.appendfsync = Ok("always".into());
        valkey.no_appendfsync_on_rewrite = Some(false);
        assert_eq!(valkey.findings(false), vec![]);

        // A server that names itself without a version of its own: its redis_version.
        let other = Probe::from_info("server_name:keyvalue\r\nredis_version:7.2.0\r\n");
        assert_eq!(other.server_label().as_deref(), Some("keyvalue 7.2.0"));
        let unversioned = Probe::from_info("server_name:valkey\r\n");
        assert_eq!(unversioned.server_label().as_deref(), Some("valkey ?"));
        // INFO without a server section names nobody.
        let bare = Probe::from_info("# Persistence\r\naof_enabled:1\r\n");
        assert_eq!((bare.server, bare.server_version), (None, None));
        assert_eq!(Probe::from_info("").server_label(), None);
    }

    #[test]
    fn a_stepped_node_clock_shows_against_the_median() {
        let with = |ms: i64| {
            let mut p = safe_probe();
            p.clock_offset_ms = Some(ms);
            p
        };
        let (a, b, c) = (with(3), with(120_004), with(-1));
        assert_eq!(
            clock_skews(&[Some(&a), Some(&b), None, Some(&c)]),
            vec![Some(0), Some(120_001), None, Some(-4)]
        );
        assert_eq!(clock_skews(&[None, None]), vec![None, None]);
    }

    #[test]
    fn each_unsafe_setting_is_named() {
        let mut p = safe_probe();
        p.appendfsync = Ok("everysec".into());
        assert_eq!(
            p.findings(false),
            vec![Finding::FsyncNotAlways("everysec".into())]
        );

        let mut p = safe_probe();
        p.aof_enabled = Some(false);
        assert_eq!(p.findings(false), vec![Finding::AofDisabled]);

        let mut p = safe_probe();
        p.maxmemory_policy = Some("volatile-lru".into());
        assert_eq!(
            p.findings(false),
            vec![Finding::EvictionPolicy("volatile-lru".into())]
        );

        let mut p = safe_probe();
        p.no_appendfsync_on_rewrite = Some(true);
        assert_eq!(p.findings(false), vec![Finding::NoFsyncOnRewrite]);

        let mut p = safe_probe();
        p.aof_last_write_status = Some("err".into());
        assert_eq!(
            p.findings(false),
            vec![Finding::AofWriteFailing("err".into())]
        );
    }

    #[test]
    fn unreadable_fsync_is_unverified_never_ok() {
        let mut p = safe_probe();
        p.appendfsync = Err("NOPERM".into());
        let f = p.findings(false);
        assert_eq!(f, vec![Finding::FsyncUnverified("NOPERM".into())]);
        assert_eq!(f[0].severity(), Severity::Unsafe);
        assert_eq!(p.findings(true), vec![Finding::FsyncAttested]);
    }

    #[test]
    fn later_urls_to_the_same_server_are_duplicates() {
        let d = duplicate_servers(&[Some("a"), Some("b"), Some("a"), None, Some("b")]);
        assert_eq!(d, vec![None, None, Some(NodeId(0)), None, Some(NodeId(1))]);
    }
}
