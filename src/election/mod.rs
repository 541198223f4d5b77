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
/// ([`Leadership::term`]) and let the resource reject lower terms ([`FencingToken`](crate::FencingToken)).
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

/// Work done once per period (the seed's daily job) by whichever instance leads.
///
/// Every instance calls [`run_period`](Self::run_period) for the current period; the one that
/// holds the job's lease checks a completion record on a majority, runs the work if the period
/// is not done yet, and records completion with its fencing token on a majority. A failover
/// after completion does not run the period again; a failover during the work lets the new
/// leader run it (make the work's side effects idempotent or fenced by the token: a paused old
/// leader can still be finishing).
///
/// Three ways to run a period: [`run_period`](Self::run_period) (the work's end records the
/// period, whatever it returns), [`try_run_period`](Self::try_run_period) (work that can fail:
/// an `Err` records nothing, so the next call runs the period again), and
/// [`begin_period`](Self::begin_period) (the caller holds the lease itself, as
/// `redquorum job run` does for a command, and says when the period is complete).
///
/// The job's lease is the lock named like the job ([`Lock::holder`] of that name shows who
/// runs it). A one-shot call (`wait` zero, a cron run) takes over the lease of a runner that
/// crashed after watching it unchanged for its TTL plus drift (see [`Lock::try_acquire`]).
/// Completion records never expire; the newest 1024 are kept (see
/// [`JobOptions::with_retained_records`]).
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

/// What [`PeriodicJob::run_period`] (or [`PeriodicJob::try_run_period`]) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome<T> {
    /// This instance ran the period's work.
    Ran {
        /// The work's result.
        output: T,
        /// The token it ran with (recorded with the completion; by `try_run_period` only when
        /// the work returned `Ok`).
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

/// What [`PeriodicJob::begin_period`] found.
#[must_use = "a due period holds the job's lease until it is completed or abandoned"]
#[derive(Debug)]
pub enum PeriodStart {
    /// This instance holds the job's lease and the period is not recorded: do the work, then
    /// [`PeriodRun::complete`] it (recorded) or [`PeriodRun::abandon`] it (not recorded).
    Due(PeriodRun),
    /// The period was already completed (by the holder of `token`); the lease was released.
    AlreadyDone {
        /// The token recorded with the completion.
        token: FencingToken,
    },
    /// Another instance holds the job's lease right now (or `wait` ended first).
    NotLeader,
}

/// A period being run under the job's lease, from [`PeriodicJob::begin_period`]. Dropping it
/// abandons the period (nothing recorded) and releases the lease in the background; prefer
/// [`complete`](Self::complete) or [`abandon`](Self::abandon).
#[must_use = "the period is recorded only by `complete`"]
#[derive(Debug)]
pub struct PeriodRun {
    job: PeriodicJob,
    period: crate::keys::Name,
    guard: LockGuard,
}

impl PeriodRun {
    /// The fencing token of this run (the one [`complete`](Self::complete) records): write
    /// with it.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// The period's name.
    pub fn period(&self) -> &str {
        self.period.as_str()
    }

    /// The job's lease: [`LockGuard::lost`] fires when it is lost (stop the work; a new holder
    /// may run the period), [`LockGuard::valid_until`] bounds how long the work may go on.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Record the period as done with this run's token on a majority, then release the lease.
    /// Call it only when the work is complete: it records even if the lease was lost meanwhile
    /// (a new holder may then be running the period again; fence or make the work idempotent).
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if a majority did not apply the record (the lease is released
    /// anyway). The record may then be on some nodes: a later run may find the period done, or
    /// run it again.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a dropped call may leave the record on some nodes only (as with an
    /// error); the lease is released in the background.
    pub async fn complete(self) -> Result<FencingToken, Error> {
        let PeriodRun { job, period, guard } = self;
        let token = guard.token();
        let recorded = crate::jobs::record(
            &job.lock,
            &job.done_key,
            period.as_str(),
            token,
            job.retained,
        )
        .await;
        let _ = guard.release().await;
        recorded.map(|()| token)
    }

    /// Leave the period unrecorded (the work failed or was stopped) and release the lease, so
    /// that the next run, here or on another instance, runs the period again.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped call releases the lease in the background.
    pub async fn abandon(self) {
        let _ = self.guard.release().await;
    }
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
    /// Waits up to `wait` for the job's lease. The period is recorded when `work` returns,
    /// whatever it returns (for work that can fail, see [`try_run_period`](Self::try_run_period)).
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
        let infallible = |token, cancel| {
            let fut = work(token, cancel);
            async move { Ok::<T, std::convert::Infallible>(fut.await) }
        };
        Ok(match self.try_run_period(period, wait, infallible).await? {
            JobOutcome::Ran { output, token } => JobOutcome::Ran {
                output: output.unwrap_or_else(|never| match never {}),
                token,
            },
            JobOutcome::AlreadyDone { token } => JobOutcome::AlreadyDone { token },
            JobOutcome::NotLeader => JobOutcome::NotLeader,
        })
    }

    /// Run fallible `work` for `period` unless it was done already, waiting up to `wait` for
    /// the job's lease. `Ok` records the period with the run's token (as
    /// [`run_period`](Self::run_period)); `Err` records nothing, so the next call (here or on
    /// another instance) runs the period again. Either way the outcome is
    /// [`JobOutcome::Ran`] with the work's result.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease was lost while the work ran (the work was cancelled
    /// and the period is not recorded); [`Error::NoQuorum`] without a majority (reading the
    /// records, or recording after an `Ok`: the record may then be on some nodes only);
    /// invalid input. The work's own failure is not an error of this call.
    ///
    /// # Cancel safety
    /// As [`run_period`](Self::run_period): dropping the call drops `work` wherever it is and
    /// leaves the period unrecorded, unless the record was being written (then it may be on
    /// some nodes only). The lease is released.
    pub async fn try_run_period<F, Fut, T, E>(
        &self,
        period: &str,
        wait: Duration,
        work: F,
    ) -> Result<JobOutcome<Result<T, E>>, Error>
    where
        F: FnOnce(FencingToken, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let run = match self.begin_period(period, wait).await? {
            PeriodStart::Due(run) => run,
            PeriodStart::AlreadyDone { token } => return Ok(JobOutcome::AlreadyDone { token }),
            PeriodStart::NotLeader => return Ok(JobOutcome::NotLeader),
        };
        let token = run.token();
        let mut fut = Box::pin(work(token, run.guard.cancellation_token()));
        let output = tokio::select! {
            out = &mut fut => out,
            reason = run.guard.lost() => {
                drop(fut);
                run.abandon().await;
                return Err(Error::LeaseLost { name: self.lock.name().to_string(), reason });
            }
        };
        match output {
            Ok(value) => {
                run.complete().await?;
                Ok(JobOutcome::Ran {
                    output: Ok(value),
                    token,
                })
            }
            Err(failure) => {
                run.abandon().await;
                Ok(JobOutcome::Ran {
                    output: Err(failure),
                    token,
                })
            }
        }
    }

    /// Take the job's lease for `period` (waiting up to `wait`) and read its completion record
    /// on a majority: [`PeriodStart::Due`] hands the held lease to the caller, who does the
    /// work and then completes or abandons the run; otherwise the lease is not held. With
    /// `wait` zero (a cron run) it tries once: at once when the lease is free, within about
    /// the holder's extension interval when a live instance holds it, after the TTL plus drift
    /// (taking the lease over) when its holder crashed.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority (the lease, if won, is released); invalid input
    /// (the period's name: 1 to 512 bytes, no control characters). A held lease is
    /// [`PeriodStart::NotLeader`], not an error.
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease won by a dropped call is released in the background; nothing is
    /// recorded.
    pub async fn begin_period(&self, period: &str, wait: Duration) -> Result<PeriodStart, Error> {
        let period = crate::keys::Name::new("period", period)?;
        let guard = match self.lock.acquire(wait).await {
            Ok(g) => g,
            Err(Error::LockHeld { .. } | Error::Timeout { .. } | Error::Contended { .. }) => {
                return Ok(PeriodStart::NotLeader)
            }
            Err(e) => return Err(e),
        };
        match crate::jobs::completed(&self.lock, &self.done_key, period.as_str()).await {
            Ok(None) => Ok(PeriodStart::Due(PeriodRun {
                job: self.clone(),
                period,
                guard,
            })),
            Ok(Some(token)) => {
                let _ = guard.release().await;
                Ok(PeriodStart::AlreadyDone { token })
            }
            Err(e) => {
                let _ = guard.release().await;
                Err(e)
            }
        }
    }
}
