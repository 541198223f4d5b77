//! The leader loop as users write it: campaign, run the leader's work for the term, campaign
//! again after a loss, resign on shutdown ([`Election::lead`]).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Election, Leadership};
use crate::error::Error;
use crate::fencing::FencingToken;

/// What [`Election::lead`] did, returned once it was shut down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeadSummary {
    /// Terms this candidate won (the work ran once in each).
    pub terms: u64,
    /// Terms that ended because leadership was lost (the work was stopped).
    pub lost: u64,
    /// The last term won.
    pub last_term: Option<FencingToken>,
}

/// How one term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TermEnd {
    /// The work returned by itself while this candidate still led.
    Returned,
    /// Leadership was lost (the work was dropped).
    Lost,
    /// The shutdown token fired (the work was told, and awaited while leadership lasted).
    Shutdown,
}

/// What the loop does after a term, once the lease is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Campaign again at once.
    Campaign,
    /// Campaign again after a pause, so that a waiting candidate (woken by the release) leads.
    CampaignAfterPause,
    /// Return the summary.
    Return,
}

/// What follows a term's end (every term ends with a release of the lease first). Pure.
fn after_term(end: TermEnd) -> Next {
    match end {
        // A work that returns hands over: another candidate may do better (or the work had
        // nothing left to do); without the pause this candidate would win the free lease back.
        TermEnd::Returned => Next::CampaignAfterPause,
        TermEnd::Lost => Next::Campaign,
        TermEnd::Shutdown => Next::Return,
    }
}

/// The pause after a work that returned by itself: a retry delay of the lease (a tenth of its
/// TTL, 10 ms to 500 ms), longer than a woken waiter takes to acquire.
fn pause_after_return(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

impl Election {
    /// Lead for as long as `shutdown` is not cancelled: campaign, run `work` for every term
    /// won, campaign again when a term ends, and resign when shut down. `work` is called once
    /// per term with the term (write with it) and a cancellation token.
    ///
    /// - **Loss** (the lease could not be extended, or was taken over): the work's token is
    ///   cancelled and the work is dropped at once, when the loss is signalled, no later than
    ///   the end of the lease's validity and so before another candidate can lead. There is no
    ///   grace period: clean up in destructors, and fence every side effect with the term. The
    ///   lease is released (its stale copies deleted) and the candidate campaigns again.
    /// - **The work returns** by itself while still leading: the term ends; the candidate
    ///   resigns (a waiting candidate is woken at once), pauses a retry delay (a tenth of the
    ///   TTL, 10 ms to 500 ms) so that one can take over, and campaigns again. A work that
    ///   should lead for good runs until its token is cancelled.
    /// - **Shutdown**: a campaign in progress stops; a running work's token is cancelled and
    ///   the work is awaited for as long as leadership lasts (dropped at a loss meanwhile), then
    ///   the candidate resigns, so a successor is woken at once rather than after the TTL. A
    ///   work that ignores its token keeps `lead` (and leadership) waiting.
    ///
    /// # Guarantees
    /// Those of [`Election`]: a work runs only within its term's validity (as long as this
    /// process is not paused and its runtime not starved: see [`Lock`](crate::Lock)), so the
    /// works of two candidates never overlap, and each term is greater than every earlier one.
    /// One handle runs one work at a time: a term's work has ended (returned or dropped)
    /// before the next campaign begins. Tasks the work spawns are not stopped by `lead`: pass
    /// them the token.
    ///
    /// # Not guaranteed
    /// That a process paused past its validity stops in time (nothing can notice while
    /// paused): the term, checked by the resource ([`FencingToken`]), is what makes a stale
    /// leader's writes harmless. Fairness between candidates.
    ///
    /// ```no_run
    /// # async fn demo(client: redquorum::Client) -> Result<(), redquorum::Error> {
    /// use std::time::Duration;
    /// use tokio_util::sync::CancellationToken;
    /// let election = redquorum::Election::new(&client, "scheduler", Duration::from_secs(5), "host-a")?;
    /// let shutdown = CancellationToken::new(); // cancel it on SIGTERM
    /// let summary = election
    ///     .lead(shutdown.clone(), |term, cancel| async move {
    ///         while !cancel.is_cancelled() {
    ///             // Schedule the next batch, writing with `term`.
    ///             println!("leading in term {term}");
    ///             tokio::select! {
    ///                 _ = cancel.cancelled() => {}
    ///                 _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    ///             }
    ///         }
    ///     })
    ///     .await?;
    /// println!("led {} terms", summary.terms);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign): invalid input only (outages and contention are
    /// retried for as long as it runs), or [`Error::Internal`] when the runtime shuts down.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops a running work where it is (its token is
    /// cancelled when the lease is released) and resigns in the background; a campaign in
    /// progress stops (a lease it wins later is released). Prefer `shutdown`: it lets the work
    /// finish and resigns before returning.
    pub async fn lead<F, Fut>(
        &self,
        shutdown: CancellationToken,
        mut work: F,
    ) -> Result<LeadSummary, Error>
    where
        F: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut summary = LeadSummary::default();
        loop {
            let leadership = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(summary),
                won = self.campaign() => won?,
            };
            summary.terms += 1;
            summary.last_term = Some(leadership.term());
            let end = run_term(&leadership, &shutdown, &mut work).await;
            tracing::debug!(candidate = %self.candidate, term = %leadership.term(), ?end, "term ended");
            // Every end releases the lease: a successor is woken at once (after a loss, the
            // copies still on some nodes would make the next campaign wait them out).
            let _ = leadership.resign().await;
            if end == TermEnd::Lost {
                summary.lost += 1;
            }
            match after_term(end) {
                Next::Campaign => {}
                Next::CampaignAfterPause => {
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(summary),
                        () = tokio::time::sleep(pause_after_return(self.lock.ttl())) => {}
                    }
                }
                Next::Return => return Ok(summary),
            }
        }
    }
}

/// Run one term's work until it returns, leadership is lost or `shutdown` fires (then the
/// work is told and awaited while leadership lasts). The work is dropped when this returns.
async fn run_term<F, Fut>(
    leadership: &Leadership,
    shutdown: &CancellationToken,
    work: &mut F,
) -> TermEnd
where
    F: FnMut(FencingToken, CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    // Cancelled with the lease's own token (at the loss signal, synchronously), or by us at
    // shutdown.
    let token = leadership.cancellation_token().child_token();
    let fut = work(leadership.term(), token.clone());
    tokio::pin!(fut);
    let lost = leadership.lost();
    tokio::pin!(lost);
    tokio::select! {
        biased;
        _ = &mut lost => return TermEnd::Lost,
        () = &mut fut => {
            // A work that returned because its token fired at a loss ended with the loss.
            return if leadership.is_leader() { TermEnd::Returned } else { TermEnd::Lost };
        }
        () = shutdown.cancelled() => {}
    }
    token.cancel();
    tokio::select! {
        biased;
        _ = &mut lost => {}
        () = &mut fut => {}
    }
    TermEnd::Shutdown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_term_the_loop_hands_over_campaigns_again_or_returns() {
        let cases = [
            (TermEnd::Returned, Next::CampaignAfterPause),
            (TermEnd::Lost, Next::Campaign),
            (TermEnd::Shutdown, Next::Return),
        ];
        for (end, next) in cases {
            assert_eq!(after_term(end), next, "{end:?}");
        }
        let ms = Duration::from_millis;
        assert_eq!(pause_after_return(ms(50)), ms(10));
        assert_eq!(pause_after_return(ms(2000)), ms(200));
        assert_eq!(pause_after_return(ms(60_000)), ms(500));
    }
}
