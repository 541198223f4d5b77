//! Once-per-period jobs ([`PeriodicJob`]): work done once per period by whichever instance holds
//! the job's lease, with completion records on a majority. Also the records' node steps, which
//! a group's acknowledgements reuse.
//!
//! # How it works
//! 1. An instance takes the job's lease (a [`Lock`] named like the job), waiting up
//!    to `wait`; a one-shot run (`wait` zero) takes over the lease of a runner that crashed
//!    after watching it unchanged for its TTL plus drift.
//! 2. It reads the period's completion record and begin mark from a majority
//!    (`rq:done:<job>`: period -> token, and `"\u{1f}begun:" + period` -> token), every node
//!    answering counted: the record that counts is the highest at or above the highest begin
//!    mark read (a record below it is a deposed holder's late record).
//! 3. No record counts: it marks the period begun with its token on a majority (`record.lua`
//!    on the begin mark, under the lease as in step 4), then runs the work under the lease
//!    (`run_period`), or hands the held lease to the caller (`begin_period` -> [`PeriodRun`]).
//! 4. Work complete (and the lease not lost: a loss ready together with the work's end wins):
//!    `record.lua` raises the period's field to the run's token on a majority (marker-guarded;
//!    each node refuses where it shows a later holder: the lock's fence key above the token,
//!    its floors above it where the node holds no copy of this holder's lease, or the
//!    period's begin mark above it). The record counts only if a majority applied it before
//!    the lease's validity at its send ended, judged as an extension is; then the lease is
//!    released; `prune.lua` then drops the fields beyond the newest 2 x 1024 (best effort, on
//!    every voting node). Failed or abandoned work records nothing.
//!
//! # Guarantees
//! The holder of the job's lease runs period P only if no counting completion record for P
//! is found on a majority, and records completion with its token on a majority while its lease
//! holds: a fail-over after completion does not run P again; a fail-over during the work lets
//! the new holder run it. Work that fails (`run_period`'s `Err`, a [`PeriodRun`] abandoned or
//! dropped) records nothing, so the next run does it. A run that lost its lease before its
//! record counted is told so ([`Error::LeaseLost`]), never that it recorded, and once a later
//! run (token t) began P, no record below t counts for any reader, wherever it landed: a
//! deposed holder's late record never makes P look done after its successor began it and
//! failed.
//!
//! The argument. A run with token t marks P begun on a majority M within its lease, so after
//! its grant and before any later grant. A record r below t that is applied on a node of M
//! after the mark is refused there (the begin mark is above r); wherever else r lands, a
//! reader after the mark reads a node of M (two majorities share a node), sees a begin mark of
//! at least t and ignores r. Conversely a record r that counted was applied on a majority
//! within r's lease, so before any later grant, hence before any later run's read: that read
//! finds r, and no begin mark above r (a run marks P begun only after finding no counting
//! record; by induction over the later runs in token order), so P is done for it. The lease
//! check on the nodes makes the late record's writer learn it lost (a majority refuses it, or
//! it came after the validity); the begin mark closes the rest: a late record refused on the
//! majority that granted t can still land on a node outside it, and without the mark a later
//! reader counting every node would find it after t's run failed.
//!
//! Not guaranteed: that a paused old holder is not still finishing the work (make it fenced by
//! the token or idempotent); a record written to some nodes only when recording failed or
//! came late (a later run may find the period done, or run it again); periods older than the
//! retained records are not remembered.
//!
//! # Invariants
//! - Records and begin marks never expire on a node and only grow: `record.lua` raises a
//!   field, never lowers it; they are collected by count (beyond the retained ones, lowest
//!   token first, so a late record goes before the begin mark above it), never by time.
//! - A completion or begin mark is written only under a marker check on each node
//!   (`Guard::Marker`) and the lease check above, and read behind the marker (MULTI/EXEC).
//! - The lease check on a node uses the lock's floors only where the node holds no copy of
//!   the holder's lease: other locks share a floor bucket and may raise it above a live
//!   holder's token (as for `lock_extend.lua`'s re-creation of a copy).
//!
//! # What it relies on outside this folder
//! - `crate::lock` for the job's lease (the election module is not involved: a job is not an
//!   election).
//! - Keys (`src/keys.rs`): `KeyKind::Done` (`rq:done:<job>`: the records and the begin marks),
//!   and the job's `KeyKind::Lock`, `KeyKind::Fence` and `KeyKind::FenceFloor` (its bucket and
//!   the single floor), read by `record.lua`; a group's acknowledgements (`KeyKind::Ack`,
//!   `KeyKind::PoolAck`) go through `record.lua` with two keys.
//! - Scripts: `src/scripts/record.lua`, `src/scripts/prune.lua`.
//! - Repair rule (`src/repair/plan.rs`): `done` (and `ack`, `pack`): each field raised to its
//!   highest value; a begin mark is an integer field like a record, so it is raised too (a
//!   repaired node never forgets that a run began a period).
//! - ACL (`src/acl.rs`): `Feature::Election` (the lock's commands plus `HDEL`, `HGETALL` for the
//!   records); `Feature::Indexing` and `Feature::Distribution` include them too.
//! - Model: not modelled as a job; `record.lua` with two keys is mirrored for acknowledgements by
//!   `model/src/views.rs` and compared with the real script in `model/tests/conformance_views.rs`.
//! - Tests: `tests/election.rs` (a daily job runs once across four instances, again only after a
//!   fail-over mid-work), `tests/jobs.rs` (a deposed holder's late record, refused and ignored,
//!   with teeth; `Err` leaves the period to the next call), `tests/gc.rs` (records beyond the
//!   retained ones), `cli/tests/job.rs` (`redquorum job run`), `cli/tests/serve.rs`
//!   (`/complete` after the lease was lost).
//!
//! # Files
//! - `mod.rs`: the completion records, begin marks and their node steps (`completed`,
//!   `record_step`, `job_step`, the pure `judge`, `record`, `mark_begun`, `prune`).
//! - `period.rs`: [`PeriodicJob`], [`JobOptions`], [`JobOutcome`], [`PeriodStart`], [`PeriodRun`].

use std::sync::Arc;

use crate::client::{decode, script_call, Client, Guard, Request, Step};
use crate::error::{Error, NoQuorum};
use crate::fencing::FencingToken;
use crate::lock::{Lock, LockGuard};
use crate::quorum::{NodeOutcome, Tally};
use crate::scripts::{PRUNE, RECORD};

mod period;
pub use period::{JobOptions, JobOutcome, PeriodRun, PeriodStart, PeriodicJob};

/// The field of a job's record hash that holds `period`'s begin mark: the highest token that
/// began the period. Its first character is a control character, which no period name holds,
/// so it never collides with a period's record.
pub(crate) fn begun_field(period: &str) -> String {
    format!("\u{1f}begun:{period}")
}

/// The token recorded for `period` that counts, if a node of a majority has one: the highest
/// record at or above the highest begin mark read (`begun`: read and applied; off only in
/// tests). A record below a begin mark is a deposed holder's late record: a later run began
/// the period after it lost its lease, and may have failed.
pub(crate) async fn completed(
    lock: &Lock,
    done_key: &str,
    period: &str,
    begun: bool,
) -> Result<Option<FencingToken>, Error> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(done_key).arg(period).arg(begun_field(period));
    let read = Step::read(vec![cmd], |_, v| {
        decode::value::<(Option<u64>, Option<u64>)>(v)
    });
    let tally = lock
        .client()
        .decide(Request::vote("job.completed").wait_all(), read)
        .await?;
    let replies: Vec<(Option<u64>, Option<u64>)> = tally.replies().map(|(_, r)| *r).collect();
    Ok(counted_record(&replies, begun).map(FencingToken::new))
}

/// The record that counts among the nodes' `(record, begin mark)` replies: the highest record
/// at or above every begin mark (`begun` off: the highest record, the rule before issue 43).
fn counted_record(replies: &[(Option<u64>, Option<u64>)], begun: bool) -> Option<u64> {
    let floor = if begun {
        replies.iter().filter_map(|(_, b)| *b).max().unwrap_or(0)
    } else {
        0
    };
    replies
        .iter()
        .filter_map(|(r, _)| *r)
        .filter(|r| *r >= floor)
        .max()
}

/// Raise `field` of the hash `key` to `value` (an acknowledgement with its companion field),
/// marker-guarded: `record.lua` with two keys.
pub(crate) fn record_step(
    key: &str,
    field: &str,
    value: u64,
    companion: Option<(&str, &str)>,
) -> Step<()> {
    let mut call = script_call(&RECORD, Guard::Marker)
        .key(key)
        .marker_key()
        .arg(field)
        .arg(value)
        .marker();
    if let Some((f, v)) = companion {
        call = call.arg(f).arg(v);
    }
    call.decode(|_, v| Ok(decode::status_pair(v)?.map(|_| ())))
}

/// What a node said to a job's write under its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobReply {
    /// Applied (the field holds at least the token now).
    Applied,
    /// Refused: the node shows a later holder or run, at this token.
    Later(u64),
    /// Refused: the node's marker is missing or stale (it may not vote).
    Marker,
}

/// A job's write under its lease, `record.lua` with six keys: raise `field` (the period's
/// record, or its begin mark) of `done_key` to the run's token, unless the node shows a later
/// holder or a later run of the period (`checked`: off only in tests).
pub(crate) fn job_step(
    guard: &LockGuard,
    done_key: &str,
    field: &str,
    period: &str,
    checked: bool,
) -> Step<JobReply> {
    let [lock_key, fence, floor, legacy] = guard.lock().holder_check_keys();
    script_call(&RECORD, Guard::Marker)
        .key(done_key)
        .marker_key()
        .key(lock_key)
        .key(fence)
        .key(floor)
        .key(legacy)
        .arg(field)
        .arg(guard.token().get())
        .marker()
        .arg(&*guard.value())
        .arg(begun_field(period))
        .arg(if checked { "" } else { "*" })
        .decode(|_, v| {
            let (status, value): (i64, u64) = redis::from_redis_value(v)?;
            Ok(match status {
                1 => NodeOutcome::Applied(JobReply::Applied),
                -2 => NodeOutcome::Rejected(JobReply::Later(value)),
                _ => NodeOutcome::Rejected(JobReply::Marker),
            })
        })
}

/// How a job's write under its lease ended, judged as an extension is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority applied it before the validity it was sent under ended.
    Counted,
    /// A majority applied it, but too late (or after the loss was signalled): it does not
    /// count, though readers may find it.
    Late,
    /// So many nodes show a later holder or run that no majority can apply it.
    Refused,
    /// Neither: no majority either way (nodes down, slow, or not voting).
    Undecided,
}

/// The verdict from `applied` and `later` (refusals that show a later holder) of `nodes`, a
/// majority being `needed`; `in_time` when the majority's replies arrived within the lease's
/// validity at the send. Pure.
pub(crate) fn judge(
    applied: usize,
    later: usize,
    nodes: usize,
    needed: usize,
    in_time: bool,
) -> Verdict {
    if applied >= needed {
        if in_time {
            Verdict::Counted
        } else {
            Verdict::Late
        }
    } else if later > nodes.saturating_sub(needed) {
        Verdict::Refused
    } else {
        Verdict::Undecided
    }
}

/// Send a job's write under `guard`'s lease (the period's record or its begin mark) and judge
/// it: `Ok` only when a majority applied it while the lease held (`checked` off, TEST ONLY:
/// unchecked on the nodes and counted whenever a majority applied it).
///
/// # Errors
/// [`Error::LeaseLost`] when it was refused (a later holder or run) or came too late;
/// [`Error::NoQuorum`] when undecided.
pub(crate) async fn write_under_lease(
    op: &'static str,
    guard: &LockGuard,
    done_key: &str,
    field: &str,
    period: &str,
    checked: bool,
) -> Result<(), Error> {
    let client = guard.lock().client();
    let until = guard.validity();
    let step = job_step(guard, done_key, field, period, checked);
    let tally: Tally<JobReply> = client.send(Request::vote(op), step).await;
    let in_time = !checked || (!until.passed() && guard.is_held());
    let later = tally
        .replies()
        .filter(|(_, r)| matches!(r, JobReply::Later(_)))
        .count();
    let m = tally.majority();
    let lost = |reason| Error::LeaseLost {
        name: guard.name().to_string(),
        reason,
    };
    match judge(tally.applied(), later, m.nodes(), m.needed(), in_time) {
        Verdict::Counted => Ok(()),
        Verdict::Late => Err(lost(guard.loss_reason())),
        Verdict::Refused => Err(lost(crate::lease::LossReason::Conflict)),
        Verdict::Undecided => {
            Err(
                NoQuorum::from_tally(op, &tally, &client.node_urls(), |r| match r {
                    JobReply::Later(t) => format!("shows a later holder or run (token {t})"),
                    JobReply::Marker => "marker missing or stale".into(),
                    JobReply::Applied => String::new(),
                })
                .into(),
            )
        }
    }
}

/// Record `period` as done with `guard`'s token on a majority, while its lease holds; then
/// prune the oldest records (in the background).
pub(crate) async fn record(
    guard: &LockGuard,
    done_key: &str,
    period: &str,
    retained: u64,
) -> Result<(), Error> {
    let client = guard.lock().client().clone();
    let checked = client.config().fenced_records;
    write_under_lease("job.record", guard, done_key, period, period, checked).await?;
    // Keep the newest records only (a job that runs every minute would otherwise add a field
    // forever). A period older than the retained ones could run again if asked for explicitly.
    // Each period has two fields (its record and its begin mark), both its run's token: the
    // newest `2 * retained` fields are about the newest `retained` periods.
    tokio::spawn(prune(
        client,
        Arc::from(done_key),
        0,
        retained.saturating_mul(2),
    ));
    Ok(())
}

/// Mark `period` begun with `guard`'s token on a majority, while its lease holds: from then on
/// no record below the token counts (readers ignore it, nodes refuse it).
pub(crate) async fn mark_begun(
    guard: &LockGuard,
    done_key: &str,
    period: &str,
) -> Result<(), Error> {
    let checked = guard.lock().client().config().fenced_records;
    let field = begun_field(period);
    write_under_lease("job.begin", guard, done_key, &field, period, checked).await
}

/// Completion records kept per job: older periods (by token) are dropped.
pub(crate) const RETAINED_RECORDS: u64 = 1024;

/// Drop the fields of a hash of integers below `threshold`, then the lowest while more than
/// `keep` remain (0: no limit), on every voting node (best effort: garbage collection).
pub(crate) async fn prune(client: Client, key: Arc<str>, threshold: u64, keep: u64) {
    let step = prune_step(&key, threshold, keep);
    let _ = client
        .send(Request::vote("gc.prune").wait_all(), step)
        .await;
}

/// `prune.lua` on the hash `key`, marker-guarded.
fn prune_step(key: &str, threshold: u64, keep: u64) -> Step<()> {
    script_call(&PRUNE, Guard::Marker)
        .key(key)
        .marker_key()
        .arg(threshold)
        .arg(keep)
        .marker()
        .decode(|_, v| {
            let deleted: i64 = redis::from_redis_value(v)?;
            Ok(if deleted >= 0 {
                NodeOutcome::Applied(())
            } else {
                NodeOutcome::Rejected(())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NodeCtx;
    use redis::Value;

    fn ctx() -> NodeCtx {
        NodeCtx {
            node: 0,
            marker: "r/c".into(),
            run_id: "r".into(),
        }
    }

    #[test]
    fn records_and_acknowledgements_are_marker_guarded_scripts() {
        let record = record_step("rq:done:j", "2026-11-23", 7, None);
        assert!(record.is_guarded());
        assert_eq!(record.args_for_tests("r/c"), vec!["2026-11-23", "7", "r/c"]);
        let ack = record_step("rq:ack:g", "m#1", 9, Some(("m#1#h", "9:abc")));
        assert_eq!(
            ack.args_for_tests("r/c"),
            vec!["m#1", "9", "r/c", "m#1#h", "9:abc"]
        );
        let reply = |s: i64| Value::Array(vec![Value::Int(s), Value::Int(3)]);
        assert_eq!(
            record.decode_for_tests(&ctx(), reply(1)).ok(),
            Some(NodeOutcome::Applied(()))
        );
        assert_eq!(
            record.decode_for_tests(&ctx(), reply(-1)).ok(),
            Some(NodeOutcome::Rejected(())),
            "a stale marker changes nothing and does not count"
        );
    }

    #[test]
    fn a_record_below_the_highest_begin_mark_does_not_count() {
        // (record, begin mark) per answering node.
        let late_on_one_node = [(Some(5), None), (None, Some(6)), (None, Some(6))];
        assert_eq!(
            counted_record(&late_on_one_node, true),
            None,
            "token 6 began the period after 5 lost its lease: 5's late record is ignored"
        );
        assert_eq!(
            counted_record(&late_on_one_node, false),
            Some(5),
            "without begin marks the late record makes the period look done (the hole)"
        );
        let done = [(Some(6), Some(6)), (Some(6), Some(6)), (Some(5), Some(5))];
        assert_eq!(counted_record(&done, true), Some(6), "at the mark counts");
        let partial = [(Some(5), Some(5)), (None, Some(5)), (None, None)];
        assert_eq!(
            counted_record(&partial, true),
            Some(5),
            "a record on one node, at the highest mark, is found as before"
        );
        assert_eq!(counted_record(&[(None, Some(7))], true), None);
    }

    #[test]
    fn a_write_under_the_lease_counts_only_in_time_and_refusals_mean_a_later_holder() {
        // (applied, later, nodes, needed, in time) -> verdict
        let cases = [
            ((2, 0, 3, 2, true), Verdict::Counted),
            ((3, 0, 3, 2, true), Verdict::Counted),
            ((2, 1, 3, 2, false), Verdict::Late),
            ((1, 2, 3, 2, true), Verdict::Refused),
            ((0, 3, 3, 2, false), Verdict::Refused),
            ((1, 1, 3, 2, true), Verdict::Undecided),
            ((0, 0, 3, 2, true), Verdict::Undecided),
            ((2, 2, 5, 3, true), Verdict::Undecided),
            ((2, 3, 5, 3, true), Verdict::Refused),
        ];
        for ((applied, later, nodes, needed, in_time), want) in cases {
            assert_eq!(
                judge(applied, later, nodes, needed, in_time),
                want,
                "{applied} applied, {later} later of {nodes} (in time: {in_time})"
            );
        }
    }

    #[test]
    fn the_begin_mark_field_cannot_be_a_period_name() {
        let field = begun_field("2026-12-03");
        assert!(crate::keys::Name::new("period", field.as_str()).is_err());
        assert!(field.ends_with("2026-12-03"));
    }

    #[test]
    fn pruning_is_marker_guarded() {
        let step = prune_step("rq:ack:g", 5, 0);
        assert!(step.is_guarded());
        assert_eq!(step.args_for_tests("r/c"), vec!["5", "0", "r/c"]);
        assert_eq!(
            step.decode_for_tests(&ctx(), Value::Int(-1)).ok(),
            Some(NodeOutcome::Rejected(()))
        );
        assert_eq!(
            step.decode_for_tests(&ctx(), Value::Int(2)).ok(),
            Some(NodeOutcome::Applied(()))
        );
    }
}
