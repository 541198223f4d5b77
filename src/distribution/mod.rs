//! Work distribution (issue 12, in progress): named work units of a pool assigned to members,
//! balanced by weight and sticky, with the fenced hand-over of peer indexing.
//!
//! - `table.rs`: the assignment table as a pure, deterministic function (this part is built);
//!   the units on the nodes, the members, the leader that seals tables and the CLI come next.

pub(crate) mod table;
