//! The error type callers branch on.
//!
//! One enum, [`Error`], with classification methods; per-node detail travels beside it in
//! [`NoQuorum`]. No error text ever contains a password.

use std::fmt;

use crate::config::ConfigError;
use crate::keys::NameError;
use crate::quorum::{NodeId, NodeOutcome, Tally};

/// Everything a redquorum operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; nothing was sent.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// A user-supplied name is invalid; nothing was sent.
    #[error("invalid name: {0}")]
    Name(#[from] NameError),
    /// Not enough nodes applied the operation. Carries every node's problem.
    #[error(transparent)]
    NoQuorum(#[from] NoQuorum),
    /// An argument is out of range; nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Other clients kept winning: the attempt limit or the operation timeout was reached
    /// while a majority was answering.
    #[error("{op}: gave up after {attempts} contended rounds in {elapsed:?}")]
    Contended {
        /// The operation.
        op: &'static str,
        /// Rounds tried.
        attempts: u32,
        /// Time spent.
        elapsed: std::time::Duration,
    },
    /// The lock is held by someone else (contention, not an outage).
    #[error("lock {name:?} is held by another holder")]
    LockHeld {
        /// The lock.
        name: String,
    },
    /// The lock's lease looks abandoned, but the caller's limit ended before it could be
    /// taken over: a [`Lock::acquire`](crate::Lock::acquire) (or a campaign, or
    /// [`PeriodicJob::begin_period`](crate::PeriodicJob::begin_period)) whose `wait` is
    /// shorter than what the takeover needs, or a one-shot
    /// [`Lock::try_acquire`](crate::Lock::try_acquire) whose watch reached its bound while
    /// the lease kept changing on too few nodes to show a live holder.
    ///
    /// Said only when this caller read the lease on a majority, held by one value, unchanged
    /// on them for at least half the lease's own (stored) TTL `ttl` (a live holder that
    /// reaches a majority extends every third of it), and a takeover round could not go yet.
    /// A lease that changed within that span (its holder is alive), or that this caller
    /// watched for less, is [`LockHeld`](Error::LockHeld) or [`Timeout`](Error::Timeout)
    /// as before. Nothing is held: every round of the attempt was released.
    ///
    /// Not guaranteed: that the holder is dead (a frozen or cut-off one may come back, and
    /// its next extension restarts the watch), nor that a caller that comes back after
    /// `takeover_in` takes it over: a fresh handle watches the lease from its own first
    /// reading, for the stored TTL plus drift. A one-shot
    /// [`try_acquire`](crate::Lock::try_acquire) does that watch itself; an acquire whose
    /// `wait` is longer than the stored TTL plus drift (and a poll) does too. Retryable.
    #[error(
        "lock {name:?} looks abandoned: its lease stayed unchanged for {} of its {} TTL (a \
         live holder extends every third of it); it can be taken over in {} if it stays so \
         (a one-shot try, or a wait longer than {}, takes it over)",
        readable(*quiet_for), readable(*ttl), readable(*takeover_in),
        readable(crate::lease::watch_window(*ttl))
    )]
    LockLooksAbandoned {
        /// The lock.
        name: String,
        /// The lease's own lease time, as the nodes store it (its holder's TTL).
        ttl: std::time::Duration,
        /// For how long this caller saw the lease unchanged on a majority.
        quiet_for: std::time::Duration,
        /// How long from the error until a takeover round can go, if the lease stays
        /// unchanged (for this caller's handle; a fresh one watches the whole window).
        takeover_in: std::time::Duration,
    },
    /// Waiting for a lock (or leadership) reached its deadline.
    #[error("{op}: still not acquired after waiting {waited:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A majority granted the lease, but its answers came too late to leave at least half the
    /// lease time: the nodes or the network are slow. The grant was released; nothing is held,
    /// and nobody else was seen holding it (unlike [`LockHeld`](Error::LockHeld) and
    /// [`Timeout`](Error::Timeout)). Retryable.
    #[error(
        "{op}: a majority granted it, but only after {took:?}, which leaves less than half \
         the lease time: the nodes or the network are too slow (nothing is held; try again, \
         or use a longer lease)"
    )]
    TooSlow {
        /// The operation.
        op: &'static str,
        /// How long the round took, from sending to the majority's answers.
        took: std::time::Duration,
    },
    /// The lease was lost while the guarded work ran (the work was cancelled), or before a
    /// write under it counted (a job's completion record: it does not count as recorded).
    #[error("lease on {name:?} lost: {reason}")]
    LeaseLost {
        /// The lock.
        name: String,
        /// Why.
        reason: crate::lease::LossReason,
    },
    /// The operation stopped part-way (a change of the node list that could not seal, copy or
    /// mark enough nodes). What it did is safe to keep; run it again to finish.
    #[error("{op}: {reason}")]
    Unfinished {
        /// The operation.
        op: &'static str,
        /// Why it stopped, and what to do.
        reason: String,
    },
    /// A failure inside this client, not of the nodes or the input: the runtime shutting down
    /// under a call, a value that cannot be encoded, a register whose stored state this
    /// client cannot read. The operation may or may not have taken effect.
    #[error("internal failure: {0}")]
    Internal(String),
    /// The sequence reached its limit (IDs stay below 2^53).
    #[error("sequence {sequence:?} is exhausted: IDs must stay below {limit}")]
    Exhausted {
        /// The sequence.
        sequence: String,
        /// The exclusive limit.
        limit: u64,
    },
}

impl Error {
    /// True when the operation may have taken effect on some nodes even though it failed
    /// (a timeout or lost reply). Such an outcome must not be treated as "not applied".
    pub fn is_outcome_unknown(&self) -> bool {
        match self {
            Error::NoQuorum(q) => q.maybe_applied_somewhere,
            Error::Config(_)
            | Error::Name(_)
            | Error::InvalidArgument(_)
            | Error::Exhausted { .. } => false,
            Error::Contended { .. } | Error::Unfinished { .. } | Error::Internal(_) => true,
            Error::LockHeld { .. }
            | Error::LockLooksAbandoned { .. }
            | Error::Timeout { .. }
            | Error::TooSlow { .. }
            | Error::LeaseLost { .. } => false,
        }
    }

    /// True when retrying the same call later may succeed (nodes down or slow, other holders,
    /// a change that stopped part-way). False for invalid input, an exhausted sequence, a lost
    /// lease (the work was cancelled: acquire again instead) and internal failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NoQuorum(_)
            | Error::Contended { .. }
            | Error::LockHeld { .. }
            | Error::LockLooksAbandoned { .. }
            | Error::Timeout { .. }
            | Error::TooSlow { .. }
            | Error::Unfinished { .. } => true,
            Error::Config(_)
            | Error::Name(_)
            | Error::InvalidArgument(_)
            | Error::LeaseLost { .. }
            | Error::Exhausted { .. }
            | Error::Internal(_) => false,
        }
    }
}

/// A duration as a person reads it: milliseconds under ten seconds, else tenths of seconds.
fn readable(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_secs(10) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// A quorum operation that did not reach a majority, with each node's problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NoQuorum {
    /// The operation.
    pub op: &'static str,
    /// Configured nodes.
    pub nodes: usize,
    /// Nodes needed.
    pub needed: usize,
    /// Nodes that applied it.
    pub applied: usize,
    /// One entry per node that did not apply it.
    pub problems: Vec<NodeProblem>,
    /// Whether some node may have applied it without the reply arriving.
    pub maybe_applied_somewhere: bool,
}

/// Why one node did not count.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeProblem {
    /// Which node.
    pub node: NodeId,
    /// Its URL, password redacted.
    pub url: String,
    /// What went wrong, in words.
    pub problem: String,
}

impl NoQuorum {
    /// Build from a tally; `urls` are the redacted node URLs in node order and `rejected`
    /// describes a node's rejection reply.
    pub(crate) fn from_tally<T>(
        op: &'static str,
        tally: &Tally<T>,
        urls: &[String],
        rejected: impl Fn(&T) -> String,
    ) -> NoQuorum {
        let problems = tally
            .results()
            .iter()
            .filter(|r| !r.outcome.is_applied())
            .map(|r| NodeProblem {
                node: r.node,
                url: urls.get(r.node.0).cloned().unwrap_or_default(),
                problem: match &r.outcome {
                    NodeOutcome::Rejected(t) => format!("rejected: {}", rejected(t)),
                    NodeOutcome::Unknown(cause) => cause.to_string(),
                    NodeOutcome::Applied(_) => String::new(),
                },
            })
            .collect();
        NoQuorum {
            op,
            nodes: tally.majority().nodes(),
            needed: tally.majority().needed(),
            applied: tally.applied(),
            problems,
            maybe_applied_somewhere: tally
                .results()
                .iter()
                .any(|r| matches!(&r.outcome, NodeOutcome::Unknown(c) if c.may_have_applied())),
        }
    }
}

impl fmt::Display for NoQuorum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: no majority: {} of {} nodes applied it, {} needed",
            self.op, self.applied, self.nodes, self.needed
        )?;
        for p in &self.problems {
            write!(f, "; {} {}: {}", p.node, p.url, p.problem)?;
        }
        Ok(())
    }
}

impl std::error::Error for NoQuorum {}
