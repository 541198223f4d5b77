//! Once-per-period jobs ([`PeriodicJob`]): work done once per period by whichever instance holds
//! the job's lease, with completion records on a majority. Also the records' node steps, which
//! a group's acknowledgements reuse.
//!
//! # How it works
//! 1. An instance takes the job's lease (a [`Lock`] named like the job), waiting up
//!    to `wait`; a one-shot run (`wait` zero) takes over the lease of a runner that crashed
//!    after watching it unchanged for its TTL plus drift.
//! 2. It reads the period's completion record from a majority (`rq:done:<job>`, period ->
//!    token), every node answering counted: a record any node of a majority holds is seen.
//! 3. No record: it runs the work under the lease (`run_period`, `try_run_period`), or hands the
//!    held lease to the caller (`begin_period` -> [`PeriodRun`]).
//! 4. Work complete: `record.lua` raises the period's field to the run's token on a majority
//!    (marker-guarded), then the lease is released; `prune.lua` then drops the records beyond
//!    the newest 1024 (best effort, on every voting node). Failed or abandoned work records
//!    nothing.
//!
//! # Guarantees
//! The holder of the job's lease runs period P only if no completion record for P is found on a
//! majority, and records completion with its token on a majority: a fail-over after completion
//! does not run P again; a fail-over during the work lets the new holder run it. Work that fails
//! (`try_run_period`'s `Err`, a [`PeriodRun`] abandoned or dropped) records nothing, so the next
//! run does it. Not guaranteed: that a paused old holder is not still finishing the work (make it
//! fenced by the token or idempotent); a record written to some nodes only when recording failed
//! (a later run may find the period done, or run it again); periods older than the retained
//! records are not remembered.
//!
//! # Invariants
//! - Records never expire on a node and only grow: `record.lua` raises a field, never lowers it;
//!   they are collected by count (beyond the retained ones), never by time.
//! - A completion is recorded only under a marker check on each node (`Guard::Marker`), and read
//!   behind the marker (MULTI/EXEC).
//!
//! # What it relies on outside this folder
//! - `crate::lock` for the job's lease (the election module is not involved: a job is not an
//!   election).
//! - Keys (`src/keys.rs`): `KeyKind::Done` (`rq:done:<job>`), and the job's `KeyKind::Lock` and
//!   `KeyKind::Fence`; a group's acknowledgements (`KeyKind::Ack`, `KeyKind::PoolAck`) go through
//!   the same steps.
//! - Scripts: `src/scripts/record.lua`, `src/scripts/prune.lua`.
//! - Repair rule (`src/repair/plan.rs`): `done` (and `ack`, `pack`): each field raised to its
//!   highest value.
//! - ACL (`src/acl.rs`): `Feature::Election` (the lock's commands plus `HDEL`, `HGETALL` for the
//!   records); `Feature::Indexing` and `Feature::Distribution` include them too.
//! - Model: not modelled as a job; `record.lua` is mirrored for acknowledgements by
//!   `model/src/views.rs` and compared with the real script in `model/tests/conformance_views.rs`.
//! - Tests: `tests/election.rs` (a daily job runs once across four instances, again only after a
//!   fail-over mid-work), `tests/gc.rs` (records beyond the retained ones), `cli/tests/job.rs`
//!   (`redquorum job run`).
//!
//! # Files
//! - `mod.rs`: the completion records and their node steps (`completed`, `record_step`,
//!   `record`, `prune`).
//! - `period.rs`: [`PeriodicJob`], [`JobOptions`], [`JobOutcome`], [`PeriodStart`], [`PeriodRun`].

use std::sync::Arc;

use crate::client::{decode, script_call, Client, Guard, Request, Step};
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lock::Lock;
use crate::quorum::NodeOutcome;
use crate::scripts::{PRUNE, RECORD};

mod period;
pub use period::{JobOptions, JobOutcome, PeriodRun, PeriodStart, PeriodicJob};

/// The token recorded for `period`, if a node of a majority has it.
pub(crate) async fn completed(
    lock: &Lock,
    done_key: &str,
    period: &str,
) -> Result<Option<FencingToken>, Error> {
    let read = Step::read(vec![hget(done_key, period)], |_, v| {
        decode::value::<Option<u64>>(v)
    });
    let tally = lock
        .client()
        .decide(Request::vote("job.completed").wait_all(), read)
        .await?;
    Ok(tally
        .replies()
        .filter_map(|(_, t)| *t)
        .max()
        .map(FencingToken::new))
}

fn hget(key: &str, field: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HGET");
    cmd.arg(key).arg(field);
    cmd
}

/// Raise `field` of the hash `key` to `value` (a completion record, an acknowledgement with
/// its companion field), marker-guarded: `record.lua`.
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

/// Record `period` as done with `token` on a majority.
pub(crate) async fn record(
    lock: &Lock,
    done_key: &str,
    period: &str,
    token: FencingToken,
    retained: u64,
) -> Result<(), Error> {
    let step = record_step(done_key, period, token.get(), None);
    lock.client()
        .decide(Request::vote("job.record"), step)
        .await?;
    // Keep the newest records only (a job that runs every minute would otherwise add a field
    // forever). A period older than the retained ones could run again if asked for explicitly.
    tokio::spawn(prune(
        lock.client().clone(),
        Arc::from(done_key),
        0,
        retained,
    ));
    Ok(())
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
