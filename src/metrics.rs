//! Metrics: the catalogue, and the helpers the I/O layers call.
//!
//! The library emits through the [`metrics`](https://docs.rs/metrics) crate's facade only:
//! nothing is recorded until the application installs a recorder (an exporter, e.g. a
//! Prometheus one). Without one, each helper still builds its key (a small label list: two
//! allocations per node of a fan-out, per operation, never per ID), about 0.9 µs per
//! operation on 3 nodes in a release build, then calls the no-op recorder.
//! [`describe_metrics`] registers every metric's help text and unit with the installed
//! recorder (call it once, after installing one).
//!
//! Labels are low-cardinality by construction: an operation's static name, a node's position
//! in the configured node list (`0`, `1`, ...; never its URL, which may carry a password), or
//! one word of a fixed set. No lock, sequence, group or pool name is ever a label.
//!
//! The catalogue (every metric, its type, labels and when it moves) is on [`describe_metrics`].

use std::time::Duration;

use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use ::metrics::{SharedString, Unit};

use crate::error::Error;
use crate::lease::LossReason;
use crate::quorum::{Decision, NodeOutcome, Tally, UnknownCause};

/// Counter: quorum operations by `kind` and `outcome`.
pub(crate) const QUORUM_OPERATIONS: &str = "redquorum_quorum_operations_total";
/// Histogram (seconds): quorum operations' duration by `kind`.
pub(crate) const QUORUM_OPERATION_SECONDS: &str = "redquorum_quorum_operation_seconds";
/// Counter: clients that followed a change of their node list.
pub(crate) const CLUSTER_FOLLOWS: &str = "redquorum_cluster_follows_total";
/// Counter: per-node requests by `node` and `outcome`.
pub(crate) const NODE_REQUESTS: &str = "redquorum_node_requests_total";
/// Histogram (seconds): per-node answer time by `node`.
pub(crate) const NODE_REQUEST_SECONDS: &str = "redquorum_node_request_seconds";
/// Counter: ID rounds by `path`.
pub(crate) const ID_ROUNDS: &str = "redquorum_id_rounds_total";
/// Histogram: IDs served by one group-committed call.
pub(crate) const ID_BATCH_SIZE: &str = "redquorum_id_batch_size";
/// Counter: lease acquisition attempts by `outcome`.
pub(crate) const LEASE_ACQUISITIONS: &str = "redquorum_lease_acquisitions_total";
/// Counter: lease extensions by `outcome`.
pub(crate) const LEASE_EXTENSIONS: &str = "redquorum_lease_extensions_total";
/// Counter: lease losses by `reason`.
pub(crate) const LEASE_LOSSES: &str = "redquorum_lease_losses_total";
/// Counter: leadership changes by `event`.
pub(crate) const LEADERSHIP_CHANGES: &str = "redquorum_leadership_changes_total";
/// Gauge: leaderships held by this process.
pub(crate) const LEADERSHIPS: &str = "redquorum_leaderships";
/// Counter: view changes by `kind`.
pub(crate) const VIEW_CHANGES: &str = "redquorum_view_changes_total";
/// Histogram (seconds): a member's drain of a prepared view.
pub(crate) const VIEW_DRAIN_SECONDS: &str = "redquorum_view_drain_seconds";
/// Counter: nodes turned quarantined, by `node`.
pub(crate) const NODE_QUARANTINES: &str = "redquorum_node_quarantines_total";
/// Counter: repair checks by `outcome`.
pub(crate) const REPAIRS: &str = "redquorum_repairs_total";

/// Register the help text and unit of every metric this library emits with the installed
/// recorder. Optional: metrics are emitted without it; an exporter shows the descriptions as
/// help text. Call it after installing the recorder.
///
/// The library emits through the [`metrics`](https://docs.rs/metrics) facade only: nothing is
/// recorded until the application installs a recorder. Labels are low-cardinality by
/// construction: an operation's static name, a node's position in the configured node list
/// (`0`, `1`, ...; never its URL, which may carry a password), or one word of a fixed set. No
/// lock, sequence, group or pool name is ever a label.
///
/// # The catalogue
///
/// | metric | type | labels | when it moves |
/// |---|---|---|---|
/// | `redquorum_quorum_operations_total` | counter | `kind`, `outcome` | once per quorum operation (one fan-out to the voting nodes, or to the nodes a repair asks), when it ends. `kind` is the operation's static name (`lock.acquire`, `lock.extend`, `id.next`, `id.read`, `group.view.read`, `repair.census`, ...). `outcome`: `ok` (a majority applied), `conflict` (no majority, and some node refused: a held lock, a stale marker, a lower proposal), `error` (no majority, no refusal, some node sent an error reply), `no_quorum` (no majority: too few nodes answered in time). For a batched call (`id.next`, `id.read`, `lock.extend`), the call's outcome: `ok` when a majority of nodes ran it; each item's verdict is in the ID and lease metrics. An operation that asks only some nodes (a repair's `repair.claim`, `repair.scan`, `repair.write`, `repair.mark`) is `ok` when every node it asked applied it, and is otherwise judged by those nodes' answers. |
/// | `redquorum_quorum_operation_seconds` | histogram | `kind` | the same operations' duration, from the send to the decision (or to the last awaited node). |
/// | `redquorum_node_requests_total` | counter | `node`, `outcome` | once per node a quorum operation asked. `outcome`: `applied`, `rejected` (the node replied no), `timeout`, `connection_lost`, `unreachable` (never sent: no connection), `excluded` (never sent: the node may not vote, e.g. quarantined, or a second URL to one server), `server_error` (an error reply), `abandoned` (not awaited: decided first; a release's slower nodes are still sent it, in the background, but not counted). |
/// | `redquorum_node_request_seconds` | histogram | `node` | per node that answered (any reply, or an error reply), the time from the fan-out's start to its answer. |
/// | `redquorum_id_rounds_total` | counter | `path` | once per ID round: `write` (a proposal round), `spare` (IDs from the spare block, validated by a majority read), `spare_invalid` (the validating read failed; the spare becomes a gap and a write round follows). |
/// | `redquorum_id_batch_size` | histogram | | once per group-committed ID call: how many IDs it serves (every waiting caller's, summed). |
/// | `redquorum_lease_acquisitions_total` | counter | `outcome` | once per acquisition attempt that ends (`Lock::try_acquire`; `Lock::acquire` and campaigns make one per try; an attempt its caller dropped is not counted): `granted`, `held` (another holder has it), `looks_abandoned` (a lease that stayed unchanged for half its TTL, the caller's limit ended before its takeover), `no_quorum`, `timeout` (answers too slow to leave enough validity), `contended`, `error`. |
/// | `redquorum_lease_extensions_total` | counter | `outcome` | once per extension of a held lease (the watchdog's or `LockGuard::extend`): `ok`, `conflict` (a majority holds another value: the lease is lost), `no_quorum` (retried until the deadline), `late` (a majority applied it after the loss was signalled: it does not revive the lease). |
/// | `redquorum_lease_losses_total` | counter | `reason` | once per lease whose loss is signalled, by [`LossReason`]: `conflict`, `no_quorum`, `expired`, `hold_bound_reached`. A release (`released`) is not a loss and is not counted. |
/// | `redquorum_leadership_changes_total` | counter | `event` | this process's leaderships (`Election::campaign` / `try_campaign`, and a group's or pool's leader lease): `won` when a campaign wins; `lost` when the leadership's lease is lost; `resigned` when it is released (`Leadership::resign`, dropped, a member leaving). Each `won` is followed by exactly one `lost` or `resigned`. |
/// | `redquorum_leaderships` | gauge | | leaderships this process holds now (won and not yet lost or resigned). |
/// | `redquorum_view_changes_total` | counter | `kind` | membership (peer indexing, work distribution) views: `sealed_prepare` and `sealed_active` when this process, as a group's leader, seals a new view in that state; `adopted` when a member of this process reads a view other than the last it read (its first view too). |
/// | `redquorum_view_drain_seconds` | histogram | | per prepared view a member of this process drains: from the start of the drain (the drain hook started) to its acknowledgement being applied by a majority. |
/// | `redquorum_node_quarantines_total` | counter | `node` | when a client's verdict on a node turns to quarantined (its marker is missing or names another run_id: it lost data, or, in a new cluster, is not marked yet). |
/// | `redquorum_cluster_follows_total` | counter | | when a client configured with a node list that a change replaced follows the new cluster, at connect (`Client::connect`) or while it runs. |
/// | `redquorum_repairs_total` | counter | `outcome` | once per repair check of a node: `repaired`, `deferred` (not possible now; retried later), `not_needed` (the node was not quarantined after all). |
pub fn describe_metrics() {
    let counters: [(&'static str, &'static str); 11] = [
        (QUORUM_OPERATIONS, "Quorum operations by kind (the operation's name) and outcome (ok, conflict, error, no_quorum)."),
        (NODE_REQUESTS, "Per-node requests of quorum operations by node index and outcome (applied, rejected, timeout, connection_lost, unreachable, excluded, server_error, abandoned)."),
        (ID_ROUNDS, "ID rounds by path (write, spare, spare_invalid)."),
        (LEASE_ACQUISITIONS, "Lease acquisition attempts by outcome (granted, held, looks_abandoned, no_quorum, timeout, contended, error)."),
        (LEASE_EXTENSIONS, "Lease extensions by outcome (ok, conflict, no_quorum, late)."),
        (LEASE_LOSSES, "Leases lost, by reason (conflict, no_quorum, expired, hold_bound_reached); releases are not counted."),
        (LEADERSHIP_CHANGES, "Leadership changes of this process by event (won, lost, resigned)."),
        (VIEW_CHANGES, "Membership view changes by kind (sealed_prepare, sealed_active, adopted)."),
        (NODE_QUARANTINES, "Nodes turned quarantined (lost their data, or not yet marked), by node index."),
        (REPAIRS, "Repair checks of nodes by outcome (repaired, deferred, not_needed)."),
        (CLUSTER_FOLLOWS, "Clients that followed a change of the node list at connect."),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, SharedString::const_str(help));
    }
    let histograms: [(&'static str, Unit, &'static str); 4] = [
        (QUORUM_OPERATION_SECONDS, Unit::Seconds, "Duration of quorum operations by kind."),
        (NODE_REQUEST_SECONDS, Unit::Seconds, "Time from a quorum operation's start to a node's answer, by node index."),
        (ID_BATCH_SIZE, Unit::Count, "IDs served by one group-committed ID call."),
        (VIEW_DRAIN_SECONDS, Unit::Seconds, "A member's drain of a prepared view: from its start to its acknowledgement on a majority."),
    ];
    for (name, unit, help) in histograms {
        describe_histogram!(name, unit, SharedString::const_str(help));
    }
    describe_gauge!(
        LEADERSHIPS,
        Unit::Count,
        "Leaderships (elections, group and pool leaders) this process holds now."
    );
}

/// `node` label values: a node's position in the configured list, without formatting per call.
const NODE_LABELS: [&str; 64] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61", "62", "63",
];

/// The `node` label of node `i` (`other` beyond the configurable maximum, which never happens).
fn node_label(i: usize) -> &'static str {
    NODE_LABELS.get(i).copied().unwrap_or("other")
}

/// A quorum operation's `outcome` label (see the catalogue); `asked(i)`: whether the operation
/// asked node `i`.
pub(crate) fn operation_outcome<T>(
    tally: &Tally<T>,
    asked: impl Fn(usize) -> bool,
) -> &'static str {
    // Some node was not asked (a repair step on one node): judged by the nodes it asked.
    let partial = tally.results().iter().any(|r| !asked(r.node.0));
    let every_asked_applied = || {
        tally
            .results()
            .iter()
            .filter(|r| asked(r.node.0))
            .all(|r| r.outcome.is_applied())
    };
    if tally.decision() == Decision::Reached || (partial && every_asked_applied()) {
        return "ok";
    }
    let mut error = false;
    for r in tally.results().iter().filter(|r| asked(r.node.0)) {
        match &r.outcome {
            NodeOutcome::Rejected(_) => return "conflict",
            NodeOutcome::Unknown(UnknownCause::ServerError(_)) => error = true,
            _ => {}
        }
    }
    if error {
        "error"
    } else {
        "no_quorum"
    }
}

/// A node's `outcome` label in one operation (see the catalogue).
pub(crate) fn node_outcome<T>(outcome: &NodeOutcome<T>) -> &'static str {
    match outcome {
        NodeOutcome::Applied(_) => "applied",
        NodeOutcome::Rejected(_) => "rejected",
        NodeOutcome::Unknown(cause) => match cause {
            UnknownCause::Timeout => "timeout",
            UnknownCause::ConnectionLost(_) => "connection_lost",
            UnknownCause::Abandoned => "abandoned",
            UnknownCause::Unreachable(_) => "unreachable",
            UnknownCause::Excluded(_) => "excluded",
            UnknownCause::ServerError(_) => "server_error",
        },
    }
}

/// One quorum operation `kind` ended with `tally`; `asked(i)` is whether it asked node `i`
/// (nodes it did not ask are not counted). A handful of counter and histogram updates per
/// fan-out, no formatting.
pub(crate) fn quorum_operation<T>(
    kind: &'static str,
    tally: &Tally<T>,
    asked: impl Fn(usize) -> bool,
) {
    let outcome = operation_outcome(tally, &asked);
    counter!(QUORUM_OPERATIONS, "kind" => kind, "outcome" => outcome).increment(1);
    histogram!(QUORUM_OPERATION_SECONDS, "kind" => kind).record(tally.elapsed().as_secs_f64());
    for r in tally.results().iter().filter(|r| asked(r.node.0)) {
        let node = node_label(r.node.0);
        counter!(NODE_REQUESTS, "node" => node, "outcome" => node_outcome(&r.outcome)).increment(1);
        if let Some(latency) = r.latency {
            histogram!(NODE_REQUEST_SECONDS, "node" => node).record(latency.as_secs_f64());
        }
    }
}

/// The path of one ID round (the `path` label of [`ID_ROUNDS`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum IdPath {
    /// A proposal (write) round.
    Write,
    /// IDs from the spare block, validated by a majority read.
    Spare,
    /// A validating read of the spare that failed.
    SpareInvalid,
}

/// One ID round on `path` (on the IDs' fast path: literal labels make a static key, no
/// allocation).
pub(crate) fn id_round(path: IdPath) {
    match path {
        IdPath::Write => counter!(ID_ROUNDS, "path" => "write"),
        IdPath::Spare => counter!(ID_ROUNDS, "path" => "spare"),
        IdPath::SpareInvalid => counter!(ID_ROUNDS, "path" => "spare_invalid"),
    }
    .increment(1);
}

/// One group-committed ID call serving `ids` IDs.
pub(crate) fn id_batch(ids: u64) {
    histogram!(ID_BATCH_SIZE).record(ids as f64);
}

/// One acquisition attempt ended with `result` (`Ok` when granted).
pub(crate) fn lease_acquisition<T>(result: &Result<T, Error>) {
    let outcome = match result {
        Ok(_) => "granted",
        Err(Error::LockHeld { .. }) => "held",
        Err(Error::LockLooksAbandoned { .. }) => "looks_abandoned",
        Err(Error::NoQuorum(_)) => "no_quorum",
        // `timeout` names an attempt's answers too slow to leave enough validity.
        Err(Error::Timeout { .. } | Error::TooSlow { .. }) => "timeout",
        Err(Error::Contended { .. }) => "contended",
        Err(_) => "error",
    };
    counter!(LEASE_ACQUISITIONS, "outcome" => outcome).increment(1);
}

/// How one lease extension ended (the `outcome` label of [`LEASE_EXTENSIONS`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Extension {
    /// A majority applied it in time.
    Ok,
    /// A majority holds another value.
    Conflict,
    /// No majority answered in time.
    NoQuorum,
    /// Applied, but after the loss was signalled.
    Late,
}

/// One lease extension ended as `outcome`.
pub(crate) fn lease_extension(outcome: Extension) {
    let outcome = match outcome {
        Extension::Ok => "ok",
        Extension::Conflict => "conflict",
        Extension::NoQuorum => "no_quorum",
        Extension::Late => "late",
    };
    counter!(LEASE_EXTENSIONS, "outcome" => outcome).increment(1);
}

/// A lease's loss was signalled with `reason` (a release is not counted).
pub(crate) fn lease_loss(reason: &LossReason) {
    let reason = match reason {
        LossReason::Released => return,
        LossReason::Conflict => "conflict",
        LossReason::NoQuorum(_) => "no_quorum",
        LossReason::Expired => "expired",
        LossReason::HoldBoundReached => "hold_bound_reached",
    };
    counter!(LEASE_LOSSES, "reason" => reason).increment(1);
}

/// This process won a leadership.
pub(crate) fn leadership_won() {
    counter!(LEADERSHIP_CHANGES, "event" => "won").increment(1);
    gauge!(LEADERSHIPS).increment(1.0);
}

/// A leadership this process held ended with `reason`.
pub(crate) fn leadership_ended(reason: &LossReason) {
    let event = match reason {
        LossReason::Released => "resigned",
        _ => "lost",
    };
    // The gauge first: whoever sees the change counted sees the gauge moved.
    gauge!(LEADERSHIPS).decrement(1.0);
    counter!(LEADERSHIP_CHANGES, "event" => event).increment(1);
}

/// A view change of `kind` (the `kind` label of [`VIEW_CHANGES`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum ViewChange {
    /// The leader sealed a prepared view.
    SealedPrepare,
    /// The leader sealed an active view.
    SealedActive,
    /// A member read a view other than the last it published.
    Adopted,
}

/// One view change of `kind`.
pub(crate) fn view_change(kind: ViewChange) {
    let kind = match kind {
        ViewChange::SealedPrepare => "sealed_prepare",
        ViewChange::SealedActive => "sealed_active",
        ViewChange::Adopted => "adopted",
    };
    counter!(VIEW_CHANGES, "kind" => kind).increment(1);
}

/// A member drained a prepared view in `took`.
pub(crate) fn view_drain(took: Duration) {
    histogram!(VIEW_DRAIN_SECONDS).record(took.as_secs_f64());
}

/// Node `node` turned quarantined in a client's verdicts.
pub(crate) fn node_quarantined(node: usize) {
    counter!(NODE_QUARANTINES, "node" => node_label(node)).increment(1);
}

/// A client followed a change of its node list ([`CLUSTER_FOLLOWS`]).
pub(crate) fn cluster_followed() {
    counter!(CLUSTER_FOLLOWS).increment(1);
}

/// How one repair check ended (the `outcome` label of [`REPAIRS`]).
pub(crate) fn repair(outcome: &'static str) {
    counter!(REPAIRS, "outcome" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::{Majority, NodeId, NodeResult};

    fn tally(outcomes: Vec<NodeOutcome<()>>) -> Tally<()> {
        let results = outcomes
            .into_iter()
            .enumerate()
            .map(|(i, outcome)| NodeResult {
                node: NodeId(i),
                outcome,
                latency: Some(Duration::from_millis(1)),
            })
            .collect();
        Tally::new(Majority::of(3), results, Duration::from_millis(2))
    }

    #[test]
    fn operation_outcomes() {
        use NodeOutcome::*;
        let err = || Unknown(UnknownCause::ServerError("ERR".into()));
        let cases = [
            (
                vec![Applied(()), Applied(()), Unknown(UnknownCause::Abandoned)],
                "ok",
            ),
            (vec![Applied(()), Rejected(()), err()], "conflict"),
            (
                vec![Applied(()), err(), Unknown(UnknownCause::Timeout)],
                "error",
            ),
            (
                vec![
                    Applied(()),
                    Unknown(UnknownCause::Timeout),
                    Unknown(UnknownCause::Excluded("q".into())),
                ],
                "no_quorum",
            ),
        ];
        for (outcomes, want) in cases {
            assert_eq!(
                operation_outcome(&tally(outcomes.clone()), |_| true),
                want,
                "{outcomes:?}"
            );
        }
        // An operation that asks one node (a repair's claim) is judged by that node.
        let one = |outcome| {
            tally(vec![
                Unknown(UnknownCause::Excluded("not asked".into())),
                outcome,
                Unknown(UnknownCause::Excluded("not asked".into())),
            ])
        };
        assert_eq!(operation_outcome(&one(Applied(())), |i| i == 1), "ok");
        assert_eq!(
            operation_outcome(&one(Rejected(())), |i| i == 1),
            "conflict"
        );
        assert_eq!(
            operation_outcome(&one(Unknown(UnknownCause::Timeout)), |i| i == 1),
            "no_quorum"
        );
    }

    #[test]
    fn node_labels_are_positions() {
        assert_eq!(node_label(0), "0");
        assert_eq!(node_label(crate::config::MAX_NODES), "63");
        assert_eq!(node_label(1000), "other");
        for (i, l) in NODE_LABELS.iter().enumerate() {
            assert_eq!(*l, i.to_string());
        }
    }

    #[test]
    fn every_unknown_cause_has_its_own_label() {
        let causes = [
            UnknownCause::Timeout,
            UnknownCause::ConnectionLost(String::new()),
            UnknownCause::Abandoned,
            UnknownCause::Unreachable(String::new()),
            UnknownCause::Excluded(String::new()),
            UnknownCause::ServerError(String::new()),
        ];
        let labels: std::collections::BTreeSet<_> = causes
            .into_iter()
            .map(|c| node_outcome(&NodeOutcome::<()>::Unknown(c)))
            .collect();
        assert_eq!(labels.len(), 6);
    }

    /// The helpers record what the catalogue says, under a local recorder.
    #[test]
    fn helpers_record_under_their_names() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            describe_metrics();
            let t = tally(vec![
                NodeOutcome::Applied(()),
                NodeOutcome::Rejected(()),
                NodeOutcome::Unknown(UnknownCause::Abandoned),
            ]);
            quorum_operation("lock.acquire", &t, |i| i != 2);
            lease_loss(&LossReason::Released);
            lease_loss(&LossReason::Expired);
        });
        let snap = snapshotter.snapshot().into_hashmap();
        let names: Vec<String> = snap
            .keys()
            .map(|k| {
                let labels: Vec<String> = k
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                format!("{}{{{}}}", k.key().name(), labels.join(","))
            })
            .collect();
        for want in [
            "redquorum_quorum_operations_total{kind=lock.acquire,outcome=conflict}",
            "redquorum_quorum_operation_seconds{kind=lock.acquire}",
            "redquorum_node_requests_total{node=0,outcome=applied}",
            "redquorum_node_requests_total{node=1,outcome=rejected}",
            "redquorum_node_request_seconds{node=1}",
            "redquorum_lease_losses_total{reason=expired}",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        assert!(
            !names.iter().any(|n| n.contains("node=2")),
            "a node not asked is not counted: {names:?}"
        );
        assert!(
            !names.iter().any(|n| n.contains("released")),
            "a release is no loss: {names:?}"
        );
    }
}
