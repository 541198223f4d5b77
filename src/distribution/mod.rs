//! Work distribution: named work units of a pool assigned to members, balanced by weight and
//! sticky, with the fenced hand-over of peer indexing. A pool is a group (`crate::membership`)
//! whose views carry unit lists; it adds no second barrier, beat or view register.
//!
//! # How it works
//! 1. **Units** (`units.rs`): producers add and remove units in the pool's unit register, a hash
//!    `unit -> version * 2 + added` on every node, raised only (`units.lua`); versions come from
//!    the pool's own fencing-ID sequence (`crate::id`). A read keeps, per unit, the highest entry
//!    of a majority. Pins and drains are entries of the same register.
//! 2. **Read as a change log** (`since.rs`, `unit_log.rs`): the pool's leader asks each node for
//!    the entries raised since its last read there (`units_since.lua`), or its whole register
//!    when it holds no valid cursor there, and merges its per-node copies.
//! 3. **Plan** (`table.rs`, `plan.rs`): the leader computes the table `unit -> member ID` from
//!    the previous table, the live members with their weights (member key `<id>#<nonce>*<w>`),
//!    the units and the settings, keeping a member's units through its restart grace.
//! 4. **Write, then seal** (`lists.rs`, `pool.rs`): each member ID's units are written to a
//!    majority as write-once fields `<version>.<digest>` (a snapshot and deltas,
//!    `plist.lua`); only then does the group's leader seal the view naming them.
//! 5. **Hand over**: the group's prepare/active barrier runs with units as tasks; a member loads
//!    only its own list and owns a unit only if the view's list for its ID names it (under a
//!    prepared view, both lists).
//! 6. **Collect**: removed units stay as tombstones until a collection (`units_gc.lua`, every 10
//!    minutes by the leader) finds every node up; old list fields are collected after an
//!    activation.
//!
//! # Guarantees
//! Full lists on [`PoolMember`] and [`Units`]: no unit has two owners at any instant (the
//! barrier of [`Member`](crate::Member)); every assignment carries the table's version as a
//! fencing token; every member's load is within one unit of its weighted share, and a change
//! moves only what the balance needs; a unit added (or removed) by a call that returned before a
//! `list` began is listed (or not) by it, on any client, with any minority of nodes down, wiped or
//! partitioned. Not guaranteed: progress without a majority; units are worked by nobody while
//! their owner is away within its grace, or when no member with a weight is present; a failed
//! change may have changed some units; tombstones stay until every node is up for a collection.
//!
//! # Invariants
//! - Architecture invariant: a pool is a group whose views carry unit lists; a view names every
//!   list by a write-once field whose name is its payload's digest, written to a majority before
//!   the view is sealed; a list that does not resolve to the view's size and digest is owned by
//!   nobody.
//! - Architecture invariant: a removed unit's entry is deleted only after every node holds it
//!   alike and every node's collection floor is above it; `units.lua` refuses entries below the
//!   floor, so no delayed write can bring a collected unit back.
//! - Architecture invariant: a pool leader trusts a node's change log only under the epoch that
//!   node handed it together with its whole register (bound to the node's marker and last repair,
//!   `rq:marked`, lasting only while every write since logged); every reply is folded into a
//!   per-field maximum.
//! - The table is a pure, deterministic function of its inputs (`distribution_table`).
//!
//! # What it relies on outside this folder
//! - `crate::membership` (a pool member is a group [`Member`](crate::Member) with `Tables`, under
//!   `GroupKinds::POOL`) and `crate::id` (the pool's version sequence).
//! - Keys (`src/keys.rs`): `KeyKind::Units`, `KeyKind::UnitVersion`, `KeyKind::UnitFloor`,
//!   `KeyKind::UnitStamp`, `KeyKind::UnitLog`, `KeyKind::UnitEpoch`, `KeyKind::PoolList`
//!   (`pool_list_key`), and the pool's group kinds `KeyKind::PoolMembers`, `KeyKind::PoolView`,
//!   `KeyKind::PoolAck`, `KeyKind::PoolLock`, `KeyKind::PoolFence`; `KeyKind::Marked` for the
//!   change log's epoch.
//! - Scripts: `src/scripts/units.lua`, `src/scripts/units_since.lua`, `src/scripts/units_gc.lua`,
//!   `src/scripts/plist.lua`, `src/scripts/id_propose.lua` (versions), and membership's scripts.
//! - Repair rule (`src/repair/plan.rs`): unit entries raised (a removal below the collection
//!   floor is not written); `uver` and `ufloor` raised; list fields written where missing; the
//!   change log (`ustamp`, `ulog`, `uepoch`) never copied; the pool's group keys as membership's.
//! - ACL (`src/acl.rs`): `Feature::Distribution`.
//! - Model: the unit lists are not modelled; the barrier they ride on is `model/src/views.rs`.
//! - Tests: `tests/distribution.rs` (no unit with two owners, balance and movement, under faults,
//!   with teeth), `tests/units.rs`, `tests/flushall.rs` (a unit collected while a repairer was
//!   paused), `cli/tests/dist_processes.rs` (members as separate processes);
//!   `benches/distribution.rs`.
//!
//! # Files
//! - `table.rs`: the assignment table, pure and deterministic.
//! - `plan.rs`: the pool leader's plan (which process works each member ID's list, the restart
//!   grace), pure.
//! - `lists.rs`: unit lists as write-once snapshot and delta fields, pure.
//! - `unit_log.rs`: the leader's copies of every node's unit register, pure.
//! - `since.rs`: the `units_since.lua` step and the decode of its reply.
//! - `pool.rs`: the pool's side of its group (the leader's planner, writes, collection, a
//!   member's load of its own lists).
//! - `member.rs`: [`PoolMember`], [`PoolOptions`], [`pool_table`].
//! - `units.rs`: [`Units`] (add, remove, list, collect) and [`PoolSettings`] (pins, drains).

mod lists;
mod member;
mod plan;
mod pool;
mod since;
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
