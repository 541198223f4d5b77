//! Views, indexes, ownership and the transition decision: pure functions, no I/O, no clock.
//!
//! A view is `{version, state, members -> index}` with dense indexes `0..replicas`. It is
//! sealed by the group's leader, so its version is `(leader term, seq)`: a deposed leader's late
//! view always has a lower version than any view of a later term. A new view starts in
//! [`ViewState::Prepare`]; it becomes [`ViewState::Active`] only when every member of the
//! previous view acknowledged (drained the tasks it loses) or its membership lease expired
//! ([`transition_ready`]). Nobody takes tasks under a view that is not active.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fencing::FencingToken;

/// Bits of a view token given to the sequence number within a term.
const SEQ_BITS: u32 = 20;

/// A view's version: the sealing leader's term, then a sequence number within that term.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct ViewVersion {
    /// The sealing leader's term (its lease's fencing token).
    pub term: u64,
    /// Views sealed by that leader, counted from 1.
    pub seq: u64,
}

impl ViewVersion {
    /// The version as one fencing token, ordered exactly like versions:
    /// `term * 2^20 + seq`. `None` if it does not fit below 2^53 (term >= 2^33 or
    /// seq >= 2^20), which a caller must treat as "seal no more views".
    pub fn token(self) -> Option<FencingToken> {
        if self.seq >= (1 << SEQ_BITS) || self.term >= (1 << (53 - SEQ_BITS)) {
            return None;
        }
        Some(FencingToken::new((self.term << SEQ_BITS) | self.seq))
    }
}

/// A token (a view's, an acknowledgement's) as Redis stores it: digits only, below 2^53.
pub(crate) fn parse_int(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|v| *v < crate::VALUE_LIMIT)
}

/// Whether tasks may be taken under a view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ViewState {
    /// Sealed; old members are draining. A member keeps only the tasks it owns under both the
    /// last active view and this one; nobody takes a task whose owner changes.
    Prepare,
    /// Every old member drained (or its lease expired): tasks are taken under this view.
    Active,
}

/// How tasks map to members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The seed's rule: task `t` belongs to index `t % replicas`. Moves about n/(n+1) of the
    /// tasks on every change.
    Modulo,
    /// `hash(task) % buckets`, each bucket assigned to a member by rendezvous hashing. Moves
    /// about 1/n of the tasks on a change.
    Buckets {
        /// Number of buckets (at least 1).
        count: u32,
    },
}

/// One agreed view of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// Its version.
    pub version: ViewVersion,
    /// Prepare or active.
    pub state: ViewState,
    /// Member ID -> dense index in `0..replicas`.
    pub members: BTreeMap<String, u32>,
    /// The members of the last active view: each must acknowledge (drain) or lose its lease
    /// before this view may become active.
    #[serde(default)]
    pub draining: BTreeSet<String>,
    /// The last active view's members and indexes (what `draining` worked under). While this
    /// view is prepared, a member keeps exactly the tasks it owns under both.
    #[serde(default)]
    pub previous: BTreeMap<String, u32>,
    /// The version this view was derived from (sealed as a compare-and-set on it: a node
    /// takes the view only while it holds this version or an older one).
    #[serde(default)]
    pub base: ViewVersion,
    /// Work distribution only (empty for peer indexing): per member ID, the unit list this
    /// view gives it and the process (member key) that works it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lists: BTreeMap<String, ListRef>,
    /// Work distribution only: the last active view's `lists` (what `draining` worked under).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub previous_lists: BTreeMap<String, ListRef>,
}

/// Work distribution: a reference from a view to one member ID's unit list, stored on the
/// nodes as immutable fields (a snapshot and the deltas on it), each named
/// `<version>.<digest>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRef {
    /// The member key (`<id>#<nonce>`) that works the list; `None` while the ID is away within
    /// its restart grace (nobody works its units).
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The field holding the list's newest snapshot or delta.
    #[serde(rename = "f")]
    pub field: String,
    /// How many units the list holds.
    #[serde(rename = "n")]
    pub count: u64,
    /// A digest of the whole list (16 hex digits), checked by every reader.
    #[serde(rename = "d")]
    pub digest: String,
    /// Units written in the deltas since the snapshot (a new snapshot is written when this
    /// would exceed the list's size).
    #[serde(rename = "c", default)]
    pub chain: u64,
    /// The member's weight (kept while the ID is away within its grace).
    #[serde(rename = "w", default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn is_one(w: &u32) -> bool {
    *w == 1
}

impl View {
    /// The empty view every group starts from.
    pub fn empty() -> View {
        View {
            version: ViewVersion::default(),
            state: ViewState::Active,
            members: BTreeMap::new(),
            draining: BTreeSet::new(),
            previous: BTreeMap::new(),
            base: ViewVersion::default(),
            lists: BTreeMap::new(),
            previous_lists: BTreeMap::new(),
        }
    }

    /// The last active view this prepared view replaces (empty for an active view).
    pub fn previous_view(&self) -> View {
        View {
            version: ViewVersion::default(),
            state: ViewState::Active,
            members: self.previous.clone(),
            draining: BTreeSet::new(),
            previous: BTreeMap::new(),
            base: ViewVersion::default(),
            lists: self.previous_lists.clone(),
            previous_lists: BTreeMap::new(),
        }
    }

    /// The same view carrying these unit lists (work distribution).
    pub(crate) fn with_lists(mut self, lists: BTreeMap<String, ListRef>) -> View {
        self.lists = lists;
        self
    }

    /// The list this view gives the member with key `key`, if it works one.
    pub(crate) fn list_of(&self, key: &str) -> Option<(&str, &ListRef)> {
        let id = member_id(key);
        self.lists
            .get_key_value(id)
            .filter(|(_, l)| l.key.as_deref() == Some(key))
            .map(|(id, l)| (id.as_str(), l))
    }

    /// Number of members.
    pub fn replicas(&self) -> u32 {
        self.members.len() as u32
    }

    /// A member's index.
    pub fn index_of(&self, member: &str) -> Option<u32> {
        self.members.get(member).copied()
    }

    /// The next view for `members`, sealed in `term`: sticky dense indexes, state prepare.
    pub fn next(&self, members: &BTreeSet<String>, term: u64) -> View {
        let seq = if term == self.version.term {
            self.version.seq + 1
        } else {
            1
        };
        // Whoever took tasks last is whoever was in the last ACTIVE view: a prepared view that
        // never became active handed out nothing.
        let (previous, previous_lists) = match self.state {
            ViewState::Active => (self.members.clone(), self.lists.clone()),
            ViewState::Prepare => (self.previous.clone(), self.previous_lists.clone()),
        };
        View {
            version: ViewVersion { term, seq },
            state: ViewState::Prepare,
            members: sticky_indexes(&self.members, members),
            draining: previous.keys().cloned().collect(),
            previous,
            base: self.version,
            lists: self.lists.clone(),
            previous_lists,
        }
    }

    /// This view with a sequence number above every one its sealer already tried in this
    /// term (`attempted`): a seal that reached only some nodes is never reused for other
    /// content, so one version always names one view.
    pub fn above_attempts(mut self, attempted: Option<ViewVersion>) -> View {
        if let Some(a) = attempted.filter(|a| a.term == self.version.term) {
            self.version.seq = self.version.seq.max(a.seq.saturating_add(1));
        }
        self
    }

    /// A digest of the view's content (16 hex digits), stored beside it: an equal version
    /// with another digest is a conflict, never "already held".
    pub fn digest(json: &str) -> String {
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()))
    }

    /// The digest of this view's stored form (see [`View::digest`]).
    pub fn content_digest(&self) -> String {
        View::digest(&serde_json::to_string(self).unwrap_or_default())
    }

    /// The same view, activated under a new version sealed in `term`.
    pub fn activated(&self, term: u64) -> View {
        let seq = if term == self.version.term {
            self.version.seq + 1
        } else {
            1
        };
        View {
            version: ViewVersion { term, seq },
            state: ViewState::Active,
            members: self.members.clone(),
            draining: BTreeSet::new(),
            previous: BTreeMap::new(),
            base: self.version,
            lists: self.lists.clone(),
            previous_lists: BTreeMap::new(),
        }
    }

    /// The member that owns `task` under `mode`, if the view has members.
    pub fn owner(&self, task: &[u8], task_id: u64, mode: Ownership) -> Option<&str> {
        match mode {
            Ownership::Modulo => {
                let replicas = self.replicas();
                if replicas == 0 {
                    return None;
                }
                let index = (task_id % u64::from(replicas)) as u32;
                self.members
                    .iter()
                    .find(|(_, i)| **i == index)
                    .map(|(m, _)| m.as_str())
            }
            Ownership::Buckets { count } => bucket_owner(
                bucket_of(task, count),
                self.members.keys().map(String::as_str),
            ),
        }
    }
}

/// The member ID of a member key `<id>#<nonce>` (a key without `#` is its own ID).
pub(crate) fn member_id(key: &str) -> &str {
    key.rsplit_once('#').map_or(key, |(id, _)| id)
}

/// Dense, sticky indexes: a member keeps its previous index while that index is below the new
/// member count and not taken; the remaining members fill the free indexes in ID order.
/// Deterministic: the same inputs give the same output on every instance.
pub(crate) fn sticky_indexes(
    previous: &BTreeMap<String, u32>,
    members: &BTreeSet<String>,
) -> BTreeMap<String, u32> {
    let n = members.len() as u32;
    let mut out = BTreeMap::new();
    let mut taken = BTreeSet::new();
    for m in members {
        if let Some(&i) = previous.get(m) {
            if i < n && taken.insert(i) {
                out.insert(m.clone(), i);
            }
        }
    }
    let mut free = (0..n).filter(|i| !taken.contains(i));
    for m in members {
        if !out.contains_key(m) {
            if let Some(i) = free.next() {
                out.insert(m.clone(), i);
            }
        }
    }
    out
}

/// The bucket of a task: a stable 64-bit hash (xxh3) modulo `count` (at least 1).
pub(crate) fn bucket_of(task: &[u8], count: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(task) % u64::from(count.max(1))) as u32
}

/// Rendezvous (highest random weight) hashing: the member with the largest
/// `hash(member, bucket)` owns the bucket. Removing a member moves only its buckets; adding
/// one moves about 1/n of them to it.
pub(crate) fn bucket_owner<'a>(
    bucket: u32,
    members: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    members.max_by_key(|m| {
        let mut buf = Vec::with_capacity(m.len() + 4);
        buf.extend_from_slice(&bucket.to_le_bytes());
        buf.extend_from_slice(m.as_bytes());
        (xxhash_rust::xxh3::xxh3_64(&buf), *m)
    })
}

/// The transition barrier: a prepared view may become active once every member of the last
/// active view (`prepared.draining`) has acknowledged it (drained what it loses) or lost its
/// membership lease.
pub(crate) fn transition_ready(
    prepared: &View,
    acknowledged: &BTreeSet<String>,
    lease_expired: &BTreeSet<String>,
) -> bool {
    prepared
        .draining
        .iter()
        .all(|m| acknowledged.contains(m) || lease_expired.contains(m))
}

/// The fraction of `tasks` whose owner differs between two views under `mode`.
pub fn moved_fraction(before: &View, after: &View, tasks: u64, mode: Ownership) -> f64 {
    if tasks == 0 {
        return 0.0;
    }
    let moved = (0..tasks)
        .filter(|t| {
            let key = t.to_le_bytes();
            before.owner(&key, *t, mode) != after.owner(&key, *t, mode)
        })
        .count();
    moved as f64 / tasks as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn view(ids: &[&str]) -> View {
        View::empty().next(&set(ids), 1)
    }

    #[test]
    fn indexes_are_dense_and_sticky() {
        let v1 = view(&["a", "b", "c", "d"]);
        assert_eq!(
            v1.members.values().copied().collect::<BTreeSet<_>>(),
            (0..4).collect()
        );
        // c leaves: a, b keep theirs; d's index 3 is out of range and takes the free one (2).
        let v2 = v1.next(&set(&["a", "b", "d"]), 1);
        assert_eq!(v2.index_of("a"), v1.index_of("a"));
        assert_eq!(v2.index_of("b"), v1.index_of("b"));
        assert_eq!(
            v2.members.values().copied().collect::<BTreeSet<_>>(),
            (0..3).collect()
        );
        // e joins: everyone keeps theirs, e gets index 3.
        let v3 = v2.next(&set(&["a", "b", "d", "e"]), 1);
        for m in ["a", "b", "d"] {
            assert_eq!(
                v3.index_of(m),
                v2.index_of(m),
                "{m} must keep its index when someone joins"
            );
        }
        assert_eq!(v3.index_of("e"), Some(3));
    }

    #[test]
    fn a_later_term_always_wins_and_tokens_order_like_versions() {
        let v = view(&["a"]);
        let same_term = v.next(&set(&["a", "b"]), 1);
        let new_term = v.next(&set(&["a", "b"]), 2);
        assert!(same_term.version > v.version && new_term.version > same_term.version);
        assert!(new_term.version.token() > same_term.version.token());
        let deposed_late = ViewVersion { term: 1, seq: 999 };
        assert!(
            deposed_late < new_term.version,
            "a deposed leader's late view loses"
        );
        assert!(deposed_late.token() < new_term.version.token());
        assert_eq!(
            ViewVersion {
                term: 1 << 33,
                seq: 1
            }
            .token(),
            None,
            "out of range is refused, not wrapped"
        );
    }

    #[test]
    fn modulo_moves_almost_everything_buckets_move_about_one_nth() {
        let before = view(&["a", "b", "c", "d", "e", "f", "g", "h"]);
        let after = before.next(&set(&["a", "b", "c", "d", "e", "f", "g", "h", "i"]), 1);
        let modulo = moved_fraction(&before, &after, 20_000, Ownership::Modulo);
        let buckets = moved_fraction(&before, &after, 20_000, Ownership::Buckets { count: 1024 });
        assert!(modulo > 0.7, "modulo moves most tasks on a join: {modulo}");
        assert!(
            (0.07..0.16).contains(&buckets),
            "rendezvous buckets move about 1/9: {buckets}"
        );
    }

    #[test]
    fn every_task_has_exactly_one_owner_in_a_view() {
        let v = view(&["a", "b", "c"]);
        for t in 0..1000u64 {
            for mode in [Ownership::Modulo, Ownership::Buckets { count: 64 }] {
                assert!(
                    v.owner(&t.to_le_bytes(), t, mode).is_some(),
                    "task {t} has no owner under {mode:?}"
                );
            }
        }
        assert_eq!(View::empty().owner(b"x", 1, Ownership::Modulo), None);
    }

    #[test]
    fn the_barrier_waits_for_every_member_of_the_last_active_view() {
        let active = view(&["a", "b", "c"]).activated(1);
        let prepared = active.next(&set(&["a", "b"]), 1);
        assert_eq!(prepared.draining, set(&["a", "b", "c"]));
        assert!(!transition_ready(&prepared, &set(&["a", "b"]), &set(&[])));
        assert!(
            transition_ready(&prepared, &set(&["a", "b"]), &set(&["c"])),
            "an expired lease counts"
        );
        assert!(transition_ready(
            &prepared,
            &set(&["a", "b", "c"]),
            &set(&[])
        ));
        // A second change before activation still waits for the last ACTIVE view's members.
        let again = prepared.next(&set(&["a"]), 1);
        assert_eq!(again.draining, set(&["a", "b", "c"]));
        assert!(
            transition_ready(&view(&["a"]), &set(&[]), &set(&[])),
            "nothing to drain at first"
        );
    }
}
