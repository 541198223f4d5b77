//! The units of a pool, stored on the quorum nodes: add, remove, list.
//!
//! Each node holds a hash `rq:units:<pool>` of `unit -> version * 2 + (1 if added, 0 if
//! removed)`. Versions come from the pool's own fencing-ID sequence (`rq:uver:<pool>`), so a
//! change that finished before another began has the lower version. A change writes its
//! entries to a majority (`units.lua`: an entry is only ever raised, marker-guarded); a read
//! takes every entry from a majority and keeps, per unit, the highest: a unit added (or
//! removed) before a read starts is seen so by that read, whatever node failed in between.
//! Adding or removing units costs O(units changed) per node, not O(pool size). Removed units
//! stay as entries (tombstones); collecting them safely is future work.

use std::collections::{BTreeMap, BTreeSet};

use crate::client::{decode, script_call, Client, Guard, Request, Step};
use crate::error::Error;
use crate::id::IdGenerator;
use crate::keys::{KeyKind, Name};
use crate::quorum::NodeOutcome;
use crate::scripts::{UNITS, VALUE_LIMIT};

/// Units written per script call.
const BATCH: usize = 1000;

/// The units of a pool of work, stored on the quorum nodes (see the module docs of
/// `distribution/units.rs` for the register).
///
/// # Guarantees
/// A unit added (or removed) by a call that returned `Ok` before [`list`](Units::list) began
/// is listed (or not) by it, on any client, with any minority of nodes down, wiped (and
/// repaired) or partitioned; changes by calls that overlap in time are ordered by their
/// versions (fencing IDs of the pool). Any number of producers may change one pool at once.
/// A unit is a name: not empty, at most 512 bytes, no control character.
///
/// # Not guaranteed
/// A call that failed may have changed some units (`Error::is_outcome_unknown`). Removed
/// units are kept as tombstones on the nodes for now.
#[derive(Clone, Debug)]
pub struct Units {
    client: Client,
    key: String,
    stamp: String,
    versions: IdGenerator,
}

impl Units {
    /// The units of `pool`.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid pool name.
    pub fn new(client: &Client, pool: &str) -> Result<Units, Error> {
        let pool = Name::new("pool", pool)?;
        Ok(Units {
            client: client.clone(),
            key: pool.key(KeyKind::Units),
            stamp: pool.key(KeyKind::UnitStamp),
            versions: IdGenerator::with_kind(client, pool.as_str(), KeyKind::UnitVersion)?,
        })
    }

    /// Add `units` (1,000 per round trip).
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid unit (nothing was sent); [`Error::NoQuorum`] without a
    /// majority (the units of earlier batches stay added).
    ///
    /// # Cancel safety
    /// A dropped call may have added some of the units.
    pub async fn add(&self, units: &[String]) -> Result<(), Error> {
        self.change(units, true).await
    }

    /// Remove `units`: no table computed after this returns assigns them.
    ///
    /// # Errors
    /// As [`add`](Units::add).
    ///
    /// # Cancel safety
    /// A dropped call may have removed some of the units.
    pub async fn remove(&self, units: &[String]) -> Result<(), Error> {
        self.change(units, false).await
    }

    async fn change(&self, units: &[String], added: bool) -> Result<(), Error> {
        for u in units {
            Name::new("unit", u)?;
        }
        for chunk in units.chunks(BATCH) {
            let versions = self.versions.next_ids(chunk.len() as u64).await?;
            let entries: Vec<(String, u64)> = chunk
                .iter()
                .zip(versions)
                .map(|(u, v)| entry(v, added).map(|e| (u.clone(), e)))
                .collect::<Result<_, _>>()?;
            let step = write_step(&self.key, &self.stamp, &entries);
            self.client
                .decide(Request::vote("units.write"), step)
                .await?;
        }
        Ok(())
    }

    /// Every unit present, as a majority holds them, sorted.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn list(&self) -> Result<BTreeSet<String>, Error> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.key);
        let read = Step::read(vec![cmd], |_, v| {
            decode::value::<BTreeMap<String, String>>(v)
        });
        let tally = self
            .client
            .decide(Request::vote("units.read").wait_all(), read)
            .await?;
        Ok(merge(tally.replies().map(|(_, h)| h)))
    }
}

/// The entry of a change at `version`: `version * 2 + 1` for an add, `version * 2` for a
/// remove (below 2^53).
fn entry(version: u64, added: bool) -> Result<u64, Error> {
    version
        .checked_mul(2)
        .map(|e| e + u64::from(added))
        .filter(|e| *e < VALUE_LIMIT)
        .ok_or(Error::Exhausted {
            sequence: "unit versions".into(),
            limit: VALUE_LIMIT / 2,
        })
}

/// The units present after merging the nodes' registers: per unit the highest entry, present
/// when it is odd. An entry that does not parse is ignored (the script refuses to raise it).
pub(crate) fn merge<'a>(
    nodes: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> BTreeSet<String> {
    let mut best: BTreeMap<&str, u64> = BTreeMap::new();
    for node in nodes {
        for (unit, e) in node {
            if let Ok(e) = e.parse::<u64>() {
                let b = best.entry(unit).or_insert(0);
                *b = (*b).max(e);
            }
        }
    }
    best.into_iter()
        .filter(|(_, e)| e % 2 == 1)
        .map(|(u, _)| u.to_string())
        .collect()
}

/// `units.lua` for these entries, marker-guarded; the node's change stamp starts at a random
/// value where missing (so a restarted count never repeats one a leader saw).
fn write_step(key: &str, stamp: &str, entries: &[(String, u64)]) -> Step<()> {
    let start = rand::random::<u64>() >> 24;
    let mut call = script_call(&UNITS, Guard::Marker)
        .key(key)
        .marker_key()
        .key(stamp)
        .marker()
        .arg(start);
    for (unit, e) in entries {
        call = call.arg(unit).arg(*e);
    }
    call.decode(|_, v| {
        let raised: i64 = redis::from_redis_value(v)?;
        Ok(if raised >= 0 {
            NodeOutcome::Applied(())
        } else {
            NodeOutcome::Rejected(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(entries: &[(&str, u64)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(u, e)| (u.to_string(), e.to_string()))
            .collect()
    }

    #[test]
    fn the_highest_entry_of_a_majority_decides() {
        let a = node(&[("x", 3), ("y", 5), ("z", 8)]); // x added at 1, y at 2, z removed at 4
        let b = node(&[("x", 6), ("y", 5)]); // x removed at 3 (a missed it)
        let c = node(&[("z", 11), ("w", 10)]); // z added again at 5, w only ever removed
        let got = merge([&a, &b, &c].into_iter());
        let want: BTreeSet<String> = ["y", "z"].iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn entries_encode_the_version_and_the_change() {
        assert_eq!(entry(7, true).ok(), Some(15));
        assert_eq!(entry(7, false).ok(), Some(14));
        assert!(
            entry(VALUE_LIMIT / 2, true).is_err(),
            "no entry reaches 2^53"
        );
    }

    #[test]
    fn a_write_is_a_marker_guarded_script_with_its_entries() {
        let step = write_step(
            "rq:units:p",
            "rq:ustamp:p",
            &[("a".into(), 3), ("b".into(), 4)],
        );
        assert!(step.is_guarded());
        let args = step.args_for_tests("r/c");
        assert_eq!(args[0], "r/c");
        assert!(
            args[1].parse::<u64>().is_ok_and(|s| s < 1 << 40),
            "stamp start"
        );
        assert_eq!(args[2..], ["a", "3", "b", "4"]);
    }
}
