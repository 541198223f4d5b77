//! The pool leader's copy of every node's unit register, kept current from the nodes' change
//! logs (`units_since.lua`), pure: no I/O.
//!
//! Each node sends either its whole register (with the epoch id and stamp of its log) or the
//! fields changed since the stamp the leader last saw there (a collected field with an empty
//! entry). The leader keeps one mirror per node: a whole register replaces it; a delta applies
//! only when it starts exactly where the mirror stands (same node incarnation, same epoch, the
//! delta's base = the mirror's stamp), otherwise it is ignored and the node answers whole next
//! time. The units are merged, as a fresh read would, over the mirrors of the nodes that answered
//! this read (at least a majority): per field the highest entry. So a unit added or removed on a
//! majority before the read began is seen so, and a collected removal leaves the mirrors.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::units::{merge_best, PoolSettings};

/// A pool's units and its settings (one register).
pub(super) type UnitsAndSettings = (BTreeSet<String>, PoolSettings);

/// One node's register as the leader last knew it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Mirror {
    /// The node incarnation (its marker) the mirror is of.
    marker: Arc<str>,
    /// The node's log epoch and its stamp when the mirror was last brought up to date.
    epoch: String,
    stamp: u64,
    /// Field -> entry.
    fields: HashMap<String, u64>,
}

/// One node's reply to `units_since.lua`, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reply {
    /// The node's index.
    pub(super) node: usize,
    /// The marker it answered under.
    pub(super) marker: Arc<str>,
    /// Its whole register (`true`) or a delta.
    pub(super) whole: bool,
    /// The log's epoch id.
    pub(super) epoch: String,
    /// The node's stamp now.
    pub(super) stamp: u64,
    /// A delta's base stamp.
    pub(super) since: u64,
    /// Field -> entry ("" for a field collected since).
    pub(super) pairs: Vec<(String, String)>,
}

/// The leader's mirrors of every node's register (see the module docs).
#[derive(Clone, Debug, Default)]
pub(super) struct Mirrors {
    nodes: HashMap<usize, Mirror>,
    units: Arc<UnitsAndSettings>,
    /// The nodes the current units were merged from.
    merged_from: Vec<usize>,
    /// The last fold, per reply: whether it was a whole register, how many fields it carried.
    pub(super) last: Vec<(bool, usize)>,
}

impl Mirrors {
    /// Every node's cursor: node -> (incarnation, epoch, stamp). A node answering under
    /// another marker gets no cursor (`("", 0)`: it sends its whole register).
    pub(super) fn cursors(&self) -> HashMap<usize, (Arc<str>, String, u64)> {
        self.nodes
            .iter()
            .map(|(n, m)| (*n, (m.marker.clone(), m.epoch.clone(), m.stamp)))
            .collect()
    }

    /// The cursor to send node `node` (answering under `marker`): its epoch and stamp, or
    /// `("", 0)` (send the whole register) when the leader holds no mirror of that incarnation.
    #[cfg(test)]
    fn cursor(&self, node: usize, marker: &str) -> (String, u64) {
        match self.nodes.get(&node) {
            Some(m) if &*m.marker == marker => (m.epoch.clone(), m.stamp),
            _ => (String::new(), 0),
        }
    }

    /// Whether some of the `nodes` has no copy here yet (its whole register is needed).
    pub(super) fn missing_any(&self, nodes: usize) -> bool {
        (0..nodes).any(|n| !self.nodes.contains_key(&n))
    }

    /// The units as last merged.
    pub(super) fn units(&self) -> Arc<UnitsAndSettings> {
        self.units.clone()
    }

    /// Fold one read's replies; `needed` of them must apply (a majority), else an error and
    /// the units are not changed. Returns whether the merged units changed.
    pub(super) fn fold(&mut self, replies: Vec<Reply>, needed: usize) -> Result<bool, String> {
        self.last.clear();
        let mut applied = Vec::new();
        // Whether any mirror's content may have changed (a whole register, a non-empty delta).
        let mut dirty = false;
        for r in replies {
            self.last.push((r.whole, r.pairs.len()));
            let node = r.node;
            if let Some(changed) = self.apply(r) {
                applied.push(node);
                dirty |= changed;
            }
        }
        if applied.len() < needed {
            // The copies changed but no merge followed: the next one must not take the
            // shortcut below.
            self.merged_from.clear();
            return Err(format!(
                "{} of the replies apply to the leader's copies of the registers, {needed} needed",
                applied.len()
            ));
        }
        applied.sort_unstable();
        applied.dedup();
        // No merge since the copies were (re)built: whatever comes out is news (the units
        // held before are unknown, so "the same as before" proves nothing).
        let fresh = self.merged_from.is_empty();
        if !dirty && !fresh && applied == self.merged_from {
            return Ok(false);
        }
        let units = self.merge(&applied);
        self.merged_from = applied;
        if !fresh && units == *self.units {
            return Ok(false);
        }
        self.units = Arc::new(units);
        Ok(true)
    }

    /// Apply one reply to its node's mirror: a whole register replaces it; a delta applies
    /// only where the mirror stands (same incarnation, epoch, and base stamp). Some(whether
    /// the mirror's content may have changed) when it applied; None when it was ignored (the
    /// mirror moved on or was lost: the node answers whole next time this mirror's cursor is
    /// not valid there).
    fn apply(&mut self, r: Reply) -> Option<bool> {
        if r.whole {
            let fields = r
                .pairs
                .into_iter()
                .filter_map(|(f, e)| Some((f, e.parse::<u64>().ok()?)))
                .collect();
            self.nodes.insert(
                r.node,
                Mirror {
                    marker: r.marker,
                    epoch: r.epoch,
                    stamp: r.stamp,
                    fields,
                },
            );
            return Some(true);
        }
        let m = self
            .nodes
            .get_mut(&r.node)
            .filter(|m| m.marker == r.marker && m.epoch == r.epoch && m.stamp == r.since)?;
        let changed = !r.pairs.is_empty();
        for (f, e) in r.pairs {
            if e.is_empty() {
                m.fields.remove(&f);
            } else if let Ok(e) = e.parse::<u64>() {
                m.fields.insert(f, e);
            }
        }
        m.stamp = r.stamp;
        Some(changed)
    }

    /// The units and settings merged over the mirrors of the `applied` nodes: per field, the
    /// highest entry.
    fn merge(&self, applied: &[usize]) -> UnitsAndSettings {
        let mut best: HashMap<&str, u64> = HashMap::new();
        for node in applied {
            if let Some(m) = self.nodes.get(node) {
                for (f, e) in &m.fields {
                    let b = best.entry(f.as_str()).or_insert(0);
                    *b = (*b).max(*e);
                }
            }
        }
        merge_best(best.into_iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(node: usize, epoch: &str, stamp: u64, pairs: &[(&str, &str)]) -> Reply {
        reply(node, "m", true, epoch, stamp, 0, pairs)
    }

    fn delta(node: usize, epoch: &str, stamp: u64, since: u64, pairs: &[(&str, &str)]) -> Reply {
        reply(node, "m", false, epoch, stamp, since, pairs)
    }

    fn reply(
        node: usize,
        marker: &str,
        whole: bool,
        epoch: &str,
        stamp: u64,
        since: u64,
        pairs: &[(&str, &str)],
    ) -> Reply {
        Reply {
            node,
            marker: marker.into(),
            whole,
            epoch: epoch.into(),
            stamp,
            since,
            pairs: pairs
                .iter()
                .map(|(f, e)| (f.to_string(), e.to_string()))
                .collect(),
        }
    }

    fn units(m: &Mirrors) -> Vec<String> {
        m.units().0.iter().cloned().collect()
    }

    #[test]
    fn a_removal_collected_after_the_leader_read_it_leaves_the_unit_removed() {
        let mut m = Mirrors::default();
        // a and b added (entries odd).
        let base = [("a", "3"), ("b", "5")];
        assert_eq!(
            m.fold(
                vec![whole(0, "e0", 10, &base), whole(1, "e1", 20, &base)],
                2
            ),
            Ok(true)
        );
        assert_eq!(units(&m), ["a", "b"]);
        assert_eq!(m.cursor(0, "m"), ("e0".into(), 10));
        // a removed (entry 6), then collected everywhere before the next read: the delta
        // carries the collection as an empty entry.
        assert_eq!(
            m.fold(
                vec![
                    delta(0, "e0", 12, 10, &[("a", "")]),
                    delta(1, "e1", 22, 20, &[("a", "")])
                ],
                2
            ),
            Ok(true)
        );
        assert_eq!(
            units(&m),
            ["b"],
            "a removal collected unseen must not bring a back"
        );
    }

    #[test]
    fn a_delta_applies_only_where_the_mirror_stands_and_a_majority_must_apply() {
        let mut m = Mirrors::default();
        let base = [("a", "3")];
        m.fold(
            vec![whole(0, "e0", 10, &base), whole(1, "e1", 20, &base)],
            2,
        )
        .expect("applies");
        // A delta from another base, another epoch, or another incarnation does not apply.
        for wrong in [
            delta(0, "e0", 12, 11, &[("b", "7")]),
            delta(0, "eX", 12, 10, &[("b", "7")]),
            reply(0, "other", false, "e0", 12, 10, &[("b", "7")]),
        ] {
            let mut copy = m.clone();
            assert!(
                copy.fold(vec![wrong.clone(), delta(1, "e1", 20, 20, &[])], 2)
                    .is_err(),
                "{wrong:?} must not count"
            );
            assert_eq!(units(&copy), ["a"], "nothing changed by a refused read");
        }
        assert_eq!(
            m.cursor(0, "other"),
            (String::new(), 0),
            "new incarnation: whole"
        );
    }

    #[test]
    fn the_units_are_merged_over_the_nodes_that_answered_this_read() {
        let mut m = Mirrors::default();
        // b was added on node 1 only (a write that failed), a everywhere.
        m.fold(
            vec![
                whole(0, "e0", 1, &[("a", "3")]),
                whole(1, "e1", 1, &[("a", "3"), ("b", "5")]),
                whole(2, "e2", 1, &[("a", "3")]),
            ],
            2,
        )
        .expect("applies");
        assert_eq!(units(&m), ["a", "b"]);
        // A later read answered by nodes 0 and 2: as a fresh read of them would, b is gone
        // (the leader's copy of node 1 is not counted).
        assert_eq!(
            m.fold(
                vec![delta(0, "e0", 1, 1, &[]), delta(2, "e2", 1, 1, &[])],
                2
            ),
            Ok(true)
        );
        assert_eq!(units(&m), ["a"]);
        // Nothing new from the same nodes: nothing changed.
        assert_eq!(
            m.fold(
                vec![delta(0, "e0", 1, 1, &[]), delta(2, "e2", 1, 1, &[])],
                2
            ),
            Ok(false)
        );
    }

    #[test]
    fn copies_rebuilt_after_a_loss_count_as_news_even_when_empty() {
        let mut m = Mirrors::default();
        assert_eq!(
            m.fold(vec![whole(0, "e0", 1, &[]), whole(1, "e1", 1, &[])], 2),
            Ok(true),
            "a fold into fresh copies is always news (a plan cached before the loss must go)"
        );
    }

    #[test]
    fn a_failed_fold_forces_the_next_merge() {
        let mut m = Mirrors::default();
        m.fold(
            vec![
                whole(0, "e0", 1, &[("a", "3")]),
                whole(1, "e1", 1, &[("a", "3")]),
            ],
            2,
        )
        .expect("applies");
        // Node 0 sends its register with a removed; node 1's reply does not apply.
        assert!(m
            .fold(
                vec![whole(0, "e0", 2, &[("a", "4")]), delta(1, "e1", 1, 7, &[])],
                2
            )
            .is_err());
        assert_eq!(
            m.fold(
                vec![delta(0, "e0", 2, 2, &[]), delta(1, "e1", 1, 1, &[])],
                2
            ),
            Ok(true)
        );
        assert!(
            units(&m).is_empty(),
            "a fresh read of nodes 0 and 1 shows a removed"
        );
    }
}
