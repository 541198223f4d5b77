//! Extensions: one lease, or a client's many leases due at about the same time, in one
//! `lock_extend.lua` call per node. Each lease in a batch is judged on its own nodes' statuses
//! exactly as if it had been extended alone (the fan-out waits until every lease is decided),
//! and its new validity runs from the moment its version was taken, before it was queued.
//!
//! The watchdogs of one client's leases hand their extensions to the client's [`Batcher`],
//! which sends what has gathered a short while after the first arrived ([`decide::gather`]:
//! at most 100 ms, and at most a thirtieth of the shortest TTL waiting), at most
//! [`MAX_BATCH`] leases per call. An explicit extension (`LockGuard::extend`, in `guard.rs`)
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
    /// The validity the lease had when the extension was asked for, on both clocks: the
    /// extension counts only if decided before its earlier end, read when it is decided (a
    /// host suspend during the call shortens it).
    pub(super) until: Stamp,
    /// When this extension's version was taken: its validity runs from here, not from the
    /// batch's send. (An extension with a later version may be sent first, during the gather
    /// delay; this one then changes nothing on the nodes, and a watcher may have seen the
    /// later version since before this batch was sent.)
    pub(super) versioned_at: Stamp,
}

/// What an extension means for one lease: `Ok(new validity)` when a majority applied it
/// within the old validity; `Err(true)` on conflict (no majority can ever extend);
/// `Err(false)` otherwise; with the reason.
pub(super) type Outcome = Result<Stamp, (bool, String)>;

/// `lock_extend.lua` for `items`, marker-guarded. A node's outcome is applied when it answered
/// (each lease is then judged on its own status, [`decide::lease_outcome`]), unknown when its
/// marker is stale.
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
    Ok(NodeOutcome::Applied(statuses))
}

/// Send one extension call for `items` (at most [`MAX_BATCH`]) and judge each lease.
pub(super) async fn send(
    client: &Client,
    items: &[Item],
    deadline: Duration,
    server_clock: bool,
) -> Vec<Outcome> {
    let request = Request::vote("lock.extend").within(deadline);
    let tally = client
        .send_items(request, step(items, server_clock), items.len(), |s, i| {
            decide::lease_outcome(s.get(i))
        })
        .await;
    let decided_at = Instant::now();
    let boot_at = clock::boot_now();
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
                it.until.end_at(decided_at, boot_at),
            ) {
                ExtendVerdict::Extended => Ok(it.versioned_at.after(lease::validity(it.ttl))),
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
    /// Woken on every queued extension, so the flusher recomputes when to send (a shorter
    /// TTL may have arrived).
    queued: Notify,
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

    /// Extend `item` in the client's next batch and wait for its outcome. Dropping the
    /// future (the lease released, lost or dropped) withdraws the extension unless its call
    /// is already being sent.
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
            // The guard exists before the task: a task dropped unpolled resets the flag too.
            let reset = ResetOnDrop(self.clone(), false);
            tokio::spawn(self.clone().flush(client.clone(), reset));
        } else {
            self.queued.notify_one();
        }
        rx.await.unwrap_or_else(|_| {
            Err((
                false,
                "the extension batch was dropped (runtime shutting down)".into(),
            ))
        })
    }

    /// When the next batch is due: a gather delay after the earliest-due extension waiting
    /// (withdrawn ones dropped), or `None` when nothing waits (the flusher then ends).
    fn due(&self) -> Option<Instant> {
        let mut q = self.queue();
        q.waiting.retain(|w| !w.tx.is_closed());
        let at = q
            .waiting
            .iter()
            .map(|w| w.queued + decide::gather(w.item.ttl))
            .min();
        if at.is_none() {
            q.flushing = false;
        }
        at
    }

    /// Send what gathered, batch after batch, until nothing waits. Each call runs in a task
    /// of its own, so a call waiting for a slow node holds no later batch up. If this task
    /// ends any other way (a panic, the runtime shutting down), `reset` fails the waiting
    /// extensions (their senders drop) and the next extension starts a new flusher.
    async fn flush(self: Arc<Self>, client: Client, mut reset: ResetOnDrop) {
        while let Some(at) = self.due() {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = self.queued.notified() => continue,
            }
            let mut batch = std::mem::take(&mut self.queue().waiting);
            // Withdrawn while the batch gathered (released, lost or dropped): not sent.
            batch.retain(|w| !w.tx.is_closed());
            for ((deadline, server_clock), group) in group_calls(batch) {
                let client = client.clone();
                tokio::spawn(async move {
                    let items: Vec<Item> = group.iter().map(|w| w.item.clone()).collect();
                    let outcomes = send(&client, &items, deadline, server_clock).await;
                    for (w, outcome) in group.into_iter().zip(outcomes) {
                        let _ = w.tx.send(outcome);
                    }
                });
            }
        }
        // `due` found nothing waiting and cleared `flushing`: a new flusher may already run.
        reset.1 = true;
    }
}

/// The calls of one batch: leases that share the call's settings, at most [`MAX_BATCH`] each.
fn group_calls(batch: Vec<Waiting>) -> Vec<((Duration, bool), Vec<Waiting>)> {
    let mut groups: HashMap<(Duration, bool), Vec<Waiting>> = HashMap::new();
    for w in batch {
        groups
            .entry((w.deadline, w.server_clock))
            .or_default()
            .push(w);
    }
    let mut calls = Vec::new();
    for (settings, group) in groups {
        let mut group = group.into_iter().peekable();
        while group.peek().is_some() {
            calls.push((settings, group.by_ref().take(MAX_BATCH).collect()));
        }
    }
    calls
}

/// Clears the batcher's `flushing` flag when its flusher ends abnormally (a panic, the
/// runtime shutting down); the flag is whether it ended normally.
struct ResetOnDrop(Arc<Batcher>, bool);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if self.1 {
            return;
        }
        // Ended abnormally with extensions still queued: fail them (their senders drop), so
        // no watchdog waits on a flusher that is gone.
        let mut q = self.0.queue();
        q.waiting.clear();
        q.flushing = false;
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
            until: Stamp::now(),
            versioned_at: Stamp::now(),
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
            Some(NodeOutcome::Applied(vec![1, 0])),
            "one lease held by another value: the node answered, each lease judged alone"
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
