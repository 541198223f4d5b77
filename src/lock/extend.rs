//! Extensions: one lease, or a client's many leases due at about the same time, in one
//! `lock_extend.lua` call per node. Each lease in a batch is judged on its own nodes' statuses
//! exactly as if it had been extended alone, and its new validity runs from the moment the
//! batch was sent.
//!
//! The watchdogs of one client's leases hand their extensions to the client's [`Batcher`],
//! which sends what has gathered a short while after the first arrived ([`decide::gather`]:
//! at most 100 ms, and at most a thirtieth of the shortest TTL waiting), at most
//! [`MAX_BATCH`] leases per call. An explicit [`LockGuard::extend`](super::LockGuard::extend)
//! is sent at once, alone.

use std::collections::HashMap;

use super::*;

/// Most leases in one extension call (one script call per node).
pub(super) const MAX_BATCH: usize = 1000;

/// One lease's part of an extension call.
#[derive(Clone, Debug)]
pub(super) struct Item {
    pub(super) key: String,
    pub(super) fence: String,
    pub(super) floor: String,
    pub(super) value: Arc<str>,
    pub(super) version: u64,
    pub(super) ttl: Duration,
    pub(super) token: u64,
    /// The validity the lease had when the extension was asked for.
    pub(super) valid_until: Instant,
}

/// What an extension means for one lease: `Ok(new validity)` when a majority applied it
/// within the old validity; `Err(true)` on conflict (no majority can ever extend);
/// `Err(false)` otherwise; with the reason.
pub(super) type Outcome = Result<Stamp, (bool, String)>;

/// `lock_extend.lua` for `items`, marker-guarded. A node's outcome is applied when every
/// lease in it was extended there, rejected (with the statuses) when some was not, unknown
/// when its marker is stale.
pub(super) fn step(items: &[Item], server_clock: bool) -> Step<Vec<i64>> {
    let mut call = script_call(&LOCK_EXTEND, Guard::Marker)
        .marker_key()
        .key(fixed_key(KeyKind::FenceFloor));
    for it in items {
        call = call.key(&it.key).key(&it.fence).key(&it.floor);
    }
    call = call.marker().arg(if server_clock { "x" } else { "" });
    for it in items {
        call = call
            .arg(&*it.value)
            .arg(it.version)
            .arg(it.ttl.as_millis() as u64)
            .arg(it.token);
    }
    let n = items.len();
    call.decode(move |_, v| decode(v, n))
}

/// A node's answer to `lock_extend.lua` for `n` leases.
pub(super) fn decode(v: redis::Value, n: usize) -> redis::RedisResult<NodeOutcome<Vec<i64>>> {
    if let redis::Value::Int(-1) = v {
        return Ok(NodeOutcome::Unknown(UnknownCause::Excluded(
            "marker missing or stale".into(),
        )));
    }
    let statuses: Vec<i64> = redis::from_redis_value(v)?;
    if statuses.len() != n {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "lock_extend.lua answered for another number of leases",
            format!("{} statuses for {n} leases", statuses.len()),
        )));
    }
    Ok(if statuses.iter().all(|s| decide::extension_applied(*s)) {
        NodeOutcome::Applied(statuses)
    } else {
        NodeOutcome::Rejected(statuses)
    })
}

/// Send one extension call for `items` (at most [`MAX_BATCH`]) and judge each lease.
pub(super) async fn send(
    client: &Client,
    items: &[Item],
    deadline: Duration,
    server_clock: bool,
) -> Vec<Outcome> {
    let start = Stamp::now();
    let request = Request::vote("lock.extend").within(deadline);
    let tally = client.send(request, step(items, server_clock)).await;
    let decided_at = Instant::now();
    let m = tally.majority();
    items
        .iter()
        .enumerate()
        .map(|(i, it)| {
            let lease = tally.item(|statuses: &Vec<i64>| decide::lease_outcome(statuses.get(i)));
            let (applied, conflicts) = (lease.applied(), lease.rejected());
            match lease::judge_extension(
                applied,
                conflicts,
                m.nodes(),
                m.needed(),
                decided_at,
                it.valid_until,
            ) {
                ExtendVerdict::Extended => Ok(start.after(lease::validity(it.ttl))),
                verdict => {
                    let why = format!(
                        "lock.extend: {applied} of {} nodes extended the lease, {} needed; {conflicts} hold another value or a higher fence{}",
                        m.nodes(),
                        m.needed(),
                        if verdict == ExtendVerdict::TooLate {
                            "; decided after the validity ended"
                        } else {
                            ""
                        }
                    );
                    Err((verdict == ExtendVerdict::Conflict, why))
                }
            }
        })
        .collect()
}

/// A client's extension batcher: the watchdogs of its leases queue their extensions here.
/// One per client (see [`Client::shared`]); a flushing task runs only while extensions wait.
#[derive(Default)]
pub(super) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// A flushing task is running.
    flushing: bool,
}

struct Waiting {
    item: Item,
    queued: Instant,
    deadline: Duration,
    server_clock: bool,
    tx: tokio::sync::oneshot::Sender<Outcome>,
}

impl Batcher {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Extend `item` in the client's next batch and wait for its outcome.
    pub(super) async fn extend(
        self: Arc<Self>,
        client: &Client,
        item: Item,
        deadline: Duration,
        server_clock: bool,
    ) -> Outcome {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut q = self.queue();
            q.waiting.push(Waiting {
                item,
                queued: Instant::now(),
                deadline,
                server_clock,
                tx,
            });
            !std::mem::replace(&mut q.flushing, true)
        };
        if start {
            tokio::spawn(self.clone().flush(client.clone()));
        }
        rx.await.unwrap_or_else(|_| {
            Err((
                false,
                "the extension batch was dropped (runtime shutting down)".into(),
            ))
        })
    }

    /// Send what gathered, batch after batch, until nothing waits.
    async fn flush(self: Arc<Self>, client: Client) {
        loop {
            let send_at = {
                let mut q = self.queue();
                q.waiting.retain(|w| !w.tx.is_closed());
                let first = q
                    .waiting
                    .iter()
                    .map(|w| w.queued + decide::gather(w.item.ttl))
                    .min();
                match first {
                    Some(at) => at,
                    None => {
                        q.flushing = false;
                        return;
                    }
                }
            };
            tokio::time::sleep_until(send_at).await;
            let batch = std::mem::take(&mut self.queue().waiting);
            // One call per group of leases that share the call's settings.
            let mut groups: HashMap<(Duration, bool), Vec<Waiting>> = HashMap::new();
            for w in batch {
                groups
                    .entry((w.deadline, w.server_clock))
                    .or_default()
                    .push(w);
            }
            let mut calls = futures::stream::FuturesUnordered::new();
            for ((deadline, server_clock), group) in groups {
                let mut group = group.into_iter().peekable();
                while group.peek().is_some() {
                    let chunk: Vec<Waiting> = group.by_ref().take(MAX_BATCH).collect();
                    let client = client.clone();
                    calls.push(async move {
                        let items: Vec<Item> = chunk.iter().map(|w| w.item.clone()).collect();
                        let outcomes = send(&client, &items, deadline, server_clock).await;
                        for (w, outcome) in chunk.into_iter().zip(outcomes) {
                            let _ = w.tx.send(outcome);
                        }
                    });
                }
            }
            while calls.next().await.is_some() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NodeCtx;
    use redis::Value;

    fn item(name: &str, version: u64) -> Item {
        Item {
            key: format!("rq:lock:{name}"),
            fence: format!("rq:fence:{name}"),
            floor: "rq:floor:1".into(),
            value: Arc::from(format!("v-{name}")),
            version,
            ttl: Duration::from_millis(1500),
            token: 7,
            valid_until: Instant::now(),
        }
    }

    #[test]
    fn a_batch_carries_every_lease_behind_one_marker_check() {
        let s = step(&[item("a", 2), item("b", 3)], false);
        assert!(s.is_guarded());
        assert_eq!(
            s.args_for_tests("r/c"),
            vec!["r/c", "", "v-a", "2", "1500", "7", "v-b", "3", "1500", "7"]
        );
    }

    #[test]
    fn a_nodes_statuses_decode_per_lease() {
        let ctx = NodeCtx {
            node: 0,
            marker: "r/c".into(),
            run_id: "r".into(),
        };
        let s = step(&[item("a", 2), item("b", 3)], false);
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        assert_eq!(
            s.decode_for_tests(&ctx, ints(&[1, 2])).ok(),
            Some(NodeOutcome::Applied(vec![1, 2])),
            "extended and re-created: applied"
        );
        assert_eq!(
            s.decode_for_tests(&ctx, ints(&[1, 0])).ok(),
            Some(NodeOutcome::Rejected(vec![1, 0])),
            "one lease held by another value: the node did not apply all"
        );
        assert!(matches!(
            s.decode_for_tests(&ctx, Value::Int(-1)),
            Ok(NodeOutcome::Unknown(UnknownCause::Excluded(_)))
        ));
        assert!(
            s.decode_for_tests(&ctx, ints(&[1])).is_err(),
            "a reply for another number of leases is an error"
        );
    }
}
