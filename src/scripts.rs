//! The Lua scripts, each in its own file under `src/scripts/` with a header documenting
//! KEYS, ARGV (with units) and return values.
//!
//! Scripts are sent with EVALSHA and reloaded on NOSCRIPT by redis-rs (safe: NOSCRIPT means
//! nothing ran). User-supplied names reach them only as KEYS.

use std::sync::LazyLock;

/// The ID generator's node step: set-if-less-than for a block, guarded by the node marker.
pub(crate) static ID_PROPOSE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/id_propose.lua")));

/// Repair: raise monotonic registers to at least the given values.
pub(crate) static RAISE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/raise.lua")));

/// Largest value any ID or token may take, exclusive: Lua compares doubles, exact below 2^53.
pub const VALUE_LIMIT: u64 = 1 << 53;
