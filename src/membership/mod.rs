//! Fenced peer indexing: every instance of a group learns `(index, replicas)` and which tasks it
//! owns, with an enforced prepare/active transition when membership changes.
//!
//! - `assign`: the pure core (view versions and their tokens, sticky dense indexes, the two
//!   ownership modes, the transition barrier's decision).
//! - `register` (private): the view register on the quorum nodes (no fork: a compare-and-set on
//!   each view's base).
//! - `group`: [`Member`], beats, the leader that seals and activates views, drain hooks.

pub(crate) mod assign;
pub(crate) mod decide;
pub(crate) mod group;
pub(crate) mod register;
pub(crate) mod tables;

pub use assign::{moved_fraction, ListRef, Ownership, View, ViewState, ViewVersion};
pub use group::{Assignment, Drain, DrainHook, GroupOptions, Member};
#[cfg(feature = "test-util")]
pub use register::{ReadingForTests, ViewRegisterForTests};
