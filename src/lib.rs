//! # redquorum
//!
//! Coordination across **N independent Redis nodes** with majority quorums: monotonic
//! fencing IDs, fenced leases and leader election, fenced peer indexing and work
//! distribution. This release contains:
//! - [`Client`]: the nodes, their safety checks ([`Client::check`]), repair of nodes that lost
//!   their data, and the cluster's identity (the node list stored on the nodes,
//!   [`Descriptor`], [`Client::change_cluster`]);
//! - [`IdGenerator`]: monotonic fencing IDs;
//! - [`Lock`] and [`LockGuard`]: fenced leases with auto-extension and an early loss signal;
//! - [`Election`] and [`PeriodicJob`]: leader election and once-per-period work;
//! - [`Member`]: fenced peer indexing (`(index, replicas)` and owned tasks, with a safe
//!   transition when membership changes);
//! - [`PoolMember`], [`Units`] and [`pool_table`]: work distribution (named work units
//!   assigned to members, weighted, balanced and sticky, with a fenced hand-over);
//! - [`FencingToken`], [`fenced_set`] and [`FENCED_SET_LUA`]: the resource side of fencing.
//! - metrics through the [`metrics`](https://docs.rs/metrics) facade (quorum operations, nodes,
//!   IDs, leases, leadership, views, quarantines and repairs), recorded by whatever recorder
//!   the application installs; [`describe_metrics`] registers their descriptions.
//!
//! Each type's docs state its guarantees, what is not guaranteed, errors and cancel safety;
//! every handle takes its options at construction (`*Options`, e.g. [`LockOptions`]). Services
//! in other languages use the same client through `redquorum serve`, the CLI's HTTP API.
//!
//! The `test-util` feature adds the `*_for_tests` switches that weaken a protection (so a
//! test can show that its checker catches what the protection prevents). Never enable it in
//! a production build: the default build cannot weaken a quorum.
//!
//! ## What every guarantee assumes
//! - Each node persists a write before replying: `appendonly yes`, `appendfsync always`,
//!   on a disk that does not lie about fsync. [`Client::check`] verifies what it can.
//! - Nodes never evict keys: `maxmemory-policy noeviction`.
//! - Nodes fail independently, and each is counted once (two URLs to one server are
//!   detected by `run_id` and the second is not counted, from the first fan-out).
//! - Every client of a cluster lists the cluster's nodes: checked, since the node list is
//!   stored on the nodes and a client with another node count is refused at connect.
//! - At most a minority of the configured nodes is down, slow, partitioned, restarted or
//!   wiped at any time.
//!
//! In [`SafetyMode::Strict`] (the default) a node whose configuration breaks an assumption
//! does not count toward any majority. The majority is always `n / 2 + 1` of the
//! *configured* nodes.
//!
//! ## Example
//! ```no_run
//! # async fn demo() -> Result<(), redquorum::Error> {
//! let config = redquorum::Config::from_list("redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003")?;
//! let client = redquorum::Client::connect(config).await?;
//! for report in client.check().await {
//!     println!("{} {} votes={} {}", report.node, report.url, report.votes, report.summary());
//! }
//! let tally = client.ping().await?;
//! println!("{} of {} nodes answered", tally.applied(), tally.majority().nodes());
//! # Ok(()) }
//! ```

pub mod acl;
mod client;
mod clock;
mod cluster;
mod config;
mod distribution;
mod election;
mod error;
mod fencing;
mod id;
mod jobs;
mod keys;
mod lease;
mod lock;
mod membership;
mod metrics;
mod node;
mod quorum;
mod repair;
mod safety;
mod scripts;
mod transport;

// Every public item has exactly one path: here.
pub use crate::metrics::describe_metrics;
pub use client::Client;
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub use clock::{judge_validity_on_monotonic_clock_only_for_tests, set_boot_clock_ahead_for_tests};
pub use cluster::Descriptor;
#[cfg(feature = "test-util")]
pub use config::CopyEvent;
pub use config::{
    Config, ConfigError, NodeUrl, SafetyMode, ATTEST_FSYNC_ENV, CACERT_ENV, CERT_ENV, CLUSTER_ENV,
    ENV_VARS, KEY_ENV, MAX_NODES, NODES_ENV, SNI_ENV,
};
#[cfg(feature = "test-util")]
pub use distribution::LeaderUnitsForTests;
pub use distribution::{
    distribution_table, pool_table, MemberWeight, PoolMember, PoolOptions, PoolSettings, PoolTable,
    TableInputs, UnitTable, Units, MAX_WEIGHT,
};
pub use election::{Election, LeadSummary, LeaderInfo, Leadership};
pub use error::{Error, NoQuorum, NodeProblem};
pub use fencing::{fenced_set, FencedWrite, FencingToken};
pub use id::{
    IdGenerator, IdOptions, DEFAULT_LOOKAHEAD, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_JUMP,
    MAX_IDS_PER_CALL, MAX_LOOKAHEAD,
};
pub use jobs::{JobOptions, JobOutcome, PeriodRun, PeriodStart, PeriodicJob};
pub use keys::{Name, NameError, KEY_PREFIX, MAX_NAME_BYTES};
pub use lease::MAX_DRIFT_RATE;
pub use lock::{Holder, LeaseStatus, Lock, LockGuard, LockOptions, LossReason, MAX_TTL, MIN_TTL};
pub use membership::{
    moved_fraction, Assignment, Drain, DrainHook, GroupOptions, ListRef, Member, Ownership, View,
    ViewState, ViewVersion,
};
#[cfg(feature = "test-util")]
pub use membership::{ReadingForTests, ViewRegisterForTests};
pub use quorum::{Decision, Majority, NodeId, NodeOutcome, NodeResult, Tally, UnknownCause};
pub use repair::{ClusterChange, ClusterInit};
pub use safety::{clock_skews, Finding, NodeReport, Probe, Severity};
pub use scripts::{FENCED_SET_LUA, VALUE_LIMIT};
/// The cancellation token the work closures receive and [`Election::lead`] takes for shutdown
/// (re-exported from `tokio-util`, so callers need not depend on it).
pub use tokio_util::sync::CancellationToken;

/// The README's Rust blocks, compiled as doc tests: a quickstart that stops building fails CI.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
