//! Work distribution: named work units of a pool assigned to members, balanced by weight and
//! sticky, with the fenced hand-over of peer indexing.
//!
//! - `table.rs`: the assignment table as a pure, deterministic function;
//! - `plan.rs`: the pool leader's plan (which process works each member ID's list, the
//!   restart grace), pure;
//! - `lists.rs`: unit lists on the nodes (write-once snapshot and delta fields), pure;
//! - `pool.rs`: the pool's side of its group (the leader's planner, writes, collection, a
//!   member's load of its own lists);
//! - `member.rs`: [`PoolMember`], [`PoolOptions`], [`pool_table`];
//! - `unit_log.rs`: the pool leader's copies of every node's unit register, kept current from
//!   the nodes' change logs, pure;
//! - `units.rs`: [`Units`], the units of a pool on the quorum nodes (add, remove, list) and
//!   its [`PoolSettings`] (pins, drained members).

mod lists;
mod member;
mod plan;
mod pool;
pub(crate) mod table;
mod unit_log;
mod units;

#[cfg(feature = "test-util")]
pub use member::LeaderUnitsForTests;
pub use member::{pool_table, PoolMember, PoolOptions, PoolTable, MAX_WEIGHT};
pub use table::{distribution_table, MemberWeight, TableInputs, UnitTable};
pub use units::{PoolSettings, Units};

use crate::error::Error;

/// Run CPU-heavy work (decoding, merging, planning a large pool) on the blocking pool, so the
/// runtime's workers keep serving beats and lease extensions meanwhile.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("a blocking task failed: {e}")))?
}
