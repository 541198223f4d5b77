//! The units of a pool, stored on the quorum nodes: add, remove, replace all, list.
//!
//! Each node holds a hash `rq:units:<pool>` of `unit -> version * 2 + (1 if added, 0 if
//! removed)`. Versions come from the pool's own fencing-ID sequence (`rq:uver:<pool>`), so a
//! change that finished before another began has the lower version. A change writes its
//! entries to a majority (`units.lua`: an entry is only ever raised, marker-guarded); a read
//! takes every entry from a majority and keeps, per unit, the highest: a unit added (or
//! removed) before a read starts is seen so by that read, whatever node failed in between.
//! Adding or removing units costs O(units changed) per node, not O(pool size). Removed units
//! stay as entries (tombstones) until collected: a collection reads every node, raises the
//! pool's floor (`rq:ufloor:<pool>`) above the removals every node holds alike, on every node,
//! then deletes them; `units.lua` refuses entries below the floor, so a write delayed in the
//! network cannot bring a collected unit back (`units_gc.lua`).
//!
//! The same hash holds the pool's settings, under field names no unit can have (they contain
//! U+001F, a control character, which names refuse), with the same entries and the same
//! highest-version-wins rule: `pin<US><unit><US><member>` (odd: pinned to that member; even,
//! with an empty member: unpinned) and `drain<US><member>` (odd: drained; even: not). So a
//! setting costs one entry, is seen by every later read, is repaired like a unit, and moves
//! the leader's change stamp like one.

use std::collections::{BTreeMap, BTreeSet};

use crate::client::{decode, script_call, Client, Guard, Request, ScriptCall, Step};
use crate::error::Error;
use crate::id::IdGenerator;
use crate::keys::{fixed_key, KeyKind, Name};
use crate::quorum::NodeOutcome;
use crate::scripts::{UNITS, UNITS_GC, VALUE_LIMIT};

/// Units written per script call: few enough that a call fits the node timeout, to which
/// every writing vote is held (a repair waits no longer for writes in flight). A call of
/// 1,000 units overran the 250 ms default on a heavily loaded test machine (load 15 on 2
/// cores).
const BATCH: usize = 250;

/// Separates the parts of a setting's field name (U+001F, which no name may contain).
const SEP: char = '\u{1f}';

/// A pool's operator settings: pinned units and drained members.
///
/// A pin is honoured while its unit exists and its member is present; a member ID away within
/// its restart grace is still present (its pinned units wait for it, unworked); past the
/// grace, a pinned unit is shared like any other until the member is back. Draining every
/// member with a weight leaves the unpinned units unowned. A drained member stays
/// a member of the pool (it keeps its place in the view and its pins) but owns no other unit;
/// its units are handed over through the barrier like any other change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolSettings {
    /// Unit -> the member ID it is pinned to.
    pub pins: BTreeMap<String, String>,
    /// Drained member IDs.
    pub drained: BTreeSet<String>,
}

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
/// units are kept as tombstones on the nodes until [`collect_removed`](Units::collect_removed)
/// (a pool's leader runs it every 10 minutes) finds every node up.
#[derive(Clone, Debug)]
pub struct Units {
    client: Client,
    keys: UnitKeys,
    versions: IdGenerator,
}

/// The keys of a pool's unit register on each node.
#[derive(Clone, Debug)]
pub(crate) struct UnitKeys {
    /// The register (hash: field -> entry).
    pub(crate) units: String,
    /// The change stamp.
    pub(crate) stamp: String,
    /// The collection floor.
    pub(crate) floor: String,
    /// The change log (field -> stamp of its last raise).
    pub(crate) log: String,
    /// The change log's epoch.
    pub(crate) epoch: String,
}

impl UnitKeys {
    pub(crate) fn new(pool: &Name) -> UnitKeys {
        UnitKeys {
            units: pool.key(KeyKind::Units),
            stamp: pool.key(KeyKind::UnitStamp),
            floor: pool.key(KeyKind::UnitFloor),
            log: pool.key(KeyKind::UnitLog),
            epoch: pool.key(KeyKind::UnitEpoch),
        }
    }
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
            keys: UnitKeys::new(&pool),
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

    /// Replace the pool's units by `units`: the ones missing are added first, then the ones
    /// not in `units` are removed (units in both are not touched, so their owners keep them).
    ///
    /// Not atomic: a reader in between sees the old units plus some new ones, never a unit
    /// outside both sets; a concurrent change by another producer is ordered by its version as
    /// usual (a unit it adds after this call read the pool stays).
    ///
    /// # Errors
    /// As [`add`](Units::add); [`Error::NoQuorum`] also for the read of the current units.
    ///
    /// # Cancel safety
    /// A dropped call may have added or removed some of the units.
    pub async fn replace_all(&self, units: &[String]) -> Result<(), Error> {
        for u in units {
            Name::new("unit", u)?;
        }
        let want: BTreeSet<&String> = units.iter().collect();
        let current = self.list().await?;
        let missing: Vec<String> = want
            .iter()
            .filter(|u| !current.contains(**u))
            .map(|u| (*u).clone())
            .collect();
        self.add(&missing).await?;
        let extra: Vec<String> = current.into_iter().filter(|u| !want.contains(u)).collect();
        self.remove(&extra).await
    }

    /// Pin `unit` to the member `id`: every later table gives the unit to that member while
    /// it is present (whatever its weight, drained or not). A later pin of the same unit
    /// replaces this one. Pinning a unit does not add it.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid unit or ID (nothing was sent); [`Error::NoQuorum`]
    /// without a majority.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have pinned the unit.
    pub async fn pin(&self, unit: &str, id: &str) -> Result<(), Error> {
        Name::new("unit", unit)?;
        Name::new("member", id)?;
        self.write(&[(format!("pin{SEP}{unit}{SEP}{id}"), true)])
            .await
    }

    /// Unpin `units`: they are shared by weight again in later tables.
    ///
    /// # Errors
    /// As [`pin`](Units::pin).
    ///
    /// # Cancel safety
    /// A dropped call may have unpinned some of the units.
    pub async fn unpin(&self, units: &[String]) -> Result<(), Error> {
        for u in units {
            Name::new("unit", u)?;
        }
        let fields: Vec<(String, bool)> = units
            .iter()
            .map(|u| (format!("pin{SEP}{u}{SEP}"), false))
            .collect();
        self.write(&fields).await
    }

    /// Drain the member `id` (`true`) or end its drain (`false`). A drained member stays a
    /// member and keeps its pinned units; its other units are handed to the others through
    /// the barrier (its drain hook runs, it acknowledges or its lease ends, before a new owner
    /// starts).
    ///
    /// # Errors
    /// As [`pin`](Units::pin).
    ///
    /// # Cancel safety
    /// A dropped call may or may not have changed the setting.
    pub async fn drain(&self, id: &str, drained: bool) -> Result<(), Error> {
        Name::new("member", id)?;
        self.write(&[(format!("drain{SEP}{id}"), drained)]).await
    }

    /// The pool's settings, as a majority holds them.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn settings(&self) -> Result<PoolSettings, Error> {
        Ok(merge_all(self.read().await?.iter()).1)
    }

    async fn change(&self, units: &[String], added: bool) -> Result<(), Error> {
        for u in units {
            Name::new("unit", u)?;
        }
        let fields: Vec<(String, bool)> = units.iter().map(|u| (u.clone(), added)).collect();
        self.write(&fields).await
    }

    /// Raise each field's entry to a new version (odd when `true`), 1,000 per round trip. A
    /// batch refused for being below a collection floor (its versions were taken before a
    /// concurrent collection) is retried with new versions.
    async fn write(&self, fields: &[(String, bool)]) -> Result<(), Error> {
        for chunk in fields.chunks(BATCH) {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let versions = self.versions.next_ids(chunk.len() as u64).await?;
                let entries: Vec<(String, u64)> = chunk
                    .iter()
                    .zip(versions)
                    .map(|((f, set), v)| entry(v, *set).map(|e| (f.clone(), e)))
                    .collect::<Result<_, _>>()?;
                let step = write_step(&self.keys, &entries);
                // Within the node timeout, as every writing vote (`Request::node_deadline`):
                // a repair waits no longer for writes in flight.
                let request = Request::vote("units.write");
                let tally = self.client.send(request, step).await;
                let below_floor = tally
                    .results()
                    .iter()
                    .any(|r| matches!(r.outcome, NodeOutcome::Rejected(BELOW_FLOOR)));
                if !tally.reached() && below_floor && attempt < 3 {
                    continue;
                }
                self.client
                    .require_majority("units.write", tally, |_| String::new())?;
                break;
            }
        }
        Ok(())
    }

    /// Collect removed units (and ended drains): entries that are removals on every node alike
    /// are deleted from every node, after the pool's collection floor was raised above them on
    /// every node, so that no write still in flight with an older version can bring a removed
    /// unit back (it is refused). Returns how many entries were collected.
    ///
    /// Collects nothing (`Ok(0)`) unless every node answers and accepts the floor: a node that
    /// is down keeps every removal until a later collection. Pins are not collected.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] when not even a majority answers the read.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped call leaves a raised floor and some removals deleted, both safe.
    pub async fn collect_removed(&self) -> Result<usize, Error> {
        self.collect(true).await
    }

    /// TEST ONLY: [`collect_removed`](Self::collect_removed) without raising the floor first
    /// (so a delayed old write can resurrect a collected unit).
    ///
    /// # Errors
    /// As [`collect_removed`](Self::collect_removed).
    ///
    /// # Cancel safety
    /// As [`collect_removed`](Self::collect_removed), without the floor's protection.
    #[cfg(feature = "test-util")]
    pub async fn collect_removed_without_floor_for_tests(&self) -> Result<usize, Error> {
        self.collect(false).await
    }

    /// TEST ONLY: replay an add of `unit` at `version` on the node at `node` alone, as a write
    /// delayed in the network would land; true when that node applied it.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid unit.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have written the entry.
    #[cfg(feature = "test-util")]
    pub async fn replay_add_for_tests(
        &self,
        unit: &str,
        version: u64,
        node: usize,
    ) -> Result<bool, Error> {
        Name::new("unit", unit)?;
        let step = write_step(&self.keys, &[(unit.to_string(), entry(version, true)?)]);
        let steps =
            crate::client::Steps::per_node(move |ctx| (ctx.node == node).then(|| step.clone()));
        let tally = self
            .client
            .send(Request::vote("units.replay").wait_all(), steps)
            .await;
        Ok(tally
            .results()
            .iter()
            .any(|r| r.node.0 == node && r.outcome.is_applied()))
    }

    /// A `units_gc.lua` call in `mode`, its keys and marker placed (arguments follow).
    fn gc_call(&self, mode: &str) -> ScriptCall {
        script_call(&UNITS_GC, Guard::Marker)
            .key(&self.keys.units)
            .marker_key()
            .key(&self.keys.floor)
            .key(&self.keys.log)
            .key(&self.keys.stamp)
            .key(&self.keys.epoch)
            .marker()
            .arg(mode)
    }

    async fn collect(&self, floor_first: bool) -> Result<usize, Error> {
        let nodes = self.client.node_urls().len();
        let all = self.read().await?;
        if all.len() < nodes {
            return Ok(0);
        }
        let candidates = removals_everywhere(&all);
        let Some(top) = candidates.iter().map(|(_, e)| *e).max() else {
            return Ok(0);
        };
        if floor_first {
            let step = self
                .gc_call("floor")
                .arg(top + 1)
                .decode(|_, v| decode::one_applied(v));
            let tally = self
                .client
                .send(Request::vote("units.gc.floor").wait_all(), step)
                .await;
            if tally.applied() < nodes {
                return Ok(0);
            }
        }
        for chunk in candidates.chunks(BATCH) {
            let mut call = self.gc_call("delete");
            for (field, e) in chunk {
                call = call.arg(field).arg(*e);
            }
            let step = call.decode(|_, v| decode::count_or_refusal(v));
            self.client
                .send(Request::vote("units.gc.delete").wait_all(), step)
                .await;
        }
        Ok(candidates.len())
    }

    /// Every unit present, as a majority holds them, sorted.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn list(&self) -> Result<BTreeSet<String>, Error> {
        Ok(merge_all(self.read().await?.iter()).0)
    }

    /// Every node's register, from a majority (and every node that answers in time).
    async fn read(&self) -> Result<Vec<BTreeMap<String, String>>, Error> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.keys.units);
        // Decoded off the async runtime (megabytes for a large pool).
        let read = Step::read(vec![cmd], |_, v| Ok(NodeOutcome::Applied(v)));
        let tally = self
            .client
            .decide(
                Request::vote("units.read")
                    .wait_all()
                    .within(self.client.config().operation_timeout())
                    .reads_only(),
                read,
            )
            .await?;
        let raw: Vec<redis::Value> = tally.replies().map(|(_, v)| v.clone()).collect();
        super::blocking(move || {
            raw.into_iter()
                .map(|v| {
                    Ok(
                        redis::from_redis_value::<Option<BTreeMap<String, String>>>(v)
                            .map_err(|e| Error::Internal(format!("a unit register: {e}")))?
                            .unwrap_or_default(),
                    )
                })
                .collect()
        })
        .await
    }
}

/// A new change-log epoch id (random, 16 hex digits).
pub(crate) fn epoch_id() -> String {
    format!("{:016x}", rand::random::<u64>())
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

/// The units present and the settings after merging the nodes' registers: per field the
/// highest entry; a unit is present when its entry is odd; a unit's pin is its pin field with
/// the highest entry, when odd; a member is drained when its drain entry is odd. An entry that
/// does not parse is ignored (the script refuses to raise it).
pub(crate) fn merge_all<'a>(
    nodes: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> (BTreeSet<String>, PoolSettings) {
    let mut best: BTreeMap<&str, u64> = BTreeMap::new();
    for node in nodes {
        for (field, e) in node {
            if let Ok(e) = e.parse::<u64>() {
                let b = best.entry(field).or_insert(0);
                *b = (*b).max(e);
            }
        }
    }
    merge_best(best.into_iter())
}

/// The units present and the settings from the highest entry of every field (as
/// [`merge_all`] after its per-field maximum).
pub(crate) fn merge_best<'a>(
    best: impl Iterator<Item = (&'a str, u64)>,
) -> (BTreeSet<String>, PoolSettings) {
    let mut units = BTreeSet::new();
    let mut settings = PoolSettings::default();
    // Per unit, the pin field with the highest entry: (entry, member).
    let mut pins: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for (field, e) in best {
        if !field.contains(SEP) {
            if e % 2 == 1 {
                units.insert(field.to_string());
            }
            continue;
        }
        let mut parts = field.split(SEP);
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("pin"), Some(unit), Some(member), None) => {
                let p = pins.entry(unit).or_insert((e, member));
                if e > p.0 {
                    *p = (e, member);
                }
            }
            (Some("drain"), Some(member), None, None) if e % 2 == 1 => {
                settings.drained.insert(member.to_string());
            }
            _ => {}
        }
    }
    settings.pins = pins
        .into_iter()
        .filter(|(_, (e, m))| e % 2 == 1 && !m.is_empty())
        .map(|(u, (_, m))| (u.to_string(), m.to_string()))
        .collect();
    (units, settings)
}

/// The reply of `units.lua` for entries below the collection floor.
const BELOW_FLOOR: i64 = -2;

/// Entries that are removals (even) with the same value on every node of `all`: units and
/// drains, never pins (an older pin of the same unit could otherwise win again).
fn removals_everywhere(all: &[BTreeMap<String, String>]) -> Vec<(String, u64)> {
    let Some((first, rest)) = all.split_first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter(|(f, _)| !f.starts_with(&format!("pin{SEP}")))
        .filter_map(|(f, e)| {
            let n = e.parse::<u64>().ok().filter(|n| n % 2 == 0)?;
            rest.iter()
                .all(|node| node.get(f) == Some(e))
                .then(|| (f.clone(), n))
        })
        .collect()
}

/// `units.lua` for these entries, marker-guarded; the node's change stamp starts at a random
/// value where missing (so a restarted count never repeats one a leader saw). Applied with
/// the number of entries raised; rejected with -1 (marker) or [`BELOW_FLOOR`].
fn write_step(keys: &UnitKeys, entries: &[(String, u64)]) -> Step<i64> {
    let start = rand::random::<u64>() >> 24;
    let mut call = script_call(&UNITS, Guard::Marker)
        .key(&keys.units)
        .marker_key()
        .key(&keys.stamp)
        .key(&keys.floor)
        .key(&keys.log)
        .key(&keys.epoch)
        .key(fixed_key(KeyKind::Marked))
        .marker()
        .arg(start)
        .arg(epoch_id());
    for (unit, e) in entries {
        call = call.arg(unit).arg(*e);
    }
    call.decode(|_, v| decode::count_or_refusal(v))
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
        let got = merge_all([&a, &b, &c].into_iter()).0;
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
        let keys = UnitKeys::new(&Name::new("pool", "p").expect("name"));
        let step = write_step(&keys, &[("a".into(), 3), ("b".into(), 4)]);
        assert!(step.is_guarded());
        let args = step.args_for_tests("r/c");
        assert_eq!(args[0], "r/c");
        assert!(
            args[1].parse::<u64>().is_ok_and(|s| s < 1 << 40),
            "stamp start"
        );
        assert_eq!(args[2].len(), 16, "a new epoch id");
        assert_eq!(args[3..], ["a", "3", "b", "4"]);
    }

    #[test]
    fn settings_share_the_register_and_the_latest_version_wins() {
        let pin = |u: &str, m: &str| format!("pin{SEP}{u}{SEP}{m}");
        let drain = |m: &str| format!("drain{SEP}{m}");
        // x pinned to a at 2, then to b at 5 (node b missed the second); y pinned at 3,
        // unpinned at 6; m drained at 4; n drained at 1, undrained at 7.
        let a = node(&[
            ("x", 1),
            (&pin("x", "a"), 5),
            (&pin("x", "b"), 11),
            (&drain("m"), 9),
        ]);
        let b = node(&[
            (&pin("x", "a"), 5),
            (&pin("y", "c"), 7),
            (&pin("y", ""), 12),
        ]);
        let c = node(&[(&drain("n"), 3), (&drain("n"), 14)]);
        let (units, settings) = merge_all([&a, &b, &c].into_iter());
        assert_eq!(units, ["x".to_string()].into(), "settings are not units");
        assert_eq!(
            settings.pins,
            [("x".to_string(), "b".to_string())].into(),
            "the later pin wins; an unpin clears"
        );
        assert_eq!(settings.drained, ["m".to_string()].into());
    }
}
