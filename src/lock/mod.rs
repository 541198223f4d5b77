//! Fenced leases: Redlock over the quorum nodes, with a fencing token minted inside each
//! acquisition, auto-extension, and a loss signal that fires before anyone else can hold the
//! lock, and **no node clock in any decision**.
//!
//! # How it works
//! A lock key on each node holds `(value, version, ttl)` and never expires on the node; the
//! lock's fence key holds the highest token granted.
//! 1. **Acquire** (`acquire.rs`): a round proposes a fresh random value and a token above every
//!    fence this handle knows; `lock_acquire.lua` grants it on a node that has no key (or, in a
//!    takeover, that still holds exactly the watched state) and raises the fence in the same
//!    atomic step, recording beside the copy the fence key it replaced. A majority granting with
//!    at least half the TTL left wins; any other round is undone everywhere (`undo.rs`): rolled
//!    back where its grant is untouched, folded elsewhere (see "An undone round" below).
//! 2. **Takeover**: a held lease is taken over only after this handle saw the same
//!    `(value, version)` on a majority, on the same node incarnations, unchanged for the TTL plus
//!    drift on its own monotonic clock (`crate::lease`), and then by compare-and-swap of exactly
//!    that state.
//! 3. **Hold** (`guard.rs`): a watchdog extends every TTL/3 (`lock_extend.lua`, batched per
//!    client in `extend.rs`, each lease judged on its own); each extension bumps the version and
//!    re-creates a copy a node lacks unless a later grant happened there. Validity runs
//!    `TTL - drift` from (just before) the send of the last acquisition or extension a majority
//!    applied; loss is signalled a margin before it ends.
//! 4. **Release**: `lock_release.lua` deletes only this holder's copy, folds the fence into its
//!    floor bucket (or, for a lock acquired again within a second, keeps it for the next grant
//!    and folds it once the handle is idle: `fold.rs`), and publishes a wake-up hint for
//!    waiters (`holder.rs`).
//!
//! # An undone round
//! A round that no caller was given a guard for (too few grants, too late, or its caller went
//! away) is undone on every node by `lock_release.lua`'s mode `"undo"`: where the node's copy
//! still holds the round's value at version 1 with the field `p` that only `lock_acquire.lua`
//! writes, and its fence key still holds exactly the round's token, the copy is deleted and
//! the fence key set back to `p`, its value before the grant; anywhere else the copy (if the
//! round's) is deleted and the fence folded into the floor, as a release does. Why: a holder H
//! whose grant missed node C re-creates its copy there with its extensions only while C's fence
//! is at most H's token; a losing contender's round granted on C alone (H's majority refuses
//! it) used to be folded into C's floor, above H's token for good, and H lived on a bare
//! majority for its whole tenure (issue 43). Rolled back, C counts from where it did before,
//! and H's next extension re-creates its copy there.
//!
//! Why it is safe:
//! - *Untouched means nothing happened since.* The value is fresh per round and only its own
//!   round names it; its copy is never extended (no caller holds it). Any later grant on C
//!   replaces the copy whole (a swap writes a new value and `p`; a grant "if free" needs no
//!   copy there), and raises the fence key above the token; a repair's raise, a fold or a
//!   collect (which needs no copy there) change the fence key; a re-created or restored copy
//!   has no `p`; a node that lost its data has neither. So the check says that C's lock and
//!   fence keys are exactly as the grant left them, and rolling back makes C what it would be
//!   had the round never reached it (the floor, never lowered, keeps whatever was folded into
//!   it meanwhile). A node that restarted with its data kept the grant and everything before
//!   it (Redis persists writes in order), so its own earlier grants are all within `p`.
//! - *No caller used the token.* A round is undone only once its client decided it was not
//!   granted, and a guard is returned only for a granted round (a guard's release never rolls
//!   back: the lease model plants that bug, `Bug::UndoOfHeldLease`). So no fenced
//!   resource has seen the token, and no caller's validity rests on the grant.
//! - *Token order.* A token given to a caller was granted by a majority; on each node of that
//!   majority the grant raised the fence to it, and since then that node's
//!   `max(fence key, floor)` stays at or above it: a rollback on that node lowers the fence key
//!   only to `p`, read after that grant (a rollback of a grant made before it is impossible:
//!   that grant changed the copy), and the floor never goes down. Two majorities share a node,
//!   so every later grant's token is above it.
//! - *Mutual exclusion and re-creation.* An extension re-creates a copy only where the fence
//!   is at most its token, so that a holder whose lease ended cannot come back after a later
//!   holder was granted there (and released); a rolled-back round had no holder, and a later
//!   holder's grant is never rolled back. A lost reply (the round was in fact granted by a
//!   majority it did not see), a delayed undo landing after other events, and a wiped or
//!   flushed node (its copy, restored without `p`, is folded) all meet the same check.
//!
//! # Guarantees
//! The full list is on [`Lock`]. Under the crate's assumptions (clients' monotonic clocks within
//! `MAX_DRIFT_RATE` of real time; nodes' wall clocks may step at any time): every
//! [`FencingToken`] a caller is given is greater than every token given to a caller before it
//! for the lock (the token of a round that no caller was given may be rolled back and
//! proposed again: it was never used); while a guard's
//! `is_held()` is true, no other client holds the lock; loss (conflict, no quorum, expiry, hold
//! bound) is signalled no later than `valid_until`, and no extension succeeds after it.
//! Not guaranteed: a process paused past `valid_until` cannot notice while paused, so mutual
//! exclusion alone never authorizes a side effect (check the token at the resource:
//! `crate::fencing`); progress without a majority; fairness; an abandoned lease is taken over
//! only by a client that watched it for its TTL.
//!
//! # Invariants
//! - Architecture invariant: a fencing token is minted only inside the acquisition script, in
//!   the same atomic step that grants the lease on that node; there is no separate "get a token"
//!   call.
//! - Architecture invariant: no safety decision reads a node's wall clock: no script calls
//!   `TIME`, no key expiry is relied on (`PEXPIRE` only behind the test-only
//!   `with_server_clock_leases_for_tests`); every "is it over?" is decided by a client on its own
//!   monotonic clock through `crate::lease`.
//! - Architecture invariant: a lease's loss is published (status channel, cancellation token,
//!   `lost()`) a margin before its validity deadline, computed from an instant before the send of
//!   the last successful acquisition or extension. Every validity a caller is shown or acts on
//!   is the earlier of its ends on the monotonic and the boot clock (`clock::Stamp::end`), read
//!   when it is used: a host suspend shortens it.
//! - A released lock's next token stays above every token it had: acquisitions count from the
//!   highest of its fence, its floor bucket and the older single floor.
//! - Only a round no caller was given is ever rolled back (`undo.rs`), and only where its grant
//!   is untouched; a holder's release folds or keeps its fence, never lowers it.
//!
//! Why `lease/` is not inside this folder: the lease rules (`crate::lease`) are also the rules of
//! a group's beats (`lease/beats.rs`, watched by the group leader), of the repair claim's takeover
//! (`repair/claim.rs`), of an election's "looks abandoned" and of [`LossReason`] in errors and
//! metrics. Under `lock/` all of those would depend on the lock for a pure core; as a sibling,
//! `lock/` depends on `lease/` and nothing depends on `lock/` for the rules.
//!
//! # What it relies on outside this folder
//! - Keys (`src/keys.rs`): `KeyKind::Lock` (`rq:lock:<name>`: a hash `v`, `n`, `t`),
//!   `KeyKind::Fence` (`rq:fence:<name>`), `KeyKind::FenceFloor` (`floor_key`: 1,024 buckets,
//!   and the older single `rq:floor`), `BLOCKER_PREFIX` (a repair's blocker is nobody's lease);
//!   a group's or pool's leader lease uses `KeyKind::GroupLock`/`KeyKind::PoolLock` and their
//!   fences.
//! - Scripts: `src/scripts/lock_acquire.lua`, `src/scripts/lock_extend.lua`,
//!   `src/scripts/lock_release.lua` (and `src/scripts/fenced_set.lua` at the resource, in
//!   `src/fencing.rs`).
//! - Lease rules: `src/lease/mod.rs` (drift, validity, the watch, the acquisition plan).
//! - Repair rule (`src/repair/plan.rs`): a lease key is restored only where the node has none,
//!   with the copy its sources agree on, else a blocker (`restore.lua`); fences and floors are
//!   raised, and every floor is read again after the scans.
//! - ACL (`src/acl.rs`): `Feature::Locks` (`HMGET`, `HGET`, `HSET`, `DEL`, `PUBLISH`,
//!   `SUBSCRIBE`).
//! - Model: `model/src/leases.rs` (`rq-model leases`), checked in `model/tests/leases.rs`;
//!   `model/tests/conformance_leases.rs` compares it with the real scripts.
//! - Tests: `tests/locks.rs` (fencing a paused holder, the loss signal, racing clients, with
//!   teeth), `tests/lease_safety.rs` (clock steps and lost copies), `tests/floor_repair.rs`,
//!   `tests/gc.rs` (fence keys collected), `tests/hostile_values.rs`; `benches/locks.rs`.
//!
//! # Files
//! - `mod.rs`: [`Lock`], [`LockOptions`], construction.
//! - `decide.rs`: the pure decisions of one lease (after a round, the watchdog's schedule);
//!   table-tested.
//! - `steps.rs`: the node steps (acquire, extend, release, read) and their pure decoders.
//! - `acquire.rs`: acquisition rounds, waiting, scoped `run`, release.
//! - `undo.rs`: a round's undo (a rollback where its grant is untouched, else a fold).
//! - `extend.rs`: extensions, one lease or a client's many (the per-client batcher).
//! - `guard.rs`: [`LockGuard`], the watchdog, the loss signal.
//! - `holder.rs`: who holds a lock; release wake-up hints.

mod acquire;
mod decide;
mod extend;
mod fold;
mod guard;
mod holder;
mod steps;
mod undo;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{decode, script_call, Client, Guard, Request, Step, Steps, Targets};
use crate::clock::{self, Stamp};
use crate::error::{Error, NoQuorum};
use crate::fencing::FencingToken;
use crate::keys::{fixed_key, KeyKind, Name};
use crate::lease::{self, Ask, ExtendVerdict, KeyState, Plan, Seen, Watch};
use crate::quorum::{bounded_learn, NodeOutcome, Tally, UnknownCause};
use crate::scripts::{LOCK_ACQUIRE, LOCK_EXTEND, LOCK_RELEASE, VALUE_LIMIT};

/// How far above the majority's fence one node's fence may be before it is set aside (the
/// same bound as [`crate::id::DEFAULT_MAX_JUMP`]).
const MAX_FENCE_JUMP: u64 = crate::id::DEFAULT_MAX_JUMP;

/// Shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest TTL accepted.
pub const MAX_TTL: Duration = crate::lease::MAX_LEASE_TIME;

/// Fenced leases: Redlock over the quorum nodes, with a fencing token minted inside each
/// acquisition, auto-extension, and a loss signal that fires before anyone else can hold the
/// lock, and **no node clock in any decision**.
///
/// # How a lease works
/// A lock key on each node holds `(value, version, ttl)` and never expires on the node (a
/// node's wall clock may step at any time; Redis expires keys on it). The holder's value is
/// random per acquisition; every extension bumps the version. A client acquires
/// - at once, when a majority of nodes has no key (the classic fast path), or
/// - by **takeover**: after it has seen the same `(value, version)` on a node, of the same node
///   incarnation, unchanged for the stored TTL plus drift on **its own monotonic clock**, it
///   replaces exactly that state by compare-and-swap (see `lease.rs` for the argument).
///
/// Extensions re-create the copy on a node that lacks it (it missed the grant, or lost its data
/// and was repaired) unless a later acquisition was granted there (a losing contender's round is rolled back
/// where it is untouched, so it does not count), and repair restores lease
/// keys, so a lease does not live on a bare majority for the rest of its life.
///
/// # Guarantees
/// Under the crate's assumptions (see the crate docs), including: clients' monotonic clocks
/// run within [`MAX_DRIFT_RATE`](crate::MAX_DRIFT_RATE) of real time; nodes' wall clocks may
/// step at any time, forward or back:
/// - **Fencing:** every [`FencingToken`] a caller is given is greater than every token given to
///   a caller before it for the same lock, on any client. The token is minted in the same atomic
///   step that grants the lease on each node, so a deposed holder cannot hold the newest token.
///   (An attempt that returns no guard may have proposed a token that a later attempt proposes
///   again: nobody could use it.)
/// - **Mutual exclusion within validity:** while a guard's [`is_held`](LockGuard::is_held) is
///   true (its [`valid_until`](LockGuard::valid_until) is in the future on both the monotonic
///   and the boot clock, which counts host suspend), no other client holds a granted lease on
///   the same lock. Validity runs `TTL - (1 % + 2 ms)` from (just before) the send of the last
///   acquisition or extension a majority applied.
/// - **Early loss signal:** [`LockGuard::lost`], the guard's
///   [`cancellation_token`](LockGuard::cancellation_token) and its [`status`](LockGuard::status)
///   channel report loss (conflict, no quorum, expiry, hold bound) no later than `valid_until`,
///   i.e. before another client can acquire, as long as this process is running and its async
///   runtime is not starved. [`LockGuard::is_held`] reads the clocks itself and is the
///   authority: check it before a side effect when the runtime may be busy.
/// - **Host suspend:** `is_held` and `valid_until` count the time the host was suspended
///   (`CLOCK_BOOTTIME`) from the moment it resumes; the loss signal follows within the
///   watchdog's slice (at most a second).
/// - Once loss was signalled, no extension succeeds; release deletes only this holder's key.
///
/// # Not guaranteed
/// - A process that pauses (GC, swap, SIGSTOP, a host suspend) past `valid_until` cannot notice
///   anything while paused; after a host suspend that outlasted the validity, the loss signal
///   comes up to a second after the resume (`is_held` is right at once). Mutual exclusion alone never authorizes a side effect: **check the token at the
///   resource** ([`FencingToken`], [`fenced_set`](crate::fenced_set)).
/// - Progress without a majority; fairness between waiters.
/// - A lease abandoned by a crashed holder is taken over only by a client that watches it for
///   its TTL (the holder's, stored on the nodes, not the watcher's): [`Lock::acquire`] with a
///   wait longer than that TTL does that (fail-over within the TTL plus one poll), and one
///   whose wait ends first says [`Error::LockLooksAbandoned`] (with when it can be taken) once
///   it saw the lease unchanged for half that TTL; [`Lock::try_acquire`] watches a held lease
///   itself until its holder shows it is alive or the holder's TTL plus drift has passed,
///   then takes an abandoned one over, whatever its own TTL.
///   [`Lock::holder`] names such a holder until then; it says the holder looks abandoned
///   ([`Holder::looks_abandoned`]) once this handle has watched the lease unchanged for its
///   TTL plus drift ([`Lock::holder_watching`] watches).
/// - Keys of abandoned locks stay on the nodes until a takeover or release removes them.
///
/// # Timing advice
/// Pick a TTL well above the worst pause you want to ride out without losing the lease, and
/// keep work that must not overlap behind the fencing token. The per-node deadline defaults to
/// a tenth of the TTL (capped by the client's node timeout); extensions run every TTL/3.
///
/// A named lock over the client's nodes. Cheap to clone.
///
/// ```no_run
/// # async fn demo(client: redquorum::Client) -> Result<(), redquorum::Error> {
/// use std::time::Duration;
/// let lock = redquorum::Lock::new(&client, "nightly-report", Duration::from_secs(10))?;
/// let guard = lock.acquire(Duration::from_secs(5)).await?;
/// println!("holding with token {}", guard.token()); // pass it to every write
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<LockInner>,
}

struct LockInner {
    client: Client,
    name: Name,
    key: String,
    fence_key: String,
    marker_key: String,
    /// This lock's bucket of the fence floor (see [`crate::keys::floor_key`]).
    floor_key: String,
    channel: String,
    ttl: Duration,
    node_deadline: Duration,
    auto_extend: bool,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
    min_validity: Duration,
    holder: String,
    known_fence: AtomicU64,
    /// What this handle has seen on each node, and since when (see [`crate::lease`]).
    watch: Mutex<Watch<KeyState>>,
    /// TEST ONLY: keys expire on the nodes' clocks (the unsafe Redlock behaviour).
    server_clock: bool,
    /// A round its caller dropped is released in the background (off only in tests).
    undo_dropped_rounds: bool,
    /// A round not granted is rolled back where its grant is untouched (off only in tests).
    rollback_undone_rounds: bool,
    /// TEST ONLY: a holder's release counts a node where it deleted nothing as deleted.
    release_counts_foreign_copies: bool,
    /// How long a held lease must be seen unchanged before a takeover, by its lease time.
    takeover_window: fn(Duration) -> Duration,
    /// This handle's releases: whether the next one folds the fence or keeps it.
    folds: Mutex<fold::Folds>,
}

impl LockInner {
    fn watch(&self) -> std::sync::MutexGuard<'_, Watch<KeyState>> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn folds(&self) -> std::sync::MutexGuard<'_, fold::Folds> {
        self.folds.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.inner.name)
            .field("ttl", &self.inner.ttl)
            .finish()
    }
}

/// How a [`Lock`] behaves, given at construction ([`Lock::with_options`]); the defaults are
/// what [`Lock::new`] uses.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    manual_extend: bool,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
    node_timeout: Option<Duration>,
    holder: String,
}

impl LockOptions {
    /// Extend automatically every TTL/3 (default true). Without it the lease simply ends
    /// unless [`LockGuard::extend`] is called.
    pub fn with_auto_extend(mut self, on: bool) -> Self {
        self.manual_extend = !on;
        self
    }

    /// Stop extending (and signal [`LossReason::HoldBoundReached`]) once the lease has been
    /// held this long. Default: no bound. Guards against zombie holders; an election's bound
    /// on one leader's term.
    pub fn with_max_hold(mut self, d: Duration) -> Self {
        self.max_hold = Some(d);
        self
    }

    /// Stop after this many extensions. Default: no bound.
    pub fn with_max_extensions(mut self, n: u32) -> Self {
        self.max_extensions = Some(n);
        self
    }

    /// Per-node deadline of lease requests. Default: TTL/10, capped by the client's node
    /// timeout, at least 2 ms. At most the client's node timeout ([`Lock::with_options`]
    /// refuses more): a repair waits that long for requests in flight before it reads the
    /// other nodes, so a reply counted later could be a grant the repaired node forgot.
    pub fn with_node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = Some(d.max(Duration::from_millis(1)));
        self
    }

    /// Describe the holder (host, pid...) in the lock value; readable by [`Lock::holder`] and
    /// [`Election::leader`](crate::Election::leader). At most 256 bytes; control characters
    /// are dropped.
    pub fn with_holder(mut self, holder: &str) -> Self {
        self.holder = clean_label(holder);
        self
    }
}

/// A caller-supplied label as stored: control characters dropped, at most 256 characters.
pub(crate) fn clean_label(label: &str) -> String {
    label
        .chars()
        .filter(|c| !c.is_control())
        .take(256)
        .collect()
}

impl Lock {
    /// A lock named `name` with lease time `ttl` (between [`MIN_TTL`] and [`MAX_TTL`]) and
    /// the default [`LockOptions`].
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid name; [`Error::InvalidArgument`] for a TTL out of range.
    pub fn new(client: &Client, name: &str, ttl: Duration) -> Result<Lock, Error> {
        Lock::with_options(client, name, ttl, LockOptions::default())
    }

    /// A lock with the given options.
    ///
    /// # Errors
    /// As [`Lock::new`], and [`Error::InvalidArgument`] for a node timeout
    /// ([`LockOptions::with_node_timeout`]) longer than the client's.
    pub fn with_options(
        client: &Client,
        name: &str,
        ttl: Duration,
        options: LockOptions,
    ) -> Result<Lock, Error> {
        Lock::with_kinds(client, name, ttl, options, KeyKind::Lock, KeyKind::Fence)
    }

    /// A lock whose keys live under other kinds (a group's leader lock must not collide with
    /// a user lock of the same name).
    pub(crate) fn with_kinds(
        client: &Client,
        name: &str,
        ttl: Duration,
        options: LockOptions,
        lock: KeyKind,
        fence: KeyKind,
    ) -> Result<Lock, Error> {
        let name = Name::new("lock", name)?;
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(Error::InvalidArgument(format!(
                "lock ttl {ttl:?} is outside {MIN_TTL:?}..={MAX_TTL:?}"
            )));
        }
        let limit = client.config().node_timeout();
        if let Some(d) = options.node_timeout.filter(|d| *d > limit) {
            // A repair waits the client's node timeout for requests in flight before it reads
            // the other nodes; a lease reply counted after that could be a grant that a wiped
            // node lost and the repair did not see (found by the lease model's review).
            return Err(Error::InvalidArgument(format!(
                "lock node_timeout {d:?} exceeds the client's node_timeout {limit:?}: a repair \
                 waits only that long for requests in flight"
            )));
        }
        let node_deadline = options.node_timeout.unwrap_or_else(|| {
            (ttl / 10)
                .min(client.config().node_timeout())
                .max(Duration::from_millis(2))
        });
        Ok(Lock {
            inner: Arc::new(LockInner {
                client: client.clone(),
                key: name.key(lock),
                fence_key: name.key(fence),
                marker_key: fixed_key(KeyKind::Marker),
                floor_key: crate::keys::floor_key(&name.key(lock)),
                channel: format!("rq:released:{}", name.key(lock)),
                name,
                ttl,
                node_deadline,
                auto_extend: !options.manual_extend,
                max_hold: options.max_hold,
                max_extensions: options.max_extensions,
                min_validity: ttl / 2,
                holder: options.holder,
                known_fence: AtomicU64::new(0),
                watch: Mutex::new(Watch::new(client.node_urls().len())),
                server_clock: client.config().server_clock_leases,
                undo_dropped_rounds: client.config().undo_dropped_rounds,
                rollback_undone_rounds: client.config().rollback_undone_rounds,
                release_counts_foreign_copies: client.config().release_counts_foreign_copies,
                takeover_window: if client.config().takeover_wait {
                    crate::lease::watch_window
                } else {
                    |_| Duration::ZERO
                },
                folds: Mutex::default(),
            }),
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name.as_str()
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The lease time.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The keys a node reads to judge whether a later holder exists (`record.lua`): the lock
    /// key, its fence key, its floor bucket and the older single floor.
    pub(crate) fn holder_check_keys(&self) -> [String; 4] {
        let inner = &self.inner;
        [
            inner.key.clone(),
            inner.fence_key.clone(),
            inner.floor_key.clone(),
            fixed_key(KeyKind::FenceFloor),
        ]
    }
}

pub use crate::lease::LossReason;
pub use guard::{LeaseStatus, LockGuard};
pub(crate) use holder::decode_lease;
pub use holder::Holder;
use holder::ReleaseWatch;
use steps::{AcquireStep, Grant, GrantStatus};
