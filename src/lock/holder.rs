//! Who holds a lock, and wake-up hints for waiters.

use super::*;

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
            .and_then(|(value, (_, version, ttl))| holder_of(value, version, ttl)))
    }

    /// Wake-up hints for waiters: notified when the holder releases (pub/sub on every node).
    pub(crate) fn release_watch(&self, wake: Arc<Notify>) -> ReleaseWatch {
        ReleaseWatch::start(&self.inner, wake)
    }
}

/// The holder a majority's lease value names (`random:token:holder`), or none for a repair's
/// blocker (its sources disagreed on the holder: nobody's lease) or an unreadable value.
fn holder_of(value: &str, version: u64, ttl_ms: u64) -> Option<Holder> {
    let mut parts = value.splitn(3, ':');
    if parts.next()? == crate::repair::BLOCKER_PREFIX {
        return None;
    }
    let token: u64 = parts.next()?.parse().ok()?;
    Some(Holder {
        holder: parts.next().unwrap_or_default().to_string(),
        token: FencingToken::new(token),
        version,
        ttl: Duration::from_millis(ttl_ms),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repairs_blocker_names_no_holder() {
        let h = holder_of("0123abcd:7:host-1", 3, 2000).expect("a holder's value");
        assert_eq!(
            (h.holder.as_str(), h.token.get(), h.version),
            ("host-1", 7, 3)
        );
        assert_eq!(
            holder_of("repair-blocker:7:unknown: restored by a repair", 1, 2000),
            None,
            "a blocker is nobody's lease, though it carries a real token"
        );
    }
}
