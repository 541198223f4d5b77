//! Unit lists on the nodes, pure: how a member ID's list is stored, found and changed. No I/O.
//!
//! Each member ID of a pool has a hash `rq:plist:<pool len>:<pool>:<id>`. Every field is
//! written once and never changed: its name is `<version>.<digest of its payload>`, so two
//! different payloads can never share a field, and a reader checks every payload against its
//! name. A payload is a **snapshot** (`s`, then one unit per line) or a **delta** on an
//! earlier field (`d <base field>`, then `+unit` / `-unit` lines). A view names each list's
//! newest field with the list's size and digest ([`ListRef`]); a reader walks the deltas back
//! to the snapshot, applies them forward and checks the size and digest.
//!
//! A new table writes a delta of the units that changed, so its writes are proportional to
//! the change; a snapshot is written instead once the deltas since the last one would hold
//! more units than the list itself (at least 64), so a member reads at most about twice its
//! own units. Units never contain a line break (names have no control characters).

use std::collections::{BTreeSet, HashMap};

use xxhash_rust::xxh3::xxh3_64;

use crate::membership::ListRef;

/// Deltas may hold at least this many units before a snapshot is written.
const MIN_CHAIN: u64 = 64;

/// Deltas never hold more than this many units (so never more fields than this) before a
/// snapshot is written, however large the list: a chain always resolves.
const MAX_CHAIN: u64 = 4096;

/// Longest chain of deltas a reader follows (a corrupted hash could otherwise loop).
const MAX_CHAIN_FIELDS: usize = 100_000;

/// The digest of a whole list (16 hex digits).
pub(crate) fn list_digest(units: &BTreeSet<String>) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for u in units {
        h.update(u.as_bytes());
        h.update(b"\n");
    }
    format!("{:016x}", h.digest())
}

/// The field name of `payload` written at `version`.
pub(crate) fn field_name(version: u64, payload: &str) -> String {
    format!("{version}.{:016x}", xxh3_64(payload.as_bytes()))
}

/// The version part of a field name.
pub(crate) fn field_version(field: &str) -> Option<u64> {
    field.split_once('.').and_then(|(v, _)| v.parse().ok())
}

fn snapshot(units: &BTreeSet<String>) -> String {
    let mut s = String::from("s");
    for u in units {
        s.push('\n');
        s.push_str(u);
    }
    s
}

fn delta(base: &str, added: &[&String], removed: &[&String]) -> String {
    let mut s = format!("d {base}");
    for (sign, units) in [('+', added), ('-', removed)] {
        for u in units {
            s.push('\n');
            s.push(sign);
            s.push_str(u);
        }
    }
    s
}

/// What the reader found for one list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) units: BTreeSet<String>,
    /// The version of the snapshot the chain starts at (fields below it are not needed).
    pub(crate) snapshot: u64,
}

/// The list `r` names, from its hash's fields (as merged from a majority).
pub(crate) fn resolve(fields: &HashMap<String, String>, r: &ListRef) -> Result<Resolved, String> {
    let mut deltas: Vec<&str> = Vec::new();
    let mut field = r.field.as_str();
    let (mut units, snapshot) = loop {
        let payload = fields
            .get(field)
            .ok_or_else(|| format!("unit list field {field} is missing"))?;
        if field_name(field_version(field).unwrap_or(0), payload) != field {
            return Err(format!("unit list field {field} does not match its digest"));
        }
        let (head, body) = payload.split_once('\n').unwrap_or((payload, ""));
        if head == "s" {
            let units = body.lines().filter(|l| !l.is_empty()).map(str::to_string);
            break (
                units.collect::<BTreeSet<_>>(),
                field_version(field).unwrap_or(0),
            );
        }
        let base = head
            .strip_prefix("d ")
            .ok_or_else(|| format!("unit list field {field} is neither snapshot nor delta"))?;
        if deltas.len() >= MAX_CHAIN_FIELDS
            || field_version(base).unwrap_or(u64::MAX) >= field_version(field).unwrap_or(0)
        {
            return Err(format!("unit list field {field} has a bad base {base}"));
        }
        deltas.push(body);
        field = base;
    };
    for body in deltas.iter().rev() {
        for line in body.lines() {
            if let Some(u) = line.strip_prefix('+') {
                units.insert(u.to_string());
            } else if let Some(u) = line.strip_prefix('-') {
                units.remove(u);
            }
        }
    }
    if units.len() as u64 != r.count || list_digest(&units) != r.digest {
        return Err(format!(
            "unit list {} resolves to {} units that do not match the view's size {} and digest",
            r.field,
            units.len(),
            r.count
        ));
    }
    Ok(Resolved { units, snapshot })
}

/// The reference (and, when the units changed, the field to write) of a member ID's list
/// that goes from `old` (its reference and units, if it had a list) to `new`, written at
/// `version`, worked by `key` with weight `weight`. `None` for an empty list (no list).
pub(crate) fn next_list(
    version: u64,
    old: Option<(&ListRef, &BTreeSet<String>)>,
    new: &BTreeSet<String>,
    key: Option<String>,
    weight: u32,
) -> Option<(ListRef, Option<(String, String)>)> {
    if new.is_empty() {
        return None;
    }
    if let Some((r, _)) = old.filter(|(_, u)| *u == new) {
        let same = ListRef {
            key,
            weight,
            ..r.clone()
        };
        return Some((same, None));
    }
    let digest = list_digest(new);
    let count = new.len() as u64;
    let as_delta = old.and_then(|(r, units)| {
        let added: Vec<&String> = new.difference(units).collect();
        let removed: Vec<&String> = units.difference(new).collect();
        let chain = r.chain + (added.len() + removed.len()) as u64;
        (chain <= count.clamp(MIN_CHAIN, MAX_CHAIN))
            .then(|| (delta(&r.field, &added, &removed), chain))
    });
    let (payload, chain) = as_delta.unwrap_or_else(|| (snapshot(new), 0));
    let field = field_name(version, &payload);
    let r = ListRef {
        key,
        field: field.clone(),
        count,
        digest,
        chain,
        weight,
    };
    Some((r, Some((field, payload))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(units: &[&str]) -> BTreeSet<String> {
        units.iter().map(|s| s.to_string()).collect()
    }

    fn store(fields: &mut HashMap<String, String>, w: Option<(String, String)>) {
        if let Some((f, p)) = w {
            fields.insert(f, p);
        }
    }

    #[test]
    fn a_list_is_a_snapshot_then_deltas_and_reads_back_exactly() {
        let mut fields = HashMap::new();
        let a = set(&["u1", "u2", "u3"]);
        let (r1, w) = next_list(10, None, &a, Some("m#1".into()), 1).expect("list");
        assert!(w.as_ref().is_some_and(|(_, p)| p.starts_with('s')));
        store(&mut fields, w);
        let b = set(&["u1", "u3", "u4"]);
        let (r2, w) = next_list(20, Some((&r1, &a)), &b, Some("m#1".into()), 1).expect("list");
        assert!(
            w.as_ref().is_some_and(|(_, p)| p.starts_with("d ")),
            "a small change is a delta"
        );
        assert_eq!(r2.chain, 2);
        store(&mut fields, w);
        let got = resolve(&fields, &r2).expect("resolves");
        assert_eq!(got.units, b);
        assert_eq!(got.snapshot, 10);
        assert_eq!(resolve(&fields, &r1).expect("older").units, a);
    }

    #[test]
    fn unchanged_units_write_nothing_and_an_empty_list_is_no_list() {
        let a = set(&["x"]);
        let (r, _) = next_list(1, None, &a, Some("m#1".into()), 1).expect("list");
        let (same, w) = next_list(2, Some((&r, &a)), &a, Some("m#2".into()), 1).expect("list");
        assert_eq!(w, None);
        assert_eq!(same.field, r.field);
        assert_eq!(same.key.as_deref(), Some("m#2"), "the worker may change");
        assert_eq!(next_list(3, Some((&r, &a)), &set(&[]), None, 1), None);
    }

    #[test]
    fn long_chains_become_a_snapshot() {
        let mut fields = HashMap::new();
        let mut units = set(&["a"]);
        let (mut r, w) = next_list(1, None, &units, None, 1).expect("list");
        store(&mut fields, w);
        let mut snapshots = 0;
        for v in 2..300u64 {
            let mut next = units.clone();
            next.insert(format!("n{v}"));
            next.remove(&format!("n{}", v - 1));
            let (nr, w) = next_list(v, Some((&r, &units)), &next, None, 1).expect("list");
            if w.as_ref().is_some_and(|(_, p)| p.starts_with('s')) {
                snapshots += 1;
            }
            assert!(nr.chain <= MIN_CHAIN.max(nr.count));
            store(&mut fields, w);
            assert_eq!(resolve(&fields, &nr).expect("resolves").units, next);
            (r, units) = (nr, next);
        }
        assert!(snapshots >= 3, "{snapshots} snapshots in 300 changes");
    }

    #[test]
    fn a_tampered_missing_or_looping_list_is_an_error_never_a_guess() {
        let a = set(&["u1", "u2"]);
        let (r, w) = next_list(5, None, &a, None, 1).expect("list");
        let (f, p) = w.expect("write");
        let mut fields = HashMap::from([(f.clone(), p.clone())]);
        assert!(resolve(&HashMap::new(), &r).is_err(), "missing");
        fields.insert(f.clone(), format!("{p}\nu3"));
        assert!(
            resolve(&fields, &r).is_err(),
            "payload changed under its name"
        );
        let wrong_count = ListRef {
            count: 3,
            ..r.clone()
        };
        fields.insert(f, p);
        assert!(resolve(&fields, &wrong_count).is_err(), "size mismatch");
        let looping = "d 9.0000000000000000".to_string();
        let name = field_name(9, &looping);
        let lr = ListRef {
            field: name.clone(),
            ..r
        };
        let fields = HashMap::from([(name, looping)]);
        assert!(resolve(&fields, &lr).is_err(), "a delta on itself");
    }
}
