//! Leader election over the quorum nodes: the leader is the holder of a fenced lease, and the
//! leadership **term is the lease's fencing token**.
//!
//! The guarantees are documented on `Election`.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lock::{Holder, Lock, LockGuard, LockOptions, LossReason};

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
/// ([`Leadership::term`]) and let the resource reject lower terms ([`FencingToken`](crate::FencingToken)).
/// [`Election::leader`] and [`Election::observe`] report what a majority said at the time of
/// reading; the answer may be stale by the time it is used. No node clock ends a lease, so a
/// leader that crashed is still reported until a campaigning candidate takes its lease over
/// (within the TTL plus one poll when any candidate campaigns).
///
/// A named election among candidates.
#[derive(Clone, Debug)]
pub struct Election {
    lock: Lock,
    candidate: String,
}

/// The current leader as read from a majority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's candidate ID.
    pub candidate: String,
    /// Its term (the fencing token of its lease).
    pub term: FencingToken,
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
                    | Error::LockHeld { .. }
                    | Error::Contended { .. }
                    | Error::NoQuorum(_),
                ) => continue,
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
    /// [`Error::Contended`] when concurrent grants kept its token behind (retryable).
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease won by a dropped call is released in the background.
    pub async fn try_campaign(&self) -> Result<Leadership, Error> {
        self.lock.try_acquire().await.map(Leadership::won)
    }

    /// The leader according to a majority of the nodes, or `None` when there is none.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, Error> {
        Ok(self
            .lock
            .holder()
            .await?
            .map(|Holder { holder, token, .. }| LeaderInfo {
                candidate: holder,
                term: token,
            }))
    }

    /// A stream of leadership changes: the current state first, then every change (a new
    /// leader, or `None` for no leader), checked every `interval` and at once when a leader
    /// resigns. Reads that fail (no majority) are skipped. The stream ends when dropped.
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
                    if last.as_ref() != Some(&now) {
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

/// Work done once per period (the seed's daily job) by whichever instance leads.
///
/// Every instance calls [`run_period`](Self::run_period) for the current period; the one that
/// holds the job's lease checks a completion record on a majority, runs the work if the period
/// is not done yet, and records completion with its fencing token on a majority. A failover
/// after completion does not run the period again; a failover during the work lets the new
/// leader run it (make the work's side effects idempotent or fenced by the token: a paused old
/// leader can still be finishing).
#[derive(Clone, Debug)]
pub struct PeriodicJob {
    retained: u64,
    lock: Lock,
    done_key: String,
}

/// How a [`PeriodicJob`] behaves, given at construction ([`PeriodicJob::with_options`]).
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    retained: Option<u64>,
    lock: LockOptions,
}

impl JobOptions {
    /// How many completion records to keep (default 1024): after each completion the oldest
    /// records (lowest tokens) beyond this many are deleted, so the record hash stays bounded.
    /// A period older than the retained ones is not remembered: asked for again, it runs
    /// again. At least 1.
    pub fn with_retained_records(mut self, n: u64) -> Self {
        self.retained = Some(n.max(1));
        self
    }

    /// The options of the job's lease (for example [`LockOptions::with_max_hold`]).
    pub fn with_lock(mut self, options: LockOptions) -> Self {
        self.lock = options;
        self
    }
}

/// What [`PeriodicJob::run_period`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome<T> {
    /// This instance ran the period's work.
    Ran {
        /// The work's result.
        output: T,
        /// The token it ran with (recorded with the completion).
        token: FencingToken,
    },
    /// The period was already completed (by the holder of `token`).
    AlreadyDone {
        /// The token recorded with the completion.
        token: FencingToken,
    },
    /// Another instance holds the job's lease right now.
    NotLeader,
}

impl PeriodicJob {
    /// A job named `name`, whose runner holds a lease of `ttl` (extended while it runs).
    ///
    /// # Errors
    /// As [`Lock::new`].
    pub fn new(client: &Client, name: &str, ttl: Duration) -> Result<PeriodicJob, Error> {
        PeriodicJob::with_options(client, name, ttl, JobOptions::default())
    }

    /// A job with the given options.
    ///
    /// # Errors
    /// As [`Lock::new`].
    pub fn with_options(
        client: &Client,
        name: &str,
        ttl: Duration,
        options: JobOptions,
    ) -> Result<PeriodicJob, Error> {
        let lock = Lock::with_options(client, name, ttl, options.lock)?;
        let done_key = crate::keys::Name::new("job", name)?.key(crate::keys::KeyKind::Done);
        Ok(PeriodicJob {
            lock,
            done_key,
            retained: options.retained.unwrap_or(crate::jobs::RETAINED_RECORDS),
        })
    }

    /// Run `work` for `period` (for example `"2026-11-22"`) unless it was done already.
    /// Waits up to `wait` for the job's lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease was lost while the work ran (the work was cancelled
    /// and the period is not recorded); [`Error::NoQuorum`] without a majority; invalid input.
    ///
    /// # Cancel safety
    /// Not cancel-safe for the work: dropping the call drops `work` wherever it is and leaves
    /// the period unrecorded (it runs again on the next call). The lease is released.
    pub async fn run_period<F, Fut, T>(
        &self,
        period: &str,
        wait: Duration,
        work: F,
    ) -> Result<JobOutcome<T>, Error>
    where
        F: FnOnce(FencingToken, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let period = crate::keys::Name::new("period", period)?;
        let guard = match self.lock.acquire(wait).await {
            Ok(g) => g,
            Err(Error::LockHeld { .. } | Error::Timeout { .. } | Error::Contended { .. }) => {
                return Ok(JobOutcome::NotLeader)
            }
            Err(e) => return Err(e),
        };
        if let Some(token) =
            crate::jobs::completed(&self.lock, &self.done_key, period.as_str()).await?
        {
            let _ = guard.release().await;
            return Ok(JobOutcome::AlreadyDone { token });
        }
        let token = guard.token();
        let mut fut = Box::pin(work(token, guard.cancellation_token()));
        let output = tokio::select! {
            out = &mut fut => out,
            reason = guard.lost() => {
                drop(fut);
                return Err(Error::LeaseLost { name: self.lock.name().to_string(), reason });
            }
        };
        let recorded = crate::jobs::record(
            &self.lock,
            &self.done_key,
            period.as_str(),
            token,
            self.retained,
        )
        .await;
        let _ = guard.release().await;
        recorded?;
        Ok(JobOutcome::Ran { output, token })
    }
}
