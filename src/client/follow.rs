//! A running client follows a change of its node list: the swap of the list every request of
//! every clone runs on, verified exactly as [`Client::connect`] verifies a successor.
//!
//! The argument (what is guaranteed during the switch) is in `src/client/mod.rs`, "A running
//! client follows a change of its node list".

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use super::Client;
use crate::quorum::{NodeOutcome, Tally, UnknownCause};

/// When the last look for a successor ran (one look at a time per client).
#[derive(Default)]
pub(crate) struct FollowState {
    last: Option<Instant>,
    /// Why the last look refused a successor (logged at warn once, then at debug).
    refused: Option<String>,
}

impl FollowState {
    /// Whether a look may run now.
    fn due(&self, node_timeout: Duration) -> bool {
        self.last
            .is_none_or(|t| t.elapsed() >= look_interval(node_timeout))
    }
}

impl Client {
    /// This client bound to the node list in use now: every request sent through the handle
    /// runs on that list, whatever a follow does meanwhile, and starts no follow. A request,
    /// a repair and a change each run on one such handle from start to end.
    pub(crate) fn current(&self) -> Client {
        let inner = self
            .cell
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Client {
            inner,
            cell: self.cell.clone(),
            pinned: true,
        }
    }

    /// This handle if it is bound to its list, else [`current`](Self::current).
    pub(crate) fn current_or_pinned(&self) -> Client {
        if self.pinned {
            self.clone()
        } else {
            self.current()
        }
    }

    /// After a request of a user's handle ran on `on` (a [`current`](Self::current) handle):
    /// when it found no majority and some node was excluded from it (a seal, or a marker a
    /// change replaced, fails the marker check at once; a timeout or a refusal alone says
    /// nothing about a change), or whenever `on`'s probes show a sealed node (also while it
    /// still works: a bare majority of the old list), look for a successor in the background,
    /// so the caller's next request (a retry) runs on the new list. Never in the request's own
    /// time: a request without a majority costs its deadline and no more.
    pub(crate) fn after_request<T>(&self, on: &Client, tally: &Tally<T>) {
        if self.pinned || !self.cell.follows {
            return;
        }
        let evidence = on.verdicts().sealed || (!tally.reached() && excluded_somewhere(tally));
        if !evidence {
            return;
        }
        let due = match self.cell.follow.try_lock() {
            Ok(state) => state.due(on.inner.config.node_timeout),
            Err(_) => false, // a look is running
        };
        if due {
            let (me, on) = (self.clone(), on.clone());
            tokio::spawn(async move { me.follow_from(&on).await });
        }
    }

    /// Look for a successor of `on`'s list (at most once per [`look_interval`], one look at
    /// a time): re-probe its nodes, judge them as [`Client::connect`] does
    /// (`Client::successor`: the seals must name it, its nodes must hold it), and, if one is
    /// verified, make it the list of every later request. Whether the client works on another
    /// list than `on`'s now.
    fn follow_from<'a>(&'a self, on: &'a Client) -> BoxFuture<'a, bool> {
        Box::pin(self.follow_look(on))
    }

    async fn follow_look(&self, on: &Client) -> bool {
        let Ok(mut state) = self.cell.follow.try_lock() else {
            return false; // a look is running
        };
        if !Arc::ptr_eq(&self.current().inner, &on.inner) {
            return true; // followed meanwhile
        }
        let config = &on.inner.config;
        if !state.due(config.node_timeout) {
            return false;
        }
        state.last = Some(Instant::now());
        let look = async {
            on.check().await;
            on.successor().await
        };
        let next = match tokio::time::timeout(config.operation_timeout, look).await {
            Ok(Ok(Some(next))) => next,
            Ok(Ok(None)) | Err(_) => return false,
            Ok(Err(why)) => {
                let why = why.to_string();
                if state.refused.as_ref() == Some(&why) {
                    tracing::debug!(error = %why, "a successor of this client's node list was not followed");
                } else {
                    tracing::warn!(error = %why, "a successor of this client's node list was not followed");
                }
                state.refused = Some(why);
                return false;
            }
        };
        *self.cell.current.write().unwrap_or_else(|p| p.into_inner()) = next.inner.clone();
        next.followed_from(on);
        // The new list's nodes that are not marked yet are repaired as at connect, in the
        // background (each votes once it is marked).
        let moved = self.current();
        tokio::spawn(async move { moved.repair_quarantined().await });
        true
    }
}

/// Whether some node of `tally` was excluded from its request: a marker check that failed (a
/// seal, or a marker the change replaced), a quarantine. A refusal alone is a contended lock
/// as often as anything; a timeout says nothing about a change.
fn excluded_somewhere<T>(tally: &Tally<T>) -> bool {
    tally.results().iter().any(|r| {
        matches!(&r.outcome, NodeOutcome::Unknown(UnknownCause::Excluded(why))
            if why != super::send::NOT_ASKED && why != super::send::NOTHING_FOR_IT)
    })
}

/// How often a client looks for a successor of its list: every failed request would
/// otherwise re-probe every node (a contended lock's waiters see refusals all the time).
fn look_interval(node_timeout: Duration) -> Duration {
    (node_timeout * 4).max(Duration::from_secs(1))
}
