//! What a copy writes, decided purely from what the sources hold: each key's kind (from its
//! prefix), the merge of one page as read from every source (the highest register, the newest
//! view unless it has a sibling, the newest lease copy or a blocker where the sources disagree
//! on the holder, each hash field's highest value).
//! No I/O; unit-tested.

use std::collections::BTreeMap;

use crate::keys::{KeyKind, BLOCKER_HOLDER, BLOCKER_PREFIX};

/// What kind of state a key holds, from its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A monotonic register (string): ID sequences, lock fences.
    Register,
    /// A group's view register (hash token, view, hash).
    View,
    /// A lease key (hash v, n, t), restored beside its fence key.
    Lease,
    /// A hash merged field by field.
    Hash(HashMerge),
}

/// How a copy carries one kind of key: chosen in ONE exhaustive match, so a new kind of key
/// does not compile without its rule. The argument for each rule is its line here (and in
/// ARCHITECTURE.md): no rule ever moves a value backwards on a node.
pub(crate) fn rule(kind: KeyKind) -> Option<Kind> {
    match kind {
        // Monotonic registers: raised to the highest value any source holds.
        KeyKind::Id
        | KeyKind::Fence
        | KeyKind::GroupFence
        | KeyKind::PoolFence
        | KeyKind::FenceFloor
        | KeyKind::UnitVersion
        | KeyKind::UnitFloor => Some(Kind::Register),
        // View registers: the newest view, written by the view's own compare-and-set.
        KeyKind::View | KeyKind::PoolView => Some(Kind::View),
        // Leases: the copy the sources agree on (newest version), else a blocker; never over a key.
        KeyKind::Lock | KeyKind::GroupLock | KeyKind::PoolLock => Some(Kind::Lease),
        // Completion records and acknowledgements: each field raised to its highest value.
        KeyKind::Done | KeyKind::Ack | KeyKind::PoolAck => Some(Kind::Hash(HashMerge::Max)),
        // Unit registers: each entry raised; a removal below the collection floor is not.
        KeyKind::Units => Some(Kind::Hash(HashMerge::Units)),
        // Beats: each raised to its highest sequence ("left" above all), so a beat never goes
        // back to a value a leader may already have seen.
        KeyKind::Members | KeyKind::PoolMembers => Some(Kind::Hash(HashMerge::Beat)),
        // Unit lists: every field is written once (its name is its version and digest).
        KeyKind::PoolList => Some(Kind::Hash(HashMerge::IfAbsent)),
        // The node's own identity, claim and history: never copied (a copy would make the
        // target look verified, claimed or logged when it is not).
        KeyKind::Marker
        | KeyKind::Cluster
        | KeyKind::RepairClaim
        | KeyKind::Marked
        | KeyKind::UnitStamp
        | KeyKind::UnitLog
        | KeyKind::UnitEpoch => None,
    }
}

/// The kind of state `key` holds, if it is state to copy.
pub(crate) fn classify(key: &str) -> Option<Kind> {
    KeyKind::of_key(key).and_then(rule)
}

/// A lease key's fence key (`rq:lock:x` -> `rq:fence:x`, `rq:glock:g` -> `rq:gfence:g`).
pub(super) fn fence_of(lease_key: &str) -> Option<String> {
    if let Some(name) = lease_key.strip_prefix("rq:lock:") {
        Some(format!("rq:fence:{name}"))
    } else if let Some(name) = lease_key.strip_prefix("rq:plock:") {
        Some(format!("rq:pfence:{name}"))
    } else {
        lease_key
            .strip_prefix("rq:glock:")
            .map(|name| format!("rq:gfence:{name}"))
    }
}

/// How a hash is merged field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HashMerge {
    /// Each field raised to its highest value (completion records, acknowledgements).
    Max,
    /// As `Max`, for a pool's unit register: on the target, a removal below the pool's
    /// collection floor is not written.
    Units,
    /// Membership beats: each raised to its highest sequence, `left` above any.
    Beat,
    /// A field written where missing (write-once unit lists).
    IfAbsent,
}

impl HashMerge {
    pub(super) fn mode(self) -> &'static str {
        match self {
            HashMerge::Max => "max",
            HashMerge::Units => "units",
            HashMerge::Beat => "beat",
            HashMerge::IfAbsent => "absent",
        }
    }

    /// Whether `new` should replace `old` in the merge of the sources (the scripts apply the
    /// same rule on the target).
    fn prefers(self, new: &str, old: &str) -> bool {
        let num = |v: &str| v.parse::<u64>().ok();
        match self {
            HashMerge::Max | HashMerge::Units => num(new).unwrap_or(0) > num(old).unwrap_or(0),
            HashMerge::Beat => match (new, old) {
                (_, "left") => false,
                ("left", _) => true,
                _ => num(new).unwrap_or(0) > num(old).unwrap_or(0),
            },
            HashMerge::IfAbsent => false,
        }
    }
}

/// A lease key's content: holder value, version, ttl (ms).
type LeaseCopy = (String, u64, u64);

/// What one source holds of the keys of one page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holdings {
    pub(crate) registers: BTreeMap<String, u64>,
    /// Group view registers: key -> (version token, view JSON).
    pub(crate) views: BTreeMap<String, (u64, String)>,
    /// Lease keys: key -> (value, version, ttl ms).
    pub(crate) leases: BTreeMap<String, LeaseCopy>,
    /// Merged hashes: key -> field -> value.
    pub(crate) hashes: BTreeMap<String, BTreeMap<String, String>>,
}

/// The fencing token inside a lease value (`random:token:holder`).
pub(super) fn lease_token(value: &str) -> u64 {
    value
        .split(':')
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// What the targets must be given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Registers and the value each is raised to.
    pub(crate) registers: Vec<(String, u64)>,
    /// Per view key the newest view the sources hold.
    pub(crate) views: Vec<(String, (u64, String))>,
    /// View keys whose newest view has a sibling on the sources (another view derived from the
    /// same base): which of the two a majority adopted may have been decided on the target
    /// alone, so the copy must wait until a later seal moves the chain past both.
    pub(crate) ambiguous: Vec<String>,
    /// Per lease key the copy to restore: the newest version if the sources agree on the
    /// holder, otherwise a blocker ([`restored_copy`]).
    pub(crate) leases: BTreeMap<String, LeaseCopy>,
    /// Per hash field the highest value (or any, for beats).
    pub(crate) hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)>,
    /// Lease keys whose sources hold different holders' copies (each planned as a blocker):
    /// the copy reads the page again after a while, as a contender's losing round is usually
    /// released within milliseconds.
    pub(crate) disputed: usize,
}

impl Plan {
    pub(super) fn is_empty(&self) -> bool {
        self.registers.is_empty()
            && self.views.is_empty()
            && self.leases.is_empty()
            && self.hashes.is_empty()
    }
}

/// Merge what the sources hold. `server_clock_leases` is the TEST-ONLY unsafe mode in which a
/// lost lease copy or beat stays lost; `newest_lease_restore` the TEST-ONLY unsafe rule of
/// [`restored_copy`].
#[cfg(test)]
pub(crate) fn plan(
    sources: &[&Holdings],
    server_clock_leases: bool,
    newest_lease_restore: bool,
) -> Plan {
    plan_with(sources, server_clock_leases, newest_lease_restore, true)
}

/// `plan` (test-only), with `beats_by_max` false the TEST-ONLY rule before issue 27: a beat is
/// restored only where the target lacks it, from the first source that holds it (it can go
/// back).
pub(crate) fn plan_with(
    sources: &[&Holdings],
    server_clock_leases: bool,
    newest_lease_restore: bool,
    beats_by_max: bool,
) -> Plan {
    let mut registers: BTreeMap<String, u64> = BTreeMap::new();
    let mut all_views: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    let mut all_leases: BTreeMap<String, Vec<LeaseCopy>> = BTreeMap::new();
    for h in sources {
        for (k, v) in &h.registers {
            let e = registers.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        for (k, (t, v)) in &h.views {
            all_views
                .entry(k.clone())
                .or_default()
                .insert(*t, v.clone());
        }
        if server_clock_leases {
            continue;
        }
        for (k, copy) in &h.leases {
            all_leases.entry(k.clone()).or_default().push(copy.clone());
        }
    }
    let hashes = merge_hashes(sources, server_clock_leases, beats_by_max);
    Plan {
        registers: registers.into_iter().collect(),
        ambiguous: all_views
            .iter()
            .filter(|(_, vs)| newest_has_sibling(vs))
            .map(|(k, _)| k.clone())
            .collect(),
        views: all_views
            .into_iter()
            .filter_map(|(k, vs)| vs.into_iter().next_back().map(|(t, v)| (k, (t, v))))
            .collect(),
        disputed: if newest_lease_restore {
            0
        } else {
            all_leases
                .values()
                .filter(|copies| copies.iter().any(|c| c.0 != copies[0].0))
                .count()
        },
        leases: all_leases
            .into_iter()
            .filter_map(|(k, copies)| restored_copy(&copies, newest_lease_restore).map(|c| (k, c)))
            .collect(),
        hashes,
    }
}

/// Every hash key's fields merged by its kind's rule ([`HashMerge::prefers`]); beats are
/// skipped under `server_clock_leases` and restored only where absent without `beats_by_max`
/// (both TEST-ONLY).
fn merge_hashes(
    sources: &[&Holdings],
    server_clock_leases: bool,
    beats_by_max: bool,
) -> BTreeMap<String, (HashMerge, BTreeMap<String, String>)> {
    let mut hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)> = BTreeMap::new();
    for h in sources {
        for (k, fields) in &h.hashes {
            let Some(Kind::Hash(merge)) = classify(k) else {
                continue;
            };
            if server_clock_leases && merge == HashMerge::Beat {
                continue;
            }
            let merge = match merge {
                HashMerge::Beat if !beats_by_max => HashMerge::IfAbsent,
                other => other,
            };
            let entry = hashes
                .entry(k.clone())
                .or_insert_with(|| (merge, BTreeMap::new()));
            for (f, v) in fields {
                let take = entry.1.get(f).is_none_or(|old| merge.prefers(v, old));
                if take {
                    entry.1.insert(f.clone(), v.clone());
                }
            }
        }
    }
    hashes
}

/// The lease copy a repair restores from the copies its sources hold of one lease key.
///
/// If they all hold one value: its newest version. If they hold different values, the lost
/// node may have granted any of them (two contenders can even propose the same token), and a
/// copy of the wrong one could be released by its owner, who never held the lease, freeing
/// the node for a second holder beside the one whose grant was lost. So the node gets a
/// *blocker* instead: a value no client holds, with the highest token and lease time among
/// the copies. No client releases or extends it; it leaves only by a takeover, after a
/// watcher has seen it unchanged for its lease time, by which time any lease the lost grant
/// counted towards has ended unless its holder extended it on a majority without this node.
/// (`model/` checks this rule; its planted `RestoreNewest` is the old "newest copy" rule,
/// which `newest_anyway` plants here, for tests.)
fn restored_copy(copies: &[LeaseCopy], newest_anyway: bool) -> Option<LeaseCopy> {
    let newest = copies
        .iter()
        .max_by_key(|(value, version, _)| (lease_token(value), *version))?;
    if newest_anyway || copies.iter().all(|(value, _, _)| *value == newest.0) {
        return Some(newest.clone());
    }
    let ttl = copies.iter().map(|(_, _, ttl)| *ttl).max().unwrap_or(0);
    let token = lease_token(&newest.0);
    Some((format!("{BLOCKER_PREFIX}:{token}:{BLOCKER_HOLDER}"), 1, ttl))
}

/// Whether the newest of these views (token -> JSON) shares its base with another one.
fn newest_has_sibling(views: &BTreeMap<u64, String>) -> bool {
    let base = |json: &String| {
        serde_json::from_str::<crate::membership::View>(json)
            .ok()
            .map(|v| v.base)
    };
    let Some((newest, json)) = views.iter().next_back() else {
        return false;
    };
    let Some(newest_base) = base(json) else {
        return false;
    };
    views
        .iter()
        .any(|(t, v)| t != newest && base(v) == Some(newest_base))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holdings(registers: &[(&str, u64)], beats: &[(&str, &str)]) -> Holdings {
        let mut h = Holdings {
            registers: registers.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Holdings::default()
        };
        if !beats.is_empty() {
            h.hashes.insert(
                "rq:members:g".into(),
                beats
                    .iter()
                    .map(|(f, v)| (f.to_string(), v.to_string()))
                    .collect(),
            );
        }
        h
    }

    #[test]
    fn a_newest_view_with_a_sibling_on_the_sources_is_ambiguous() {
        use crate::membership::View;
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect();
        let v1 = View::empty().next(&set(&["a"]), 1);
        let x = v1.next(&set(&["a", "c"]), 1); // (1, 2), base v1
        let w = v1.next(&set(&["a", "d"]), 2); // (2, 1), base v1: a sibling of x
        let w2 = x.next(&set(&["a", "e"]), 2); // (2, 1) in another chain: base x
        let json = |v: &View| serde_json::to_string(v).expect("json");
        let tok = |v: &View| v.version.token().expect("t").get();
        let holding = |views: &[&View]| Holdings {
            views: views
                .iter()
                .map(|v| ("rq:view:g".to_string(), (tok(v), json(v))))
                .collect::<Vec<_>>()
                .into_iter()
                .take(1)
                .collect(),
            ..Holdings::default()
        };
        let (hx, hw) = (holding(&[&x]), holding(&[&w]));
        let p = plan(&[&hx, &hw], false, false);
        assert_eq!(
            p.ambiguous,
            vec!["rq:view:g".to_string()],
            "x and w share a base"
        );
        let mut w2 = w2;
        w2.version.seq = 2;
        let hw2 = holding(&[&w2]);
        let p = plan(&[&hx, &hw2], false, false);
        assert!(p.ambiguous.is_empty(), "w2 derives from x: one chain");
        assert_eq!(p.views[0].1 .0, tok(&w2));
    }

    #[test]
    fn only_state_keys_are_copied() {
        assert_eq!(classify("rq:id:orders"), Some(Kind::Register));
        assert_eq!(classify("rq:members:g"), Some(Kind::Hash(HashMerge::Beat)));
        for not_state in [
            "rq:marker",
            "rq:cluster",
            "rq:repairing",
            "user:key",
            "rq:idx",
        ] {
            assert_eq!(classify(not_state), None, "{not_state}");
        }
        assert_eq!(fence_of("rq:lock:a"), Some("rq:fence:a".into()));
        assert_eq!(fence_of("rq:glock:g"), Some("rq:gfence:g".into()));
        assert_eq!(fence_of("rq:plock:p"), Some("rq:pfence:p".into()));
        assert_eq!(
            classify("rq:plist:3:a:b:c"),
            Some(Kind::Hash(HashMerge::IfAbsent)),
            "unit lists are copied field by field (each written once)"
        );
        assert_eq!(classify("rq:pview:p"), Some(Kind::View));
        assert_eq!(classify("rq:ustamp:p"), None, "a stamp is not copied");
        for derived in ["rq:ulog:p", "rq:uepoch:p", "rq:marked"] {
            assert_eq!(
                classify(derived),
                None,
                "{derived}: a node's change log and its epoch describe that node's own history"
            );
        }
    }

    #[test]
    fn a_lease_is_restored_only_where_the_sources_agree_on_its_holder() {
        let lease = |v: &str, n: u64, t: u64| Holdings {
            leases: [("rq:lock:a".to_string(), (v.to_string(), n, t))].into(),
            ..Holdings::default()
        };
        let none = Holdings::default();
        let (a3, a5, b) = (
            lease("r1:7:alice", 3, 1000),
            lease("r1:7:alice", 5, 1000),
            lease("r2:7:bob", 1, 2000),
        );
        let p = plan(&[&a3, &a5, &none], false, false);
        assert_eq!(p.disputed, 0, "one holder is no dispute");
        assert_eq!(
            p.leases["rq:lock:a"],
            ("r1:7:alice".to_string(), 5, 1000),
            "one holder on every source that has the key: its newest version"
        );
        let p = plan(&[&a3, &b], false, false);
        assert_eq!(p.disputed, 1, "one disputed key");
        let (value, version, ttl) = &p.leases["rq:lock:a"];
        assert!(
            value.starts_with("repair-blocker:7:") && *version == 1 && *ttl == 2000,
            "two holders with one token (the lost node may have granted either): a blocker with \
             the token and the longest lease time, got {:?}",
            p.leases["rq:lock:a"]
        );
        assert_eq!(lease_token(value), 7);
        let newer = lease("r3:9:carol", 1, 500);
        let p = plan(&[&a5, &newer], false, false);
        assert_eq!(
            lease_token(&p.leases["rq:lock:a"].0),
            9,
            "a blocker carries the highest token"
        );
        assert!(p.leases["rq:lock:a"].0.starts_with("repair-blocker:"));
    }

    #[test]
    fn a_beat_is_restored_at_its_highest_sequence_and_left_above_any() {
        // Node a saw m1 at 3, b at 5 (a later beat that a did not get); m2 left, but b still
        // shows its last sequence.
        let a = holdings(&[], &[("m1", "3"), ("m2", "left")]);
        let b = holdings(&[], &[("m1", "5"), ("m2", "7")]);
        for order in [[&a, &b], [&b, &a]] {
            let p = plan(&order, false, false);
            let (merge, beats) = &p.hashes["rq:members:g"];
            assert_eq!(*merge, HashMerge::Beat);
            assert_eq!(
                beats["m1"], "5",
                "the highest beat whatever the sources' order: a beat never goes back"
            );
            assert_eq!(beats["m2"], "left", "left is above any sequence");
        }
    }

    #[test]
    fn every_key_kind_has_one_rule_and_the_nodes_own_keys_are_never_copied() {
        for kind in KeyKind::ALL {
            let key = format!("rq:{}:x", kind.word());
            assert_eq!(
                classify(&key),
                rule(kind),
                "{key} is classified by its kind's rule"
            );
        }
        for own in [
            KeyKind::Marker,
            KeyKind::Cluster,
            KeyKind::RepairClaim,
            KeyKind::Marked,
        ] {
            assert_eq!(rule(own), None, "{own:?} describes the node itself");
        }
    }

    #[test]
    fn the_highest_register_and_every_beat_are_planned() {
        let a = holdings(&[("rq:id:x", 5), ("rq:id:y", 9)], &[("m1", "3")]);
        let b = holdings(&[("rq:id:x", 7)], &[("m1", "2"), ("m2", "1")]);
        let p = plan(&[&a, &b], false, false);
        assert_eq!(
            p.registers,
            vec![("rq:id:x".into(), 7), ("rq:id:y".into(), 9)]
        );
        let beats = &p.hashes["rq:members:g"].1;
        assert_eq!(
            beats.len(),
            2,
            "a beat any source holds is restored: {beats:?}"
        );
        let unsafe_plan = plan(&[&a, &b], true, false);
        assert!(
            unsafe_plan.hashes.is_empty(),
            "the test-only mode restores no beats"
        );
    }
}
