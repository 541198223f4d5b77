//! Fenced leases: Redlock over the quorum nodes, with a fencing token minted inside each
//! acquisition, auto-extension, and a loss signal that fires before anyone else can hold the
//! lock, and **no node clock in any decision**.
//!
//! # How a lease works
//! A lock key on each node holds `(value, version, ttl)` and never expires on the node (a
//! node's wall clock may step at any time; Redis expires keys on it). The holder's value is
//! random per acquisition; every extension bumps the version. A client acquires
//! - at once, when a majority of nodes has no key (the classic fast path), or
//! - by **takeover**: after it has seen the same `(value, version)` on a node, of the same node
//!   incarnation, unchanged for the stored TTL plus drift on **its own monotonic clock**, it
//!   replaces exactly that state by compare-and-swap (see [`crate::lease`] for the argument).
//!
//! Extensions re-create the copy on a node that lacks it (it missed the grant, or lost its data
//! and was repaired) unless a later acquisition was granted there, and repair restores lease
//! keys, so a lease does not live on a bare majority for the rest of its life.
//!
//! # Guarantees
//! Under the crate's assumptions (see the crate docs), including: clients' monotonic clocks
//! run within [`MAX_DRIFT_RATE`](crate::MAX_DRIFT_RATE) of real time; nodes' wall clocks may
//! step at any time, forward or back:
//! - **Fencing:** every granted [`FencingToken`] is greater than every token granted before it
//!   for the same lock, on any client. The token is minted in the same atomic step that grants
//!   the lease on each node, so a deposed holder cannot hold the newest token.
//! - **Mutual exclusion within validity:** while a guard's [`is_held`](LockGuard::is_held) is
//!   true (its [`valid_until`](LockGuard::valid_until) is in the future on both the monotonic
//!   and the boot clock, which counts host suspend), no other client holds a granted lease on
//!   the same lock. Validity runs `TTL - (1 % + 2 ms)` from the send of the last acquisition or
//!   extension a majority applied.
//! - **Early loss signal:** [`LockGuard::lost`], the guard's
//!   [`cancellation_token`](LockGuard::cancellation_token) and its [`status`](LockGuard::status)
//!   channel report loss (conflict, no quorum, expiry, hold bound) no later than `valid_until`,
//!   i.e. before another client can acquire, as long as this process is running and its async
//!   runtime is not starved. [`LockGuard::is_held`] reads the clocks itself and is the
//!   authority: check it before a side effect when the runtime may be busy.
//! - Once loss was signalled, no extension succeeds; release deletes only this holder's key.
//!
//! # Not guaranteed
//! - A process that pauses (GC, swap, SIGSTOP) past `valid_until` cannot notice anything while
//!   paused. Mutual exclusion alone never authorizes a side effect: **check the token at the
//!   resource** ([`crate::fencing`]).
//! - Progress without a majority; fairness between waiters.
//! - A lease abandoned by a crashed holder is taken over only by a client that watches it for
//!   its TTL: [`Lock::acquire`] with a wait longer than the TTL does that (fail-over within the
//!   TTL plus one poll); [`Lock::try_acquire`] never waits, so on a fresh handle it cannot take
//!   over an abandoned lease (the same handle remembers what it saw across calls).
//! - Keys of abandoned locks stay on the nodes until a takeover or release removes them.
//!
//! # Timing advice
//! Pick a TTL well above the worst pause you want to ride out without losing the lease, and
//! keep work that must not overlap behind the fencing token. The per-node deadline defaults to
//! a tenth of the TTL (capped by the client's node timeout); extensions run every TTL/3.

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
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

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

/// A lease's state, as published on [`LockGuard::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held until the instant (monotonic clock), unless extended.
    Held {
        /// End of validity.
        valid_until: Instant,
    },
    /// Lost or released.
    Lost(LossReason),
}

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
}

impl LockInner {
    fn watch(&self) -> std::sync::MutexGuard<'_, Watch<KeyState>> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
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

/// One node's answer to an acquisition round.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    status: GrantStatus,
    /// The node's fence before the round.
    fence: u64,
    /// What the key held before the round, on which incarnation.
    seen: Seen<KeyState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GrantStatus {
    Granted,
    /// The key was not in the state asked for (or the round only read it).
    NotAsExpected,
    /// The key was as asked but the fence is at or above the proposed token.
    TokenLow,
    /// The node's marker is missing or stale: it may not vote.
    Refused,
}

impl Lock {
    /// A lock named `name` with lease time `ttl` (between [`MIN_TTL`] and [`MAX_TTL`]).
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid name; [`Error::InvalidArgument`] for a TTL out of range.
    pub fn new(client: &Client, name: &str, ttl: Duration) -> Result<Lock, Error> {
        Lock::with_kinds(client, name, ttl, KeyKind::Lock, KeyKind::Fence)
    }

    /// A lock whose keys live under other kinds (a group's leader lock must not collide with
    /// a user lock of the same name).
    pub(crate) fn with_kinds(
        client: &Client,
        name: &str,
        ttl: Duration,
        lock: KeyKind,
        fence: KeyKind,
    ) -> Result<Lock, Error> {
        let name = Name::new("lock", name)?;
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(Error::InvalidArgument(format!(
                "lock ttl {ttl:?} is outside {MIN_TTL:?}..={MAX_TTL:?}"
            )));
        }
        let node_deadline = (ttl / 10)
            .min(client.config().node_timeout())
            .max(Duration::from_millis(2));
        Ok(Lock {
            inner: Arc::new(LockInner {
                client: client.clone(),
                key: name.key(lock),
                fence_key: name.key(fence),
                marker_key: fixed_key(KeyKind::Marker),
                channel: format!("rq:released:{}", name.key(lock)),
                name,
                ttl,
                node_deadline,
                auto_extend: true,
                max_hold: None,
                max_extensions: None,
                min_validity: ttl / 2,
                holder: String::new(),
                known_fence: AtomicU64::new(0),
                watch: Mutex::new(Watch::new(client.node_urls().len())),
                server_clock: client.config().server_clock_leases,
            }),
        })
    }

    fn reconfigure(self, f: impl FnOnce(&mut LockInner)) -> Self {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                f(&mut inner);
                Lock {
                    inner: Arc::new(inner),
                }
            }
            Err(shared) => Lock { inner: shared },
        }
    }

    /// Extend automatically every TTL/3 (default true). Without it the lease simply expires
    /// unless [`LockGuard::extend`] is called.
    pub fn with_auto_extend(self, on: bool) -> Self {
        self.reconfigure(|l| l.auto_extend = on)
    }

    /// Stop extending (and signal [`LossReason::HoldBoundReached`]) once the lease has been
    /// held this long. Default: no bound. Guards against zombie holders.
    pub fn with_max_hold(self, d: Duration) -> Self {
        self.reconfigure(|l| l.max_hold = Some(d))
    }

    /// Stop after this many extensions. Default: no bound.
    pub fn with_max_extensions(self, n: u32) -> Self {
        self.reconfigure(|l| l.max_extensions = Some(n))
    }

    /// Per-node deadline of lease requests. Default: TTL/10, capped by the client's node
    /// timeout, at least 2 ms.
    pub fn with_node_timeout(self, d: Duration) -> Self {
        self.reconfigure(|l| l.node_deadline = d.max(Duration::from_millis(1)))
    }

    /// Describe the holder (host, pid...) in the lock value; readable by
    /// [`Election::leader`](crate::Election::leader). At most 256 bytes; control characters are
    /// dropped.
    pub fn with_holder(self, holder: &str) -> Self {
        let clean: String = holder
            .chars()
            .filter(|c| !c.is_control())
            .take(256)
            .collect();
        self.reconfigure(|l| l.holder = clean)
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

    /// One acquisition attempt.
    ///
    /// # Errors
    /// [`Error::LockHeld`] if another holder has it; [`Error::NoQuorum`] if a majority did not
    /// answer; [`Error::Timeout`] if the nodes answered too slowly to leave half the TTL of
    /// validity. Every failed attempt is released on every node.
    ///
    /// # Cancel safety
    /// Cancel-safe: the attempt runs in a task of its own, and a lease it wins after the caller
    /// went away is released.
    pub async fn try_acquire(&self) -> Result<LockGuard, Error> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lock = self.clone();
        tokio::spawn(async move {
            let result = lock.attempt().await;
            if let Err(Ok(guard)) = tx.send(result) {
                let _ = guard.release().await;
            }
        });
        rx.await.unwrap_or_else(|_| {
            Err(Error::Internal(
                "acquisition task dropped (runtime shutting down)".into(),
            ))
        })
    }

    /// Acquire, retrying after random delays (and as soon as the holder releases) until `wait`
    /// has passed. `Duration::ZERO` tries once.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the wait ends with the lock still held; [`Error::NoQuorum`] when
    /// the last attempt lacked a majority; invalid input errors at once.
    ///
    /// # Cancel safety
    /// Cancel-safe, like [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, wait: Duration) -> Result<LockGuard, Error> {
        let started = Instant::now();
        let deadline = started + wait;
        let released = Arc::new(Notify::new());
        // Waiters listen for releases; a single try needs no subscription.
        let _watch = (!wait.is_zero()).then(|| ReleaseWatch::start(&self.inner, released.clone()));
        loop {
            let err = match self.try_acquire().await {
                Ok(g) => return Ok(g),
                Err(e @ (Error::LockHeld { .. } | Error::NoQuorum(_) | Error::Timeout { .. })) => e,
                Err(other) => return Err(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(match err {
                    Error::LockHeld { .. } if !wait.is_zero() => Error::Timeout {
                        op: "lock.acquire",
                        waited: now - started,
                    },
                    other => other,
                });
            }
            // A random delay longer than an acquisition takes, so waiters spread out.
            let base =
                (self.inner.ttl / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
            let delay = base.mul_f64(0.5 + rand::random::<f64>());
            tokio::select! {
                _ = tokio::time::sleep_until((now + delay).min(deadline)) => {}
                _ = released.notified() => {}
            }
        }
    }

    /// Run `work` while holding the lock: acquire (waiting up to `wait`), run the future,
    /// cancel it (drop it) as soon as the lease is lost, then release.
    ///
    /// The closure receives the fencing token and a cancellation token that is cancelled on
    /// loss; pass them to anything the work spawns.
    ///
    /// # Errors
    /// Acquisition errors as in [`acquire`](Self::acquire); [`Error::LeaseLost`] if the lease
    /// was lost before `work` finished (the work was cancelled).
    ///
    /// # Cancel safety
    /// Dropping the call drops `work` wherever it is and releases the lease in the
    /// background; the work's own side effects are the caller's to reason about (use the
    /// fencing token).
    pub async fn run<F, Fut, T>(&self, wait: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(FencingToken, CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(wait).await?;
        // Boxed so it can be dropped (stopped, destructors run) before the release.
        let mut fut = Box::pin(work(guard.token(), guard.cancellation_token()));
        tokio::select! {
            out = &mut fut => {
                let _ = guard.release().await;
                Ok(out)
            }
            reason = guard.lost() => {
                drop(fut);
                let _ = guard.release().await;
                Err(Error::LeaseLost { name: self.name().to_string(), reason })
            }
        }
    }

    async fn attempt(&self) -> Result<LockGuard, Error> {
        let inner = &self.inner;
        let needed = inner.client.majority().needed();
        for _ in 0..6 {
            let token = inner.known_fence.load(Ordering::Acquire).saturating_add(1);
            if token >= VALUE_LIMIT {
                return Err(Error::Exhausted {
                    sequence: format!("fence of lock {}", inner.name.as_str()),
                    limit: VALUE_LIMIT,
                });
            }
            // Value = 128 random bits (fresh per round), the token, the holder description.
            let value: Arc<str> = format!("{}:{}:{}", random_hex128(), token, inner.holder).into();
            let stamp = Stamp::now();
            let start = stamp.mono;
            let asks = match lease::plan(&inner.watch(), needed, start) {
                Plan::Attempt(asks) => asks,
                // Not yet: refresh what the nodes hold (a holder that extends or releases
                // shows it), and decide again.
                Plan::WaitUntil(_) => vec![Ask::Read; inner.client.node_urls().len()],
            };
            let only_reads = asks.iter().all(|a| *a == Ask::Read);
            let tally = self.send_round(&value, token, asks).await;
            let seen_at = Instant::now();
            // A fence far above what a majority reports (a corrupted or hostile node) is not
            // learned: the token would jump toward its limit.
            let fences: Vec<u64> = tally.replies().map(|(_, g)| g.fence).collect();
            let (highest, set_aside) = bounded_learn(
                &fences,
                needed,
                inner.known_fence.load(Ordering::Acquire),
                MAX_FENCE_JUMP,
            );
            if set_aside {
                tracing::warn!(lock = %inner.name.as_str(), fences = ?fences, learned = highest, "a node reports a fence far above the majority; not jumping to it");
            }
            inner.known_fence.fetch_max(
                highest.max(if tally.applied() > 0 { token } else { 0 }),
                Ordering::AcqRel,
            );
            {
                let mut watch = inner.watch();
                for r in tally.results() {
                    match &r.outcome {
                        NodeOutcome::Applied(_) => watch.forget(r.node.0),
                        NodeOutcome::Rejected(g) => match g.status {
                            GrantStatus::Refused => {
                                watch.forget(r.node.0);
                                inner.client.suspect(r.node.0);
                            }
                            _ => watch.observe(r.node.0, g.seen.clone(), seen_at),
                        },
                        NodeOutcome::Unknown(_) => {}
                    }
                }
            }
            if tally.reached() {
                let until = stamp.after(lease::validity(inner.ttl));
                let left = until.mono.saturating_duration_since(Instant::now());
                if left < inner.min_validity {
                    self.release_value(&value).await;
                    return Err(Error::Timeout {
                        op: "lock.acquire (too slow to leave enough validity)",
                        waited: start.elapsed(),
                    });
                }
                tracing::debug!(lock = %inner.name, token, validity_ms = left.as_millis() as u64, "lease granted");
                return Ok(LockGuard::start(
                    self.clone(),
                    value,
                    FencingToken::new(token),
                    start,
                    until,
                ));
            }
            // Not granted: undo partial grants everywhere (also on nodes whose reply was not
            // awaited: they may have granted), then decide why.
            if !only_reads {
                self.release_value(&value).await;
            }
            let low = tally
                .replies()
                .any(|(_, g)| g.status == GrantStatus::TokenLow);
            if low {
                continue; // our token guess was behind: the next round proposes above it
            }
            if only_reads
                && matches!(
                    lease::plan(&inner.watch(), needed, Instant::now()),
                    Plan::Attempt(_)
                )
            {
                continue; // the fresh reading makes a round possible now
            }
            let held = tally
                .replies()
                .any(|(_, g)| matches!(g.seen.state, KeyState::Held { .. }));
            if held || tally.replies().count() >= needed {
                return Err(Error::LockHeld {
                    name: inner.name.as_str().to_string(),
                });
            }
            return Err(NoQuorum::from_tally(
                "lock.acquire",
                &tally,
                inner.client.node_urls(),
                |g| format!("{:?}", g.status),
            )
            .into());
        }
        Err(Error::LockHeld {
            name: inner.name.as_str().to_string(),
        })
    }

    /// One acquisition round: to each node its ask (grant if free, swap a watched stale
    /// key, or only read), decided as soon as a majority granted or cannot.
    async fn send_round(&self, value: &Arc<str>, token: u64, asks: Vec<Ask>) -> Tally<Grant> {
        let inner = &self.inner;
        let acquire = AcquireStep {
            keys: self.lease_keys(),
            value: value.clone(),
            ttl_ms: inner.ttl.as_millis() as u64,
            token,
            expiry: inner.server_clock,
        };
        let asks: Arc<[Ask]> = asks.into();
        let steps = Steps::per_node(move |ctx| {
            let ask = asks.get(ctx.node).cloned().unwrap_or(Ask::Read);
            Some(acquire.step(&ask))
        });
        let request = Request::vote("lock.acquire").within(inner.node_deadline);
        inner.client.send(request, steps).await
    }

    /// The lease's keys on a node: the lock, its fence, the marker, the fence floor.
    fn lease_keys(&self) -> [String; 4] {
        [
            self.inner.key.clone(),
            self.inner.fence_key.clone(),
            self.inner.marker_key.clone(),
            fixed_key(KeyKind::FenceFloor),
        ]
    }

    /// Compare-and-delete on every node (also nodes that did not answer: they may have
    /// applied). Returns how many nodes had deleted it when the outcome was decided; slower
    /// nodes are still sent the release in the background (and their copy expires with the
    /// TTL anyway), so one frozen node does not slow a release down.
    async fn release_value(&self, value: &Arc<str>) -> usize {
        let inner = &self.inner;
        // No marker check: deleting one's own copy is safe on any node, verified or not.
        let step = script_call(&LOCK_RELEASE, Guard::None("deleting one's own copy"))
            .key(&inner.key)
            .key(&inner.fence_key)
            .key(fixed_key(KeyKind::FenceFloor))
            .arg(&**value)
            .arg(&inner.channel)
            .decode(|_, v| decode::one_applied(v));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let client = inner.client.clone();
        let request = Request::any_node("lock.release", Targets::All)
            .within(inner.node_deadline)
            .reporting(tx);
        tokio::spawn(async move { client.send(request, step).await });
        rx.await.unwrap_or(0)
    }

    /// Extend on every voting node with the next version (re-creating a missing copy where
    /// safe). `Ok(new valid_until)` when a majority applied it within the current validity;
    /// `Err(true)` on conflict (no majority can ever extend); `Err(false)` otherwise.
    async fn send_extend(
        &self,
        value: &Arc<str>,
        token: FencingToken,
        version: u64,
        valid_until: Instant,
    ) -> Result<Stamp, (bool, String)> {
        let inner = &self.inner;
        let [key, fence, marker, floor] = self.lease_keys();
        let step = script_call(&LOCK_EXTEND, Guard::Marker)
            .key(key)
            .key(fence)
            .key(marker)
            .key(floor)
            .arg(&**value)
            .arg(version)
            .arg(inner.ttl.as_millis() as u64)
            .arg(token.get())
            .marker()
            .arg(if inner.server_clock { "x" } else { "" })
            .decode(|_, v| decode_extension(v));
        let start = Stamp::now();
        let request = Request::vote("lock.extend").within(inner.node_deadline);
        let tally = inner.client.send(request, step).await;
        let recreated = tally.replies().filter(|(_, r)| **r).count();
        if recreated > 0 {
            tracing::debug!(lock = %inner.name, recreated, "extension re-created missing copies");
        }
        let m = tally.majority();
        match lease::judge_extension(
            tally.applied(),
            tally.rejected(),
            m.nodes(),
            m.needed(),
            Instant::now(),
            valid_until,
        ) {
            ExtendVerdict::Extended => Ok(start.after(lease::validity(inner.ttl))),
            verdict => {
                let why =
                    NoQuorum::from_tally("lock.extend", &tally, inner.client.node_urls(), |_| {
                        "held by another value".into()
                    })
                    .to_string();
                Err((verdict == ExtendVerdict::Conflict, why))
            }
        }
    }
}

/// What a majority of nodes says about who holds a lock.
///
/// No node clock decides when a lease ends, so a holder that crashed stays named here until
/// another client takes the lease over (after watching it unchanged for its TTL) or it is
/// released: watch [`version`](Holder::version) to tell a live holder (it changes at every
/// extension) from a dead one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holder description given with [`Lock::with_holder`] (a candidate ID for elections).
    pub holder: String,
    /// The fencing token of the holder's lease (the leadership term, for elections).
    pub token: FencingToken,
    /// The holder's extension count as seen by the majority (the lowest among them).
    pub version: u64,
    /// The holder's lease time.
    pub ttl: Duration,
}

impl Lock {
    /// Who holds the lock according to a majority of the nodes, if anyone does.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn holder(&self) -> Result<Option<Holder>, Error> {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.inner.key).arg("v").arg("n").arg("t");
        let read = Step::read(vec![hmget], |_, v| {
            let (value, version, ttl): (Option<String>, Option<u64>, Option<u64>) =
                redis::from_redis_value(v)?;
            Ok(NodeOutcome::Applied((
                value,
                version.unwrap_or(0),
                ttl.unwrap_or(0),
            )))
        });
        let request = Request::vote("lock.holder")
            .wait_all()
            .within(self.inner.node_deadline);
        let tally = self.inner.client.decide(request, read).await?;
        let needed = tally.majority().needed();
        let mut counts: std::collections::HashMap<&str, (usize, u64, u64)> =
            std::collections::HashMap::new();
        for (_, (value, version, ttl)) in tally.replies() {
            if let Some(v) = value {
                let e = counts.entry(v.as_str()).or_insert((0, u64::MAX, 0));
                e.0 += 1;
                e.1 = e.1.min(*version);
                e.2 = e.2.max(*ttl);
            }
        }
        Ok(counts
            .into_iter()
            .find(|(_, (n, _, _))| *n >= needed)
            .and_then(|(value, (_, version, ttl))| {
                let mut parts = value.splitn(3, ':');
                let _random = parts.next()?;
                let token: u64 = parts.next()?.parse().ok()?;
                Some(Holder {
                    holder: parts.next().unwrap_or_default().to_string(),
                    token: FencingToken::new(token),
                    version,
                    ttl: Duration::from_millis(ttl),
                })
            }))
    }

    /// Wake-up hints for waiters: notified when the holder releases (pub/sub on every node).
    pub(crate) fn release_watch(&self, wake: Arc<Notify>) -> ReleaseWatch {
        ReleaseWatch::start(&self.inner, wake)
    }
}

/// Subscribes to the lock's release notifications on every node while a waiter waits, so a
/// release wakes it at once. A hint only: nothing is decided from it.
pub(crate) struct ReleaseWatch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ReleaseWatch {
    fn start(inner: &LockInner, wake: Arc<Notify>) -> ReleaseWatch {
        let tasks = inner
            .client
            .pubsub_clients()
            .into_iter()
            .map(|client| {
                let (wake, channel) = (wake.clone(), inner.channel.clone());
                tokio::spawn(async move {
                    let Ok(mut ps) = client.get_async_pubsub().await else {
                        return;
                    };
                    if ps.subscribe(&channel).await.is_err() {
                        return;
                    }
                    let mut messages = ps.on_message();
                    while messages.next().await.is_some() {
                        wake.notify_waiters();
                        wake.notify_one();
                    }
                })
            })
            .collect();
        ReleaseWatch { tasks }
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A held lease. Dropping it stops extension and starts a best-effort release in the
/// background; prefer [`release`](LockGuard::release), which reports the outcome.
#[must_use = "a lease is released when its guard is dropped"]
pub struct LockGuard {
    shared: Arc<LeaseShared>,
    released: bool,
}

struct LeaseShared {
    lock: Lock,
    value: Arc<str>,
    token: FencingToken,
    acquired_at: Instant,
    times: Mutex<Times>,
    status: watch::Sender<LeaseStatus>,
    cancel: CancellationToken,
    stop: CancellationToken,
    suspended_for_tests: AtomicBool,
    /// The version of the last extension sent (the acquisition is version 1).
    version: AtomicU64,
    /// When the loss was signalled (monotonic clock).
    lost_at: Mutex<Option<Instant>>,
}

#[derive(Clone, Copy)]
struct Times {
    /// End of validity on both clocks (see [`crate::clock`]).
    until: Stamp,
    extensions: u32,
}

impl Times {
    fn valid_until(&self) -> Instant {
        self.until.mono
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.shared.lock.name())
            .field("token", &self.shared.token)
            .field("status", &*self.shared.status.borrow())
            .finish()
    }
}

impl LockGuard {
    fn start(
        lock: Lock,
        value: Arc<str>,
        token: FencingToken,
        acquired_at: Instant,
        until: Stamp,
    ) -> LockGuard {
        let (status, _) = watch::channel(LeaseStatus::Held {
            valid_until: until.mono,
        });
        let shared = Arc::new(LeaseShared {
            lock,
            value,
            token,
            acquired_at,
            times: Mutex::new(Times {
                until,
                extensions: 0,
            }),
            status,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
            suspended_for_tests: AtomicBool::new(false),
            version: AtomicU64::new(1),
            lost_at: Mutex::new(None),
        });
        tokio::spawn(watchdog(shared.clone()));
        LockGuard {
            shared,
            released: false,
        }
    }

    /// The fencing token minted with this lease: pass it with every write to a resource.
    pub fn token(&self) -> FencingToken {
        self.shared.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.shared.lock.name()
    }

    /// End of validity on this process's monotonic clock (moves forward with extensions).
    pub fn valid_until(&self) -> Instant {
        self.shared.times().valid_until()
    }

    /// True while the lease has not been lost and its validity has not ended.
    pub fn is_held(&self) -> bool {
        matches!(*self.shared.status.borrow(), LeaseStatus::Held { .. })
            && !self.shared.times().until.passed()
    }

    /// A channel that carries every status change; it ends in [`LeaseStatus::Lost`].
    pub fn status(&self) -> watch::Receiver<LeaseStatus> {
        self.shared.status.subscribe()
    }

    /// A token cancelled when the lease is lost (or released).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Resolves with the reason once the lease is lost; fires no later than `valid_until`.
    ///
    /// # Cancel safety
    /// Cancel-safe; call it again to wait again.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut rx = self.shared.status.subscribe();
        async move {
            loop {
                if let LeaseStatus::Lost(reason) = &*rx.borrow_and_update() {
                    return reason.clone();
                }
                if rx.changed().await.is_err() {
                    return LossReason::Released;
                }
            }
        }
    }

    /// When the loss (or release) was signalled, on the monotonic clock; `None` while held.
    pub fn lost_at(&self) -> Option<Instant> {
        *self
            .shared
            .lost_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Extend now (the watchdog does this on its own unless auto-extend is off).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the extension failed; the lease is then reported lost.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped extension may have reached some nodes, which only lengthens
    /// the copies there; the validity this guard reports is unchanged by it.
    pub async fn extend(&self) -> Result<(), Error> {
        extend_once(&self.shared)
            .await
            .map_err(|reason| Error::LeaseLost {
                name: self.name().to_string(),
                reason,
            })
    }

    /// Release the lease (compare-and-delete on every node) and stop extending. Returns
    /// whether a majority still held it.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for reporting release failures.
    ///
    /// # Cancel safety
    /// If cancelled, the lease is no longer extended and expires at its TTL.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.released = true;
        let shared = self.shared.clone();
        shared.stop.cancel();
        shared.signal(LossReason::Released);
        let deleted = shared.lock.release_value(&shared.value).await;
        Ok(deleted >= shared.lock.inner.client.majority().needed())
    }

    /// TEST ONLY: stop extending without signalling, as if this process were paused, so a test
    /// can show what fencing protects against. The loss signal still fires at `valid_until`.
    #[cfg(feature = "test-util")]
    pub fn suspend_extension_for_tests(&self) {
        self.shared
            .suspended_for_tests
            .store(true, Ordering::SeqCst);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let shared = self.shared.clone();
        shared.stop.cancel();
        shared.signal(LossReason::Released);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                shared.lock.release_value(&shared.value).await;
            });
        }
    }
}

impl LeaseShared {
    fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reason of a signalled loss ([`LossReason::Released`] if none was signalled).
    fn lost_reason(&self) -> LossReason {
        match &*self.status.borrow() {
            LeaseStatus::Lost(r) => r.clone(),
            LeaseStatus::Held { .. } => LossReason::Released,
        }
    }

    /// Publish the loss once; later reasons are ignored.
    fn signal(&self, reason: LossReason) {
        let now = Instant::now();
        let changed = self.status.send_if_modified(|s| {
            if matches!(s, LeaseStatus::Lost(_)) {
                false
            } else {
                // Recorded and cancelled before the change is published, so whoever sees the
                // loss also sees when, and finds the token cancelled.
                *self.lost_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
                self.cancel.cancel();
                *s = LeaseStatus::Lost(reason.clone());
                true
            }
        });
        if changed && reason != LossReason::Released {
            tracing::warn!(lock = %self.lock.name(), token = %self.token, %reason, "lease lost");
        }
    }
}

async fn extend_once(shared: &Arc<LeaseShared>) -> Result<(), LossReason> {
    if let LeaseStatus::Lost(reason) = &*shared.status.borrow() {
        return Err(reason.clone());
    }
    let times = shared.times();
    let version = shared.version.fetch_add(1, Ordering::AcqRel) + 1;
    match shared
        .lock
        .send_extend(&shared.value, shared.token, version, times.valid_until())
        .await
    {
        // An extension decided after the loss was signalled does not revive the lease.
        Ok(_) if matches!(*shared.status.borrow(), LeaseStatus::Lost(_)) => {
            Err(shared.lost_reason())
        }
        Ok(until) => {
            let mut t = shared.times.lock().unwrap_or_else(|p| p.into_inner());
            if until.mono > t.until.mono {
                t.until = until;
            }
            t.extensions += 1;
            let v = t.valid_until();
            drop(t);
            shared.status.send_if_modified(|s| match s {
                LeaseStatus::Held { valid_until } => {
                    *valid_until = v;
                    true
                }
                LeaseStatus::Lost(_) => false,
            });
            Ok(())
        }
        Err((true, _)) => {
            shared.signal(LossReason::Conflict);
            Err(LossReason::Conflict)
        }
        Err((false, why)) => Err(LossReason::NoQuorum(why)),
    }
}

/// Extends at about TTL/3 and signals loss no later than the validity deadline.
async fn watchdog(shared: Arc<LeaseShared>) {
    let lock = shared.lock.inner.clone();
    let mut last_failure: Option<LossReason> = None;
    let mut next_extend = Instant::now() + lock.ttl / 3;
    // Signal a little before the deadline, so that timer and scheduling delays cannot push the
    // signal past it.
    let margin = lock.ttl / 50 + Duration::from_millis(1);
    loop {
        let until = shared.times().until;
        let valid_until = until.mono;
        let signal_at =
            valid_until - margin.min(valid_until.saturating_duration_since(shared.acquired_at));
        // The boot clock also counts time the host was suspended (tokio's clock does not):
        // wake at least every second to compare with it.
        if clock::boot_now() + margin >= until.boot {
            shared.signal(last_failure.take().unwrap_or(LossReason::Expired));
            return;
        }
        let check_at = (Instant::now() + Duration::from_secs(1)).min(signal_at);
        let bound_reached = lock
            .max_hold
            .is_some_and(|m| shared.acquired_at.elapsed() >= m)
            || lock
                .max_extensions
                .is_some_and(|m| shared.times().extensions >= m);
        if bound_reached {
            shared.signal(LossReason::HoldBoundReached);
            return;
        }
        let extending = lock.auto_extend && !shared.suspended_for_tests.load(Ordering::SeqCst);
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep_until(check_at) => {
                if shared.times().valid_until() <= Instant::now() + margin {
                    shared.signal(last_failure.take().unwrap_or(LossReason::Expired));
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_extend), if extending => {
                if shared.suspended_for_tests.load(Ordering::SeqCst) {
                    continue;
                }
                let attempt = tokio::select! {
                    r = extend_once(&shared) => Some(r),
                    _ = tokio::time::sleep_until(signal_at) => None,
                    _ = shared.stop.cancelled() => return,
                };
                match attempt {
                    Some(Ok(())) => {
                        last_failure = None;
                        next_extend = Instant::now() + lock.ttl / 3;
                    }
                    Some(Err(LossReason::Conflict)) => return,
                    Some(Err(other)) => {
                        last_failure = Some(other);
                        // Try again soon, well before the deadline.
                        next_extend = Instant::now() + (lock.ttl / 10).max(Duration::from_millis(5));
                    }
                    None => {
                        shared.signal(last_failure.take().unwrap_or(LossReason::Expired));
                        return;
                    }
                }
            }
        }
    }
}

/// 128 random bits from the OS CSPRNG, as 32 hex digits.
fn random_hex128() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // The OS CSPRNG is unavailable (it never is on Linux); fall back to the thread RNG,
        // which is itself seeded from the OS.
        bytes = rand::random();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One acquisition round's node step, built once per round; [`step`](Self::step) gives each
/// node its ask.
struct AcquireStep {
    keys: [String; 4],
    value: Arc<str>,
    ttl_ms: u64,
    token: u64,
    /// The test-only server-side expiry.
    expiry: bool,
}

impl AcquireStep {
    /// `lock_acquire.lua` for one node: grant if free, swap the watched state (compared with
    /// the incarnation it was watched on), or only read.
    fn step(&self, ask: &Ask) -> Step<Grant> {
        let call = script_call(&LOCK_ACQUIRE, Guard::Marker)
            .key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .key(&self.keys[3])
            .arg(&*self.value)
            .arg(self.ttl_ms)
            .arg(self.token);
        let call = match ask {
            Ask::Read => call.marker().arg("read").arg("").arg(0),
            Ask::Swap(Seen {
                state: KeyState::Absent,
                ..
            }) => call.marker().arg("absent").arg("").arg(0),
            Ask::Swap(Seen {
                run_id,
                state: KeyState::Held { value, version, .. },
            }) => call.arg(&**run_id).arg("swap").arg(&**value).arg(*version),
        };
        call.arg(if self.expiry { "x" } else { "" })
            .decode(|ctx, v| decode_grant(&ctx.marker, v))
    }
}

/// A node's answer to `lock_acquire.lua`: `{status, fence, value, version, ttl}`.
fn decode_grant(marker: &Arc<str>, v: redis::Value) -> redis::RedisResult<NodeOutcome<Grant>> {
    let (status, fence, cur_value, cur_version, cur_ttl): (i64, u64, String, u64, u64) =
        redis::from_redis_value(v)?;
    let state = if cur_value.is_empty() {
        KeyState::Absent
    } else {
        KeyState::Held {
            value: cur_value.into(),
            version: cur_version,
            ttl: Duration::from_millis(cur_ttl),
        }
    };
    let grant = Grant {
        status: match status {
            1 => GrantStatus::Granted,
            0 => GrantStatus::NotAsExpected,
            -2 => GrantStatus::TokenLow,
            _ => GrantStatus::Refused,
        },
        fence,
        seen: Seen {
            run_id: marker.clone(),
            state,
        },
    };
    Ok(if status == 1 {
        NodeOutcome::Applied(grant)
    } else {
        NodeOutcome::Rejected(grant)
    })
}

/// A node's answer to `lock_extend.lua`: applied (re-created a missing copy: `true`), marker
/// stale (unknown), or held by another value.
fn decode_extension(v: redis::Value) -> redis::RedisResult<NodeOutcome<bool>> {
    let status: i64 = redis::from_redis_value(v)?;
    Ok(match status {
        1 | 2 => NodeOutcome::Applied(status == 2),
        -1 => NodeOutcome::Unknown(UnknownCause::Excluded("marker missing or stale".into())),
        _ => NodeOutcome::Rejected(false),
    })
}
