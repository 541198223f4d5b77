//! Work distribution (issue 12, in progress): named work units of a pool assigned to members,
//! balanced by weight and sticky, with the fenced hand-over of peer indexing.
//!
//! - `table.rs`: the assignment table as a pure, deterministic function;
//! - `units.rs`: [`Units`], the units of a pool on the quorum nodes (add, remove, list).
//!
//! The members, the leader that seals tables, the hand-over and the CLI come next.

pub(crate) mod table;
mod units;

pub use table::{distribution_table, MemberWeight, TableInputs, UnitTable};
pub use units::Units;
