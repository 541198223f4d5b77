//! The Lua scripts, each in its own file under `src/scripts/` with a header documenting
//! KEYS, ARGV (with units) and return values.
//!
//! Every script starts with `scripts/prelude.lua` (strict integer parsing, corrupted registers
//! raised as errors).
//!
//! Scripts are sent with EVALSHA and reloaded on NOSCRIPT by redis-rs (safe: NOSCRIPT means
//! nothing ran). User-supplied names reach them only as KEYS.

use std::sync::LazyLock;

/// The ID generator's node step: set-if-less-than for a block, guarded by the node marker.
pub(crate) static ID_PROPOSE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/id_propose.lua")
    ))
});

/// Repair: raise monotonic registers to at least the given values.
pub(crate) static RAISE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/raise.lua")
    ))
});

/// Work distribution: write-once unit-list fields, and their collection.
pub(crate) static PLIST: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/plist.lua")
    ))
});

/// Largest value any ID or token may take, exclusive: Lua compares doubles, exact below 2^53.
pub const VALUE_LIMIT: u64 = 1 << 53;

/// Lease acquisition with the fencing token minted in the same step.
pub(crate) static LOCK_ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/lock_acquire.lua")
    ))
});

/// Lease extension (compare-and-pexpire).
pub(crate) static LOCK_EXTEND: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/lock_extend.lua")
    ))
});

/// Lease release (compare-and-delete, notifies waiters).
pub(crate) static LOCK_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/lock_release.lua")
    ))
});

/// Resource-side fencing guard for a Redis resource (run by `fencing::fenced_set`).
pub(crate) static FENCED_SET: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/fenced_set.lua")
    ))
});

/// The text of the resource-side fencing guard, for users who load it themselves.
pub const FENCED_SET_LUA: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/fenced_set.lua")
);

/// Membership beat / leave.
pub(crate) static MEMBER_BEAT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/member_beat.lua")
    ))
});

/// The view register's conditional write.
pub(crate) static VIEW_WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/view_write.lua")
    ))
});

/// Repair: restore lease keys and hash entries a quarantined node lost.
pub(crate) static RESTORE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/restore.lua")
    ))
});

/// `cluster init` on a set-up cluster: raise a marked node's descriptor, compare-and-set.
pub(crate) static CLUSTER_INIT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/cluster_init.lua")
    ))
});

/// Raise one integer field of a hash (completion records, acknowledgements), marker-guarded.
pub(crate) static RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/record.lua")
    ))
});

/// A change of the node list: seal an old node's marker.
pub(crate) static SEAL: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/seal.lua")
    ))
});

/// Repair: one repairer at a time per node.
pub(crate) static CLAIM: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/claim.lua")
    ))
});

/// Garbage collection of acknowledgements and completion records.
pub(crate) static PRUNE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/prune.lua")
    ))
});

/// A pool's unit register: raise entries, marker-guarded.
pub(crate) static UNITS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/units.lua")
    ))
});

/// A pool leader's read of a node's unit register: the fields raised since its last read.
pub(crate) static UNITS_SINCE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/units_since.lua")
    ))
});

/// A pool's unit register: collect removals (raise the floor, then delete).
pub(crate) static UNITS_GC: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/units_gc.lua")
    ))
});

/// The last step of a repair: descriptor and marker, while the repairer's claim holds.
pub(crate) static MARK: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/mark.lua")
    ))
});
