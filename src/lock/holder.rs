//! Who holds a lock, and wake-up hints for waiters.

use super::*;

/// The first field of a repair's blocker value (`src/repair/plan.rs`, `restore.lua`).
const BLOCKER_PREFIX: &str = "repair-blocker";

/// What a majority of nodes says about who holds a lock.
///
/// No node clock decides when a lease ends, so a holder that crashed stays named here until
/// another client takes the lease over (after watching it unchanged for its TTL) or it is
/// released: watch [`version`](Holder::version) to tell a live holder (it changes at every
/// extension) from a dead one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holder description given with [`LockOptions::with_holder`] (a candidate ID for
    /// elections).
    pub holder: String,
    /// The fencing token of the holder's lease (the leadership term, for elections).
    pub token: FencingToken,
    /// The holder's extension count as seen by the majority (the lowest among them).
    pub version: u64,
    /// The holder's lease time.
    pub ttl: Duration,
}

impl Lock {
    /// Who holds the lock according to a majority of the nodes, if anyone does. A blocker that
    /// a repair left where its sources disagreed on the holder is reported as no holder (it
    /// stays until a waiter takes it over after its lease time).
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn holder(&self) -> Result<Option<Holder>, Error> {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.inner.key).arg("v").arg("n").arg("t");
        let read = Step::read(vec![hmget], |_, v| {
            let (value, version, ttl): (Option<String>, Option<u64>, Option<u64>) =
                redis::from_redis_value(v)?;
            Ok(NodeOutcome::Applied((
                value,
                version.unwrap_or(0),
                ttl.unwrap_or(0),
            )))
        });
        let request = Request::vote("lock.holder")
            .wait_all()
            .within(self.inner.node_deadline);
        let tally = self.inner.client.decide(request, read).await?;
        let needed = tally.majority().needed();
        let mut counts: std::collections::HashMap<&str, (usize, u64, u64)> =
            std::collections::HashMap::new();
        for (_, (value, version, ttl)) in tally.replies() {
            if let Some(v) = value {
                let e = counts.entry(v.as_str()).or_insert((0, u64::MAX, 0));
                e.0 += 1;
                e.1 = e.1.min(*version);
                e.2 = e.2.max(*ttl);
            }
        }
        Ok(counts
            .into_iter()
            .find(|(_, (n, _, _))| *n >= needed)
            .and_then(|(value, (_, version, ttl))| {
                let mut parts = value.splitn(3, ':');
                // A repair's blocker (its sources disagreed on the holder) is nobody's lease.
                if parts.next()? == BLOCKER_PREFIX {
                    return None;
                }
                let token: u64 = parts.next()?.parse().ok()?;
                Some(Holder {
                    holder: parts.next().unwrap_or_default().to_string(),
                    token: FencingToken::new(token),
                    version,
                    ttl: Duration::from_millis(ttl),
                })
            }))
    }

    /// Wake-up hints for waiters: notified when the holder releases (pub/sub on every node).
    pub(crate) fn release_watch(&self, wake: Arc<Notify>) -> ReleaseWatch {
        ReleaseWatch::start(&self.inner, wake)
    }
}

/// Subscribes to the lock's release notifications on every node while a waiter waits, so a
/// release wakes it at once. A hint only: nothing is decided from it.
pub(crate) struct ReleaseWatch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ReleaseWatch {
    pub(super) fn start(inner: &LockInner, wake: Arc<Notify>) -> ReleaseWatch {
        let tasks = inner
            .client
            .pubsub_clients()
            .into_iter()
            .map(|client| {
                let (wake, channel) = (wake.clone(), inner.channel.clone());
                tokio::spawn(async move {
                    let Ok(mut ps) = client.get_async_pubsub().await else {
                        return;
                    };
                    if ps.subscribe(&channel).await.is_err() {
                        return;
                    }
                    let mut messages = ps.on_message();
                    while messages.next().await.is_some() {
                        wake.notify_waiters();
                        wake.notify_one();
                    }
                })
            })
            .collect();
        ReleaseWatch { tasks }
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
