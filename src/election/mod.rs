//! Leader election over the quorum nodes: the leader is the holder of a fenced lease, and the
//! leadership **term is the lease's fencing token**. It adds no protocol of its own to
//! `crate::lock`.
//!
//! # How it works
//! 1. [`Election::campaign`] acquires the election's lease (a [`Lock`] named like the election,
//!    its holder description the candidate ID), retrying until it wins; `try_campaign` tries
//!    once (taking over a lease left unchanged for its TTL plus drift).
//! 2. The winner's [`Leadership`] carries the term (the lease's token) and the lease's loss
//!    signal; `resign` releases the lease, which wakes waiting candidates at once (the release
//!    hint).
//! 3. [`Election::leader`] and [`Election::observe`] read the holder from a majority; a handle
//!    that has watched the lease unchanged for its TTL plus drift reports the leader as looking
//!    abandoned.
//! 4. [`Election::lead`] (`lead.rs`) is the leader loop: campaign, run the work once per term
//!    with the term and a cancellation token, drop it when leadership is lost, campaign again;
//!    on shutdown tell the work, await it and resign. What follows a term is a pure table.
//!
//! # Guarantees
//! Those of [`Lock`] (full list on [`Election`] and [`Election::lead`]): at most one leader
//! within validity; every term is greater than every earlier term; a leader learns of its loss
//! no later than the end of its validity, so two candidates' works never overlap; a resigning
//! leader's successor is woken at once, a crashed leader's takes over within the TTL plus one
//! retry delay. Not guaranteed: leadership alone never authorizes an unfenced side effect
//! (write with the term, let the resource refuse lower terms); `leader` and `observe` may be
//! stale by the time they are used; fairness between candidates.
//!
//! # Invariants
//! - The term is the lease's fencing token, minted in the acquisition script: no separate term
//!   counter exists.
//! - One handle runs one work at a time: a term's work has ended (returned or dropped) before the
//!   next campaign begins.
//! - Every `won` leadership is followed by exactly one `lost` or `resigned` (the leadership
//!   metrics).
//!
//! # What it relies on outside this folder
//! - `crate::lock` for everything on the nodes, and `crate::lease` for "looks abandoned".
//! - Keys (`src/keys.rs`): the lock's `KeyKind::Lock` and `KeyKind::Fence` under the election's
//!   name (a group's or pool's leader uses `KeyKind::GroupLock` or `KeyKind::PoolLock`).
//! - Scripts: the lock's `src/scripts/lock_acquire.lua`, `src/scripts/lock_extend.lua`,
//!   `src/scripts/lock_release.lua`.
//! - Repair rule (`src/repair/plan.rs`): as a lock's (lease copies restored, fences raised).
//! - ACL (`src/acl.rs`): `Feature::Election` (the lock's commands, plus what periodic jobs need).
//! - Model: `model/src/leases.rs` (a leader is a lease holder).
//! - Tests: `tests/election.rs` (one leader at a time, hand-over and fail-over, the leader loop),
//!   `tests/metrics.rs` (leaderships won and resigned).
//!
//! # Files
//! - `mod.rs`: [`Election`], [`Leadership`], [`LeaderInfo`].
//! - `lead.rs`: [`Election::lead`], the leader loop, and [`LeadSummary`].

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lock::{Holder, Lock, LockGuard, LockOptions, LossReason};

mod lead;
pub use lead::LeadSummary;

/// Leader election over the quorum nodes: the leader is the holder of a fenced lease, and the
/// leadership **term is the lease's fencing token**.
///
/// # Guarantees
/// Those of [`Lock`]: at most one leader within validity; every term is greater than
/// every earlier term; a leader learns of its loss ([`Leadership::lost`]) no later than the end
/// of its validity. A resigning leader's successor is woken at once (release notifications);
/// a crashed leader's successor takes over within the TTL plus one retry delay.
///
/// # Not guaranteed
/// Leadership alone never authorizes an unfenced side effect: write with the term
/// ([`Leadership::term`]) and let the resource reject lower terms ([`FencingToken`]).
/// [`Election::leader`] and [`Election::observe`] report what a majority said at the time of
/// reading; the answer may be stale by the time it is used. No node clock ends a lease, so a
/// leader that crashed is still reported until a campaigning candidate takes its lease over
/// (within the TTL plus one poll when any candidate campaigns); a handle that has watched the
/// lease unchanged for its TTL plus drift says the leader looks abandoned
/// ([`LeaderInfo::looks_abandoned`]; a single read cannot tell).
///
/// A named election among candidates.
#[derive(Clone, Debug)]
pub struct Election {
    lock: Lock,
    candidate: String,
}

/// The current leader as read from a majority.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's candidate ID.
    pub candidate: String,
    /// Its term (the fencing token of its lease).
    pub term: FencingToken,
    /// The leader's lease time (as its lease holds it).
    pub ttl: Duration,
    /// For how long this [`Election`] handle has seen the leader's lease unchanged, on its
    /// own monotonic clock; `None` without history (a first read). See
    /// [`Holder::unchanged_for`].
    pub unchanged_for: Option<Duration>,
}

impl LeaderInfo {
    /// A leader as its own process knows it (a candidate that just won reports itself): no
    /// history, so [`looks_abandoned`](Self::looks_abandoned) is false.
    pub fn new(candidate: impl Into<String>, term: FencingToken, ttl: Duration) -> LeaderInfo {
        LeaderInfo {
            candidate: candidate.into(),
            term,
            ttl,
            unchanged_for: None,
        }
    }

    /// Whether the leader looks abandoned (crashed, frozen or cut off): this handle has seen
    /// its lease unchanged on a majority for the lease's TTL plus drift. A crashed leader
    /// stays the leader until a candidate takes its lease over; this says so before. False
    /// without history; see [`Holder::looks_abandoned`] for what it does not guarantee.
    pub fn looks_abandoned(&self) -> bool {
        crate::lease::looks_abandoned(self.unchanged_for, self.ttl)
    }

    fn from_holder(h: Holder) -> LeaderInfo {
        LeaderInfo {
            candidate: h.holder,
            term: h.token,
            ttl: h.ttl,
            unchanged_for: h.unchanged_for,
        }
    }
}

/// Being the leader. Dropping it resigns in the background; prefer [`resign`](Self::resign).
#[must_use = "leadership ends when this is dropped"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Election {
    /// An election named `name` with leader lease time `ttl`, for candidate `candidate` (an ID
    /// others will see, e.g. host and pid; control characters are dropped, 256 bytes at most).
    ///
    /// # Errors
    /// As [`Lock::new`]; [`Error::InvalidArgument`] for an empty candidate ID.
    pub fn new(
        client: &Client,
        name: &str,
        ttl: Duration,
        candidate: &str,
    ) -> Result<Election, Error> {
        Election::with_options(client, name, ttl, candidate, LockOptions::default())
    }

    /// An election whose leadership lease takes `options` (for example
    /// [`LockOptions::with_max_hold`] to bound one leader's term); the holder description is
    /// the candidate ID.
    ///
    /// # Errors
    /// As [`Election::new`].
    pub fn with_options(
        client: &Client,
        name: &str,
        ttl: Duration,
        candidate: &str,
        options: LockOptions,
    ) -> Result<Election, Error> {
        let candidate = Election::candidate_label(candidate)?;
        let lock = Lock::with_options(client, name, ttl, options.with_holder(&candidate))?;
        Ok(Election::on_lock(lock, candidate))
    }

    /// A candidate ID as stored (see [`LockOptions::with_holder`]).
    pub(crate) fn candidate_label(candidate: &str) -> Result<String, Error> {
        if candidate.trim().is_empty() {
            return Err(Error::InvalidArgument("candidate ID is empty".into()));
        }
        Ok(crate::lock::clean_label(candidate))
    }

    /// An election over a lock whose holder description is `candidate` (internal key kinds
    /// for group leaders).
    pub(crate) fn on_lock(lock: Lock, candidate: String) -> Election {
        Election { lock, candidate }
    }

    /// This candidate's ID.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Wait until this candidate is the leader.
    ///
    /// # Errors
    /// Invalid input only; outages and contention are retried for as long as it waits.
    ///
    /// # Cancel safety
    /// Cancel-safe: drop the future to stop campaigning; a lease won after that is released.
    pub async fn campaign(&self) -> Result<Leadership, Error> {
        loop {
            match self.lock.acquire(Duration::from_secs(3600)).await {
                Ok(guard) => return Ok(Leadership::won(guard)),
                Err(
                    Error::Timeout { .. }
                    | Error::TooSlow { .. }
                    | Error::LockHeld { .. }
                    | Error::LockLooksAbandoned { .. }
                    | Error::Contended { .. }
                    | Error::NoQuorum(_),
                ) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait up to `wait` to become the leader, as [`campaign`](Self::campaign) does (outages
    /// and contention are retried), then give up. A leader that crashed is outwaited (its
    /// lease taken over after its own TTL plus drift) when `wait` is long enough.
    ///
    /// # Errors
    /// [`Error::LockLooksAbandoned`] when `wait` ended before the takeover of a leader's lease
    /// that stayed unchanged for at least half its TTL (the leader is probably gone; the error
    /// says when its lease can be taken over); [`Error::Timeout`] when it ended otherwise
    /// (a live leader, or an outage); invalid input at once.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`campaign`](Self::campaign).
    pub async fn campaign_for(&self, wait: Duration) -> Result<Leadership, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // A zero wait would be a one-shot try: the deadline is the caller's.
            match self.lock.acquire(left.max(Duration::from_millis(1))).await {
                Ok(guard) => return Ok(Leadership::won(guard)),
                Err(e @ Error::LockLooksAbandoned { .. }) => return Err(e),
                Err(Error::TooSlow { .. } | Error::Contended { .. } | Error::NoQuorum(_))
                    if tokio::time::Instant::now() < deadline =>
                {
                    continue
                }
                Err(e) if e.is_retryable() || matches!(e, Error::Timeout { .. }) => {
                    return Err(Error::Timeout {
                        op: "election.campaign",
                        waited: wait,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Become leader only if nobody is: at once when the lease is free; within about the
    /// leader's extension interval, with [`Error::LockHeld`], when a live leader holds it; after
    /// the TTL plus drift, by a takeover, when the leader is gone (crashed) and its lease stayed
    /// unchanged (see [`Lock::try_acquire`]).
    ///
    /// # Errors
    /// [`Error::LockHeld`] if there is a live leader; [`Error::NoQuorum`] without a majority;
    /// [`Error::TooSlow`] when the nodes answered too late to leave half the TTL;
    /// [`Error::Contended`] when concurrent grants kept its token behind (both retryable, and
    /// neither means another leader).
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease won by a dropped call is released in the background.
    pub async fn try_campaign(&self) -> Result<Leadership, Error> {
        self.lock.try_acquire().await.map(Leadership::won)
    }

    /// One acquisition attempt, without watching a held lease across rounds: for a candidate
    /// that watches the lease from readings of its own and tries when
    /// [`Lock::ready_at`] says so (a group's members, whose view reads carry the lease).
    /// Errors as [`try_campaign`](Self::try_campaign); cancel-safe.
    pub(crate) async fn campaign_once(&self) -> Result<Leadership, Error> {
        self.lock.attempt_once().await.map(Leadership::won)
    }

    /// The lease under this election.
    pub(crate) fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The leader according to a majority of the nodes, or `None` when there is none, read
    /// once. The reading is remembered by this handle: a later call says for how long the
    /// leader's lease stayed unchanged and whether the leader looks abandoned
    /// ([`LeaderInfo::looks_abandoned`]); a first call cannot tell (see [`Lock::holder`]).
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, Error> {
        Ok(self.lock.holder().await?.map(LeaderInfo::from_holder))
    }

    /// The leader, watched for up to `watch` to tell a live leader from an abandoned one (see
    /// [`Lock::holder_watching`]: it returns as soon as it can tell; a watch of the TTL plus
    /// 1 % plus 2 ms always can).
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered the first read.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn leader_watching(&self, watch: Duration) -> Result<Option<LeaderInfo>, Error> {
        Ok(self
            .lock
            .holder_watching(watch)
            .await?
            .map(LeaderInfo::from_holder))
    }

    /// A stream of leadership changes: the current state first, then every change (a new
    /// leader, or `None` for no leader), checked every `interval` and at once when a leader
    /// resigns. A leader that comes to look abandoned ([`LeaderInfo::looks_abandoned`]: its
    /// lease unchanged for its TTL plus drift, as this stream saw it) is a change too, reported
    /// within one `interval` of it. Reads that fail (no majority) are skipped. The stream ends
    /// when dropped.
    pub fn observe(
        &self,
        interval: Duration,
    ) -> impl Stream<Item = Option<LeaderInfo>> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let election = self.clone();
        tokio::spawn(async move {
            let wake = Arc::new(Notify::new());
            let _watch = election.lock.release_watch(wake.clone());
            let mut last: Option<Option<LeaderInfo>> = None;
            loop {
                if let Ok(now) = election.leader().await {
                    if last.as_ref().is_none_or(|last| !same_report(last, &now)) {
                        if tx.send(now.clone()).await.is_err() {
                            return;
                        }
                        last = Some(now);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = wake.notified() => {}
                    _ = tx.closed() => return,
                }
            }
        });
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }
}

/// Whether two readings report the same leadership (the same leader and term, looking
/// abandoned or not): what [`Election::observe`] streams changes of.
fn same_report(a: &Option<LeaderInfo>, b: &Option<LeaderInfo>) -> bool {
    let key = |l: &Option<LeaderInfo>| {
        l.as_ref()
            .map(|l| (l.candidate.clone(), l.term, l.looks_abandoned()))
    };
    key(a) == key(b)
}

impl Leadership {
    /// Leadership won with `guard`: counted now, and again when it ends (a task waits for the
    /// lease's end, which a release or a drop of the guard also signals).
    fn won(guard: LockGuard) -> Leadership {
        crate::metrics::leadership_won();
        let lost = guard.lost();
        tokio::spawn(async move { crate::metrics::leadership_ended(&lost.await) });
        Leadership { guard }
    }

    /// The term: the fencing token of the leader's lease. Write with it.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// Resolves when leadership is lost, no later than the end of its validity.
    pub fn lost(&self) -> impl std::future::Future<Output = LossReason> + Send + 'static {
        self.guard.lost()
    }

    /// Cancelled when leadership is lost.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.guard.cancellation_token()
    }

    /// Whether this process is still the leader (lease not lost, validity not over).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Step down: release the lease so a waiting candidate takes over at once.
    ///
    /// # Errors
    /// None today (see [`LockGuard::release`]).
    ///
    /// # Cancel safety
    /// Cancel-safe: leadership already ended when the call began (the lease is reported
    /// lost first); a dropped release leaves copies that a successor takes over after their
    /// TTL.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await.map(|_| ())
    }

    /// The underlying lease guard.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }
}
