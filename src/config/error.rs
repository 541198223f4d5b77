//! [`ConfigError`]: every configuration problem, named with the setting and its value.

use std::time::Duration;

use super::NODES_ENV;

/// A configuration problem, named precisely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The node list is empty.
    #[error("no nodes configured: give at least one redis:// URL (or set {NODES_ENV})")]
    NoNodes,
    /// More nodes than [`MAX_NODES`](super::MAX_NODES).
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
