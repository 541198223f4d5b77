//! One page of a copy on one node: a source's keys read behind the incarnation the copy
//! planned on (one MULTI/EXEC with its marker and last-repair nonce), and a target raised to
//! the merged page under the repairer's claim (every script call checks it atomically). The
//! copy's orchestration, and why each check is needed, is in `copy.rs`.

use std::collections::BTreeMap;

use super::plan::{classify, fence_of, lease_token, HashMerge, Holdings, Kind, Plan};
use crate::client::NodeConn;
use crate::keys::{fixed_key, KeyKind, BLOCKER_HOLDER};
use crate::membership::View;
use crate::quorum::NodeOutcome;
use crate::scripts::{RAISE, RESTORE, VIEW_WRITE};

/// A source's incarnation as the census found it: the copy reads it only while it is the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Incarnation {
    /// The server's run_id (a restart changes it).
    pub(crate) run_id: String,
    /// Its marker (a FLUSHALL removes it).
    pub(crate) marker: Option<String>,
    /// Its last repair's nonce (`rq:marked`: every repair writes a new one).
    pub(crate) marked: Option<String>,
}

/// One source's answer to a read behind its incarnation.
#[derive(Clone, Debug)]
pub(super) enum Behind<T> {
    /// Read on the incarnation the copy planned on.
    Same(T),
    /// The source is not that incarnation any more: what it returned is worthless.
    Changed,
}

/// Run `fill`'s commands on `nc` in one MULTI/EXEC behind a read of the marker and of the last
/// repair's nonce, and compare both (and the connection's run_id) with `expected`. `check`
/// false is the TEST-ONLY blind copy.
pub(super) async fn behind(
    nc: &mut NodeConn,
    expected: &Incarnation,
    check: bool,
    fill: impl FnOnce(&mut redis::Pipeline),
) -> redis::RedisResult<Behind<Vec<redis::RedisResult<redis::Value>>>> {
    let mut pipe = redis::pipe();
    pipe.atomic().ignore_errors();
    pipe.cmd("GET").arg(fixed_key(KeyKind::Marker));
    pipe.cmd("GET").arg(fixed_key(KeyKind::Marked));
    fill(&mut pipe);
    let mut replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(&mut nc.conn).await?;
    if replies.len() < 2 {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "copy read",
            format!("expected at least 2 replies, got {}", replies.len()),
        )));
    }
    let rest = replies.split_off(2);
    let marked: Option<String> =
        redis::from_redis_value(replies.pop().unwrap_or(Ok(redis::Value::Nil))?)?;
    let marker: Option<String> =
        redis::from_redis_value(replies.pop().unwrap_or(Ok(redis::Value::Nil))?)?;
    let same = nc.run_id() == expected.run_id.as_str()
        && marker == expected.marker
        && marked == expected.marked;
    Ok(if same || !check {
        Behind::Same(rest)
    } else {
        Behind::Changed
    })
}

/// Read the given keys from one node, each by its kind, in one transaction behind its
/// incarnation. A key of an unexpected type (an older layout) or with a value that does not
/// parse is skipped.
pub(super) async fn read_keys(
    mut nc: NodeConn,
    keys: &[String],
    expected: &Incarnation,
    check: bool,
) -> redis::RedisResult<Behind<Holdings>> {
    let kinds: Vec<Kind> = keys.iter().filter_map(|k| classify(k)).collect();
    let replies = behind(&mut nc, expected, check, |pipe| {
        for (key, kind) in keys.iter().zip(&kinds) {
            match kind {
                Kind::Register => pipe.cmd("GET").arg(key),
                Kind::View => pipe.cmd("HMGET").arg(key).arg("token").arg("view"),
                Kind::Lease => pipe.cmd("HMGET").arg(key).arg("v").arg("n").arg("t"),
                Kind::Hash(_) => pipe.cmd("HGETALL").arg(key),
            };
        }
    })
    .await?;
    let Behind::Same(replies) = replies else {
        return Ok(Behind::Changed);
    };
    let mut h = Holdings::default();
    for ((key, kind), reply) in keys.iter().zip(&kinds).zip(replies) {
        let Ok(value) = reply else { continue };
        match kind {
            Kind::Register => {
                if let Ok(Some(v)) = redis::from_redis_value::<Option<u64>>(value) {
                    h.registers.insert(key.clone(), v);
                }
            }
            Kind::View => {
                if let Ok((Some(t), Some(v))) =
                    redis::from_redis_value::<(Option<u64>, Option<String>)>(value)
                {
                    h.views.insert(key.clone(), (t, v));
                }
            }
            Kind::Lease => {
                if let Ok((Some(v), Some(n), Some(t))) =
                    redis::from_redis_value::<(Option<String>, Option<u64>, Option<u64>)>(value)
                {
                    h.leases.insert(key.clone(), (v, n, t));
                }
            }
            Kind::Hash(_) => {
                if let Ok(fields) = redis::from_redis_value::<BTreeMap<String, String>>(value) {
                    if !fields.is_empty() {
                        h.hashes.insert(key.clone(), fields);
                    }
                }
            }
        }
    }
    Ok(Behind::Same(h))
}

/// A node a copy writes to: the incarnation it must keep and the claim it must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) run_id: String,
    /// The repairer's claim nonce the node must carry for every write (`*`: the TEST-ONLY
    /// unclaimed write).
    pub(crate) claim: String,
}

/// Raise one node to `plan`, only while it is still the incarnation `target` names and carries
/// its claim. Applied(number of keys or fields written), or Rejected when the node restarted
/// or refused a write (its claim is gone: another repair finished, or the node lost its data).
pub(super) async fn raise(
    mut nc: NodeConn,
    plan: &Plan,
    target: &Target,
) -> redis::RedisResult<NodeOutcome<usize>> {
    if nc.run_id() != target.run_id.as_str() {
        return Ok(NodeOutcome::Rejected(0));
    }
    let claim = Claim {
        key: fixed_key(KeyKind::RepairClaim),
        nonce: &target.claim,
    };
    // Each step stops at the first call that answers -1 (the claim is not the repairer's), and
    // no later step runs: the node then takes nothing more of this copy. (Each script checks
    // the claim again atomically; the client does not lean on that alone.)
    let Some(registers) = raise_registers(&mut nc, plan, &claim).await? else {
        return Ok(NodeOutcome::Rejected(0));
    };
    let Some(views) = raise_views(&mut nc, plan, &claim).await? else {
        return Ok(NodeOutcome::Rejected(0));
    };
    let Some(leases) = restore_leases(&mut nc, plan, &claim).await? else {
        return Ok(NodeOutcome::Rejected(0));
    };
    let Some(hashes) = restore_hashes(&mut nc, plan, &claim).await? else {
        return Ok(NodeOutcome::Rejected(0));
    };
    let raised = registers + views + leases + hashes;
    Ok(NodeOutcome::Applied(raised))
}

/// The repairer's claim a target must carry for every write.
struct Claim<'a> {
    /// `rq:repairing`.
    key: String,
    /// The repairer's nonce (`*`: the TEST-ONLY unclaimed write).
    nonce: &'a str,
}

/// Add a script's count of keys or fields written to `raised`; None when the script refused
/// (-1: the claim is not the repairer's).
fn counted(raised: &mut usize, n: i64) -> Option<()> {
    *raised += usize::try_from(n).ok()?;
    Some(())
}

/// The monotonic registers of `plan`, raised by `raise.lua` (200 a call). None: refused.
async fn raise_registers(
    nc: &mut NodeConn,
    plan: &Plan,
    claim: &Claim<'_>,
) -> redis::RedisResult<Option<usize>> {
    let mut raised = 0;
    for chunk in plan.registers.chunks(200) {
        let mut inv = RAISE.prepare_invoke();
        inv.key(&claim.key).arg(claim.nonce);
        for (k, v) in chunk {
            inv.key(k).arg(*v);
        }
        if counted(&mut raised, inv.invoke_async::<i64>(&mut nc.conn).await?).is_none() {
            return Ok(None);
        }
    }
    Ok(Some(raised))
}

/// The views of `plan`, each by the view register's own compare-and-set on the view's base,
/// under the claim instead of the marker (the node is being repaired precisely because its
/// marker is missing or stale). None: refused.
async fn raise_views(
    nc: &mut NodeConn,
    plan: &Plan,
    claim: &Claim<'_>,
) -> redis::RedisResult<Option<usize>> {
    let mut raised = 0;
    for (key, (token, view)) in &plan.views {
        let Ok(parsed) = serde_json::from_str::<View>(view) else {
            continue;
        };
        let base = parsed.base.token().map(|t| t.get()).unwrap_or(0);
        let (stored, _): (i64, u64) = VIEW_WRITE
            .key(key)
            .key(fixed_key(KeyKind::Marker))
            .key(&claim.key)
            .arg(*token)
            .arg(view)
            .arg(View::digest(view))
            .arg(base)
            .arg(format!("claim:{}", claim.nonce))
            .invoke_async(&mut nc.conn)
            .await?;
        if stored == -1 {
            return Ok(None);
        }
        raised += usize::from(stored == 1);
    }
    Ok(Some(raised))
}

/// The lease copies (or blockers) of `plan`, each beside its fence key, by `restore.lua`
/// (never over an existing key). None: refused.
async fn restore_leases(
    nc: &mut NodeConn,
    plan: &Plan,
    claim: &Claim<'_>,
) -> redis::RedisResult<Option<usize>> {
    let mut raised = 0;
    for (key, (value, version, ttl)) in &plan.leases {
        let Some(fence_key) = fence_of(key) else {
            continue;
        };
        let written: i64 = RESTORE
            .key(&claim.key)
            .key(key)
            .key(&fence_key)
            .arg(claim.nonce)
            .arg("lease")
            .arg(value)
            .arg(*version)
            .arg(*ttl)
            .arg(lease_token(value))
            .arg(BLOCKER_HOLDER)
            .invoke_async(&mut nc.conn)
            .await?;
        if counted(&mut raised, written).is_none() {
            return Ok(None);
        }
    }
    Ok(Some(raised))
}

/// The hash fields of `plan`, each raised by its merge rule (`restore.lua`, 200 fields a
/// call). None: refused.
async fn restore_hashes(
    nc: &mut NodeConn,
    plan: &Plan,
    claim: &Claim<'_>,
) -> redis::RedisResult<Option<usize>> {
    let mut raised = 0;
    for (key, (merge, fields)) in &plan.hashes {
        let third = match merge {
            HashMerge::Units => units_floor_of(key).unwrap_or_else(|| key.clone()),
            _ => key.clone(),
        };
        for chunk in fields.iter().collect::<Vec<_>>().chunks(200) {
            let mut inv = RESTORE.prepare_invoke();
            inv.key(&claim.key)
                .key(key)
                .key(&third)
                .arg(claim.nonce)
                .arg(merge.mode());
            for (f, v) in chunk {
                inv.arg(*f).arg(*v);
            }
            if counted(&mut raised, inv.invoke_async::<i64>(&mut nc.conn).await?).is_none() {
                return Ok(None);
            }
        }
    }
    Ok(Some(raised))
}

/// A pool's collection floor key from its unit register's key (`rq:units:p` -> `rq:ufloor:p`).
fn units_floor_of(units_key: &str) -> Option<String> {
    let pool = units_key.strip_prefix("rq:units:")?;
    Some(format!("rq:ufloor:{pool}"))
}
