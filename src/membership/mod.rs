//! Fenced peer indexing: every instance of a group learns `(index, replicas)` and which tasks it
//! owns, with an enforced prepare/active transition when membership changes, and no node clock
//! in any decision.
//!
//! # How it works
//! 1. **Join and beat** (`group/beats.rs`): each process joins with a member key
//!    `<id>#<nonce>` and, on a timer of its own, raises its beat (a growing sequence number) in
//!    the group's beats hash on every node (`member_beat.lua`, no expiry). Its membership lease
//!    is valid from the send of its last beat a majority applied, for 1.25 intervals minus
//!    drift, on its monotonic clock.
//! 2. **Lead** (`group/leader.rs`, `group/campaign.rs`): members campaign for the group's
//!    leader lease (an [`Election`](crate::Election) under the group's own key kinds): their
//!    view reads carry the lease and feed the lock's watch, and a member
//!    tries an acquisition round only when that watch says the lease is free or was left
//!    unchanged for its TTL plus drift. The leader judges a member gone only after its beat
//!    stayed unchanged on a majority, on one node incarnation, for the lease time plus drift on
//!    its own clock (`crate::lease`), from readings taken after the view it judges was on a
//!    majority. It reads the view and the beats twice an interval, and at once when a silent
//!    member could be judged gone.
//! 3. **Seal** (`register.rs`): the leader seals the next view `{version = (term, seq), members
//!    -> dense sticky index, state, base}` as a compare-and-set on the version it was derived
//!    from (`view_write.lua`), never reusing a version; it then publishes a hint
//!    (`group/hints.rs`) that wakes the members.
//! 4. **Adopt**: a reader takes the highest version a majority returned and writes it back (the
//!    same compare-and-set) before adopting it, unless a majority answered with it already. A
//!    member reads once per beat (and at once on a hint); the first two members of the view by
//!    index, its deputies, twice an interval, with the beats, so that one of them takes a
//!    crashed leader's lease over first and judges the old leader from a warm watch
//!    (`decide::Role`).
//! 5. **Transition**: a new view starts `prepare`: members of the last active view narrow to the
//!    tasks both views give them, run the drain hook for the rest, and acknowledge
//!    (`record.lua`); the leader activates the view once every one of them acknowledged or is
//!    gone (`assign::transition_ready`).
//! 6. A member's [`Assignment`] comes from the view it adopted (`decide.rs`), carries the view
//!    token (`term * 2^20 + seq`) as a fencing token, and lasts only while its lease is valid.
//!
//! # Guarantees
//! Under the crate's assumptions (details on [`Member`]): (I1) no task has two owners at any
//! instant, and a stale owner's writes are refused by the view token; (I2) once membership is
//! stable, every task has exactly one owner; (I3) a join, leave or crash is active within two
//! intervals. Views cannot fork: one version names one view, of the views derived from one base
//! at most one is ever adopted, a deposed leader's late view loses, and no two instances adopt
//! views in opposite orders (the argument is in `register.rs`; why the barrier holds without
//! node clocks is on [`Member`]). Not guaranteed: progress without a majority; a member that
//! ignores its drain hook and keeps using an old [`Assignment`] until its `valid_until` can
//! overlap with the next owner (use `Member::owns` or `changes()`, the drain hook, and the token).
//!
//! # Invariants
//! - Architecture invariant: a member owns a task only if the view it adopted gives it the task
//!   (a prepared view only when the last active view gives it too) and only while its own
//!   membership lease is valid on its monotonic clock, with a validity taken from a beat whose
//!   reply arrived before the view read; a view is activated only after every member of the last
//!   active view acknowledged it or was judged gone, from readings taken after the view was
//!   sealed. A leader's memory that a member was gone ("buried") keeps only members no view names
//!   out of the next view; it never stands in for that judgement.
//! - Architecture invariant: a view is adopted only after a majority holds it, and every write of
//!   a view (seal, write-back, repair) is the compare-and-set on its base (`view_write.lua`).
//! - A beat never goes back to a value a leader already saw (repair restores beats at their
//!   highest sequence), and a marker never repeats on a node, so a leader's watch restarts after
//!   any data loss.
//!
//! # What it relies on outside this folder
//! - `crate::election` and `crate::lock` for the group's leader lease; `crate::lease` for the
//!   validity and the beat watch; `crate::jobs` for the acknowledgements' steps (`record.lua`,
//!   `prune.lua`).
//! - Keys (`src/keys.rs`): `KeyKind::Members` (beats), `KeyKind::View` (the view register: token,
//!   view, hash), `KeyKind::Ack` (acknowledgements), `KeyKind::GroupLock` and
//!   `KeyKind::GroupFence` (the leader lease); a pool uses the `Pool*` kinds instead
//!   (`GroupKinds::POOL`).
//! - Scripts: `src/scripts/member_beat.lua`, `src/scripts/view_write.lua`,
//!   `src/scripts/record.lua`, `src/scripts/prune.lua`, and the lock's scripts for the leader.
//! - Repair rule (`src/repair/plan.rs`): beats raised to their highest sequence (`left` above
//!   all); the newest view written by its own compare-and-set (a newest view with a sibling stops
//!   the copy until the next seal); acknowledgements raised field by field; the leader lease as a
//!   lock's.
//! - ACL (`src/acl.rs`): `Feature::Indexing` (the lock's commands plus `HDEL`, `HGETALL`; hints
//!   by `PUBLISH` and `SUBSCRIBE`).
//! - Model: `model/src/views.rs` (`rq-model views`: the view register and the prepare/active
//!   barrier), checked in `model/tests/views.rs`; `model/tests/conformance_views.rs` compares it
//!   with `view_write.lua` and `record.lua`.
//! - Tests: `tests/membership.rs` (I1, I2, I3 under faults; without the barrier a double owner),
//!   `tests/views.rs` (no fork, with teeth), `tests/gc.rs` (acknowledgements collected),
//!   `tests/metrics.rs`; `benches/membership.rs`.
//!
//! # Files
//! - `assign.rs`: the pure core: view versions and tokens, sticky dense indexes, the two
//!   ownership modes, the transition barrier's decision, moved fractions.
//! - `assignment.rs`: [`Assignment`] (what a view gives a member, ignoring time).
//! - `decide.rs`: the pure decisions (a member's assignment, when it drains, what the leader seals
//!   next, which acknowledgements count, duplicate IDs); table-tested.
//! - `register.rs`: the view register on the nodes (decode, pick, read, adopt, seal).
//! - `tables.rs`: the hook by which work distribution rides on a group (`Tables`).
//! - `group/`: [`Member`], its options, beats, loop, leader step and hints.

pub(crate) mod assign;
mod assignment;
pub(crate) mod decide;
pub(crate) mod group;
pub(crate) mod register;
pub(crate) mod tables;

pub use assign::{moved_fraction, ListRef, Ownership, View, ViewState, ViewVersion};
pub use assignment::Assignment;
pub use group::{Drain, DrainHook, GroupOptions, Member};
#[cfg(feature = "test-util")]
pub use register::{ReadingForTests, ViewRegisterForTests};
