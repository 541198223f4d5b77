//! Leases without node clocks: the pure decision core of every lease (a lock, a leader's lease,
//! a member's beats, a repair claim): validity, watching, takeover and expiry, with time passed
//! in. No I/O, no clock reads, no Redis: table-tested.
//!
//! # How it works
//! No safety decision reads a node's wall clock (Redis key expiry included); only clients'
//! monotonic clocks decide, each assumed within [`MAX_DRIFT_RATE`] of real time, with a margin
//! `drift(ttl)` = 1 % of the lease time plus 2 ms.
//! 1. **Holder side**: a lease is valid from the *send* of its last write a majority applied,
//!    for `ttl - drift` (`validity`).
//! 2. **Watcher side**: a [`Watch`] records, per node, the state it showed (a value that never
//!    repeats) with the node incarnation that showed it and when it was first seen unchanged.
//! 3. A watcher may treat the lease as over only after a majority showed one state unchanged
//!    for `ttl + drift` (`watch_window`, `quiet_for`) from the receipt of the first reply that
//!    showed it; `plan_with` then says whether an acquisition goes at once (no key on a majority),
//!    swaps the watched state, or waits. The window is the lease's own (stored) TTL's, never
//!    the watcher's: a one-shot watch is bounded by `one_shot_watch`, twice the window of the
//!    longest TTL it knows; a caller whose own limit ends first is told, by `quiet_lease`,
//!    that the lease looks abandoned (unchanged on a majority for half its TTL, where a live
//!    holder extends every third of it) and when a takeover can go.
//! 4. `judge_extension` says what an extension's tally means; `beats.rs` applies the same watch
//!    to a group's beats (a member is gone only after its beat stayed unchanged).
//!
//! # Guarantees
//! With clock rates within [`MAX_DRIFT_RATE`] (0.5 %) of real time, a holder's validity ends
//! before any watcher acts on its lease (the argument is on [`MAX_DRIFT_RATE`]): the holder's last
//! write applied on a majority meets the watcher's majority at a node where it landed before the
//! watcher's first reading. Not guaranteed: anything about clocks running faster or slower than
//! that rate; a process paused past its validity notices nothing while paused.
//!
//! # Invariants
//! - Architecture invariant: a watcher acts on a lease only after seeing the same never-repeating
//!   state (random value + version, or a beat sequence) on the same node incarnation for the
//!   lease time plus drift; a takeover compare-and-swap carries that incarnation, so a node that
//!   restarted or was repaired in between refuses it.
//! - A node that restarts or loses its data shows another marker (`<run_id>.<epoch>`), which
//!   restarts every watch of it.
//! - Nothing here reads a clock or does I/O: instants and readings come in as arguments.
//!
//! Why this is a sibling of `lock/` and not inside it: see the module docs of `src/lock/mod.rs`
//! (the beats, the repair claim, elections, errors and metrics use these rules too).
//!
//! # What it relies on outside this folder
//! - Keys, scripts, repair rule, ACL: none (it decides from readings its callers take: the lock's
//!   `rq:lock:` keys, a group's beats, the repair claim `rq:repairing`).
//! - `crate::clock::Instant` (the monotonic instant type, tokio's, so paused-time tests move it).
//! - Model: `model/src/leases.rs` (the takeover wait and the drift margin; planted bugs "takeover
//!   without the wait", "no drift margin") and `model/src/views.rs` (the leader's watch of beats,
//!   "validity beyond the watch window").
//! - Tests: the unit tests here and in `beats.rs`; `tests/lease_safety.rs` (node clock steps,
//!   with teeth), `tests/locks.rs` (a lapsed lease taken over only after the watch),
//!   `tests/membership.rs` (a member judged gone on the leader's clock).
//!
//! # Files
//! - `mod.rs`: drift and validity, [`Watch`], the acquisition plan (`plan_with`), `quiet_for`,
//!   `one_shot_watch`, `quiet_lease`, `judge_extension`, [`LossReason`].
//! - `beats.rs`: the leader's watch over a group's beats (`Beats`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

/// The pure decision core of every lease: validity, watching, takeover and expiry, with time
/// passed in. No I/O, no clock reads, no Redis: table-tested below.
///
/// # The rule this module implements
/// No safety decision reads a node's wall clock (Redis key expiry included): a node's clock may
/// step at any time. Only the clients' monotonic clocks decide, and they are assumed to run at
/// a rate within [`MAX_DRIFT_RATE`] of real time.
/// - **Holder side.** A lease (or membership beat) is valid on its holder from the *send* time
///   of its last write that a majority applied, for `ttl - drift(ttl)`. A lock extension counts
///   from an instant taken before its version was (`versioned_at`), which is before its send:
///   batched extensions wait up to TTL/30 for company, and a later version may overtake them.
/// - **Watcher side.** Another client may treat a lease as over only after it has seen the same
///   value (which never repeats: a random per-acquisition value plus a version that every
///   extension bumps), on the same node incarnation (`run_id`), for `ttl + drift(ttl)` counted
///   from the *receipt* of the first reply that showed it. For a lock it then replaces exactly
///   that value by compare-and-swap, bound to that incarnation.
///
/// Why that is enough: let E be the holder's last write applied on a majority M_E, sent at s.
/// The watcher acts on a majority M_W whose every node showed an unchanged value from its
/// first reading r_n to its last (or its compare-and-swap) c_n. M_E and M_W share a node n. E
/// cannot have been applied at n between r_n and c_n (the value would have changed, and values
/// never repeat on one incarnation), nor after c_n (a lock's key is then someone else's, so E
/// is rejected there; for a beat, see the membership docs), so it was applied before r_n, and
/// s < r_n. (A lock extension with version v that finds a higher version w already at n
/// changes nothing there and still answers "applied": then w, taken after v's stamp, was sent
/// and applied at n before r_n or between r_n and c_n; the latter would have changed the value,
/// so stamp(v) < send(w) < r_n, and the validity from stamp(v) ends in time all the same.) The holder's validity ends at s + ttl - drift on its clock; the watcher acts at
/// r_n + ttl + drift or later on its clock: with rates within [`MAX_DRIFT_RATE`] of real time,
/// the first comes first. A node that restarts or loses its data changes its `run_id`, which
/// restarts every watch of it, and a compare-and-swap carries the incarnation it watched.
///
/// The largest rate difference between a client's monotonic clock and real time that the
/// margins cover: 0.5 %. (NTP slews a clock by at most 0.05 %.)
pub const MAX_DRIFT_RATE: f64 = 0.005;

/// The margin taken off (holder) or added to (watcher) a lease time: 1 % of it plus 2 ms
/// (timer granularity), which covers [`MAX_DRIFT_RATE`] on both sides.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a holder's lease is valid after the send of its last write a majority applied.
pub(crate) fn validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(drift(ttl))
}

/// End of a holder's validity for a write sent at `sent`.
#[cfg_attr(not(test), allow(dead_code))] // membership uses it
pub(crate) fn valid_until(sent: Instant, ttl: Duration) -> Instant {
    sent + validity(ttl)
}

/// How long a watcher must see a value unchanged before it may treat the lease as over.
pub(crate) fn watch_window(ttl: Duration) -> Duration {
    ttl + drift(ttl)
}

/// Whether a holder looks abandoned to a reader that has seen its lease unchanged on a
/// majority for `unchanged` (see [`quiet_for`]): at least the lease's own `ttl` plus drift,
/// the window after which a contender may take the lease over. `None` (no history) never does.
pub(crate) fn looks_abandoned(unchanged: Option<Duration>, ttl: Duration) -> bool {
    unchanged.is_some_and(|u| u >= watch_window(ttl))
}

/// For how long `needed` nodes have each shown the lease `value` unchanged (same version, same
/// node incarnation), between their first and their latest reading: the `needed`-th longest of
/// those spans. Only nodes read before their latest reading count (a single reading says
/// nothing about how long a state lasted); `None` when fewer than `needed` such nodes show
/// `value`. A reading that found the lease changed counts with a span of zero.
pub(crate) fn quiet_for(watch: &Watch<KeyState>, value: &str, needed: usize) -> Option<Duration> {
    let mut spans: Vec<Duration> = (0..watch.len())
        .filter_map(|i| watch.span_with_history(i))
        .filter(|(seen, _)| matches!(&seen.state, KeyState::Held { value: v, .. } if &**v == value))
        .map(|(_, span)| span)
        .collect();
    spans.sort_unstable_by(|a, b| b.cmp(a));
    spans.get(needed.checked_sub(1)?).copied()
}

/// The longest lease time a lease may have (`crate::lock::MAX_TTL` is this): a stored lease
/// time above it is a corrupted value, and a one-shot watch counts it as this one, so a
/// corrupted `t` field cannot keep a one-shot caller watching for ages.
pub(crate) const MAX_LEASE_TIME: Duration = Duration::from_secs(24 * 3600);

/// How long a one-shot acquisition (`Lock::try_acquire`) may watch a held lease before it
/// gives up: twice the watch window of the longest lease time it knows of, its own `ttl` or
/// one a node stores for the lease it holds (`longest_ttl`), so a lease abandoned by a holder
/// with a longer TTL than the caller's is outwaited and taken over, whatever the caller's
/// own TTL. Twice: the watch of a node starts again when its state changes (a contender's
/// copy that came and went), and the first reading may come late.
pub(crate) fn one_shot_watch(ttl: Duration, watch: &Watch<KeyState>) -> Duration {
    watch_window(ttl.max(longest_ttl(watch)).min(MAX_LEASE_TIME)) * 2
}

/// The longest lease time among the held states `watch` shows now (zero when none).
pub(crate) fn longest_ttl(watch: &Watch<KeyState>) -> Duration {
    (0..watch.len())
        .filter_map(|i| match watch.get(i) {
            Some((
                Seen {
                    state: KeyState::Held { ttl, .. },
                    ..
                },
                _,
            )) => Some(*ttl),
            _ => None,
        })
        .max()
        .unwrap_or_default()
}

/// A lease that looks abandoned to a caller whose own limit ended before it could be taken
/// over (see [`quiet_lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuietLease {
    /// The lease's own (stored) lease time.
    pub(crate) ttl: Duration,
    /// For how long a majority showed it unchanged (see [`quiet_for`]).
    pub(crate) quiet_for: Duration,
    /// The earliest instant a takeover round can go, if it stays unchanged.
    pub(crate) ready_at: Instant,
}

/// Whether the lease a majority holds looks abandoned to a caller whose limit ends at `now`
/// before a takeover could go: one value held on `needed` nodes of the watch, shown unchanged
/// there for at least half its own lease time (a live holder that reaches a majority extends
/// every third of it, so it changes well within half), and the plan still waiting (a takeover
/// can go at `ready_at`, after `now`). `None` otherwise: nobody holds it on a majority, the
/// holder showed it is alive within the last half lease time, this caller watched it too
/// briefly to tell, or a round could go now.
pub(crate) fn quiet_lease(
    watch: &Watch<KeyState>,
    needed: usize,
    now: Instant,
    window_of: fn(Duration) -> Duration,
) -> Option<QuietLease> {
    let (value, ttl) = held_by_majority(watch, needed)?;
    let quiet_for = quiet_for(watch, &value, needed)?;
    if quiet_for < ttl / 2 {
        return None;
    }
    match plan_with(watch, needed, now, window_of) {
        Plan::WaitUntil(ready_at) if ready_at > now => Some(QuietLease {
            ttl,
            quiet_for,
            ready_at,
        }),
        _ => None,
    }
}

/// The value that at least `needed` nodes of `watch` hold now, with the longest lease time
/// they store for it.
fn held_by_majority(watch: &Watch<KeyState>, needed: usize) -> Option<(Arc<str>, Duration)> {
    let held: Vec<(&Arc<str>, Duration)> = (0..watch.len())
        .filter_map(|i| match watch.get(i) {
            Some((
                Seen {
                    state: KeyState::Held { value, ttl, .. },
                    ..
                },
                _,
            )) => Some((value, *ttl)),
            _ => None,
        })
        .collect();
    held.iter().find_map(|(value, _)| {
        let same: Vec<Duration> = held
            .iter()
            .filter(|(v, _)| v == value)
            .map(|(_, t)| *t)
            .collect();
        let ttl = same.iter().max().copied()?;
        (same.len() >= needed).then(|| ((*value).clone(), ttl))
    })
}

/// One node's observed state, tied to the node incarnation that showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen<S> {
    /// The node's `run_id` (its marker) when it answered.
    pub(crate) run_id: Arc<str>,
    /// What it showed.
    pub(crate) state: S,
}

/// Per-node observations with the instant each one was first seen unchanged.
#[derive(Clone, Debug)]
pub(crate) struct Watch<S> {
    nodes: Vec<Option<Observed<S>>>,
}

/// One node's current observation in a [`Watch`].
#[derive(Clone, Debug)]
struct Observed<S> {
    /// What it showed.
    seen: Seen<S>,
    /// When first seen so, and when last seen so.
    first: Instant,
    last: Instant,
    /// When the node was first read at all (kept across changes, until it is forgotten): a
    /// node read only once has no history to tell how long its state lasted.
    since: Instant,
}

impl<S: Clone + PartialEq> Watch<S> {
    /// A watch of `n` nodes that has seen nothing yet.
    pub(crate) fn new(n: usize) -> Self {
        Watch {
            nodes: vec![None; n],
        }
    }

    /// Record that node `i` showed `seen`, in a reply received at `at`. A different state or
    /// incarnation restarts that node's watch; the same one keeps its first instant. A node
    /// that did not answer is simply not observed (its earlier observation stands: values never
    /// repeat, so an unchanged value at two readings means unchanged in between).
    pub(crate) fn observe(&mut self, i: usize, seen: Seen<S>, at: Instant) {
        // A client that followed a change to a longer node list reads nodes beyond the ones
        // this watch was made for: watch them too.
        if i >= self.nodes.len() && i < crate::MAX_NODES {
            self.nodes.resize(i + 1, None);
        }
        let Some(slot) = self.nodes.get_mut(i) else {
            return;
        };
        match slot {
            Some(old) if old.seen == seen => old.last = at,
            _ => {
                let since = slot.as_ref().map_or(at, |old| old.since);
                *slot = Some(Observed {
                    seen,
                    first: at,
                    last: at,
                    since,
                })
            }
        }
    }

    /// Forget node `i` (e.g. it answered with an error that says nothing about its state).
    pub(crate) fn forget(&mut self, i: usize) {
        if let Some(slot) = self.nodes.get_mut(i) {
            *slot = None;
        }
    }

    /// What node `i` showed, and since when.
    pub(crate) fn get(&self, i: usize) -> Option<(&Seen<S>, Instant)> {
        self.nodes
            .get(i)
            .and_then(Option::as_ref)
            .map(|o| (&o.seen, o.first))
    }

    /// How long node `i` has been seen unchanged, between its first and its latest reading
    /// (what a watcher without a compare-and-swap may rely on).
    pub(crate) fn span(&self, i: usize) -> Option<Duration> {
        self.nodes
            .get(i)
            .and_then(Option::as_ref)
            .map(|o| o.last.saturating_duration_since(o.first))
    }

    /// Node `i`'s [`span`](Self::span), if it was read before its latest reading (so the span
    /// says how long its state lasted: zero when it changed at the latest reading), and what
    /// it showed.
    pub(crate) fn span_with_history(&self, i: usize) -> Option<(&Seen<S>, Duration)> {
        self.nodes
            .get(i)
            .and_then(Option::as_ref)
            .filter(|o| o.since < o.last)
            .map(|o| (&o.seen, o.last.saturating_duration_since(o.first)))
    }

    /// Whether node `i` has shown `seen` unchanged for at least `window` at `now`.
    pub(crate) fn unchanged_for(
        &self,
        i: usize,
        seen: &Seen<S>,
        window: Duration,
        now: Instant,
    ) -> bool {
        self.get(i)
            .is_some_and(|(s, since)| s == seen && now.saturating_duration_since(since) >= window)
    }

    /// The instant at which node `i`'s current observation will have lasted `window`.
    pub(crate) fn ready_at(&self, i: usize, window: Duration) -> Option<Instant> {
        self.get(i).map(|(_, since)| since + window)
    }

    /// Number of nodes watched.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// A lock key's state on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyState {
    /// No key: nobody holds the lease on this node.
    Absent,
    /// Held by the acquisition `value`, at extension `version`, for a lease time of `ttl`.
    Held {
        value: Arc<str>,
        version: u64,
        ttl: Duration,
    },
}

/// What an acquisition attempt should send to each node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Grant if the key is still exactly this (compare-and-swap), on this incarnation.
    Swap(Seen<KeyState>),
    /// Only read the state (the node is not ready for a swap).
    Read,
}

/// The next step of an acquisition, decided from the watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Enough nodes are ready: send these asks (one per node) in one round.
    Attempt(Vec<Ask>),
    /// Not yet: a majority can be ready at this instant if nothing changes.
    WaitUntil(Instant),
}

/// Decide an acquisition round from the watch, at `now`, needing `needed` nodes.
///
/// A node is ready when it was last seen with no key (nobody holds the lease there), or with a
/// key unchanged for the key's own lease time plus drift. Nodes never observed are asked to
/// grant if free (the optimistic first round). When fewer than `needed` nodes can be ready,
/// the plan waits until the earliest instant at which `needed` would be.
#[cfg(test)]
pub(crate) fn plan(watch: &Watch<KeyState>, needed: usize, now: Instant) -> Plan {
    plan_with(watch, needed, now, watch_window)
}

/// `plan` (test-only) with the watch window given as a function of the key's lease time (the
/// `test-util` switch "takeover without the wait" passes zero).
pub(crate) fn plan_with(
    watch: &Watch<KeyState>,
    needed: usize,
    now: Instant,
    window_of: fn(Duration) -> Duration,
) -> Plan {
    let mut asks = Vec::with_capacity(watch.len());
    let mut ready = 0usize;
    let mut later: Vec<Instant> = Vec::new();
    for i in 0..watch.len() {
        match watch.get(i) {
            // Never seen: optimistic, grant if free (the script says what it holds otherwise).
            None => {
                asks.push(Ask::Swap(Seen {
                    run_id: "".into(),
                    state: KeyState::Absent,
                }));
                ready += 1;
            }
            Some((seen, _)) => match &seen.state {
                KeyState::Absent => {
                    asks.push(Ask::Swap(seen.clone()));
                    ready += 1;
                }
                KeyState::Held { ttl, .. } => {
                    let window = window_of(*ttl);
                    if watch.unchanged_for(i, seen, window, now) {
                        asks.push(Ask::Swap(seen.clone()));
                        ready += 1;
                    } else {
                        asks.push(Ask::Read);
                        if let Some(at) = watch.ready_at(i, window) {
                            later.push(at);
                        }
                    }
                }
            },
        }
    }
    if ready >= needed {
        return Plan::Attempt(asks);
    }
    later.sort();
    let missing = needed - ready;
    match later.get(missing - 1) {
        Some(at) => Plan::WaitUntil(*at),
        // Not enough nodes were ever seen: read again soon.
        None => Plan::Attempt(asks),
    }
}

/// The holder's view of one extension round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtendVerdict {
    /// A majority applied it and the lease was still valid when it was decided: the new
    /// validity runs from the send time.
    Extended,
    /// So many nodes hold another value that no majority can ever extend: the lease is lost.
    Conflict,
    /// Not decided (nodes slow or down): try again before the validity ends.
    Undecided,
    /// Decided too late: the validity ended before the majority answered.
    TooLate,
}

/// Judge an extension round: `applied` and `conflicts` (nodes that hold another value) out of
/// `nodes`, needing `needed`; `decided_at` is when the round ended, `valid_until` the validity
/// before it.
pub(crate) fn judge_extension(
    applied: usize,
    conflicts: usize,
    nodes: usize,
    needed: usize,
    decided_at: Instant,
    valid_until: Instant,
) -> ExtendVerdict {
    if conflicts > nodes - needed {
        ExtendVerdict::Conflict
    } else if applied >= needed {
        if decided_at < valid_until {
            ExtendVerdict::Extended
        } else {
            ExtendVerdict::TooLate
        }
    } else {
        ExtendVerdict::Undecided
    }
}

mod beats;
pub(crate) use beats::{BeatGarbage, BeatReading, Beats};

/// Why a lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A majority no longer holds this holder's value (expired there, or someone else has it).
    Conflict,
    /// Extensions could not reach a majority before the validity deadline.
    NoQuorum(String),
    /// The validity deadline was reached without a successful extension.
    Expired,
    /// The configured bound on hold time or extensions was reached.
    HoldBoundReached,
    /// Released by its holder.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Conflict => f.write_str("a majority no longer holds this lease"),
            LossReason::NoQuorum(why) => write!(f, "could not extend on a majority: {why}"),
            LossReason::Expired => f.write_str("validity deadline reached without an extension"),
            LossReason::HoldBoundReached => f.write_str("hold-time or extension bound reached"),
            LossReason::Released => f.write_str("released"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(value: &str, version: u64, ttl_ms: u64) -> KeyState {
        KeyState::Held {
            value: value.into(),
            version,
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    fn seen(run: &str, state: KeyState) -> Seen<KeyState> {
        Seen {
            run_id: run.into(),
            state,
        }
    }

    #[test]
    fn margins_are_one_percent_plus_two_milliseconds_each_side() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(drift(ttl), Duration::from_millis(102));
        assert_eq!(valid_until(t0, ttl), t0 + Duration::from_millis(9_898));
        assert_eq!(watch_window(ttl), Duration::from_millis(10_102));
        // The holder's end, stretched by the worst drift, still comes before the watcher's
        // start, shrunk by the worst drift.
        let holder_real = 9_898.0 / (1.0 - MAX_DRIFT_RATE);
        let watcher_real = 10_102.0 * (1.0 - MAX_DRIFT_RATE);
        assert!(
            holder_real < watcher_real,
            "{holder_real} vs {watcher_real}"
        );
        // A tiny TTL keeps a positive validity.
        assert!(valid_until(t0, Duration::from_millis(10)) > t0);
    }

    #[test]
    fn a_watch_keeps_its_first_instant_until_the_value_or_the_incarnation_changes() {
        let t0 = Instant::now();
        let mut w = Watch::new(1);
        let a5 = seen("r1", held("a", 5, 1000));
        w.observe(0, a5.clone(), t0);
        w.observe(0, a5.clone(), t0 + Duration::from_millis(600));
        assert!(w.unchanged_for(
            0,
            &a5,
            Duration::from_millis(1000),
            t0 + Duration::from_millis(1000)
        ));
        // An extension bumps the version: the watch starts again.
        let a6 = seen("r1", held("a", 6, 1000));
        w.observe(0, a6.clone(), t0 + Duration::from_millis(1100));
        assert!(!w.unchanged_for(
            0,
            &a6,
            Duration::from_millis(1000),
            t0 + Duration::from_millis(1500)
        ));
        // The same value on a new incarnation (restart, repair copy) starts again too.
        let a6_new_run = seen("r2", held("a", 6, 1000));
        w.observe(0, a6_new_run.clone(), t0 + Duration::from_millis(2200));
        assert!(!w.unchanged_for(
            0,
            &a6_new_run,
            Duration::from_millis(1000),
            t0 + Duration::from_millis(3000)
        ));
        assert!(w.unchanged_for(
            0,
            &a6_new_run,
            Duration::from_millis(1000),
            t0 + Duration::from_millis(3200)
        ));
    }

    #[test]
    fn a_free_majority_is_taken_at_once() {
        let t0 = Instant::now();
        let mut w = Watch::new(3);
        w.observe(0, seen("r0", KeyState::Absent), t0);
        w.observe(1, seen("r1", held("a", 1, 10_000)), t0);
        w.observe(2, seen("r2", KeyState::Absent), t0);
        let Plan::Attempt(asks) = plan(&w, 2, t0) else {
            panic!("two free nodes of three must be attempted at once");
        };
        assert_eq!(asks[0], Ask::Swap(seen("r0", KeyState::Absent)));
        assert_eq!(
            asks[1],
            Ask::Read,
            "a fresh holder's key must not be swapped"
        );
        assert_eq!(asks[2], Ask::Swap(seen("r2", KeyState::Absent)));
    }

    #[test]
    fn a_held_key_is_swapped_only_after_its_own_ttl_plus_drift_unchanged() {
        // Case A of the clock-step issue: node 0 and 1 hold A's lease, node 2 missed it. No
        // node's clock matters: the contender must watch A's key for A's TTL.
        let t0 = Instant::now();
        let ttl = 20_000;
        let mut w = Watch::new(3);
        w.observe(0, seen("r0", held("a", 3, ttl)), t0);
        w.observe(1, seen("r1", held("a", 3, ttl)), t0);
        w.observe(2, seen("r2", KeyState::Absent), t0);
        let window = watch_window(Duration::from_millis(ttl));
        assert_eq!(
            plan(&w, 2, t0 + Duration::from_secs(3)),
            Plan::WaitUntil(t0 + window)
        );
        assert_eq!(
            plan(&w, 2, t0 + window - Duration::from_millis(1)),
            Plan::WaitUntil(t0 + window)
        );
        let Plan::Attempt(asks) = plan(&w, 2, t0 + window) else {
            panic!("after the window the stale key may be swapped");
        };
        assert_eq!(asks[0], Ask::Swap(seen("r0", held("a", 3, ttl))));
        assert_eq!(asks[2], Ask::Swap(seen("r2", KeyState::Absent)));
    }

    #[test]
    fn a_holder_that_keeps_extending_is_never_taken_over() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(900);
        let mut w = Watch::new(3);
        for step in 0..30u64 {
            let at = t0 + Duration::from_millis(100 * step);
            let version = step / 3 + 1; // an extension every 300 ms
            for i in 0..3 {
                w.observe(i, seen("r", held("a", version, 900)), at);
            }
            assert!(
                matches!(plan(&w, 2, at), Plan::WaitUntil(_)),
                "step {step}: a live holder was planned for takeover"
            );
        }
        // It stops extending: after the window from the last change, it can be taken.
        let last_change = t0 + Duration::from_millis(2700);
        assert!(matches!(
            plan(&w, 2, last_change + watch_window(ttl)),
            Plan::Attempt(_)
        ));
    }

    #[test]
    fn the_wait_is_for_the_slowest_node_that_a_majority_needs() {
        let t0 = Instant::now();
        let mut w = Watch::new(5);
        for i in 0..5 {
            w.observe(
                i,
                seen("r", held("a", 1, 1000)),
                t0 + Duration::from_millis(100 * i as u64),
            );
        }
        let window = watch_window(Duration::from_millis(1000));
        // Three of five are needed: the third-earliest observation decides.
        assert_eq!(
            plan(&w, 3, t0),
            Plan::WaitUntil(t0 + Duration::from_millis(200) + window)
        );
    }

    #[test]
    fn nodes_never_seen_are_asked_optimistically() {
        let t0 = Instant::now();
        let w: Watch<KeyState> = Watch::new(3);
        let Plan::Attempt(asks) = plan(&w, 2, t0) else {
            panic!("a first round must be attempted");
        };
        assert!(asks
            .iter()
            .all(|a| matches!(a, Ask::Swap(s) if s.state == KeyState::Absent)));
    }

    #[test]
    fn a_reader_says_how_long_a_lease_stayed_unchanged_only_from_its_own_history() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ttl = Duration::from_millis(1000);
        let mut w = Watch::new(3);
        // One reading: no history, so nothing can be said (a fresh process's single read).
        for i in 0..3 {
            w.observe(i, seen("r", held("a", 4, 1000)), at(0));
        }
        assert_eq!(quiet_for(&w, "a", 2), None);
        assert!(!looks_abandoned(quiet_for(&w, "a", 2), ttl));
        // Unchanged at the next readings: the span grows with the readings.
        for i in 0..3 {
            w.observe(i, seen("r", held("a", 4, 1000)), at(400));
        }
        assert_eq!(quiet_for(&w, "a", 2), Some(Duration::from_millis(400)));
        // Node 2 misses a reading: the majority's span is still the other two's.
        for i in 0..2 {
            w.observe(i, seen("r", held("a", 4, 1000)), at(900));
        }
        assert_eq!(quiet_for(&w, "a", 2), Some(Duration::from_millis(900)));
        assert!(
            !looks_abandoned(quiet_for(&w, "a", 2), ttl),
            "900 ms is short of the TTL plus drift (1012 ms)"
        );
        for i in 0..2 {
            w.observe(i, seen("r", held("a", 4, 1000)), at(1012));
        }
        assert!(looks_abandoned(quiet_for(&w, "a", 2), ttl));
        assert!(looks_abandoned(Some(watch_window(ttl)), ttl));
        assert!(!looks_abandoned(
            Some(watch_window(ttl) - Duration::from_millis(1)),
            ttl
        ));
        // An extension reaches nodes 0 and 1: the majority's span restarts at zero (alive).
        for i in 0..2 {
            w.observe(i, seen("r", held("a", 5, 1000)), at(1200));
        }
        assert_eq!(quiet_for(&w, "a", 2), Some(Duration::ZERO));
        // Another holder's value on a node is not this lease's: only node 2 still shows "a".
        w.observe(0, seen("r", held("b", 1, 1000)), at(1300));
        assert_eq!(quiet_for(&w, "b", 1), Some(Duration::ZERO));
        // A node restarted (another incarnation): its watch starts again.
        w.observe(1, seen("r2", held("a", 5, 1000)), at(1400));
        assert_eq!(quiet_for(&w, "a", 2), Some(Duration::ZERO));
        // A forgotten node has no history any more.
        w.forget(2);
        w.observe(2, seen("r", held("a", 5, 1000)), at(1500));
        assert_eq!(w.span_with_history(2), None);
        assert_eq!(quiet_for(&w, "a", 0), None, "no majority of zero");
    }

    #[test]
    fn a_one_shot_watches_for_the_longest_lease_time_it_knows_not_only_its_own() {
        let t0 = Instant::now();
        let (two, thirty) = (Duration::from_secs(2), Duration::from_secs(30));
        let mut w = Watch::new(3);
        assert_eq!(
            one_shot_watch(two, &w),
            watch_window(two) * 2,
            "nothing seen"
        );
        // A crashed holder's 30 s lease on two nodes: a 2 s caller watches for 30 s plus drift.
        w.observe(0, seen("r0", held("a", 4, 30_000)), t0);
        w.observe(1, seen("r1", held("a", 4, 30_000)), t0);
        w.observe(2, seen("r2", KeyState::Absent), t0);
        assert_eq!(longest_ttl(&w), thirty);
        assert_eq!(one_shot_watch(two, &w), watch_window(thirty) * 2);
        assert!(
            one_shot_watch(two, &w) > watch_window(thirty),
            "the bound leaves room for the takeover at the end of the stored TTL's window"
        );
        // A longer TTL of the caller's own still counts.
        assert_eq!(one_shot_watch(thirty * 2, &w), watch_window(thirty * 2) * 2);
        // A corrupted stored lease time (far above the longest a lease may have) counts as
        // that longest one: a cron caller is not kept watching for ages.
        w.observe(0, seen("r0", held("a", 4, 9_007_199_254_740_991)), t0);
        assert_eq!(
            one_shot_watch(two, &w),
            watch_window(MAX_LEASE_TIME) * 2,
            "a stored lease time above the longest accepted one is capped"
        );
    }

    #[test]
    fn a_lease_looks_abandoned_to_a_short_limit_only_after_half_its_ttl_unchanged() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ttl = Duration::from_millis(30_000);
        let mut w = Watch::new(3);
        let read = |w: &mut Watch<KeyState>, version: u64, ms: u64| {
            for i in 0..2 {
                w.observe(
                    i,
                    seen(&format!("r{i}"), held("a", version, 30_000)),
                    at(ms),
                );
            }
            w.observe(2, seen("r2", KeyState::Absent), at(ms));
        };
        read(&mut w, 4, 0);
        assert_eq!(quiet_lease(&w, 2, at(0), watch_window), None, "one read");
        read(&mut w, 4, 14_999);
        assert_eq!(
            quiet_lease(&w, 2, at(14_999), watch_window),
            None,
            "unchanged for less than half the TTL: a live holder may still extend"
        );
        read(&mut w, 4, 15_000);
        assert_eq!(
            quiet_lease(&w, 2, at(15_000), watch_window),
            Some(QuietLease {
                ttl,
                quiet_for: Duration::from_millis(15_000),
                ready_at: t0 + watch_window(ttl),
            }),
            "half the stored TTL unchanged: it looks abandoned, and can be taken at the window's end"
        );
        // Past the window a round can go now: nothing to tell.
        read(&mut w, 4, 30_302);
        assert_eq!(quiet_lease(&w, 2, at(30_302), watch_window), None);
        // An extension on the majority: alive, the quiet span restarts.
        read(&mut w, 5, 31_000);
        read(&mut w, 5, 40_000);
        assert_eq!(quiet_lease(&w, 2, at(40_000), watch_window), None);
        // Held on one node only: no majority holder to speak of.
        let mut lone = Watch::new(3);
        for ms in [0, 20_000] {
            lone.observe(0, seen("r0", held("a", 1, 30_000)), at(ms));
            lone.observe(1, seen("r1", held("b", 1, 30_000)), at(ms));
        }
        assert_eq!(quiet_lease(&lone, 2, at(20_000), watch_window), None);
    }

    #[allow(clippy::type_complexity)]
    #[test]
    fn extension_verdicts() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(10);
        use ExtendVerdict::*;
        assert_eq!(judge_extension(2, 0, 3, 2, t0, later), Extended);
        assert_eq!(judge_extension(2, 0, 3, 2, later, later), TooLate);
        assert_eq!(judge_extension(1, 2, 3, 2, t0, later), Conflict);
        assert_eq!(judge_extension(1, 1, 3, 2, t0, later), Undecided);
        assert_eq!(judge_extension(3, 2, 5, 3, t0, later), Extended);
        assert_eq!(judge_extension(2, 3, 5, 3, t0, later), Conflict);
    }
}
