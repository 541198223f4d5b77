//! Completion records of periodic jobs: a per-job hash `rq:done:<job>` of period -> token,
//! written to a majority and read from a majority (so a recorded completion is always seen).

use std::sync::Arc;

use crate::client::NodeConn;
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::keys::{fixed_key, KeyKind};
use crate::lock::Lock;
use crate::quorum::fanout::Wait;
use crate::quorum::NodeOutcome;
use crate::scripts::{PRUNE, RECORD};

/// The token recorded for `period`, if a node of a majority has it.
pub(crate) async fn completed(
    lock: &Lock,
    done_key: &str,
    period: &str,
) -> Result<Option<FencingToken>, Error> {
    let (key, field): (Arc<str>, Arc<str>) = (done_key.into(), period.into());
    let tally = lock
        .client()
        .fan_out("job.completed", Wait::All, move |mut nc: NodeConn| {
            let (key, field) = (key.clone(), field.clone());
            async move {
                let (marker, token): (Option<String>, Option<u64>) = nc
                    .checked_pipe()
                    .cmd("HGET")
                    .arg(&*key)
                    .arg(&*field)
                    .query_async(&mut nc.conn)
                    .await?;
                if !nc.marker_holds(marker.as_deref()) {
                    return Ok(nc.stale());
                }
                Ok(NodeOutcome::Applied(token))
            }
        })
        .await;
    let tally = lock
        .client()
        .require_majority("job.completed", tally, |_| String::new())?;
    Ok(tally
        .replies()
        .filter_map(|(_, t)| *t)
        .max()
        .map(FencingToken::new))
}

/// Record `period` as done with `token` on a majority.
pub(crate) async fn record(
    lock: &Lock,
    done_key: &str,
    period: &str,
    token: FencingToken,
    retained: u64,
) -> Result<(), Error> {
    let (key, field): (Arc<str>, Arc<str>) = (done_key.into(), period.into());
    let tally = lock
        .client()
        .fan_out("job.record", Wait::Decided, move |mut nc: NodeConn| {
            let (key, field) = (key.clone(), field.clone());
            async move {
                let (status, _): (i64, u64) = RECORD
                    .key(&*key)
                    .key(fixed_key(KeyKind::Marker))
                    .arg(&*field)
                    .arg(token.get())
                    .arg(&*nc.marker)
                    .invoke_async(&mut nc.conn)
                    .await?;
                Ok(if status == 1 {
                    NodeOutcome::Applied(())
                } else {
                    NodeOutcome::Rejected(())
                })
            }
        })
        .await;
    lock.client()
        .require_majority("job.record", tally, |_| String::new())?;
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
pub(crate) async fn prune(client: crate::Client, key: Arc<str>, threshold: u64, keep: u64) {
    let _ = client
        .fan_out("gc.prune", Wait::All, move |mut nc: NodeConn| {
            let key = key.clone();
            async move {
                let deleted: i64 = PRUNE
                    .key(&*key)
                    .key(fixed_key(KeyKind::Marker))
                    .arg(threshold)
                    .arg(keep)
                    .arg(&*nc.marker)
                    .invoke_async(&mut nc.conn)
                    .await?;
                Ok(if deleted >= 0 {
                    NodeOutcome::Applied(())
                } else {
                    NodeOutcome::Rejected(())
                })
            }
        })
        .await;
}
