//! [`Assignment`]: what a member may do under the view it adopted, and what it gives the
//! member ignoring time (pure: built by `decide::assignment`, published by the member's loop).
//! The checks that also read the clocks (`Assignment::owns`, `Assignment::owns_unit`) are in
//! `group/mod.rs`, beside the member that publishes it.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::assign::{Ownership, View, ViewState, ViewVersion};
use crate::clock::Stamp;
use crate::fencing::FencingToken;

/// What a member may do: its place in the active view.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Assignment {
    /// This member's dense index, `0..replicas`.
    pub index: u32,
    /// Members in the view.
    pub replicas: u32,
    /// The view's version.
    pub version: ViewVersion,
    /// The version as a fencing token: pass it with every write of a task's effects.
    pub token: FencingToken,
    /// [`ViewState::Active`]: owns what the view gives it. [`ViewState::Prepare`]: a
    /// transition is draining; owns only the tasks the last active view and the new one both
    /// give it.
    pub state: ViewState,
    /// End of ownership on both clocks, unless the membership lease is refreshed (see
    /// `Assignment::valid_until`, which reads it).
    pub(super) until: Stamp,
    pub(super) view: Arc<View>,
    /// For a prepared view: the last active view (a task must be ours under both).
    pub(super) previous: Option<Arc<View>>,
    pub(super) member: Arc<str>,
    pub(super) ownership: Ownership,
    /// Work distribution: the units owned under this assignment (under a prepared view, those
    /// both the last active list and the new one give this member). `None` in a plain group.
    pub(super) units: Option<Arc<BTreeSet<String>>>,
}

impl Assignment {
    /// Whether this assignment gives task `task_id` to this member (ignoring time): under an
    /// active view, when the view says so; under a prepared one, only when both it and the last
    /// active view say so (tasks whose owner changes are held by nobody until activation).
    pub fn covers(&self, task_id: u64) -> bool {
        let key = task_id.to_le_bytes();
        let mine = |v: &View| v.owner(&key, task_id, self.ownership) == Some(&*self.member);
        match self.state {
            ViewState::Active => mine(&self.view),
            ViewState::Prepare => mine(&self.view) && self.previous.as_deref().is_some_and(mine),
        }
    }

    /// Work distribution: the units this assignment gives this member (ignoring time; under a
    /// prepared view only those both the last active table and the new one give it). `None`
    /// for a member of a plain group.
    pub fn units(&self) -> Option<&BTreeSet<String>> {
        self.units.as_deref()
    }

    /// Work distribution: whether this assignment gives `unit` to this member (ignoring time).
    pub fn covers_unit(&self, unit: &str) -> bool {
        self.units.as_ref().is_some_and(|u| u.contains(unit))
    }
}
