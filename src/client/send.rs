//! Running a [`Request`] with its [`Steps`] through the one fan-out primitive: per node, the
//! connection (opened and probed lazily), the voting checks (exclusion, one vote per server),
//! the step, its decode, all within the per-node deadline.

use std::sync::Arc;
use std::time::Duration;

use crate::cluster;
use crate::error::{Error, NoQuorum};
use crate::node::Node;
use crate::quorum::fanout::{self, NodeCall};
use crate::quorum::{NodeId, NodeOutcome, Tally, UnknownCause};

use super::request::{is_stale, stale, Arg, Body, NodeConn, NodeCtx, Request, Step, Steps};
use super::Client;

/// Why a node a request does not target is not counted.
pub(super) const NOT_ASKED: &str = "not asked by this operation";
/// Why a node a request has no step for is not counted.
pub(super) const NOTHING_FOR_IT: &str = "this operation has nothing for this node";

/// Which servers (by run_id) nodes of one fan-out already reached, and through which node.
type Claims = Arc<std::sync::Mutex<Vec<(Arc<str>, usize)>>>;

/// What every per-node call of one fan-out shares.
struct Shared<T> {
    node_timeout: Duration,
    voting_only: bool,
    cluster_id: Option<Arc<str>>,
    claims: Claims,
    steps: Steps<T>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            node_timeout: self.node_timeout,
            voting_only: self.voting_only,
            cluster_id: self.cluster_id.clone(),
            claims: self.claims.clone(),
            steps: self.steps.clone(),
        }
    }
}

impl Client {
    /// Send `request` to its nodes concurrently, each running its step, and count.
    pub(crate) async fn send<T: Send + 'static>(
        &self,
        request: Request,
        steps: impl Into<Steps<T>>,
    ) -> Tally<T> {
        self.send_decided(request, steps, None).await
    }

    /// [`send`](Self::send) of a batch of `items` items: the fan-out ends only when every item
    /// is decided (`outcome_of(reply, i)`: item `i`'s outcome on a node that replied), so a
    /// node that refused one item still counts for the others, and a slower node is waited
    /// for while some item needs it.
    pub(crate) async fn send_items<T: Send + 'static>(
        &self,
        request: Request,
        steps: impl Into<Steps<T>>,
        items: usize,
        outcome_of: impl Fn(&T, usize) -> NodeOutcome<()> + Send + Sync + 'static,
    ) -> Tally<T> {
        // The decider counts with the majority of the list the request runs on (a follow of a
        // change to another node count must not stop the fan-out at the old list's majority).
        let on = self.current_or_pinned();
        let majority = on.inner.majority;
        let decider: fanout::Decider<T> = Arc::new(move |results, pending| {
            crate::quorum::items_decision(majority, results, pending, items, &outcome_of)
        });
        let tally = on.send_on(request, steps.into(), Some(decider)).await;
        self.after_request(&on, &tally);
        tally
    }

    /// The per-node deadline `request` is sent with ([`Request::node_deadline`]: a writing
    /// vote within the node timeout), unless a test switched the bound off: then a writing
    /// vote that asked for no shorter deadline gets the operation timeout, as unit and list
    /// writes once did.
    fn node_deadline(&self, request: &Request) -> std::time::Duration {
        let config = &self.inner.config;
        if config.unbounded_vote_deadlines && request.voting_only && !request.reads_only {
            return request.deadline.unwrap_or(config.operation_timeout);
        }
        request.node_deadline(config.node_timeout)
    }

    async fn send_decided<T: Send + 'static>(
        &self,
        request: Request,
        steps: impl Into<Steps<T>>,
        decider: Option<fanout::Decider<T>>,
    ) -> Tally<T> {
        let steps = steps.into();
        // One list for the whole request: the one in use when it starts (a follow meanwhile
        // changes the next request's list, never this one's).
        let on = self.current_or_pinned();
        let tally = on.send_on(request, steps, decider).await;
        self.after_request(&on, &tally);
        tally
    }

    /// `send_decided` on this handle's own list (a pinned one).
    async fn send_on<T: Send + 'static>(
        &self,
        request: Request,
        steps: Steps<T>,
        decider: Option<fanout::Decider<T>>,
    ) -> Tally<T> {
        let node_timeout = self.node_deadline(&request);
        let Request {
            name,
            targets,
            wait,
            voting_only,
            ..
        } = request;
        // One cluster id for the whole fan-out, and one vote per server: the first node of
        // this fan-out to reach a server claims it, so a second URL to the same server is
        // excluded from the very first fan-out (before any probe comparison could notice).
        let shared = Shared {
            node_timeout,
            voting_only,
            cluster_id: self.verdicts().cluster_id.clone(),
            claims: Claims::default(),
            steps,
        };
        let calls: Vec<(NodeId, NodeCall<T>)> = self
            .inner
            .nodes
            .iter()
            .map(|node| {
                let call: NodeCall<T> = if targets.includes(node.id.0) {
                    Box::pin(self.clone().call_node(node.clone(), shared.clone()))
                } else {
                    Box::pin(futures::future::ready(NodeOutcome::Unknown(
                        UnknownCause::Excluded(NOT_ASKED.into()),
                    )))
                };
                (node.id, call)
            })
            .collect();
        // No second timer: every call is bounded by its node's own deadline (`call_node`,
        // which also discards the connection).
        let tally = fanout::fan_out(name, self.inner.majority, None, wait, calls, decider).await;
        #[cfg(feature = "test-util")]
        let tally = if self.inner.config.lost_replies_counted {
            tally.with_lost_replies_counted_for_tests()
        } else {
            tally
        };
        crate::metrics::quorum_operation(name, &tally, |i| targets.includes(i));
        tally
    }

    /// [`send`](Self::send), then `Ok` when a majority applied, or [`Error::NoQuorum`]
    /// naming each node's problem.
    pub(crate) async fn decide<T: Send + 'static>(
        &self,
        request: Request,
        steps: impl Into<Steps<T>>,
    ) -> Result<Tally<T>, Error> {
        let name = request.name;
        let tally = self.send(request, steps).await;
        self.require_majority(name, tally, |_| String::new())
    }

    /// Turn a tally into `Ok` when a majority applied, or a [`NoQuorum`] error (`rejected`
    /// describes a node's refusal).
    pub(crate) fn require_majority<T>(
        &self,
        op: &'static str,
        tally: Tally<T>,
        rejected: impl Fn(&T) -> String,
    ) -> Result<Tally<T>, Error> {
        if tally.reached() {
            Ok(tally)
        } else {
            Err(NoQuorum::from_tally(op, &tally, &self.inner.urls, rejected).into())
        }
    }

    async fn call_node<T>(self, node: Arc<Node>, shared: Shared<T>) -> NodeOutcome<T> {
        let mut generation = None;
        let outcome = tokio::time::timeout(shared.node_timeout, async {
            let lease = match node.connection().await {
                Ok(l) => l,
                Err(cause) => return NodeOutcome::Unknown(cause),
            };
            generation = Some(lease.generation);
            if let Some(why) = self.may_not_vote(&node, &shared, &lease.run_id) {
                return NodeOutcome::Unknown(UnknownCause::Excluded(why));
            }
            self.maybe_reprobe(&node);
            let marker: Arc<str> = if self.inner.config.amnesia_protection {
                let cluster_id = shared.cluster_id.as_deref().unwrap_or("");
                expected_marker(node.probed_marker(), &lease.run_id, cluster_id).into()
            } else {
                "*".into()
            };
            let ctx = NodeCtx {
                node: node.id.0,
                marker,
                run_id: lease.run_id.clone(),
            };
            let Some(step) = shared.steps.for_node(&ctx) else {
                return NodeOutcome::Unknown(UnknownCause::Excluded(NOTHING_FOR_IT.into()));
            };
            let nc = NodeConn {
                ctx,
                conn: lease.conn,
            };
            match run_step(nc, step).await {
                Ok(outcome) => {
                    if is_stale(&outcome) {
                        // A node that lost its data without restarting (FLUSHALL): re-probe
                        // it now, so it is quarantined and repaired before the next check.
                        self.suspect(node.id.0);
                    }
                    outcome
                }
                Err(e) => NodeOutcome::Unknown(node.failed(lease.generation, &e)),
            }
        })
        .await;
        match outcome {
            Ok(o) => o,
            Err(_elapsed) => {
                if let Some(g) = generation {
                    node.discard(g);
                }
                NodeOutcome::Unknown(UnknownCause::Timeout)
            }
        }
    }

    /// Why this node may not answer a voting request now (excluded by its probe, or a second
    /// URL to a server this fan-out already reached), if it may not. Requests to any node
    /// (repair, checks) see every URL and count servers themselves.
    fn may_not_vote<T>(
        &self,
        node: &Node,
        shared: &Shared<T>,
        run_id: &Arc<str>,
    ) -> Option<String> {
        if !shared.voting_only {
            return None;
        }
        if let Some(why) = self.exclusion(node.id.0) {
            if self.quarantine_reason(node.id.0).is_some() {
                self.spawn_repair(node.id.0);
            }
            return Some(why);
        }
        if !self.inner.config.cluster_identity || run_id.is_empty() {
            return None;
        }
        let mut claims = shared.claims.lock().unwrap_or_else(|p| p.into_inner());
        match claims.iter().find(|(r, _)| r == run_id) {
            Some((_, first)) if *first != node.id.0 => Some(format!(
                "the same server as node {first} (run_id), counted once"
            )),
            Some(_) => None,
            None => {
                claims.push((run_id.clone(), node.id.0));
                None
            }
        }
    }

    fn maybe_reprobe(&self, node: &Arc<Node>) {
        if node.probe_is_stale(self.inner.config.recheck_interval) && node.begin_reprobe() {
            let node = node.clone();
            let timeout = self.inner.config.node_timeout;
            tokio::spawn(async move {
                let _ = tokio::time::timeout(timeout, node.reprobe()).await;
                node.end_reprobe();
            });
        }
    }
}

/// A script call on one node: built once, straight from the shared keys and arguments (what
/// `redis::ScriptInvocation` does, without copying each of them first), and loaded once if the
/// node does not know it (it restarted, or its scripts were flushed). The guard is a
/// declaration: a marker-guarded script carries the marker (or a marker of the caller's
/// choosing) among its arguments (unit-tested per builder).
async fn run_script(
    nc: &mut NodeConn,
    script: &'static redis::Script,
    keys: &[String],
    args: &[Arg],
) -> redis::RedisResult<redis::Value> {
    let size: usize = keys.iter().map(String::len).sum::<usize>()
        + args
            .iter()
            .map(|a| match a {
                Arg::Val(v) => v.len(),
                Arg::Marker => nc.ctx.marker.len(),
            })
            .sum::<usize>();
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), 64 + size);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for k in keys {
        cmd.arg(k.as_str());
    }
    for a in args {
        match a {
            Arg::Val(v) => cmd.arg(v.as_slice()),
            Arg::Marker => cmd.arg(nc.ctx.marker.as_bytes()),
        };
    }
    match cmd.query_async(&mut nc.conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(&mut nc.conn).await?;
            cmd.query_async(&mut nc.conn).await
        }
        reply => reply,
    }
}

/// Run one step on one node's connection.
async fn run_step<T>(mut nc: NodeConn, step: Step<T>) -> redis::RedisResult<NodeOutcome<T>> {
    let (body, decode) = match step {
        Step::Session(session) => return session(nc).await,
        Step::Wire { body, decode } => (body, decode),
    };
    match body {
        Body::Script {
            script, keys, args, ..
        } => {
            let reply = run_script(&mut nc, script, &keys, &args).await?;
            decode(&nc.ctx, reply)
        }
        Body::Commands { cmds, checked } => {
            let mut pipe = redis::pipe();
            if checked {
                // One transaction: no wipe (FLUSHALL) can fall between the marker read and
                // the commands behind it.
                pipe.atomic();
                pipe.cmd("GET")
                    .arg(crate::keys::fixed_key(crate::keys::KeyKind::Marker));
            }
            for c in &cmds {
                pipe.add_command(c.clone());
            }
            let replies: Vec<redis::Value> = pipe.query_async(&mut nc.conn).await?;
            let mut replies = replies.into_iter();
            if checked {
                let marker: Option<String> =
                    redis::from_redis_value(replies.next().unwrap_or(redis::Value::Nil))?;
                if !nc.ctx.marker_holds(marker.as_deref()) {
                    return Ok(stale());
                }
            }
            let mut rest: Vec<redis::Value> = replies.collect();
            let reply = match rest.len() {
                1 => rest.pop().unwrap_or(redis::Value::Nil),
                _ => redis::Value::Array(rest),
            };
            decode(&nc.ctx, reply)
        }
    }
}

/// The marker a node must hold to vote for this client: the one its latest probe read, when
/// that names this connection's run_id and the client's cluster (it carries the epoch of the
/// node's last repair, see [`cluster::marker_value`]); otherwise one without an epoch, which
/// the node refuses unless an older release marked it (a refusal re-probes the node).
fn expected_marker(probed: Option<String>, run_id: &str, cluster_id: &str) -> String {
    match probed {
        Some(m) if cluster::parse_marker(&m) == (run_id, Some(cluster_id)) => m,
        _ => cluster::marker_value(run_id, None, cluster_id),
    }
}

#[cfg(test)]
mod marker_tests {
    use super::*;

    #[test]
    fn the_expected_marker_is_the_probed_one_only_for_this_run_and_cluster() {
        let m = cluster::marker_value("r1", Some("e1"), "c1");
        assert_eq!(
            expected_marker(Some(m.clone()), "r1", "c1"),
            m,
            "with its epoch"
        );
        assert_eq!(
            expected_marker(Some(m.clone()), "r2", "c1"),
            "r2/c1",
            "another run_id"
        );
        assert_eq!(
            expected_marker(Some(m), "r1", "c2"),
            "r1/c2",
            "another cluster"
        );
        let sealed = format!(
            "{}#sealed:c2",
            cluster::marker_value("r1", Some("e1"), "c1")
        );
        assert_eq!(expected_marker(Some(sealed), "r1", "c1"), "r1/c1", "sealed");
        assert_eq!(expected_marker(None, "r1", "c1"), "r1/c1", "unprobed");
    }
}
