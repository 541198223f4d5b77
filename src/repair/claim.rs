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
}

/// A repair's claim on the node it repairs: one repairer at a time.
pub(crate) struct RepairClaim {
    client: Client,
    node: usize,
    pub(crate) nonce: String,
}

impl RepairClaim {
    pub(crate) fn new(client: Client, node: usize) -> Self {
        RepairClaim {
            client,
            node,
            nonce: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// How long a claim may go without a refresh before another repairer may take it over
    /// (its holder refreshes after every page, and a page takes at most a few operation
    /// timeouts).
    pub(crate) fn lifetime(&self) -> Duration {
        self.client.inner.config.operation_timeout * 4
    }

    async fn run(&self, mode: &'static str, watched: &str) -> Option<Answer> {
        // No marker check: the claim guards a node that is being repaired.
        let step = script_call(&CLAIM, Guard::None("a claim on a node under repair"))
            .key(fixed_key(KeyKind::RepairClaim))
            .arg(mode)
            .arg(&self.nonce)
            .arg(watched)
            .decode(|_, v| {
                Ok(match v {
                    redis::Value::Int(1) => crate::quorum::NodeOutcome::Applied(Answer::Done),
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
    /// clock. False when the node does not answer or the holder is alive (its claim changed).
    pub(crate) async fn take(&self) -> bool {
        let watched = match self.try_take().await {
            Some(Answer::Done) => return true,
            Some(Answer::Other(v)) if !v.is_empty() => v,
            _ => return false,
        };
        let since = tokio::time::Instant::now();
        let window = crate::lease::watch_window(self.lifetime());
        loop {
            let left = window.saturating_sub(since.elapsed());
            if left.is_zero() {
                return self.run("takeover", &watched).await == Some(Answer::Done);
            }
            tokio::time::sleep(left.min(self.lifetime() / 8 + Duration::from_millis(1))).await;
            match self.try_take().await {
                Some(Answer::Done) => return true,
                Some(Answer::Other(v)) if v == watched => {}
                // Refreshed (the holder is alive), or the node stopped answering.
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
            Some(Answer::Other(_)) => {
                Err("the repair claim was taken over by another client".into())
            }
            None => Err("the node did not answer a claim refresh".into()),
        }
    }

    pub(crate) async fn release(&self) {
        let _ = self.run("release", "").await;
    }
}
