//! One shape for every quorum operation: a [`Request`] (which nodes, when to return, the
//! per-node deadline, who may vote, whether to report the decision early) and a node [`Step`]
//! (a script or commands, keys, arguments, the marker check, and a pure `decode` of the
//! reply), both built as data once per operation. [`Client::send`](super::Client::send) and
//! [`Client::decide`](super::Client::decide) run them through the one fan-out primitive.
//!
//! A step says how a node's answer is guarded against a node that lost its data:
//! - [`script_call`] with [`Guard::Marker`]: the script compares the marker atomically (the
//!   expected marker travels as an argument, [`Arg::Marker`]);
//! - [`Step::read`]: read commands behind a `GET rq:marker` in one MULTI/EXEC, and an answer counts
//!   only when the marker is the expected one;
//! - [`Guard::None`] with the reason it needs no check (a release of one's own copy, a repair
//!   of a node that is quarantined precisely because its marker is missing, a PING).
//!
//! Everything here except [`Step::session`] is pure data; decoding is pure and unit-tested.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::keys::{fixed_key, KeyKind};
use crate::node::Conn;
use crate::quorum::fanout::Wait;
use crate::quorum::{NodeOutcome, UnknownCause};

/// Which nodes an operation asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Targets {
    All,
    Only(usize),
    /// The nodes whose bits are set (node `i` is bit `i`; at most 63 nodes).
    Set(u64),
}

impl Targets {
    pub(crate) fn includes(self, i: usize) -> bool {
        match self {
            Targets::All => true,
            Targets::Only(j) => i == j,
            Targets::Set(mask) => i < 64 && mask & (1u64 << i) != 0,
        }
    }

    /// The set of these nodes.
    pub(crate) fn of(nodes: &[usize]) -> Targets {
        Targets::Set(
            nodes
                .iter()
                .filter(|i| **i < 64)
                .fold(0, |m, i| m | (1u64 << i)),
        )
    }
}

/// How one quorum operation is sent: named once, built as data.
#[derive(Debug)]
pub(crate) struct Request {
    /// The operation's name, in tracing spans and errors.
    pub(crate) name: &'static str,
    pub(crate) targets: Targets,
    pub(crate) wait: Wait,
    /// Per-node deadline asked for; the client's node timeout when `None`. A vote that may
    /// change a node is held to the node timeout whatever this says
    /// ([`node_deadline`](Self::node_deadline)).
    pub(crate) deadline: Option<Duration>,
    /// Only nodes that may vote (verified, marked, one per server) are asked. Off for
    /// repair and census, which see every URL and count servers themselves.
    pub(crate) voting_only: bool,
    /// The operation changes nothing on the nodes (a read): its per-node deadline may exceed
    /// the node timeout.
    pub(crate) reads_only: bool,
}

impl Request {
    /// A quorum operation on the voting nodes, returning as soon as it is decided.
    pub(crate) fn vote(name: &'static str) -> Request {
        Request {
            name,
            targets: Targets::All,
            wait: Wait::Decided,
            deadline: None,
            voting_only: true,
            reads_only: false,
        }
    }

    /// An operation on `targets` whether they vote or not (repair, census, bootstrap), waiting
    /// for every one of them.
    pub(crate) fn any_node(name: &'static str, targets: Targets) -> Request {
        Request {
            targets,
            wait: Wait::All,
            voting_only: false,
            ..Request::vote(name)
        }
    }

    /// Wait for every node (cleanup, reading the highest value).
    pub(crate) fn wait_all(self) -> Request {
        Request {
            wait: Wait::All,
            ..self
        }
    }

    /// Once decided, keep collecting the other nodes' answers for at most `extra`.
    pub(crate) fn linger(self, extra: Duration) -> Request {
        Request {
            wait: Wait::Linger(extra),
            ..self
        }
    }

    /// Wait for every node when `all`, else return at the decision.
    pub(crate) fn wait_all_if(self, all: bool) -> Request {
        if all {
            self.wait_all()
        } else {
            self
        }
    }

    /// A per-node deadline of its own (leases use a fraction of their TTL, repair a whole
    /// operation timeout, a large read the operation timeout). For a vote that may change a
    /// node, only a deadline shorter than the node timeout takes effect
    /// ([`node_deadline`](Self::node_deadline)).
    pub(crate) fn within(self, deadline: Duration) -> Request {
        Request {
            deadline: Some(deadline),
            ..self
        }
    }

    /// This vote only reads (a read step, or a script that writes nothing): its
    /// [`within`](Self::within) deadline may exceed the node timeout, as a large reply needs.
    /// A repair waits for writes in flight only; a read counted late changes nothing it must
    /// see.
    pub(crate) fn reads_only(self) -> Request {
        Request {
            reads_only: true,
            ..self
        }
    }

    /// The per-node deadline this request is sent with, on a client whose node timeout is
    /// `node_timeout`: the one asked for, but never above the node timeout for a vote that may
    /// change a node.
    ///
    /// Why: a repair of a node that lost its data waits the cluster's node timeout for writes
    /// in flight before it reads the other nodes (`repair::Repairer::settle_and_count`), since
    /// a client counts a reply only within its per-node deadline. A write counted from a
    /// reply later than that (a unit removal applied late on one node of its majority) could
    /// be one the repair did not see. Requests to any node (repair, census, set-up) are not
    /// votes: they run under the repairer's claims and are judged by their own procedure.
    pub(crate) fn node_deadline(&self, node_timeout: Duration) -> Duration {
        let asked = self.deadline.unwrap_or(node_timeout);
        if self.voting_only && !self.reads_only {
            asked.min(node_timeout)
        } else {
            asked
        }
    }

    /// Return at the decision, and finish the nodes still pending in the background (a
    /// release: see [`Wait::Background`]).
    pub(crate) fn finishing_in_background(self) -> Request {
        Request {
            wait: Wait::Background,
            ..self
        }
    }
}

/// One node's connection, handed to a [`Step::session`].
pub(crate) struct NodeConn {
    pub(crate) ctx: NodeCtx,
    pub(crate) conn: Conn,
}

impl NodeConn {
    /// The node's position in the configuration.
    pub(crate) fn node(&self) -> usize {
        self.ctx.node
    }

    /// The server's run_id when this connection was opened.
    pub(crate) fn run_id(&self) -> &str {
        &self.ctx.run_id
    }
}

/// What a node step knows of the node it runs on.
#[derive(Clone, Debug)]
pub(crate) struct NodeCtx {
    /// The node's position in the configuration.
    pub(crate) node: usize,
    /// The marker this node must hold for its answer to count (`<run_id>/<cluster id>`), or
    /// `*` when amnesia protection is off. It also names the node's incarnation.
    pub(crate) marker: Arc<str>,
    /// The server's run_id when the connection was opened.
    pub(crate) run_id: Arc<str>,
}

impl NodeCtx {
    /// Whether `marker` (as read in the same transaction) is the expected one.
    pub(crate) fn marker_holds(&self, marker: Option<&str>) -> bool {
        &*self.marker == "*" || marker == Some(&*self.marker)
    }
}

/// Why a read whose marker check failed does not count.
const STALE: &str =
    "its marker changed (data lost, or another server): it votes again once repaired";

/// The outcome of a read whose marker check failed.
pub(crate) fn stale<T>() -> NodeOutcome<T> {
    NodeOutcome::Unknown(UnknownCause::Excluded(STALE.into()))
}

/// Whether `outcome` is a read's failed marker check ([`stale`]): the node should be
/// re-probed (and repaired if it lost its data).
pub(crate) fn is_stale<T>(outcome: &NodeOutcome<T>) -> bool {
    matches!(outcome, NodeOutcome::Unknown(UnknownCause::Excluded(why)) if why == STALE)
}

/// One argument of a node step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    Val(Vec<u8>),
    /// The marker this node must hold (the node's [`NodeCtx::marker`]).
    Marker,
}

/// How a step's answer is protected against a node that lost its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The script compares `rq:marker` with an argument atomically before it writes.
    Marker,
    /// No marker check, and why none is needed.
    None(&'static str),
}

/// A pure decoder of one node's reply.
pub(crate) type Decode<T> =
    Arc<dyn Fn(&NodeCtx, Value) -> redis::RedisResult<NodeOutcome<T>> + Send + Sync>;

/// A node session: several round trips on one node's connection (repair's paged copy).
pub(crate) type Session<T> = Arc<
    dyn Fn(NodeConn) -> Pin<Box<dyn Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send>>
        + Send
        + Sync,
>;

pub(crate) enum Body {
    Script {
        script: &'static redis::Script,
        /// Shared by every node's copy of the step (a fan-out clones it per node).
        keys: Arc<[String]>,
        args: Arc<[Arg]>,
        guard: Guard,
        /// A marker (the node's, or one the caller watched) is among the arguments.
        marker_placed: bool,
    },
    /// Commands in one pipeline; with `checked`, behind a read of the marker.
    Commands {
        cmds: Vec<redis::Cmd>,
        checked: bool,
    },
}

/// What one node is asked to do, and how its reply is read.
pub(crate) enum Step<T> {
    Wire { body: Body, decode: Decode<T> },
    Session(Session<T>),
}

impl<T> Clone for Step<T> {
    fn clone(&self) -> Self {
        match self {
            Step::Wire { body, decode } => Step::Wire {
                body: body.clone(),
                decode: decode.clone(),
            },
            Step::Session(s) => Step::Session(s.clone()),
        }
    }
}

impl Clone for Body {
    fn clone(&self) -> Self {
        match self {
            Body::Script {
                script,
                keys,
                args,
                guard,
                marker_placed,
            } => Body::Script {
                script,
                keys: keys.clone(),
                args: args.clone(),
                guard: *guard,
                marker_placed: *marker_placed,
            },
            Body::Commands { cmds, checked } => Body::Commands {
                cmds: cmds.clone(),
                checked: *checked,
            },
        }
    }
}

/// A script call under construction: keys and arguments in order, then [`decode`](Self::decode).
#[derive(Clone)]
pub(crate) struct ScriptCall {
    script: &'static redis::Script,
    keys: Vec<String>,
    args: Vec<Arg>,
    guard: Guard,
    marker_placed: bool,
}

impl ScriptCall {
    pub(crate) fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// The node marker key, `rq:marker`.
    pub(crate) fn marker_key(self) -> Self {
        self.key(fixed_key(KeyKind::Marker))
    }

    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        for a in arg.to_redis_args() {
            self.args.push(Arg::Val(a));
        }
        self
    }

    /// The marker this node must hold, as the next argument.
    pub(crate) fn marker(mut self) -> Self {
        self.args.push(Arg::Marker);
        self.marker_placed = true;
        self
    }

    /// A marker of the caller's choosing (the incarnation it watched), as the next argument.
    pub(crate) fn marker_as(mut self, marker: &str) -> Self {
        self.args.push(Arg::Val(marker.as_bytes().to_vec()));
        self.marker_placed = true;
        self
    }

    pub(crate) fn decode<T>(
        self,
        decode: impl Fn(&NodeCtx, Value) -> redis::RedisResult<NodeOutcome<T>> + Send + Sync + 'static,
    ) -> Step<T> {
        Step::Wire {
            body: Body::Script {
                script: self.script,
                keys: self.keys.into(),
                args: self.args.into(),
                guard: self.guard,
                marker_placed: self.marker_placed,
            },
            decode: Arc::new(decode),
        }
    }

    /// The arguments as sent to a node holding `marker`.
    #[cfg(test)]
    pub(crate) fn resolved_args(args: &[Arg], marker: &str) -> Vec<Vec<u8>> {
        args.iter()
            .map(|a| match a {
                Arg::Val(v) => v.clone(),
                Arg::Marker => marker.as_bytes().to_vec(),
            })
            .collect()
    }
}

/// A script call as a node step. With [`Guard::Marker`], place [`ScriptCall::marker`] (or the
/// marker the script must compare against) among the arguments.
pub(crate) fn script_call(script: &'static redis::Script, guard: Guard) -> ScriptCall {
    ScriptCall {
        script,
        keys: Vec::new(),
        args: Vec::new(),
        guard,
        marker_placed: false,
    }
}

impl<T> Step<T> {
    /// Read commands behind a read of the node's marker, in one MULTI/EXEC transaction (no
    /// FLUSHALL can fall between them): the answer counts only
    /// when the marker is the expected one (a node emptied by FLUSHALL or swapped behind a
    /// proxy is caught at once). `decode` gets the one reply, or an array of the replies when
    /// there are several commands.
    pub(crate) fn read(
        cmds: Vec<redis::Cmd>,
        decode: impl Fn(&NodeCtx, Value) -> redis::RedisResult<NodeOutcome<T>> + Send + Sync + 'static,
    ) -> Step<T> {
        Step::commands(cmds, true, decode)
    }

    /// Commands without a marker check (PING, and reads that decide nothing).
    pub(crate) fn unchecked(
        cmds: Vec<redis::Cmd>,
        decode: impl Fn(&NodeCtx, Value) -> redis::RedisResult<NodeOutcome<T>> + Send + Sync + 'static,
    ) -> Step<T> {
        Step::commands(cmds, false, decode)
    }

    fn commands(
        cmds: Vec<redis::Cmd>,
        checked: bool,
        decode: impl Fn(&NodeCtx, Value) -> redis::RedisResult<NodeOutcome<T>> + Send + Sync + 'static,
    ) -> Step<T> {
        Step::Wire {
            body: Body::Commands { cmds, checked },
            decode: Arc::new(decode),
        }
    }

    /// Whether this step protects its answer against a node that lost its data: a guarded
    /// script carries a marker argument, a command step reads the marker first, or the step
    /// says why it needs neither. For the unit tests of every step builder.
    #[cfg(test)]
    pub(crate) fn is_guarded(&self) -> bool {
        match self {
            Step::Wire {
                body:
                    Body::Script {
                        guard: Guard::Marker,
                        marker_placed,
                        ..
                    },
                ..
            } => *marker_placed,
            Step::Wire {
                body: Body::Script { .. },
                ..
            } => true,
            Step::Wire {
                body: Body::Commands { checked, .. },
                ..
            } => *checked,
            Step::Session(_) => false,
        }
    }

    /// Decode `reply` as this step would on the node `ctx` (for unit tests of decoders).
    #[cfg(test)]
    pub(crate) fn decode_for_tests(
        &self,
        ctx: &NodeCtx,
        reply: Value,
    ) -> redis::RedisResult<NodeOutcome<T>> {
        match self {
            Step::Wire { decode, .. } => decode(ctx, reply),
            Step::Session(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a session has no decoder",
            ))),
        }
    }

    /// The arguments a script step sends to a node holding `marker` (for unit tests).
    #[cfg(test)]
    pub(crate) fn args_for_tests(&self, marker: &str) -> Vec<String> {
        match self {
            Step::Wire {
                body: Body::Script { args, .. },
                ..
            } => ScriptCall::resolved_args(args, marker)
                .into_iter()
                .map(|a| String::from_utf8_lossy(&a).into_owned())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Several round trips on one node (repair's census and paged copy, which run on nodes
    /// that are quarantined precisely because their marker is missing).
    pub(crate) fn session<F, Fut>(f: F) -> Step<T>
    where
        F: Fn(NodeConn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        Step::Session(Arc::new(move |nc| Box::pin(f(nc))))
    }
}

/// A choice of step per node.
pub(crate) type PerNode<T> = Arc<dyn Fn(&NodeCtx) -> Option<Step<T>> + Send + Sync>;

/// The steps of one operation: the same for every node, or chosen per node (a lock's
/// takeover swaps on some nodes and only reads on others). `None` for a node leaves it out.
pub(crate) enum Steps<T> {
    Same(Step<T>),
    PerNode(PerNode<T>),
}

impl<T> Clone for Steps<T> {
    fn clone(&self) -> Self {
        match self {
            Steps::Same(s) => Steps::Same(s.clone()),
            Steps::PerNode(f) => Steps::PerNode(f.clone()),
        }
    }
}

impl<T> From<Step<T>> for Steps<T> {
    fn from(step: Step<T>) -> Self {
        Steps::Same(step)
    }
}

impl<T> Steps<T> {
    pub(crate) fn per_node(
        f: impl Fn(&NodeCtx) -> Option<Step<T>> + Send + Sync + 'static,
    ) -> Steps<T> {
        Steps::PerNode(Arc::new(f))
    }

    pub(crate) fn for_node(&self, ctx: &NodeCtx) -> Option<Step<T>> {
        match self {
            Steps::Same(s) => Some(s.clone()),
            Steps::PerNode(f) => f(ctx),
        }
    }
}

/// Pure decoders shared by many steps.
pub(crate) mod decode {
    use redis::{FromRedisValue, Value};

    use crate::quorum::NodeOutcome;

    /// A script that returns 1 when it applied: `Applied(())`, anything else `Rejected(())`.
    pub(crate) fn one_applied(v: Value) -> redis::RedisResult<NodeOutcome<()>> {
        let status: i64 = redis::from_redis_value(v)?;
        Ok(if status == 1 {
            NodeOutcome::Applied(())
        } else {
            NodeOutcome::Rejected(())
        })
    }

    /// A script returning `{status, value}`: applied when the status is 1.
    pub(crate) fn status_pair(v: Value) -> redis::RedisResult<NodeOutcome<(i64, u64)>> {
        let (status, value): (i64, u64) = redis::from_redis_value(v)?;
        Ok(if status == 1 {
            NodeOutcome::Applied((status, value))
        } else {
            NodeOutcome::Rejected((status, value))
        })
    }

    /// A script returning a count, or a negative code when it refused: `Applied(n)` for
    /// `n >= 0`, `Rejected(n)` otherwise.
    pub(crate) fn count_or_refusal(v: Value) -> redis::RedisResult<NodeOutcome<i64>> {
        let n: i64 = redis::from_redis_value(v)?;
        Ok(if n >= 0 {
            NodeOutcome::Applied(n)
        } else {
            NodeOutcome::Rejected(n)
        })
    }

    /// Any reply, converted: always applied.
    pub(crate) fn value<T: FromRedisValue>(v: Value) -> redis::RedisResult<NodeOutcome<T>> {
        Ok(NodeOutcome::Applied(redis::from_redis_value(v)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(marker: &str) -> NodeCtx {
        NodeCtx {
            node: 1,
            marker: marker.into(),
            run_id: "r".into(),
        }
    }

    #[test]
    fn a_request_is_built_as_data() {
        let r = Request::vote("x");
        assert_eq!(
            (r.wait, r.voting_only, r.targets, r.deadline),
            (Wait::Decided, true, Targets::All, None)
        );
        let r = Request::any_node("y", Targets::Only(2)).within(Duration::from_secs(1));
        assert_eq!(
            (r.wait, r.voting_only, r.targets, r.deadline),
            (
                Wait::All,
                false,
                Targets::Only(2),
                Some(Duration::from_secs(1))
            )
        );
        let r = Request::any_node("z", Targets::All).finishing_in_background();
        assert_eq!(r.wait, Wait::Background);
    }

    /// Every vote that may change a node is sent within the node timeout, whatever deadline
    /// its builder asked for (`units.write` and the pool's list writes once asked for the
    /// operation timeout, longer than the wait of a repair); reads and requests to any node
    /// keep theirs.
    #[test]
    fn a_writing_votes_per_node_deadline_never_exceeds_the_node_timeout() {
        let node_timeout = Duration::from_millis(250);
        let long = Duration::from_secs(5);
        let short = Duration::from_millis(40);
        let writes = [
            Request::vote("w").within(long),
            Request::vote("w").wait_all().within(long),
            Request::vote("w").within(long).linger(long),
            Request::vote("w").within(long).finishing_in_background(),
            Request::vote("w").within(long).wait_all_if(true),
        ];
        for r in &writes {
            assert_eq!(
                r.node_deadline(node_timeout),
                node_timeout,
                "a writing vote asked for {long:?} must be held to the node timeout: {r:?}"
            );
        }
        assert_eq!(Request::vote("w").node_deadline(node_timeout), node_timeout);
        assert_eq!(
            Request::vote("w").within(short).node_deadline(node_timeout),
            short,
            "a shorter deadline (a lease's) is kept"
        );
        assert_eq!(
            Request::vote("r")
                .within(long)
                .reads_only()
                .node_deadline(node_timeout),
            long,
            "a read may take the operation timeout"
        );
        assert_eq!(
            Request::any_node("repair", Targets::All)
                .within(long)
                .node_deadline(node_timeout),
            long,
            "a request to any node is not a vote"
        );
    }

    #[test]
    fn targets_select_nodes() {
        assert!(Targets::All.includes(5));
        assert!(Targets::Only(2).includes(2) && !Targets::Only(2).includes(1));
        let set = Targets::of(&[0, 3]);
        assert!(set.includes(0) && set.includes(3) && !set.includes(1) && !set.includes(64));
    }

    #[test]
    fn the_marker_argument_is_the_nodes_own() {
        let args = vec![Arg::Val(b"a".to_vec()), Arg::Marker];
        assert_eq!(
            ScriptCall::resolved_args(&args, "run/c1"),
            vec![b"a".to_vec(), b"run/c1".to_vec()]
        );
    }

    #[test]
    fn a_marker_guard_without_the_marker_is_caught() {
        static S: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| redis::Script::new("return 1"));
        let decode = |_: &NodeCtx, v: Value| decode::one_applied(v);
        let call = script_call(&S, Guard::Marker).key("k").arg(1);
        assert!(
            !call.clone().decode(decode).is_guarded(),
            "no marker argument: not guarded"
        );
        assert!(call.clone().marker().decode(decode).is_guarded());
        assert!(call.marker_as("r/c").decode(decode).is_guarded());
        assert!(script_call(&S, Guard::None("test"))
            .arg(1)
            .decode(decode)
            .is_guarded());
        assert!(Step::read(vec![redis::cmd("GET")], decode).is_guarded());
        assert!(!Step::unchecked(vec![redis::cmd("GET")], decode).is_guarded());
    }

    #[test]
    fn a_read_counts_only_under_the_expected_marker() {
        let c = ctx("run/c1");
        assert!(c.marker_holds(Some("run/c1")));
        assert!(!c.marker_holds(None), "a wiped node has no marker");
        assert!(!c.marker_holds(Some("other/c1")), "another incarnation");
        assert!(ctx("*").marker_holds(None), "protection off");
    }

    #[test]
    fn shared_decoders() {
        assert_eq!(
            decode::one_applied(Value::Int(1)).ok(),
            Some(NodeOutcome::Applied(()))
        );
        assert_eq!(
            decode::one_applied(Value::Int(0)).ok(),
            Some(NodeOutcome::Rejected(()))
        );
        assert_eq!(
            decode::status_pair(Value::Array(vec![Value::Int(-1), Value::Int(7)])).ok(),
            Some(NodeOutcome::Rejected((-1, 7)))
        );
        assert!(
            decode::one_applied(Value::SimpleString("OK".into())).is_err(),
            "an unexpected reply is an error (the node's outcome becomes Unknown)"
        );
        assert_eq!(
            decode::value::<Option<u64>>(Value::Nil).ok(),
            Some(NodeOutcome::Applied(None))
        );
    }
}
