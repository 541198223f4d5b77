//! Test harness for `redquorum`: N real, independent Redis nodes in Docker containers,
//! each behind its own TCP fault proxy.
//!
//! Node faults (through Docker): [`TestNode::kill`] (SIGKILL), [`TestNode::restart`],
//! [`TestNode::freeze`]/[`TestNode::thaw`] (docker pause), [`TestNode::wipe_and_restart`]
//! (data loss). Network faults (in the proxy, instant): [`TestNode::cut_off`] (silent
//! partition), [`TestNode::refuse`], [`TestNode::drop_replies`],
//! [`TestNode::set_latency`] and [`TestNode::heal`]. Clock faults (an `LD_PRELOAD` shim, see
//! [`clock`]): [`TestNode::step_clock_ms`] steps one node's wall clock forward or back.
//!
//! ```no_run
//! use redquorum_testkit::Cluster;
//!
//! # async fn demo() {
//! let cluster = Cluster::start(3).await;
//! let urls = cluster.urls(); // through the fault proxies
//! cluster.node(2).cut_off(); // silent partition of node 2
//! cluster.node(1).kill().await; // kill -9, data kept
//! // ... exercise the code under test with `urls` ...
//! cluster.node(1).restart().await; // same data, same ports
//! cluster.node(2).heal();
//! # }
//! ```
//!
//! Timing relies on real time: do not call `tokio::time::pause()` in a test that uses
//! a cluster (readiness polling, proxy latency and redis-rs timeouts would misfire).
//!
//! The image comes from `scripts/build-redis-image.sh` (no registry needed); see
//! [`image_name`]. The server is Redis unless [`SERVER_ENV`] names Valkey
//! (`REDQUORUM_TEST_SERVER=valkey-server`): then local processes run it and containers run
//! [`VALKEY_IMAGE`]. Every container is removed when its [`TestNode`] is dropped, also
//! when a test panics, also when the node is frozen.
//!
//! A second backend, [`LocalNodes`], runs plain server processes ([`server_program`]) on this
//! machine (no Docker, no proxy; freeze and thaw by signal), with the same [`SAFE_ARGS`]: for
//! benchmarks and the fault campaign, where a container's network path would be measured too.
//!
//! [`checker`] holds the history checkers the tests run over what clients observed;
//! [`mutex`] checks a lock's history for linearizability against a fenced mutex.
#![warn(missing_docs, missing_debug_implementations)]

pub mod checker;
pub mod clock;
mod container;
mod local;
pub mod mutex;
mod node;
pub mod portmap;
mod ports;
mod proxy;
pub mod record;
pub mod secure;

pub use local::LocalNodes;
pub use node::TestNode;
pub use proxy::{FaultMode, FaultProxy};

/// The image `scripts/build-redis-image.sh` builds by default.
pub const DEFAULT_IMAGE: &str = "redquorum-redis:7.0";

/// The image `scripts/build-redis-image.sh` builds when [`SERVER_ENV`] names Valkey, and the
/// default image then.
pub const VALKEY_IMAGE: &str = "redquorum-valkey:8.0";

/// The environment variable that overrides the image (same variable as the script): see
/// [`image_name`].
pub const IMAGE_ENV: &str = "REDQUORUM_REDIS_IMAGE";

/// The environment variable naming the server program: a name looked up on `PATH` or a path,
/// default [`DEFAULT_SERVER`]. Every local process runs it ([`LocalNodes`], hence the fault
/// campaign, and [`secure::TlsNode`]); when its file name contains `valkey` (e.g.
/// `valkey-server`, installed by `scripts/install-valkey.sh`), container nodes default to
/// [`VALKEY_IMAGE`] too, so this one variable switches a test run to Valkey
/// (`scripts/valkey-tests.sh`).
pub const SERVER_ENV: &str = "REDQUORUM_TEST_SERVER";

/// The server program when [`SERVER_ENV`] is not set.
pub const DEFAULT_SERVER: &str = "redis-server";

/// Label put on every container the harness creates (value: the node's index).
pub const CONTAINER_LABEL: &str = "org.redquorum.testkit.node";

/// Image from env `REDQUORUM_REDIS_IMAGE`, else [`VALKEY_IMAGE`] when the server is Valkey
/// ([`server_is_valkey`]), else [`DEFAULT_IMAGE`] ("name:tag").
pub fn image_name() -> String {
    match std::env::var(IMAGE_ENV) {
        Ok(name) if !name.trim().is_empty() => name.trim().to_string(),
        _ if server_is_valkey() => VALKEY_IMAGE.to_string(),
        _ => DEFAULT_IMAGE.to_string(),
    }
}

/// The server program local nodes run: env [`SERVER_ENV`], else [`DEFAULT_SERVER`].
pub fn server_program() -> String {
    match std::env::var(SERVER_ENV) {
        Ok(program) if !program.trim().is_empty() => program.trim().to_string(),
        _ => DEFAULT_SERVER.to_string(),
    }
}

/// Whether this run is against Valkey: [`server_program`]'s file name contains `valkey`.
pub fn server_is_valkey() -> bool {
    is_valkey_program(&server_program())
}

fn is_valkey_program(program: &str) -> bool {
    std::path::Path::new(program)
        .file_name()
        .is_some_and(|name| name.to_string_lossy().contains("valkey"))
}

/// Splits "name:tag" at the last ':' ("latest" when there is no tag; a ':' that belongs
/// to a registry port, as in "host:5000/redis", is not a tag separator).
pub fn split_image_name(image: &str) -> (String, String) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') && !name.is_empty() => {
            (name.to_string(), tag.to_string())
        }
        _ => (image.to_string(), "latest".to_string()),
    }
}

/// The flags that make a node safe for redquorum, whatever runs it (a [`TestNode`] container
/// or a [`LocalNodes`] process): every write in the append-only file and fsynced before the
/// reply, no eviction under memory pressure, no RDB snapshots.
pub const SAFE_ARGS: &[&str] = &SAFE;

const SAFE: [&str; 8] = [
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--maxmemory-policy",
    "noeviction",
    "--save",
    "",
];

/// Where a container node keeps its data and listens (inside its container).
const CONTAINER: [&str; 8] = [
    "--dir",
    "/data",
    "--protected-mode",
    "no",
    "--bind",
    "0.0.0.0",
    "--port",
    "6379",
];

/// The arguments every container node starts with, before [`NodeSpec::extra_args`]:
/// [`SAFE_ARGS`], then its data directory and listening address.
pub const BASE_ARGS: &[&str] = &concat::<8, 8, 16>(SAFE, CONTAINER);

/// `a` then `b` (`C` must be `A + B`, checked at compile time).
const fn concat<const A: usize, const B: usize, const C: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; C] {
    assert!(A + B == C, "concat: C must be A + B");
    let mut out = [""; C];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < C {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

/// Args for one node; every node ALWAYS starts with [`BASE_ARGS`]:
/// `--appendonly yes --appendfsync always --maxmemory-policy noeviction --save "" --dir /data --protected-mode no --bind 0.0.0.0 --port 6379`
/// and `extra_args` are appended after them (later args override earlier ones in redis-server).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSpec {
    /// Arguments appended to [`BASE_ARGS`], e.g. `["--requirepass", "secret"]`.
    pub extra_args: Vec<String>,
}

impl NodeSpec {
    /// The safe default node: [`BASE_ARGS`] only.
    pub fn safe() -> Self {
        NodeSpec::default()
    }

    /// A node with these arguments appended to [`BASE_ARGS`].
    pub fn with_args(args: &[&str]) -> Self {
        NodeSpec {
            extra_args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// The full redis-server command line (without the program name).
    pub fn args(&self) -> Vec<String> {
        BASE_ARGS
            .iter()
            .map(|a| a.to_string())
            .chain(self.extra_args.iter().cloned())
            .collect()
    }
}

/// N independent Redis nodes, each in its own container behind its own fault proxy.
/// Dropping the cluster removes every container.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<TestNode>,
}

impl Cluster {
    /// n safe nodes, started concurrently.
    pub async fn start(n: usize) -> Cluster {
        Cluster::start_with(vec![NodeSpec::safe(); n]).await
    }

    /// One node per spec (node i gets `specs[i]`), started concurrently.
    pub async fn start_with(specs: Vec<NodeSpec>) -> Cluster {
        container::ensure_image_exists().await;
        let nodes = futures::future::join_all(
            specs
                .into_iter()
                .enumerate()
                .map(|(index, spec)| TestNode::start(index, spec)),
        )
        .await;
        Cluster { nodes }
    }

    /// URLs through each node's fault proxy: "redis://127.0.0.1:PORT" (no credentials:
    /// tests add them themselves).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TestNode::url).collect()
    }

    /// Node `i`; panics with the cluster size when out of range.
    pub fn node(&self, i: usize) -> &TestNode {
        self.nodes.get(i).unwrap_or_else(|| {
            panic!(
                "Cluster::node({i}): the cluster has only {} nodes",
                self.nodes.len()
            )
        })
    }

    /// All nodes, in index order.
    pub fn nodes(&self) -> &[TestNode] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a cluster of zero nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How many keys each node holds (DBSIZE, straight from each server), in index order.
    pub async fn key_counts(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let mut c = node.direct_connection().await;
            let n: u64 = redis::cmd("DBSIZE")
                .query_async(&mut c)
                .await
                .unwrap_or_else(|e| panic!("node {}: DBSIZE failed: {e}", node.index()));
            out.push(n);
        }
        out
    }

    /// Heals every node's proxy and sets every latency back to zero.
    pub fn heal_all(&self) {
        for node in &self.nodes {
            node.heal();
            node.set_latency(std::time::Duration::ZERO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valkey_program_is_known_by_its_file_name() {
        assert!(is_valkey_program("valkey-server"));
        assert!(is_valkey_program(
            "/opt/redquorum-valkey/usr/bin/valkey-server"
        ));
        assert!(!is_valkey_program("redis-server"));
        assert!(!is_valkey_program("/opt/valkey/bin/redis-server"));
    }

    #[test]
    fn image_names_split_at_the_last_colon() {
        assert_eq!(
            split_image_name("redquorum-redis:7.0"),
            ("redquorum-redis".into(), "7.0".into())
        );
        assert_eq!(
            split_image_name("host:5000/redis"),
            ("host:5000/redis".into(), "latest".into())
        );
        assert_eq!(
            split_image_name("host:5000/redis:7.2"),
            ("host:5000/redis".into(), "7.2".into())
        );
        assert_eq!(split_image_name("redis"), ("redis".into(), "latest".into()));
    }

    #[test]
    fn extra_args_come_after_the_safe_ones() {
        let args = NodeSpec::with_args(&["--appendfsync", "everysec"]).args();
        assert_eq!(&args[..BASE_ARGS.len()], BASE_ARGS);
        assert_eq!(&args[BASE_ARGS.len()..], ["--appendfsync", "everysec"]);
        assert_eq!(NodeSpec::safe().args(), BASE_ARGS);
    }

    #[test]
    fn container_nodes_start_with_the_shared_safe_flags() {
        assert_eq!(&BASE_ARGS[..SAFE_ARGS.len()], SAFE_ARGS);
        assert_eq!(
            &BASE_ARGS[SAFE_ARGS.len()..],
            [
                "--dir",
                "/data",
                "--protected-mode",
                "no",
                "--bind",
                "0.0.0.0",
                "--port",
                "6379"
            ]
        );
        // Each flag is a name followed by its value.
        for pair in SAFE_ARGS.chunks(2) {
            assert!(
                pair[0].starts_with("--") && !pair[1].starts_with("--"),
                "{pair:?}"
            );
        }
    }
}
