//! The one fan-out primitive: send an operation to every node at once and count.
//!
//! Every request goes out concurrently, each under its own deadline. The fan-out returns as
//! soon as the outcome is decided ([`Wait::Decided`]: a majority applied, or a majority has
//! become impossible; [`Wait::Background`] finishes the pending nodes in a task of their own)
//! or when every node has answered or timed out ([`Wait::All`]). A hung node
//! therefore costs at most the per-node deadline, and nothing when a majority answered first.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use tokio::time::Instant;
use tracing::Instrument;

use super::{Decision, Majority, NodeId, NodeOutcome, NodeResult, Tally, UnknownCause};

/// A boxed per-node request.
pub(crate) type NodeCall<T> = Pin<Box<dyn Future<Output = NodeOutcome<T>> + Send>>;

/// When a fan-out may return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// As soon as a majority applied or a majority became impossible. Nodes still pending
    /// are recorded as [`UnknownCause::Abandoned`]; their requests are dropped (a request
    /// already written to the socket may still be applied).
    Decided,
    /// Until every node answered or hit its deadline (used where every reply matters:
    /// cleanup, safety checks, reading the highest value).
    All,
    /// Like [`Wait::Decided`], but once decided, keep collecting the other nodes' answers for
    /// twice as long again as the decision took (at least [`MIN_LINGER`]), and never longer
    /// than this cap: a read that is better with every fresh reply (a group's beats) gets the
    /// nodes that answer about as fast as the majority did, and a hung node costs little.
    Linger(Duration),
    /// Like [`Wait::Decided`] for the caller, but the nodes still pending at the decision are
    /// awaited to their end in a task of their own (their answers are not counted): a cleanup
    /// (a release) goes on at the decision without a hop to another task, and its slower nodes
    /// still get it (the driver never sends a request whose caller went away before it was
    /// written, so dropping them could leave a copy behind).
    Background,
}

/// Decides a batched fan-out from the results so far and the number of nodes still pending
/// (see [`super::items_decision`]): it ends only when every item of the batch is decided.
pub(crate) type Decider<T> =
    std::sync::Arc<dyn Fn(&[NodeResult<T>], usize) -> Decision + Send + Sync>;

/// The shortest linger of [`Wait::Linger`] (loopback replies a few hundred microseconds apart).
pub(crate) const MIN_LINGER: Duration = Duration::from_millis(2);

/// Run `calls` (one per configured node) concurrently, each bounded by `node_timeout` (`None`:
/// the calls bound themselves, as the client's node calls do, and no second timer is set), and
/// count the outcomes against `majority`.
///
/// Cancel safety: dropping the returned future drops every in-flight request; a request that
/// was already written may still be applied by its node, exactly as with a timeout.
pub(crate) async fn fan_out<T: Send + 'static>(
    op: &'static str,
    majority: Majority,
    node_timeout: Option<Duration>,
    wait: Wait,
    calls: Vec<(NodeId, NodeCall<T>)>,
    decider: Option<Decider<T>>,
) -> Tally<T> {
    let span = tracing::debug_span!(
        "quorum",
        op,
        nodes = majority.nodes(),
        needed = majority.needed(),
        applied = tracing::field::Empty,
        decision = tracing::field::Empty,
        elapsed_us = tracing::field::Empty,
    );
    run(majority, node_timeout, wait, calls, decider)
        .instrument(span.clone())
        .await
        .inspect_tally(&span)
}

async fn run<T: Send + 'static>(
    majority: Majority,
    node_timeout: Option<Duration>,
    wait: Wait,
    calls: Vec<(NodeId, NodeCall<T>)>,
    decider: Option<Decider<T>>,
) -> Tally<T> {
    let start = Instant::now();
    let mut pending_ids: Vec<NodeId> = calls.iter().map(|(id, _)| *id).collect();
    let mut in_flight: FuturesUnordered<_> = calls
        .into_iter()
        .map(|(id, call)| async move {
            let outcome = match node_timeout {
                Some(limit) => match tokio::time::timeout(limit, call).await {
                    Ok(outcome) => outcome,
                    Err(_) => NodeOutcome::Unknown(UnknownCause::Timeout),
                },
                None => call.await,
            };
            (id, outcome, start.elapsed())
        })
        .collect();

    let mut results = Vec::with_capacity(majority.nodes());
    let (mut applied, mut settled) = (0usize, 0usize);
    // With `Wait::Linger`, the instant after which pending nodes are abandoned.
    let mut linger_until: Option<Instant> = None;
    while let Some((node, outcome, latency)) = next_answer(&mut in_flight, linger_until).await {
        pending_ids.retain(|p| *p != node);
        if outcome.is_applied() {
            applied += 1;
        } else {
            settled += 1;
        }
        tracing::trace!(%node, outcome = outcome.label(), latency_us = latency.as_micros() as u64, "node answered");
        results.push(NodeResult {
            node,
            outcome,
            latency: Some(latency),
        });
        let decision = match &decider {
            Some(decide) => decide(&results, pending_ids.len()),
            None => majority.decide(applied, settled),
        };
        if decision != Decision::Pending && stop_after_decision(wait, start, &mut linger_until) {
            if wait == Wait::Background && !in_flight.is_empty() {
                tokio::spawn(async move { while in_flight.next().await.is_some() {} });
            }
            break;
        }
    }
    for node in pending_ids {
        results.push(NodeResult {
            node,
            outcome: NodeOutcome::Unknown(UnknownCause::Abandoned),
            latency: None,
        });
    }
    Tally::new(majority, results, start.elapsed())
}

/// The next node's answer, or None when every node answered or the linger ended.
async fn next_answer<S: Stream + Unpin>(
    in_flight: &mut S,
    linger_until: Option<Instant>,
) -> Option<S::Item> {
    match linger_until {
        None => in_flight.next().await,
        Some(until) => tokio::time::timeout_at(until, in_flight.next())
            .await
            .ok()
            .flatten(),
    }
}

/// Once decided: whether to stop now (`Wait::Decided`); with `Wait::Linger`, the first time,
/// set when the pending nodes are abandoned (twice the decision's time, capped).
fn stop_after_decision(wait: Wait, start: Instant, linger_until: &mut Option<Instant>) -> bool {
    match wait {
        Wait::Decided | Wait::Background => true,
        Wait::Linger(cap) if linger_until.is_none() => {
            let extra = (start.elapsed() * 2).clamp(MIN_LINGER, cap.max(MIN_LINGER));
            *linger_until = Some(Instant::now() + extra);
            false
        }
        Wait::Linger(_) | Wait::All => false,
    }
}

trait InspectTally: Sized {
    fn inspect_tally(self, span: &tracing::Span) -> Self;
}

impl<T> InspectTally for Tally<T> {
    fn inspect_tally(self, span: &tracing::Span) -> Self {
        if span.is_disabled() {
            return self;
        }
        span.record("applied", self.applied());
        span.record("decision", format!("{:?}", self.decision()));
        span.record("elapsed_us", self.elapsed().as_micros() as u64);
        span.in_scope(|| {
            for r in self.results() {
                let latency_us = r.latency.map(|l| l.as_micros() as u64);
                match &r.outcome {
                    NodeOutcome::Unknown(cause) => {
                        tracing::debug!(node = %r.node, outcome = "unknown", %cause, ?latency_us, "node outcome")
                    }
                    other => tracing::debug!(node = %r.node, outcome = other.label(), ?latency_us, "node outcome"),
                }
            }
            tracing::debug!(applied = self.applied(), decision = ?self.decision(), "quorum operation done");
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted node: answers `outcome` after `delay` (on tokio's paused clock).
    fn scripted(delay_ms: u64, outcome: NodeOutcome<u32>) -> NodeCall<u32> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            outcome
        })
    }

    fn calls(script: Vec<(u64, NodeOutcome<u32>)>) -> Vec<(NodeId, NodeCall<u32>)> {
        script
            .into_iter()
            .enumerate()
            .map(|(i, (d, o))| (NodeId(i), scripted(d, o)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn returns_when_majority_applied_without_waiting_for_the_hung_node() {
        // Three fast nodes, two hung ones: the fan-out must finish at the third fast answer.
        let script = vec![
            (1, NodeOutcome::Applied(1)),
            (2, NodeOutcome::Applied(2)),
            (3, NodeOutcome::Applied(3)),
            (60_000, NodeOutcome::Applied(4)),
            (60_000, NodeOutcome::Applied(5)),
        ];
        let tally = fan_out(
            "test",
            Majority::of(5),
            Some(Duration::from_secs(10)),
            Wait::Decided,
            calls(script),
            None,
        )
        .await;
        assert!(tally.reached());
        assert_eq!(
            tally.elapsed(),
            Duration::from_millis(3),
            "a hung node must cost nothing here"
        );
        assert_eq!(
            tally.results()[3].outcome,
            NodeOutcome::Unknown(UnknownCause::Abandoned)
        );
        assert_eq!(
            tally.results().len(),
            5,
            "every configured node has an entry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_node_costs_at_most_its_deadline() {
        // Two applied, one hung: the majority needs the hung node, so we wait its deadline.
        let script = vec![
            (1, NodeOutcome::Applied(1)),
            (2, NodeOutcome::Applied(2)),
            (3, NodeOutcome::Rejected(0)),
            (4, NodeOutcome::Rejected(0)),
            (60_000, NodeOutcome::Applied(5)),
        ];
        let tally = fan_out(
            "test",
            Majority::of(5),
            Some(Duration::from_millis(50)),
            Wait::Decided,
            calls(script),
            None,
        )
        .await;
        assert!(!tally.reached());
        assert_eq!(tally.elapsed(), Duration::from_millis(50));
        assert_eq!(
            tally.results()[4].outcome,
            NodeOutcome::Unknown(UnknownCause::Timeout)
        );
        assert!(
            tally.results()[4].outcome.may_have_applied(),
            "a timeout is unknown, not 'not applied'"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn returns_early_when_majority_is_impossible() {
        let script = vec![
            (1, NodeOutcome::Rejected(7)),
            (2, NodeOutcome::Rejected(7)),
            (3, NodeOutcome::Rejected(7)),
            (60_000, NodeOutcome::Applied(1)),
            (60_000, NodeOutcome::Applied(1)),
        ];
        let tally = fan_out(
            "test",
            Majority::of(5),
            Some(Duration::from_secs(10)),
            Wait::Decided,
            calls(script),
            None,
        )
        .await;
        assert_eq!(tally.decision(), Decision::Impossible);
        assert_eq!(tally.elapsed(), Duration::from_millis(3));
        assert_eq!(tally.rejected(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_all_collects_every_reply_within_the_deadline() {
        let script = vec![
            (1, NodeOutcome::Applied(1)),
            (2, NodeOutcome::Applied(2)),
            (30, NodeOutcome::Rejected(9)),
        ];
        let tally = fan_out(
            "test",
            Majority::of(3),
            Some(Duration::from_millis(100)),
            Wait::All,
            calls(script),
            None,
        )
        .await;
        assert!(tally.reached());
        assert_eq!(tally.elapsed(), Duration::from_millis(30));
        let replies: Vec<u32> = tally.replies().map(|(_, v)| *v).collect();
        assert_eq!(replies, vec![1, 2, 9]);
    }

    #[tokio::test(start_paused = true)]
    async fn background_returns_at_the_decision_and_still_runs_the_slow_node_to_its_end() {
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let slow: NodeCall<u32> = {
            let finished = finished.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(80)).await;
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
                NodeOutcome::Applied(3)
            })
        };
        let mut calls = calls(vec![
            (1, NodeOutcome::Applied(1)),
            (2, NodeOutcome::Applied(2)),
        ]);
        calls.push((NodeId(2), slow));
        let tally = fan_out(
            "test",
            Majority::of(3),
            Some(Duration::from_millis(100)),
            Wait::Background,
            calls,
            None,
        )
        .await;
        assert_eq!(
            (tally.applied(), tally.elapsed()),
            (2, Duration::from_millis(2)),
            "the caller goes on at the decision"
        );
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            finished.load(std::sync::atomic::Ordering::SeqCst),
            "the slow node's request was still run to its end, in the background"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn linger_keeps_late_replies_for_a_while_then_abandons_a_hung_node() {
        let script = vec![
            (1, NodeOutcome::Applied(1)),
            (2, NodeOutcome::Applied(2)),
            (10, NodeOutcome::Applied(3)),
            (25, NodeOutcome::Applied(4)),
            (60_000, NodeOutcome::Applied(5)),
        ];
        let tally = fan_out(
            "test",
            Majority::of(5),
            Some(Duration::from_secs(10)),
            Wait::Linger(Duration::from_millis(100)),
            calls(script),
            None,
        )
        .await;
        let replies: Vec<u32> = tally.replies().map(|(_, v)| *v).collect();
        assert_eq!(
            replies,
            vec![1, 2, 3, 4],
            "the reply 15 ms after the decision is kept, the hung one is not"
        );
        assert_eq!(
            tally.elapsed(),
            Duration::from_millis(30),
            "decided at 10 ms (three of five), then lingered twice that, not the node timeout"
        );
        assert_eq!(
            tally.results().len(),
            5,
            "hung nodes are recorded as abandoned"
        );
    }
}
