//! [`PeriodicJob`]: once-per-period work under the job's lease, with completion records on a
//! majority (`super` holds the records' node steps).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lock::{Lock, LockGuard, LockOptions};

/// Work done once per period (the seed's daily job) by whichever instance leads.
///
/// Every instance calls [`run_period`](Self::run_period) for the current period; the one that
/// holds the job's lease checks a completion record on a majority, runs the work if the period
/// is not done yet, and records completion with its fencing token on a majority. A failover
/// after completion does not run the period again; a failover during the work lets the new
/// leader run it (make the work's side effects idempotent or fenced by the token: a paused old
/// leader can still be finishing).
///
/// Three ways to run a period: [`run_period`](Self::run_period) (work that can fail: only its
/// `Ok` records the period; an `Err` records nothing, so the next call runs the period
/// again), [`run_period_infallible`](Self::run_period_infallible) (work that cannot fail: its
/// end records the period), and [`begin_period`](Self::begin_period) (the caller holds the
/// lease itself, as `redquorum job run` does for a command, and says when the period is
/// complete).
///
/// A record counts only while the lease holds: a run that lost its lease (paused, cut off)
/// is told so ([`Error::LeaseLost`]) and its late record counts for nobody, even where it
/// lands: once a later run began the period, no record below that run's token counts.
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
    /// records (lowest tokens) beyond this many are deleted, so the record hash stays bounded
    /// (it holds two fields per period, its record and its begin mark: `2 * n` fields).
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

/// What [`PeriodicJob::run_period`] (or [`PeriodicJob::run_period_infallible`]) did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "the outcome says whether this call ran the period"]
pub enum JobOutcome<T> {
    /// This instance ran the period's work.
    Ran {
        /// The work's result.
        output: T,
        /// The token it ran with (recorded with the completion, by `run_period` only when the
        /// work returned `Ok`).
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
    /// Call it only when the work is complete. The record counts only while the lease holds:
    /// a lease already lost records nothing; each node refuses the record where it shows a
    /// later holder of the job's lease or a later run of the period; and it counts only if a
    /// majority applied it before the lease's validity at its send ended (judged as an
    /// extension is). So a run that lost its lease is told so, never that it recorded.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease was lost before the record (nothing sent), when
    /// the nodes refused it (a later holder or run: a new holder may be running the period),
    /// or when a majority applied it only after the validity ended (it does not count, but a
    /// later run may still find the period done); [`Error::NoQuorum`] when no majority
    /// decided either way (the record may be on some nodes: a later run may find the period
    /// done, or run it again). The lease is released in every case.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a dropped call may leave the record on some nodes only (as with an
    /// error); the lease is released in the background.
    pub async fn complete(self) -> Result<FencingToken, Error> {
        let PeriodRun { job, period, guard } = self;
        let token = guard.token();
        let recorded = if guard.is_held() {
            job.before_record().await;
            super::record(&guard, &job.done_key, period.as_str(), job.retained).await
        } else {
            Err(Error::LeaseLost {
                name: guard.name().to_string(),
                reason: guard.loss_reason(),
            })
        };
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
            retained: options.retained.unwrap_or(super::RETAINED_RECORDS),
        })
    }

    /// Run fallible `work` for `period` (for example `"2026-11-22"`) unless it was done
    /// already, waiting up to `wait` for the job's lease. `Ok` records the period with the
    /// run's token on a majority (while the lease holds: see [`PeriodRun::complete`]); `Err`
    /// records nothing, so the next call (here or on another instance) runs the period again.
    /// Either way the outcome is [`JobOutcome::Ran`] with the work's result. For work that
    /// cannot fail, [`run_period_infallible`](Self::run_period_infallible).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease was lost while the work ran (the work was cancelled
    /// and the period is not recorded), also when the work and the loss were ready together
    /// (the loss wins), and when the record came too late or was refused (see
    /// [`PeriodRun::complete`]); [`Error::NoQuorum`] without a majority (reading the records,
    /// or recording after an `Ok`: the record may then be on some nodes only);
    /// [`Error::TooSlow`] or [`Error::Contended`] as [`begin_period`](Self::begin_period);
    /// invalid input. The work's own failure is not an error of this call.
    ///
    /// # Cancel safety
    /// Not cancel-safe for the work: dropping the call drops `work` wherever it is and leaves
    /// the period unrecorded (it runs again on the next call), unless the record was being
    /// written (then it may be on some nodes only). The lease is released.
    pub async fn run_period<F, Fut, T, E>(
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
            // The loss first: work that ends as the lease is lost is not recorded.
            biased;
            reason = run.guard.lost() => {
                drop(fut);
                run.abandon().await;
                return Err(Error::LeaseLost { name: self.lock.name().to_string(), reason });
            }
            out = &mut fut => out,
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

    /// [`run_period`](Self::run_period) for work that cannot fail: the period is recorded
    /// when `work` returns, whatever it returns. Work that can fail belongs in `run_period`,
    /// which records only its `Ok`.
    ///
    /// # Errors
    /// As [`run_period`](Self::run_period).
    ///
    /// # Cancel safety
    /// As [`run_period`](Self::run_period).
    pub async fn run_period_infallible<F, Fut, T>(
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
        Ok(match self.run_period(period, wait, infallible).await? {
            JobOutcome::Ran { output, token } => JobOutcome::Ran {
                output: output.unwrap_or_else(|never| match never {}),
                token,
            },
            JobOutcome::AlreadyDone { token } => JobOutcome::AlreadyDone { token },
            JobOutcome::NotLeader => JobOutcome::NotLeader,
        })
    }

    /// Take the job's lease for `period` (waiting up to `wait`) and read its completion record
    /// on a majority: [`PeriodStart::Due`] hands the held lease to the caller, who does the
    /// work and then completes or abandons the run; otherwise the lease is not held. With
    /// `wait` zero (a cron run) it tries once: at once when the lease is free, within about
    /// the holder's extension interval when a live instance holds it, after the TTL plus drift
    /// (taking the lease over) when its holder crashed.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] without a majority (the lease, if won, is released);
    /// [`Error::TooSlow`] when the nodes granted the lease too late to leave half its TTL, and
    /// [`Error::Contended`] when concurrent grants kept its token behind: nobody was seen
    /// holding the lease, so these are errors to retry, never [`PeriodStart::NotLeader`] (a
    /// cron caller that took them for "another host runs it" would skip the period on every
    /// host while the nodes are slow); invalid input (the period's name: 1 to 512 bytes, no
    /// control characters). A lease held by another instance (or a `wait` that ended while it
    /// was held) is [`PeriodStart::NotLeader`], not an error; but a `wait` that ended before
    /// the takeover of a lease that looks abandoned (its holder crashed) is
    /// [`Error::LockLooksAbandoned`], which says when it can be taken over.
    ///
    /// # Cancel safety
    /// Cancel-safe: a lease won by a dropped call is released in the background; nothing is
    /// recorded.
    pub async fn begin_period(&self, period: &str, wait: Duration) -> Result<PeriodStart, Error> {
        let period = crate::keys::Name::new("period", period)?;
        let guard = match self.lock.acquire(wait).await {
            Ok(g) => g,
            Err(Error::LockHeld { .. } | Error::Timeout { .. }) => {
                return Ok(PeriodStart::NotLeader)
            }
            Err(e) => return Err(e),
        };
        match self.due(&guard, period.as_str()).await {
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

    /// Under the held lease: the record of `period` that counts, or `None` once the period is
    /// marked begun with this run's token on a majority (no record below it counts any more).
    async fn due(&self, guard: &LockGuard, period: &str) -> Result<Option<FencingToken>, Error> {
        let begun = self.lock.client().config().begun_marks;
        if let Some(token) = super::completed(&self.lock, &self.done_key, period, begun).await? {
            return Ok(Some(token));
        }
        if begun {
            super::mark_begun(guard, &self.done_key, period).await?;
        }
        Ok(None)
    }

    /// TEST ONLY: the pause of [`Config::with_record_hook_for_tests`](crate::Config), between
    /// the loss check and the record; nothing otherwise.
    async fn before_record(&self) {
        #[cfg(feature = "test-util")]
        if let Some(hook) = &self.lock.client().config().record_hook {
            (hook.0)().await;
        }
    }
}
