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
use crate::scripts::RECORD;

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
        .require_majority("job.record", tally, |_| String::new())
        .map(|_| ())
}
