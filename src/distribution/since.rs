//! The pool leader's read of one node's unit register as a change log: the `units_since.lua`
//! step, sent with the cursor the leader holds for that node (its incarnation, log epoch and
//! stamp), and the decode of its reply into a [`Reply`] for `Mirrors::fold`. The step is
//! marker-guarded; a whole register is decoded off the async runtime (see `pool.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use super::unit_log::Reply;
use super::units::UnitKeys;
use crate::client::{script_call, Guard, Steps};
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::NodeOutcome;
use crate::scripts::UNITS_SINCE;

/// One node's raw reply with the node's index and the marker it answered under.
pub(super) type RawReply = (usize, Arc<str>, redis::Value);

/// `units_since.lua` on every node, each with its own cursor from `cursors` (see
/// `Mirrors::cursors`; none where the node answers under another marker: it then sends its
/// whole register), a new epoch id `new_epoch` and stamp start `start` for a node whose log
/// has none. The reply is decoded later ([`decode`]): only the refusal (`{-1}`) is recognised
/// here.
pub(super) fn steps(
    cursors: HashMap<usize, (Arc<str>, String, u64)>,
    keys: UnitKeys,
    new_epoch: String,
    start: u64,
) -> Steps<RawReply> {
    let cursors = Arc::new(cursors);
    Steps::per_node(move |ctx| {
        let (id, stamp) = cursors
            .get(&ctx.node)
            .filter(|(marker, _, _)| *marker == ctx.marker)
            .map(|(_, id, stamp)| (id.clone(), *stamp))
            .unwrap_or_default();
        Some(
            script_call(&UNITS_SINCE, Guard::Marker)
                .key(&keys.units)
                .marker_key()
                .key(&keys.stamp)
                .key(&keys.log)
                .key(&keys.epoch)
                .key(fixed_key(KeyKind::Marked))
                .marker()
                .arg(id)
                .arg(stamp)
                .arg(&new_epoch)
                .arg(start)
                .decode(|ctx, v| {
                    // Decoded off the async runtime (a whole register is megabytes):
                    // only the refusal ({-1}) is recognised here.
                    let refused = matches!(&v, redis::Value::Array(items) if items.len() == 1);
                    let reply = (ctx.node, ctx.marker.clone(), v);
                    Ok(if refused {
                        NodeOutcome::Rejected(reply)
                    } else {
                        NodeOutcome::Applied(reply)
                    })
                }),
        )
    })
}

/// Decode one node's reply (`{mode, id, stamp, since, field, entry, ...}`).
pub(super) fn decode(node: usize, marker: Arc<str>, v: redis::Value) -> Result<Reply, String> {
    let redis::Value::Array(items) = v else {
        return Err("not an array".into());
    };
    if items.len() < 4 || items.len() % 2 != 0 {
        return Err(format!("{} items", items.len()));
    }
    let mut items = items.into_iter();
    let mut next = || items.next().ok_or_else(|| "short".to_string());
    let mode: i64 = redis::from_redis_value(next()?).map_err(|e| e.to_string())?;
    let epoch: String = redis::from_redis_value(next()?).map_err(|e| e.to_string())?;
    let stamp: u64 = redis::from_redis_value(next()?).map_err(|e| e.to_string())?;
    let since: u64 = redis::from_redis_value(next()?).map_err(|e| e.to_string())?;
    let whole = match mode {
        1 => false,
        2 => true,
        m => return Err(format!("mode {m}")),
    };
    let mut pairs = Vec::new();
    while let (Ok(f), Ok(e)) = (next(), next()) {
        pairs.push((
            redis::from_redis_value(f).map_err(|e| e.to_string())?,
            redis::from_redis_value(e).map_err(|e| e.to_string())?,
        ));
    }
    Ok(Reply {
        node,
        marker,
        whole,
        epoch,
        stamp,
        since,
        pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_and_malformed_ones_are_refused() {
        use redis::Value::{Array, BulkString, Int};
        let ok = Array(vec![
            Int(1),
            BulkString(b"e".to_vec()),
            Int(12),
            Int(10),
            BulkString(b"a".to_vec()),
            BulkString(b"".to_vec()),
        ]);
        let r = decode(0, "m".into(), ok).expect("decodes");
        assert!(!r.whole && r.stamp == 12 && r.since == 10);
        assert_eq!(r.pairs, vec![("a".to_string(), String::new())]);
        for bad in [
            Int(1),
            Array(vec![Int(-1)]),
            Array(vec![Int(3), BulkString(b"e".to_vec()), Int(1), Int(0)]),
            Array(vec![
                Int(1),
                BulkString(b"e".to_vec()),
                Int(1),
                Int(0),
                BulkString(b"odd".to_vec()),
            ]),
        ] {
            assert!(decode(0, "m".into(), bad.clone()).is_err(), "{bad:?}");
        }
    }
}
