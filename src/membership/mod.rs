//! Fenced peer indexing (in progress): the pure decision core of membership views.
//!
//! This first increment holds only the parts with no I/O, so they can be reviewed and
//! property-tested on their own: view versions and their fencing tokens, sticky dense indexes,
//! the two ownership modes (the seed's `task_id % replicas` and rendezvous-hashed buckets), and
//! the transition barrier's decision. Membership leases, the view register on the quorum
//! nodes, the leader that seals views and the `index watch` CLI build on this (see ARCHITECTURE.md
//! and the open issue).

pub mod assign;
pub mod group;
mod register;

pub use assign::{Ownership, View, ViewState, ViewVersion};
pub use group::{Assignment, Drain, DrainHook, GroupOptions, Member};
#[doc(hidden)]
pub use register::{ReadingForTests, ViewRegisterForTests};
