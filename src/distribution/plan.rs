//! The pool leader's plan, pure: from the view's lists, the live member keys, the IDs away
//! within their grace and the units, the lists the next view carries and the fields to write.
//! No I/O, no clock.
//!
//! - Each member ID is worked by one process: the key the view already names, while it is
//!   live; otherwise the smallest live key with that ID (a second process with one ID owns
//!   nothing). A key's weight is its suffix `*<w>` (1 without one).
//! - An ID whose process is gone stays in the table, worked by nobody, while it is away within
//!   its grace (a rolling restart: the same ID comes back and finds its units); after that its
//!   units are redistributed.
//! - The table is [`distribution_table`] of the previous table (the view's lists; none in the
//!   stateless mode), the members with their weights, and the units.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::lists::next_list;
use super::table::{distribution_table, MemberWeight, TableInputs};
use super::units::PoolSettings;
use crate::membership::tables::{ListWrite, Planned};
use crate::membership::ListRef;

/// A member key's ID and weight: `<id>#<nonce>` (weight 1) or `<id>#<nonce>*<w>`.
pub(crate) fn key_parts(key: &str) -> (&str, u32) {
    match key.rsplit_once('#') {
        None => (key, 1),
        Some((id, rest)) => (
            id,
            rest.split_once('*')
                .and_then(|(_, w)| w.parse().ok())
                .unwrap_or(1),
        ),
    }
}

/// What the plan is made from.
pub(crate) struct PlanInputs<'a> {
    /// The lists of the view the leader adopted.
    pub(crate) lists: &'a BTreeMap<String, ListRef>,
    /// The units of each of those lists (by ID).
    pub(crate) resolved: &'a HashMap<String, Arc<BTreeSet<String>>>,
    /// Live member keys.
    pub(crate) live: &'a BTreeSet<String>,
    /// IDs of `lists` whose process is gone, still within their grace.
    pub(crate) away: &'a BTreeSet<String>,
    /// The pool's units.
    pub(crate) units: &'a BTreeSet<String>,
    /// Pins and drained members.
    pub(crate) settings: &'a PoolSettings,
    /// Ignore the previous table (the seed's "same lists, same division").
    pub(crate) stateless: bool,
    /// The version new fields are written at (above the view's token).
    pub(crate) version: u64,
}

/// The live key that works each member ID.
pub(crate) fn workers(
    lists: &BTreeMap<String, ListRef>,
    live: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for key in live {
        let (id, _) = key_parts(key);
        let named = lists.get(id).and_then(|l| l.key.as_deref()) == Some(key.as_str());
        match out.get(id) {
            Some(k) if lists.get(id).and_then(|l| l.key.as_deref()) == Some(k.as_str()) => {}
            Some(_) if !named => {}
            _ => {
                out.insert(id.to_string(), key.clone());
            }
        }
    }
    out
}

/// The plan: the next view's lists (by ID) and the fields to write (`list_key` names an ID's
/// hash), with each ID's units.
pub(crate) fn plan(
    inputs: &PlanInputs<'_>,
    list_key: impl Fn(&str) -> String,
) -> (Planned, BTreeMap<String, BTreeSet<String>>) {
    let workers = workers(inputs.lists, inputs.live);
    // Each member's own weight (what its list records), before a drain sets it to zero.
    let mut members: Vec<MemberWeight> = workers
        .iter()
        .map(|(id, key)| MemberWeight {
            id: id.clone(),
            weight: key_parts(key).1,
        })
        .collect();
    for id in inputs.away.iter().filter(|id| !workers.contains_key(*id)) {
        if let Some(l) = inputs.lists.get(id) {
            members.push(MemberWeight {
                id: id.clone(),
                weight: l.weight,
            });
        }
    }
    let previous: BTreeMap<String, String> = inputs
        .resolved
        .iter()
        .flat_map(|(id, units)| units.iter().map(move |u| (u.clone(), id.clone())))
        .collect();
    let effective: Vec<MemberWeight> = members
        .iter()
        .map(|m| MemberWeight {
            id: m.id.clone(),
            weight: if inputs.settings.drained.contains(&m.id) {
                0
            } else {
                m.weight
            },
        })
        .collect();
    let table = distribution_table(&TableInputs {
        previous: (!inputs.stateless).then_some(&previous),
        members: &effective,
        units: inputs.units,
        pins: Some(&inputs.settings.pins),
    });
    let mut by_id: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (unit, id) in table {
        by_id.entry(id).or_default().insert(unit);
    }
    let mut planned = Planned::default();
    for m in &members {
        let new = by_id.get(m.id.as_str()).cloned().unwrap_or_default();
        let old = inputs
            .lists
            .get(&m.id)
            .zip(inputs.resolved.get(&m.id).map(|u| &**u));
        let key = workers.get(&m.id).cloned();
        if let Some((r, write)) = next_list(inputs.version, old, &new, key, m.weight) {
            if let Some((field, payload)) = write {
                planned.writes.push(ListWrite {
                    key: list_key(&m.id),
                    field,
                    payload,
                });
            }
            planned.lists.insert(m.id.clone(), r);
        }
    }
    (planned, by_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn units(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("site-{i}")).collect()
    }

    fn run(
        lists: &BTreeMap<String, ListRef>,
        resolved: &HashMap<String, Arc<BTreeSet<String>>>,
        live: &[&str],
        away: &[&str],
        units: &BTreeSet<String>,
        version: u64,
    ) -> Planned {
        plan(
            &PlanInputs {
                lists,
                resolved,
                live: &set(live),
                away: &set(away),
                units,
                settings: &PoolSettings::default(),
                stateless: false,
                version,
            },
            |id| format!("rq:plist:1:p:{id}"),
        )
        .0
    }

    /// What a plan gives each ID, as the next planner (and the members) would resolve it.
    fn resolved_of(
        p: &Planned,
        before: &HashMap<String, Arc<BTreeSet<String>>>,
        fields: &mut HashMap<String, String>,
    ) -> HashMap<String, Arc<BTreeSet<String>>> {
        for w in &p.writes {
            fields.insert(w.field.clone(), w.payload.clone());
        }
        let _ = before;
        p.lists
            .iter()
            .map(|(id, r)| {
                let got = super::super::lists::resolve(fields, r).expect("resolves");
                (id.clone(), Arc::new(got.units))
            })
            .collect()
    }

    #[test]
    fn keys_carry_their_id_and_weight() {
        assert_eq!(key_parts("a#00ff"), ("a", 1));
        assert_eq!(key_parts("a#b#00ff*3"), ("a#b", 3));
        assert_eq!(key_parts("plain"), ("plain", 1));
    }

    #[test]
    fn one_process_per_id_works_its_list_and_the_named_one_keeps_it() {
        let mut lists = BTreeMap::new();
        lists.insert(
            "a".to_string(),
            ListRef {
                key: Some("a#2".into()),
                field: "1.x".into(),
                count: 1,
                digest: "d".into(),
                chain: 0,
                weight: 1,
            },
        );
        let w = workers(&lists, &set(&["a#1", "a#2", "b#9", "b#3"]));
        assert_eq!(
            w.get("a").map(String::as_str),
            Some("a#2"),
            "the named key keeps the list"
        );
        assert_eq!(
            w.get("b").map(String::as_str),
            Some("b#3"),
            "else the smallest key"
        );
    }

    #[test]
    fn a_join_moves_only_to_the_newcomer_and_writes_only_what_changed() {
        let all = units(100);
        let mut fields = HashMap::new();
        let empty = HashMap::new();
        let p1 = run(&BTreeMap::new(), &empty, &["a#1", "b#1"], &[], &all, 10);
        assert_eq!(p1.lists.len(), 2);
        assert_eq!(p1.lists.values().map(|l| l.count).sum::<u64>(), 100);
        let r1 = resolved_of(&p1, &empty, &mut fields);
        let p2 = run(&p1.lists, &r1, &["a#1", "b#1", "c#1"], &[], &all, 20);
        let r2 = resolved_of(&p2, &r1, &mut fields);
        let counts: Vec<u64> = p2.lists.values().map(|l| l.count).collect();
        assert_eq!(counts.iter().sum::<u64>(), 100);
        assert!(counts.iter().all(|c| (33..=34).contains(c)), "{counts:?}");
        for id in ["a", "b"] {
            assert!(r2[id].is_subset(&r1[id]), "{id} only gives units up");
        }
        let written: usize = p2
            .writes
            .iter()
            .map(|w| w.payload.lines().count() - 1)
            .sum();
        assert_eq!(
            written,
            33 * 2,
            "deltas of the moved units and the newcomer's snapshot"
        );
    }

    #[test]
    fn an_id_away_within_its_grace_keeps_its_units_and_gets_them_back() {
        let all = units(60);
        let mut fields = HashMap::new();
        let empty = HashMap::new();
        let p1 = run(&BTreeMap::new(), &empty, &["a#1", "b#1*2"], &[], &all, 10);
        assert_eq!(p1.lists["b"].count, 40, "weight 2 takes two thirds");
        let r1 = resolved_of(&p1, &empty, &mut fields);
        // b's process is gone; within its grace its units stay parked under b, worked by nobody.
        let p2 = run(&p1.lists, &r1, &["a#1"], &["b"], &all, 20);
        assert_eq!(p2.lists["b"].key, None);
        assert_eq!(
            p2.lists["b"].field, p1.lists["b"].field,
            "nothing rewritten"
        );
        assert!(p2.writes.is_empty());
        // b comes back as a new process with the same ID: it gets exactly its units again.
        let r2 = resolved_of(&p2, &r1, &mut fields);
        let p3 = run(&p2.lists, &r2, &["a#1", "b#7*2"], &[], &all, 30);
        assert_eq!(p3.lists["b"].key.as_deref(), Some("b#7*2"));
        assert_eq!(p3.lists["b"].field, p1.lists["b"].field);
        // Past the grace, its units go to the others.
        let p4 = run(&p2.lists, &r2, &["a#1"], &[], &all, 30);
        assert_eq!(p4.lists.len(), 1);
        assert_eq!(p4.lists["a"].count, 60);
    }

    #[test]
    fn a_drained_id_stays_with_an_empty_list_and_its_weight_and_pins_are_honoured() {
        let all = units(60);
        let mut fields = HashMap::new();
        let empty = HashMap::new();
        let p1 = run(&BTreeMap::new(), &empty, &["a#1", "b#1*2"], &[], &all, 10);
        let r1 = resolved_of(&p1, &empty, &mut fields);
        let settings = PoolSettings {
            pins: [("site-7".to_string(), "b".to_string())].into(),
            drained: ["b".to_string()].into(),
        };
        let (p2, by_id) = plan(
            &PlanInputs {
                lists: &p1.lists,
                resolved: &r1,
                live: &set(&["a#1", "b#1*2"]),
                away: &set(&[]),
                units: &all,
                settings: &settings,
                stateless: false,
                version: 20,
            },
            |id| format!("rq:plist:1:p:{id}"),
        );
        assert_eq!(p2.lists["b"].count, 1, "drained b keeps only its pin");
        assert_eq!(p2.lists["b"].weight, 2, "its own weight is kept for later");
        assert_eq!(
            by_id["b"],
            ["site-7".to_string()].into(),
            "the pinned unit stays with b"
        );
        assert_eq!(p2.lists["a"].count, 59);
    }
}
