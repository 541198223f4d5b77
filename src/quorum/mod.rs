//! Quorum: majority arithmetic over the configured nodes, per-node outcomes, and the one fan-out
//! primitive every operation goes through. The base of every protocol above it.
//!
//! # How it works
//! An operation goes to every node at once and is decided by a majority of the *configured*
//! nodes (`n / 2 + 1`, [`Majority`]):
//! 1. `fanout::fan_out` starts one call per node, each under its own deadline;
//! 2. each answer becomes a [`NodeOutcome`] (applied, rejected, or unknown with its
//!    [`UnknownCause`]) in a [`Tally`], and [`Majority::decide`] (for a batch, `items_decision`:
//!    every item judged as if sent alone) says whether the outcome is decided: a majority
//!    applied, or a majority has become impossible;
//! 3. the fan-out returns once decided (`Wait::Decided`; `Wait::Background` also finishes the
//!    pending nodes' requests in a task of their own), once every node answered (`Wait::All`),
//!    or a short while after the decision (`Wait::Linger`); a node not awaited is
//!    [`UnknownCause::Abandoned`].
//!
//! `bounded_learn` takes from many replies the value a majority vouches for, so one node
//! reporting a value far above the others' is not followed.
//!
//! # Guarantees
//! - A decision counts only replies that arrived: a hung node costs at most its per-node
//!   deadline, and nothing when a majority answered first.
//! - Two majorities of the same `n` nodes share a node: every protocol's safety argument starts
//!   here (with cluster identity, `src/cluster/`, making every client count over the same `n`
//!   servers).
//!
//! Not guaranteed: that a request whose reply was lost did not apply (it may have: that is
//! exactly an [`UnknownCause::Timeout`]).
//!
//! # Invariants
//! - Architecture invariant: a node whose reply did not arrive (timeout, lost reply, broken
//!   connection, abandoned after the decision) is [`NodeOutcome::Unknown`], never "not applied".
//!   Only a reply that says so is [`NodeOutcome::Rejected`].
//! - Architecture invariant: this file (`quorum/mod.rs`) does no I/O and reads no clock; majority
//!   math exists only here. `fanout.rs` is the one place where requests go out to the nodes
//!   (through `Client::send`); it only counts.
//! - The majority is `needed` of the configured nodes: excluded, quarantined or unreachable nodes
//!   make a quorum harder to reach, never easier (only the `test-util` switch
//!   `Config::with_unsafe_quorum_for_tests` lowers it).
//!
//! # What it relies on outside this folder
//! - Keys, scripts, repair rule, ACL: none (it never names a key; the client layer,
//!   `src/client/`, builds the requests it fans out).
//! - Model: every model (`model/src/ids.rs`, `model/src/leases.rs`, `model/src/views.rs`,
//!   `model/src/copy.rs`) counts majorities of the configured nodes as this module does.
//! - Tests: the unit tests here and in `fanout.rs` (scripted nodes under paused tokio time);
//!   `tests/foundation.rs` (majorities under node loss, a frozen node's cost) and
//!   `tests/metrics.rs` (outcomes per operation and per node).
//!
//! # Files
//! - `mod.rs`: [`Majority`], [`Decision`], [`NodeOutcome`], [`UnknownCause`], [`Tally`],
//!   `bounded_learn`; pure, table-tested.
//! - `fanout.rs`: the fan-out primitive and its tracing span.

pub(crate) mod fanout;

use std::fmt;
use std::time::Duration;

/// The position of a node in the client's configured node list (0-based).
///
/// Node IDs are stable for the life of a [`Client`](crate::Client); they index the
/// configuration, not the servers behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// The majority of a fixed set of `n` configured nodes: `n / 2 + 1`.
///
/// The majority is always taken over the *configured* nodes, never over the nodes that
/// happen to be reachable or safe: excluding a node makes a quorum harder to reach, never
/// easier. Two majorities of the same `n` always share at least one node, which is the fact
/// every safety argument in this crate rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Majority {
    n: usize,
    needed: usize,
}

/// What a quorum operation may conclude from the answers it has so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// At least a majority applied the operation.
    Reached,
    /// Even if every node still pending applied it, no majority could be formed.
    Impossible,
    /// Neither yet: keep waiting for the pending nodes.
    Pending,
}

impl Majority {
    /// The majority of `n` nodes. `n` must be at least 1 (the configuration guarantees it).
    pub const fn of(n: usize) -> Self {
        Majority {
            n,
            needed: n / 2 + 1,
        }
    }

    /// A quorum of `needed` out of `n` that is NOT a majority when `needed <= n / 2`: only for
    /// tests that show a checker catches what a real majority prevents.
    #[cfg(feature = "test-util")]
    pub const fn unsafe_quorum_for_tests(n: usize, needed: usize) -> Self {
        Majority { n, needed }
    }

    /// Number of configured nodes.
    pub const fn nodes(self) -> usize {
        self.n
    }

    /// Nodes needed for a majority: `n / 2 + 1`.
    pub const fn needed(self) -> usize {
        self.needed
    }

    /// How many nodes may fail while a majority stays possible: `(n - 1) / 2`.
    ///
    /// An even `n` tolerates no more failures than `n - 1` does.
    pub const fn tolerated_failures(self) -> usize {
        self.n.saturating_sub(self.needed)
    }

    /// Decide from `applied` nodes that applied and `settled_not_applied` nodes that will
    /// not (rejected, unknown, excluded). The rest are pending.
    pub fn decide(self, applied: usize, settled_not_applied: usize) -> Decision {
        let needed = self.needed();
        if applied >= needed {
            return Decision::Reached;
        }
        let pending = self.n.saturating_sub(applied + settled_not_applied);
        if applied + pending < needed {
            Decision::Impossible
        } else {
            Decision::Pending
        }
    }
}

/// Why a node's outcome is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownCause {
    /// No reply within the per-node deadline. The request may have been applied.
    Timeout,
    /// The connection broke after the request may have been sent. It may have been applied.
    ConnectionLost(String),
    /// The fan-out decided before this node answered; its request may still be applied.
    Abandoned,
    /// The request was never sent: no connection could be made.
    Unreachable(String),
    /// The request was never sent: the node is excluded from quorums (strict safety mode,
    /// quarantine, or it is a second URL for a server already counted).
    Excluded(String),
    /// The node answered with an error reply; Redis did not apply the command. (A batched
    /// script, `id_propose.lua` or `lock_extend.lua`, that meets a corrupted register fails
    /// after handling the items before it; those are at worst a gap or a longer lease copy,
    /// never counted.)
    ServerError(String),
}

impl UnknownCause {
    /// Whether the request may have taken effect on the node even though no positive reply
    /// arrived. Callers that must undo partial effects (releasing a half-acquired lock) treat
    /// these nodes as if they had applied.
    pub fn may_have_applied(&self) -> bool {
        matches!(
            self,
            UnknownCause::Timeout | UnknownCause::ConnectionLost(_) | UnknownCause::Abandoned
        )
    }
}

impl fmt::Display for UnknownCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnknownCause::Timeout => f.write_str("no reply within the per-node deadline"),
            UnknownCause::ConnectionLost(e) => write!(f, "connection lost: {e}"),
            UnknownCause::Abandoned => f.write_str("not awaited: the quorum was decided first"),
            UnknownCause::Unreachable(e) => write!(f, "unreachable: {e}"),
            UnknownCause::Excluded(why) => write!(f, "excluded from quorums: {why}"),
            UnknownCause::ServerError(e) => write!(f, "error reply: {e}"),
        }
    }
}

/// One node's outcome in one quorum operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOutcome<T> {
    /// The node applied the operation and replied so.
    Applied(T),
    /// The node replied that it did not apply the operation (the reply says why).
    Rejected(T),
    /// No usable reply: see the cause for whether it may have been applied.
    Unknown(UnknownCause),
}

impl<T> NodeOutcome<T> {
    /// True for [`NodeOutcome::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, NodeOutcome::Applied(_))
    }

    /// The reply payload, if the node replied.
    pub fn reply(&self) -> Option<&T> {
        match self {
            NodeOutcome::Applied(t) | NodeOutcome::Rejected(t) => Some(t),
            NodeOutcome::Unknown(_) => None,
        }
    }

    /// Whether the operation may have taken effect on this node.
    pub fn may_have_applied(&self) -> bool {
        match self {
            NodeOutcome::Applied(_) => true,
            NodeOutcome::Rejected(_) => false,
            NodeOutcome::Unknown(c) => c.may_have_applied(),
        }
    }

    /// The same outcome with its reply mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> NodeOutcome<U> {
        match self {
            NodeOutcome::Applied(t) => NodeOutcome::Applied(f(t)),
            NodeOutcome::Rejected(t) => NodeOutcome::Rejected(f(t)),
            NodeOutcome::Unknown(c) => NodeOutcome::Unknown(c),
        }
    }

    /// A short label: `applied`, `rejected` or `unknown`.
    pub fn label(&self) -> &'static str {
        match self {
            NodeOutcome::Applied(_) => "applied",
            NodeOutcome::Rejected(_) => "rejected",
            NodeOutcome::Unknown(_) => "unknown",
        }
    }
}

/// One node's entry in a [`Tally`].
#[derive(Clone, Debug)]
pub struct NodeResult<T> {
    /// Which node.
    pub node: NodeId,
    /// What it did.
    pub outcome: NodeOutcome<T>,
    /// Time from the start of the fan-out to this node's answer; `None` if it never answered.
    pub latency: Option<Duration>,
}

/// Every node's outcome in one quorum operation, in node order, and the decision.
#[derive(Clone, Debug)]
pub struct Tally<T> {
    majority: Majority,
    results: Vec<NodeResult<T>>,
    elapsed: Duration,
    /// TEST ONLY: a lost reply (timeout, broken connection) counts as applied.
    lost_counted: bool,
}

impl<T> Tally<T> {
    pub(crate) fn new(
        majority: Majority,
        mut results: Vec<NodeResult<T>>,
        elapsed: Duration,
    ) -> Self {
        results.sort_by_key(|r| r.node);
        Tally {
            majority,
            results,
            elapsed,
            lost_counted: false,
        }
    }

    /// TEST ONLY: count every lost reply (a timeout or a broken connection after the request
    /// may have been sent) as applied, the classic bug of treating "no answer" as "yes", so a
    /// test can show what counting only real replies prevents.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_lost_replies_counted_for_tests(mut self) -> Self {
        self.lost_counted = true;
        self
    }

    /// The tally of item `i` of a batched operation, whose replies carry one entry per item:
    /// `item` maps a node's reply to that item's outcome; a node without a reply keeps its
    /// unknown outcome. Same majority, latencies and switches as this tally.
    pub(crate) fn item<U>(&self, item: impl Fn(&T) -> NodeOutcome<U>) -> Tally<U> {
        let results = self
            .results
            .iter()
            .map(|r| NodeResult {
                node: r.node,
                outcome: match &r.outcome {
                    NodeOutcome::Applied(t) | NodeOutcome::Rejected(t) => item(t),
                    NodeOutcome::Unknown(cause) => NodeOutcome::Unknown(cause.clone()),
                },
                latency: r.latency,
            })
            .collect();
        Tally {
            majority: self.majority,
            results,
            elapsed: self.elapsed,
            lost_counted: self.lost_counted,
        }
    }

    /// The same tally with every reply mapped by `f` (outcomes, latencies and switches kept).
    pub(crate) fn map<U>(self, f: impl Fn(T) -> U) -> Tally<U> {
        Tally {
            majority: self.majority,
            results: self
                .results
                .into_iter()
                .map(|r| NodeResult {
                    node: r.node,
                    outcome: r.outcome.map(&f),
                    latency: r.latency,
                })
                .collect(),
            elapsed: self.elapsed,
            lost_counted: self.lost_counted,
        }
    }

    /// The majority this tally was counted against.
    pub fn majority(&self) -> Majority {
        self.majority
    }

    /// Every node's result, in node order (one entry per configured node).
    pub fn results(&self) -> &[NodeResult<T>] {
        &self.results
    }

    /// Wall time of the whole fan-out, on the monotonic clock.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// How many nodes applied the operation.
    pub fn applied(&self) -> usize {
        self.results
            .iter()
            .filter(|r| {
                r.outcome.is_applied()
                    || (self.lost_counted
                        && matches!(
                            r.outcome,
                            NodeOutcome::Unknown(
                                UnknownCause::Timeout | UnknownCause::ConnectionLost(_)
                            )
                        ))
            })
            .count()
    }

    /// How many nodes replied that they did not apply it.
    pub fn rejected(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, NodeOutcome::Rejected(_)))
            .count()
    }

    /// The decision: reached, impossible, or (if the fan-out ended while nodes were still
    /// pending, which it does not do) pending.
    pub fn decision(&self) -> Decision {
        let applied = self.applied();
        self.majority.decide(applied, self.results.len() - applied)
    }

    /// True if a majority of the configured nodes applied the operation.
    pub fn reached(&self) -> bool {
        self.applied() >= self.majority.needed()
    }

    /// The replies of the nodes that answered (applied or rejected).
    pub fn replies(&self) -> impl Iterator<Item = (NodeId, &T)> {
        self.results
            .iter()
            .filter_map(|r| r.outcome.reply().map(|t| (r.node, t)))
    }

    /// The nodes whose outcome may include the operation having taken effect.
    pub fn maybe_applied_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.results
            .iter()
            .filter(|r| r.outcome.may_have_applied())
            .map(|r| r.node)
    }
}

/// The decision of a batched operation of `items` items, from the node results so far and
/// the nodes still `pending`: `outcome_of(reply, i)` is item `i`'s outcome on a node that
/// replied. Reached when every item reached a majority; pending while some item could still
/// go either way; otherwise impossible (every item decided, some not reached). Lost replies
/// count for nothing here, as in the fan-out's own early stop.
pub(crate) fn items_decision<T>(
    majority: Majority,
    results: &[NodeResult<T>],
    pending: usize,
    items: usize,
    outcome_of: impl Fn(&T, usize) -> NodeOutcome<()>,
) -> Decision {
    let mut all_reached = true;
    for i in 0..items {
        let applied = results
            .iter()
            .filter(|r| match &r.outcome {
                NodeOutcome::Applied(t) | NodeOutcome::Rejected(t) => outcome_of(t, i).is_applied(),
                NodeOutcome::Unknown(_) => false,
            })
            .count();
        if applied >= majority.needed() {
            continue;
        }
        all_reached = false;
        if applied + pending >= majority.needed() {
            return Decision::Pending;
        }
    }
    if all_reached {
        Decision::Reached
    } else {
        Decision::Impossible
    }
}

/// The value to learn from the values nodes reported (a sequence's maximum, a lock's fence):
/// the largest, unless it is more than `max_jump` above the value the `needed`-th smallest
/// reply holds, in which case that value: one node with a huge (corrupted or hostile) value
/// cannot make a sequence or a fence jump toward its limit. With fewer than `needed` replies,
/// a value more than `max_jump` above `known` is ignored. Returns the value and whether the
/// largest was set aside.
pub(crate) fn bounded_learn(
    values: &[u64],
    needed: usize,
    known: u64,
    max_jump: u64,
) -> (u64, bool) {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let largest = sorted.last().copied().unwrap_or(0);
    match sorted.get(needed.saturating_sub(1)) {
        Some(floor) if largest.saturating_sub(*floor) > max_jump => (*floor, true),
        Some(_) => (largest, false),
        None if largest.saturating_sub(known) > max_jump => (0, true),
        None => (largest, false),
    }
}

#[cfg(test)]
mod learn_tests {
    use super::bounded_learn;

    #[test]
    fn one_huge_value_does_not_make_the_sequence_jump() {
        assert_eq!(bounded_learn(&[5, 7, 9], 2, 0, 100), (9, false));
        assert_eq!(bounded_learn(&[5, 7, 1 << 50], 2, 0, 100), (7, true));
        assert_eq!(bounded_learn(&[1 << 50], 2, 3, 100), (0, true));
        assert_eq!(bounded_learn(&[50], 2, 3, 100), (50, false));
        assert_eq!(bounded_learn(&[], 2, 3, 100), (0, false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_of_small_clusters() {
        let table = [
            (1, 1, 0),
            (2, 2, 0),
            (3, 2, 1),
            (4, 3, 1),
            (5, 3, 2),
            (6, 4, 2),
            (7, 4, 3),
        ];
        for (n, needed, tolerated) in table {
            let m = Majority::of(n);
            assert_eq!(m.needed(), needed, "majority of {n}");
            assert_eq!(
                m.tolerated_failures(),
                tolerated,
                "failures tolerated by {n}"
            );
        }
    }

    #[test]
    fn two_majorities_always_intersect() {
        for n in 1..=9 {
            let m = Majority::of(n);
            assert!(
                2 * m.needed() > n,
                "two majorities of {n} could be disjoint"
            );
        }
    }

    #[test]
    fn decide_reached_impossible_pending() {
        let m = Majority::of(5);
        assert_eq!(m.decide(3, 0), Decision::Reached);
        assert_eq!(m.decide(2, 0), Decision::Pending);
        assert_eq!(
            m.decide(2, 2),
            Decision::Pending,
            "one pending node could still make it"
        );
        assert_eq!(m.decide(2, 3), Decision::Impossible);
        assert_eq!(
            m.decide(0, 3),
            Decision::Impossible,
            "two pending cannot make three"
        );
        assert_eq!(m.decide(0, 2), Decision::Pending);
    }

    #[test]
    fn unknown_is_never_counted_as_not_applied() {
        let lost: NodeOutcome<()> = NodeOutcome::Unknown(UnknownCause::Timeout);
        assert!(lost.may_have_applied());
        assert!(!lost.is_applied());
        let never_sent: NodeOutcome<()> =
            NodeOutcome::Unknown(UnknownCause::Unreachable("refused".into()));
        assert!(!never_sent.may_have_applied());
    }

    #[test]
    fn an_items_tally_judges_each_node_on_its_own_entry_and_keeps_the_unknowns() {
        let results = vec![
            NodeResult {
                node: NodeId(0),
                outcome: NodeOutcome::Applied(vec![true, false]),
                latency: None,
            },
            NodeResult {
                node: NodeId(1),
                outcome: NodeOutcome::Rejected(vec![true, true]),
                latency: None,
            },
            NodeResult {
                node: NodeId(2),
                outcome: NodeOutcome::Unknown(UnknownCause::Timeout),
                latency: None,
            },
        ];
        let tally = Tally::new(Majority::of(3), results, Duration::ZERO);
        let item = |i: usize| {
            tally.item(|v: &Vec<bool>| {
                if v[i] {
                    NodeOutcome::Applied(())
                } else {
                    NodeOutcome::Rejected(())
                }
            })
        };
        assert_eq!((item(0).applied(), item(0).rejected()), (2, 0));
        assert!(item(0).reached());
        assert_eq!((item(1).applied(), item(1).rejected()), (1, 1));
        assert!(!item(1).reached());
        assert!(matches!(
            item(1).results()[2].outcome,
            NodeOutcome::Unknown(UnknownCause::Timeout)
        ));
    }

    #[test]
    fn a_batch_is_decided_only_when_every_item_is() {
        let node = |i: usize, v: Vec<bool>| NodeResult {
            node: NodeId(i),
            outcome: NodeOutcome::Applied(v),
            latency: None,
        };
        let judge = |v: &Vec<bool>, i: usize| {
            if v[i] {
                NodeOutcome::Applied(())
            } else {
                NodeOutcome::Rejected(())
            }
        };
        let m = Majority::of(3);
        // Item 0 is refused on node 1, item 1 on node 2: each still needs node 0.
        let two = [node(1, vec![false, true]), node(2, vec![true, false])];
        assert_eq!(items_decision(m, &two, 1, 2, judge), Decision::Pending);
        let all = [
            node(1, vec![false, true]),
            node(2, vec![true, false]),
            node(0, vec![true, true]),
        ];
        assert_eq!(items_decision(m, &all, 0, 2, judge), Decision::Reached);
        let split = [node(1, vec![true, true]), node(2, vec![false, true])];
        assert_eq!(
            items_decision(m, &split, 0, 2, judge),
            Decision::Impossible,
            "item 0 can no longer reach a majority; item 1 did"
        );
        assert_eq!(
            items_decision(m, &split, 1, 2, judge),
            Decision::Pending,
            "item 0 can still reach one with the pending node"
        );
    }
}
