//! The hook by which work distribution rides on a group: views that carry unit lists.
//!
//! A group `Member` with a [`Tables`] is a pool member: its leader asks the
//! tables for the lists the next view must carry (and writes their fields to a majority before
//! the view naming them is sealed), and every member loads the units its view gives it. The
//! group's barrier, beats, acknowledgements and drain hooks are unchanged: a unit is a task,
//! and a member owns under a prepared view only what the last active view and the new one both
//! give it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::assign::{ListRef, View};
use crate::error::Error;

/// One field of a member ID's list hash, to be written once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListWrite {
    /// The list hash (`rq:plist:...`).
    pub(crate) key: String,
    /// `<version>.<digest>`.
    pub(crate) field: String,
    /// The snapshot or delta.
    pub(crate) payload: String,
}

/// What a leader's planner proposes: the lists of the next view, and the fields to write
/// before it is sealed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) lists: BTreeMap<String, ListRef>,
    pub(crate) writes: Vec<ListWrite>,
}

/// The units a member key works under a view: under the view itself, and (for a prepared
/// view) under the last active view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) current: Arc<BTreeSet<String>>,
    pub(crate) previous: Arc<BTreeSet<String>>,
}

/// Work distribution's side of a group (implemented in `distribution/`).
pub(crate) trait Tables: Send + Sync {
    /// Leader: the lists the next view must carry for these live member keys, or `None` when
    /// the view's lists stand.
    fn plan<'a>(
        &'a self,
        view: &'a View,
        live: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Result<Option<Planned>, Error>>;

    /// Leader: write a plan's fields to a majority (before the view naming them is sealed).
    fn write<'a>(&'a self, planned: &'a Planned) -> BoxFuture<'a, Result<(), Error>>;

    /// Member: the units the member key `key` works under `view` (an error: it owns nothing).
    fn load<'a>(&'a self, view: &'a View, key: &'a str) -> BoxFuture<'a, Result<Held, Error>>;

    /// Leader: an active view was sealed (collect the fields no later view can need).
    fn activated(self: Arc<Self>, view: &View);
}
