//! The leader's watch over a group's beats: a member is gone only after its beat stayed
//! unchanged, on one node incarnation, on a majority for the lease time plus drift on the
//! leader's own clock. Pure: instants are passed in.

use super::*;

/// One node's beats as read in one round: the node's index, its incarnation (`run_id`), and
/// member key -> beat sequence.
pub(crate) type BeatReading = (
    usize,
    Arc<str>,
    std::collections::BTreeMap<String, Arc<str>>,
);

/// Beat entries to clean up: member key -> (node, the value it must still hold).
pub(crate) type BeatGarbage = Vec<(String, Vec<(usize, Arc<str>)>)>;

/// The leader's watch over a group's beats: per member key, per node, the beat value (or its
/// absence), tied to the node incarnation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Beats {
    watches: std::collections::BTreeMap<String, Watch<Option<Arc<str>>>>,
    /// Members judged gone, with every beat value a node showed for them then. A member stays
    /// gone until a node shows a value outside this set (it beat again: values never repeat).
    /// Without this, removing a gone member's entries (or a restarted node still holding an
    /// old one) would restart its watches and bring a dead member back for a whole window.
    buried: std::collections::BTreeMap<String, std::collections::BTreeSet<Arc<str>>>,
    /// The number of configured nodes (from the latest round).
    nodes: usize,
}

/// At most this many buried members are remembered (beyond, the smallest names are dropped
/// first; a dropped one is merely watched again from scratch).
const MAX_BURIED: usize = 4096;

impl Beats {
    /// Record one round of readings, received at `at`: for each node that answered, its
    /// incarnation and every member key -> beat it holds. Members in `also` (the current view)
    /// are watched even where no node holds them.
    pub(crate) fn observe(
        &mut self,
        nodes: usize,
        readings: &[BeatReading],
        also: &std::collections::BTreeSet<String>,
        at: Instant,
    ) {
        self.nodes = nodes;
        let mut keys: std::collections::BTreeSet<String> = also.clone();
        for (_, _, beats) in readings {
            keys.extend(beats.keys().cloned());
        }
        keys.extend(self.watches.keys().cloned());
        for key in keys {
            let w = self
                .watches
                .entry(key.clone())
                .or_insert_with(|| Watch::new(nodes));
            for (node, run_id, beats) in readings {
                w.observe(
                    *node,
                    Seen {
                        run_id: run_id.clone(),
                        state: beats.get(&key).cloned(),
                    },
                    at,
                );
            }
        }
        // A buried member that beat again is watched afresh.
        self.buried.retain(|key, values| {
            !readings
                .iter()
                .any(|(_, _, beats)| beats.get(key).is_some_and(|v| !values.contains(v)))
        });
    }

    /// Whether `member` was buried and has shown no new beat value since. Only for members
    /// that no view names (whose entries the leader collects): the barrier of a view that
    /// drops a member relies on the span rule of [`gone`](Self::gone) alone, judged on
    /// readings taken after the seal (a beat seen on one node at burial may reach a majority
    /// later, and the member then holds a valid lease again).
    pub(crate) fn is_buried(&self, member: &str) -> bool {
        self.buried.contains_key(member)
    }

    /// Record that `member` was judged gone: it stays buried until a node shows a beat value
    /// that no node showed for it so far.
    pub(crate) fn bury(&mut self, member: &str) {
        let values: std::collections::BTreeSet<Arc<str>> = self
            .watches
            .get(member)
            .map(|w| {
                (0..w.len())
                    .filter_map(|i| w.get(i).and_then(|(s, _)| s.state.clone()))
                    .collect()
            })
            .unwrap_or_default();
        if self.buried.len() >= MAX_BURIED && !self.buried.contains_key(member) {
            self.buried.pop_first();
        }
        self.buried.insert(member.to_string(), values);
    }

    /// Whether `member` is gone: on at least `needed` of the nodes read in this round
    /// (`answered`), its beat (or its absence) has been seen unchanged, on one incarnation, for
    /// `window` between the first and the latest reading. A member never seen is not gone.
    pub(crate) fn gone(
        &self,
        member: &str,
        answered: &[usize],
        needed: usize,
        window: Duration,
    ) -> bool {
        let Some(w) = self.watches.get(member) else {
            return false;
        };
        answered
            .iter()
            .filter(|i| w.span(**i).is_some_and(|d| d >= window))
            .count()
            >= needed
    }

    /// The earliest instant at which one of `members` that looks silent could be judged gone
    /// ([`gone`](Self::gone)) if its beat stays unchanged: a member is silent when at least
    /// `needed` of the nodes read in this round (`answered`) have shown its beat unchanged
    /// for `silent` at `now` (a live member's beat changes every interval); it could be
    /// judged at the instant the `needed`-th of those nodes will have shown it unchanged for
    /// `window`, if that is later than `now`. `None` when no member is silent. A hint for when
    /// to read next: only
    /// [`gone`](Self::gone), on the readings then, judges.
    pub(crate) fn next_judgement(
        &self,
        members: &std::collections::BTreeSet<String>,
        answered: &[usize],
        needed: usize,
        (silent, window): (Duration, Duration),
        now: Instant,
    ) -> Option<Instant> {
        members
            .iter()
            .filter_map(|m| {
                let w = self.watches.get(m)?;
                let mut firsts: Vec<Instant> = answered
                    .iter()
                    .filter_map(|i| w.get(*i).map(|(_, first)| first))
                    .filter(|first| now.saturating_duration_since(*first) >= silent)
                    .collect();
                firsts.sort();
                firsts.get(needed.checked_sub(1)?).map(|f| *f + window)
            })
            // A member judgeable already was judged on these readings.
            .filter(|at| *at > now)
            .min()
    }

    /// Members present on at least one of the nodes read in this round.
    pub(crate) fn present(&self, answered: &[usize]) -> std::collections::BTreeSet<String> {
        self.watches
            .iter()
            .filter(|(_, w)| {
                answered
                    .iter()
                    .any(|i| w.get(*i).is_some_and(|(s, _)| s.state.is_some()))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The last beat value each node of `answered` showed for `member` (for a guarded
    /// clean-up of a gone member's entries).
    pub(crate) fn last_values(&self, member: &str, answered: &[usize]) -> Vec<(usize, Arc<str>)> {
        let Some(w) = self.watches.get(member) else {
            return Vec::new();
        };
        answered
            .iter()
            .filter_map(|i| {
                w.get(*i)
                    .and_then(|(s, _)| s.state.clone().map(|v| (*i, v)))
            })
            .collect()
    }

    /// Stop watching members that are gone, absent from every node of `answered`, and not
    /// in `keep` (bounded memory).
    pub(crate) fn prune(
        &mut self,
        answered: &[usize],
        needed: usize,
        window: Duration,
        keep: &std::collections::BTreeSet<String>,
    ) {
        let present = self.present(answered);
        let gone: Vec<String> = self
            .watches
            .keys()
            .filter(|k| {
                !keep.contains(*k)
                    && !present.contains(*k)
                    && self.gone(k, answered, needed, window)
            })
            .cloned()
            .collect();
        for k in gone {
            self.watches.remove(&k);
        }
        // Every node answered and none holds a buried member that no view names: forget it.
        if answered.len() >= self.nodes {
            self.buried
                .retain(|k, _| present.contains(k) || self.watches.contains_key(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row<'a> = (usize, &'a str, &'a [(&'a str, &'a str)]);

    fn readings(rows: &[Row<'_>]) -> Vec<BeatReading> {
        rows.iter()
            .map(|(n, run, beats)| {
                (
                    *n,
                    Arc::<str>::from(*run),
                    beats
                        .iter()
                        .map(|(k, v)| (k.to_string(), Arc::<str>::from(*v)))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_member_that_keeps_beating_is_never_gone_and_one_that_stops_is_gone_after_the_window() {
        let t0 = Instant::now();
        let window = Duration::from_millis(1000);
        let view: std::collections::BTreeSet<String> = ["m#1".to_string()].into();
        let mut b = Beats::default();
        for step in 0..20u64 {
            let at = t0 + Duration::from_millis(100 * step);
            let seq = (step / 5 + 1).to_string(); // a beat every 500 ms
            let r = readings(&[
                (0, "r0", &[("m#1", &seq)]),
                (1, "r1", &[("m#1", &seq)]),
                (2, "r2", &[]),
            ]);
            b.observe(3, &r, &view, at);
            assert!(
                !b.gone("m#1", &[0, 1, 2], 2, window),
                "step {step}: a beating member was judged gone"
            );
        }
        // It stops at seq 4 (last change at 1500 ms). Node 2 never had it: its absence has been
        // unchanged since t0, but node 2 alone is not a majority.
        let last_change = t0 + Duration::from_millis(1500);
        let r = readings(&[
            (0, "r0", &[("m#1", "4")]),
            (1, "r1", &[("m#1", "4")]),
            (2, "r2", &[]),
        ]);
        b.observe(
            3,
            &r,
            &view,
            last_change + window - Duration::from_millis(1),
        );
        assert!(!b.gone("m#1", &[0, 1, 2], 2, window));
        b.observe(3, &r, &view, last_change + window);
        assert!(b.gone("m#1", &[0, 1, 2], 2, window));
        // Only readings of this round count: with node 1 unanswered, nodes 0 and 2 decide.
        assert!(b.gone("m#1", &[0, 2], 2, window));
        assert!(!b.gone("m#1", &[0], 2, window));
    }

    #[test]
    fn the_next_judgement_is_when_a_silent_members_majority_will_have_lasted_the_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (silent, window) = (ms(750), ms(1265));
        let view: std::collections::BTreeSet<String> =
            ["a#1".to_string(), "b#1".to_string()].into();
        let mut b = Beats::default();
        // a beats once (first seen at t0) and stops; b beats again.
        let r1 = readings(&[
            (0, "r0", &[("a#1", "1"), ("b#1", "1")]),
            (1, "r1", &[("a#1", "1"), ("b#1", "1")]),
        ]);
        let r2 = readings(&[
            (0, "r0", &[("a#1", "1"), ("b#1", "2")]),
            (1, "r1", &[("a#1", "1"), ("b#1", "2")]),
        ]);
        b.observe(3, &r1, &view, t0);
        assert_eq!(
            b.next_judgement(&view, &[0, 1], 2, (silent, window), t0 + ms(500)),
            None,
            "nobody is silent half an interval after a beat"
        );
        b.observe(3, &r2, &view, t0 + ms(1000));
        assert_eq!(
            b.next_judgement(&view, &[0, 1], 2, (silent, window), t0 + ms(1000)),
            Some(t0 + window),
            "a stopped beating; b beat again"
        );
        assert_eq!(
            b.next_judgement(&view, &[0], 2, (silent, window), t0 + ms(1000)),
            None,
            "one node is not a majority"
        );
    }

    #[test]
    fn a_wiped_node_restarts_its_watch_and_a_node_clock_plays_no_part() {
        let t0 = Instant::now();
        let window = Duration::from_millis(1000);
        let view = std::collections::BTreeSet::new();
        let mut b = Beats::default();
        let r = readings(&[(0, "r0", &[("m#1", "7")]), (1, "r1", &[("m#1", "7")])]);
        b.observe(3, &r, &view, t0);
        // Node 1 lost its data: a new incarnation without the beat.
        let r = readings(&[(0, "r0", &[("m#1", "7")]), (1, "r1b", &[])]);
        b.observe(3, &r, &view, t0 + Duration::from_millis(900));
        b.observe(3, &r, &view, t0 + Duration::from_millis(1200));
        assert!(
            !b.gone("m#1", &[0, 1], 2, window),
            "node 1's new incarnation was watched only 300 ms"
        );
        b.observe(3, &r, &view, t0 + Duration::from_millis(1900));
        assert!(b.gone("m#1", &[0, 1], 2, window));
        assert_eq!(b.present(&[0, 1]), ["m#1".to_string()].into());
    }

    #[test]
    fn a_buried_member_stays_gone_when_its_entries_are_collected_until_it_beats_again() {
        let t0 = Instant::now();
        let window = Duration::from_millis(1000);
        let none = std::collections::BTreeSet::new();
        let mut b = Beats::default();
        let r = readings(&[
            (0, "r0", &[("m#1", "7")]),
            (1, "r1", &[("m#1", "7")]),
            (2, "r2", &[("m#1", "6")]),
        ]);
        b.observe(3, &r, &none, t0);
        b.observe(3, &r, &none, t0 + window);
        assert!(b.gone("m#1", &[0, 1, 2], 2, window));
        b.bury("m#1");
        // The leader's clean-up removed the entry on nodes 0 and 1; node 2 (back from a
        // restart) still shows an old value. Both restart the watches, yet it stays gone.
        let r = readings(&[(0, "r0", &[]), (1, "r1", &[]), (2, "r2b", &[("m#1", "6")])]);
        b.observe(3, &r, &none, t0 + window + Duration::from_millis(100));
        assert!(
            b.is_buried("m#1"),
            "a collected entry brought a dead member back"
        );
        // A new beat value (the process resumed) un-buries it: it is watched afresh.
        let r = readings(&[
            (0, "r0", &[("m#1", "8")]),
            (1, "r1", &[("m#1", "8")]),
            (2, "r2b", &[("m#1", "6")]),
        ]);
        b.observe(3, &r, &none, t0 + window + Duration::from_millis(200));
        assert!(!b.is_buried("m#1"));
        assert!(!b.gone("m#1", &[0, 1, 2], 2, window));
    }

    #[test]
    fn burial_never_overrides_the_span_rule_a_barrier_relies_on() {
        // The member resumes after a freeze: its beat 8 has reached node 0 only when it is
        // buried (7 unchanged on nodes 1 and 2 for the window), then reaches node 1 too.
        let t0 = Instant::now();
        let window = Duration::from_millis(1000);
        let none = std::collections::BTreeSet::new();
        let mut b = Beats::default();
        let r = readings(&[
            (0, "r0", &[("m#1", "7")]),
            (1, "r1", &[("m#1", "7")]),
            (2, "r2", &[("m#1", "7")]),
        ]);
        b.observe(3, &r, &none, t0);
        let r = readings(&[
            (0, "r0", &[("m#1", "8")]),
            (1, "r1", &[("m#1", "7")]),
            (2, "r2", &[("m#1", "7")]),
        ]);
        b.observe(3, &r, &none, t0 + window);
        assert!(b.gone("m#1", &[0, 1, 2], 2, window));
        b.bury("m#1");
        let r = readings(&[
            (0, "r0", &[("m#1", "8")]),
            (1, "r1", &[("m#1", "8")]),
            (2, "r2", &[("m#1", "7")]),
        ]);
        b.observe(3, &r, &none, t0 + window + Duration::from_millis(100));
        assert!(
            !b.gone("m#1", &[0, 1, 2], 2, window),
            "beat 8 now holds a majority: the member may hold a valid lease"
        );
        assert!(
            b.is_buried("m#1"),
            "it stays buried (8 was seen at burial): the leader consults burial only for \
             members no view names"
        );
    }
}
