//! A repair's claim on the node it writes to (`rq:repairing`, `claim.lua`): one repairer at a
//! time, decided without any node's wall clock.
//!
//! The claim's value is `<nonce>:<count>`; its holder raises the count between pages. It never
//! expires on the node: a repairer that finds another's claim watches it, and takes it over by
//! compare-and-swap only after seeing the same value for the claim's lifetime plus drift on its
//! own monotonic clock (a node's clock stepping back cannot keep a dead repairer's claim alive,
//! nor can one stepping forward end a live one). The claim decides only who does the work:
//! every write of a copy and the final mark check it atomically, so a repairer that lost it
//! (paused past its lifetime, or its node emptied by FLUSHALL) writes nothing.

use std::time::Duration;

use crate::client::{script_call, Client, Guard, Request, Targets};
use crate::keys::{fixed_key, KeyKind};
use crate::scripts::CLAIM;

/// What `claim.lua` answered.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Taken, refreshed, taken over or released.
    Done,
    /// Another repairer's claim (its value), or none ("").
    Other(String),
    /// The node's marker is not the one the census found (another repair marked it).
    Marked,
}

/// A repair's claim on the node it repairs: one repairer at a time.
pub(crate) struct RepairClaim {
    client: Client,
    node: usize,
    pub(crate) nonce: String,
    /// The marker the census found on the node (None: no marker).
    census_marker: String,
}

impl RepairClaim {
    /// A claim on `node`, to be taken only while the node holds `census_marker` (what the
    /// repairer's census found there; None: no marker).
    pub(crate) fn new(client: Client, node: usize, census_marker: Option<&str>) -> Self {
        RepairClaim {
            client,
            node,
            nonce: format!("{:032x}", rand::random::<u128>()),
            census_marker: census_marker.unwrap_or("").to_string(),
        }
    }

    /// The marker epoch of the repair this claim is for (see [`crate::cluster::marker_value`]).
    pub(crate) fn epoch(&self) -> String {
        self.nonce.chars().take(16).collect()
    }

    /// How long a claim may go without a refresh before another repairer may take it over:
    /// its holder refreshes after every page, and a page takes at most a scan, four reads (three
    /// node timeouts apart when the sources disagree on a lease) and a write, each within an
    /// operation timeout.
    pub(crate) fn lifetime(&self) -> Duration {
        let c = &self.client.inner.config;
        c.operation_timeout * 8 + c.node_timeout * 4
    }

    /// TEST ONLY (`with_server_clock_leases_for_tests`): the claim expires on the node's wall
    /// clock after its lifetime, as before issue 27; 0 (never) otherwise.
    fn node_clock_expiry_ms(&self) -> u64 {
        if self.client.inner.config.server_clock_leases {
            u64::try_from(self.lifetime().as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        }
    }

    async fn run(&self, mode: &'static str, watched: &str) -> Option<Answer> {
        // No marker check: the claim guards a node that is being repaired.
        let step = script_call(&CLAIM, Guard::None("a claim on a node under repair"))
            .key(fixed_key(KeyKind::RepairClaim))
            .key(fixed_key(KeyKind::Marker))
            .arg(mode)
            .arg(&self.nonce)
            .arg(watched)
            .arg(&self.census_marker)
            .arg(self.node_clock_expiry_ms())
            .decode(|_, v| {
                Ok(match v {
                    redis::Value::Int(1) => crate::quorum::NodeOutcome::Applied(Answer::Done),
                    redis::Value::Int(-2) => crate::quorum::NodeOutcome::Applied(Answer::Marked),
                    redis::Value::Int(_) => {
                        crate::quorum::NodeOutcome::Applied(Answer::Other(String::new()))
                    }
                    other => crate::quorum::NodeOutcome::Applied(Answer::Other(
                        redis::from_redis_value(other)?,
                    )),
                })
            });
        let request = Request::any_node("repair.claim", Targets::Only(self.node));
        let tally = self.client.send(request, step).await;
        let answer = tally.replies().next().map(|(_, a)| a.clone());
        answer
    }

    /// Take the claim if it is free (or already ours). Returns the other repairer's claim
    /// value when it is held, None when the node did not answer.
    async fn try_take(&self) -> Option<Answer> {
        self.run("take", "").await
    }

    /// Take the claim: at once if it is free; otherwise watch the holder's claim and take it
    /// over once it stayed unchanged for its lifetime plus drift on this client's monotonic
    /// clock. False when the node does not answer, the holder is alive (its claim changed or
    /// went away: it may have finished), or the node's marker is no longer the census's.
    pub(crate) async fn take(&self) -> bool {
        let watched = match self.try_take().await {
            Some(Answer::Done) => return true,
            // TEST ONLY: the node's clock expires the holder's claim; nothing to watch.
            Some(Answer::Other(_)) if self.client.inner.config.server_clock_leases => return false,
            Some(Answer::Other(v)) if !v.is_empty() => v,
            _ => return false,
        };
        let since = tokio::time::Instant::now();
        let window = crate::lease::watch_window(self.lifetime());
        tracing::info!(
            node = self.node,
            wait = ?window,
            "another repair's claim is on the node: watching it, to take it over if it stays \
             unchanged (a repair or node-list change that was interrupted)"
        );
        loop {
            let left = window.saturating_sub(since.elapsed());
            if left.is_zero() {
                return self.run("takeover", &watched).await == Some(Answer::Done);
            }
            tokio::time::sleep(left.min(self.lifetime() / 8 + Duration::from_millis(1))).await;
            match self.try_take().await {
                // Released by a repair that did not finish: the node still holds what the
                // census found (checked in the same script call).
                Some(Answer::Done) => return true,
                Some(Answer::Other(v)) if v == watched => {}
                // Refreshed (the holder is alive), released or taken by a finished repair
                // (the next attempt probes the node again), or the node stopped answering.
                _ => return false,
            }
        }
    }

    /// Raise the claim's count (the holder is alive). An error when the claim is lost.
    pub(crate) async fn refresh(&self) -> Result<(), String> {
        match self.run("refresh", "").await {
            Some(Answer::Done) => Ok(()),
            Some(Answer::Other(v)) if v.is_empty() => Err(
                "the repair claim is gone from the node (it lost its data, or another repair \
                 finished)"
                    .into(),
            ),
            Some(Answer::Other(_)) | Some(Answer::Marked) => {
                Err("the repair claim was taken over by another client".into())
            }
            None => Err("the node did not answer a claim refresh".into()),
        }
    }

    pub(crate) async fn release(&self) {
        let _ = self.run("release", "").await;
    }
}
