//! Who holds a lock, and wake-up hints for waiters.

use super::*;

/// What a majority of nodes says about who holds a lock.
///
/// No node clock decides when a lease ends, so a holder that crashed stays named here until
/// another client takes the lease over (after watching it unchanged for its TTL) or it is
/// released. [`looks_abandoned`](Holder::looks_abandoned) says when this client has watched
/// the lease long enough to tell: a live holder extends it (bumping
/// [`version`](Holder::version)) every third of its TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    /// For how long this [`Lock`] handle has seen the lease unchanged (the same value and
    /// version on a majority of the nodes, each on the same node incarnation), measured on
    /// this process's monotonic clock between its own readings; zero when the lease changed at
    /// the latest reading (its holder is alive). `None` when this handle has no history of it:
    /// a single read (a fresh handle, a one-shot command) cannot tell how long a state lasted.
    /// Readings by this handle's acquisition attempts count too.
    pub unchanged_for: Option<Duration>,
}

impl Holder {
    /// Whether the holder looks abandoned (crashed, frozen or cut off): this handle has seen
    /// its lease unchanged on a majority for at least the lease's TTL plus drift
    /// ([`unchanged_for`](Self::unchanged_for)), the window after which a contender may take
    /// it over. A live holder extends every third of its TTL, so it never looks abandoned
    /// while it can reach a majority.
    ///
    /// Not guaranteed: that the holder is dead (a frozen process may wake up; its lease is then
    /// lost, since any acquirer may take it over now); that anyone will take the lease over
    /// (nobody does until some client tries to acquire it). False without history
    /// (`unchanged_for` is `None`): watch with [`Lock::holder_watching`].
    pub fn looks_abandoned(&self) -> bool {
        lease::looks_abandoned(self.unchanged_for, self.ttl)
    }
}

/// How a watching holder read goes on (see [`Lock::holder_watching`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchStep {
    /// The answer is known: no holder, another lease, the holder showed it is alive, or it
    /// looks abandoned; or the watch is over.
    Done,
    /// Read again at this instant.
    ReadAt(Instant),
}

/// After a watching read at `now` that found `latest`, given the `first` read at `first_at`:
/// stop when the answer is known, else read again at the next poll (or when the lease would
/// have been unchanged for its window), no later than `deadline`. Pure.
fn watch_step(
    first: &Holder,
    first_at: Instant,
    latest: Option<&Holder>,
    now: Instant,
    deadline: Instant,
) -> WatchStep {
    let Some(latest) = latest else {
        return WatchStep::Done; // released (or taken over and released)
    };
    if (latest.token, &latest.holder) != (first.token, &first.holder) || latest.looks_abandoned() {
        return WatchStep::Done;
    }
    // Unchanged since the first read, the span grows exactly with the time between the two
    // readings; shorter means a majority's lease changed meanwhile: its holder is alive.
    let watched = now.saturating_duration_since(first_at);
    let before = first.unchanged_for.unwrap_or_default();
    if latest.unchanged_for.is_some_and(|u| u < before + watched) || now >= deadline {
        return WatchStep::Done;
    }
    let window = lease::watch_window(latest.ttl);
    let to_window = window.saturating_sub(latest.unchanged_for.unwrap_or_default());
    let poll = (latest.ttl / 8).clamp(Duration::from_millis(10), Duration::from_millis(500));
    WatchStep::ReadAt((now + poll.min(to_window)).min(deadline))
}

impl Lock {
    /// Who holds the lock according to a majority of the nodes, if anyone does, read once. A
    /// blocker that a repair left where its sources disagreed on the holder is reported as no
    /// holder (it stays until a waiter takes it over after its lease time).
    ///
    /// The reading is remembered by this handle (as an acquisition's readings are): a later
    /// call reports for how long the lease stayed unchanged ([`Holder::unchanged_for`]) and
    /// whether it looks abandoned. A first call has no history: `unchanged_for` is `None`.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only).
    pub async fn holder(&self) -> Result<Option<Holder>, Error> {
        self.read_holder().await.map(|(holder, _)| holder)
    }

    /// Who holds the lock, watched for up to `watch` to tell a live holder from an abandoned
    /// one: it reads the holder, then again every eighth of the holder's TTL (10 ms to 500 ms)
    /// until the lease changes (its holder is alive: about a third of the TTL at most), it
    /// looks abandoned (unchanged for the TTL plus drift), it is released or changes hands, or
    /// `watch` has passed. So a watch of the TTL plus 1 % plus 2 ms or longer always tells;
    /// a shorter one may end with [`Holder::unchanged_for`] below the window and
    /// `looks_abandoned()` false. `Duration::ZERO` reads once, as [`holder`](Self::holder).
    /// A later read that fails (no majority) is skipped; the watch goes on.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] if fewer than a majority answered the first read.
    ///
    /// # Cancel safety
    /// Cancel-safe (read-only); what was read so far is remembered by this handle.
    pub async fn holder_watching(&self, watch: Duration) -> Result<Option<Holder>, Error> {
        let (first, first_at) = self.read_holder().await?;
        let deadline = first_at + watch;
        let Some(first_holder) = first.clone() else {
            return Ok(None);
        };
        let mut latest = (first, first_at);
        loop {
            let step = watch_step(
                &first_holder,
                first_at,
                latest.0.as_ref(),
                latest.1,
                deadline,
            );
            match step {
                WatchStep::Done => return Ok(latest.0),
                WatchStep::ReadAt(at) => tokio::time::sleep_until(at).await,
            }
            match self.read_holder().await {
                Ok(read) => latest = read,
                // Skipped; the deadline still ends the watch.
                Err(_) => latest.1 = Instant::now(),
            }
        }
    }

    /// One majority read of the lock key on every node, remembered in the watch; the holder
    /// a majority names, and the instant of the reading.
    async fn read_holder(&self) -> Result<(Option<Holder>, Instant), Error> {
        let read = Step::read(vec![self.lease_read()], |ctx, v| {
            Ok(NodeOutcome::Applied(decode_lease(&ctx.marker, v)?))
        });
        let request = Request::vote("lock.holder")
            .wait_all()
            .within(self.inner.node_deadline);
        let tally = self.inner.client.decide(request, read).await?;
        let read_at = Instant::now();
        let needed = tally.majority().needed();
        let mut watch = self.inner.watch();
        for (node, seen) in tally.replies() {
            watch.observe(node.0, seen.clone(), read_at);
        }
        let states: Vec<&KeyState> = tally.replies().map(|(_, seen)| &seen.state).collect();
        let holder = majority_value(&states, needed).and_then(|(value, version, ttl)| {
            let mut holder = holder_of(value, version, ttl)?;
            holder.unchanged_for = lease::quiet_for(&watch, value, needed);
            Some(holder)
        });
        Ok((holder, read_at))
    }

    /// The read of this lease on a node (`HMGET <lock key> v n t`), for a caller that reads it
    /// inside a marker-checked read of its own (a group's view read carries its leader lease);
    /// decode the node's reply with [`decode_lease`] and hand the readings to
    /// [`observe_readings`](Self::observe_readings).
    pub(crate) fn lease_read(&self) -> redis::Cmd {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.inner.key).arg("v").arg("n").arg("t");
        hmget
    }

    /// Remember readings of this lease taken by another marker-checked read, received by `at`
    /// (as this handle's own reads and attempts are remembered): a contender watches a held
    /// lease from them without rounds of its own.
    pub(crate) fn observe_readings(&self, readings: &[(usize, Seen<KeyState>)], at: Instant) {
        let mut watch = self.inner.watch();
        for (node, seen) in readings {
            watch.observe(*node, seen.clone(), at);
        }
    }

    /// When an acquisition round could win from what this handle has seen: `None` now (the
    /// lease is free on a majority, some node was never read, or a majority showed it
    /// unchanged for its TTL plus drift), else the earliest instant a majority could be ready
    /// if nothing changes. Only a hint for when to try: the round itself decides.
    pub(crate) fn ready_at(&self, now: Instant) -> Option<Instant> {
        let inner = &self.inner;
        let needed = inner.client.majority().needed();
        match lease::plan_with(&inner.watch(), needed, now, inner.takeover_window) {
            Plan::Attempt(_) => None,
            Plan::WaitUntil(t) => Some(t),
        }
    }

    /// Wake-up hints for waiters: notified when the holder releases (pub/sub on every node).
    pub(crate) fn release_watch(&self, wake: Arc<Notify>) -> ReleaseWatch {
        ReleaseWatch::start(&self.inner, wake)
    }
}

/// A node's reply to [`Lock::lease_read`], seen on the node incarnation `marker` (the one the
/// marker-checked read verified). Pure.
pub(crate) fn decode_lease(
    marker: &Arc<str>,
    v: redis::Value,
) -> redis::RedisResult<Seen<KeyState>> {
    let (value, version, ttl): (Option<String>, Option<u64>, Option<u64>) =
        redis::from_redis_value(v)?;
    let state = match value {
        Some(value) => KeyState::Held {
            value: value.into(),
            version: version.unwrap_or(0),
            ttl: Duration::from_millis(ttl.unwrap_or(0)),
        },
        None => KeyState::Absent,
    };
    Ok(Seen {
        run_id: marker.clone(),
        state,
    })
}

/// The lease value that at least `needed` of the nodes' `states` hold, with the lowest version
/// and the highest lease time among them.
fn majority_value<'a>(states: &[&'a KeyState], needed: usize) -> Option<(&'a str, u64, Duration)> {
    let mut counts: std::collections::HashMap<&str, (usize, u64, Duration)> =
        std::collections::HashMap::new();
    for state in states {
        if let KeyState::Held {
            value,
            version,
            ttl,
        } = state
        {
            let e = counts
                .entry(&**value)
                .or_insert((0, u64::MAX, Duration::ZERO));
            e.0 += 1;
            e.1 = e.1.min(*version);
            e.2 = e.2.max(*ttl);
        }
    }
    counts
        .into_iter()
        .find(|(_, (n, _, _))| *n >= needed)
        .map(|(value, (_, version, ttl))| (value, version, ttl))
}

/// The holder a majority's lease value names (`random:token:holder`), or none for a repair's
/// blocker (its sources disagreed on the holder: nobody's lease) or an unreadable value.
fn holder_of(value: &str, version: u64, ttl: Duration) -> Option<Holder> {
    let mut parts = value.splitn(3, ':');
    if parts.next()? == crate::keys::BLOCKER_PREFIX {
        return None;
    }
    let token: u64 = parts.next()?.parse().ok()?;
    Some(Holder {
        holder: parts.next().unwrap_or_default().to_string(),
        token: FencingToken::new(token),
        version,
        ttl,
        unchanged_for: None,
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
        let ttl = Duration::from_secs(2);
        let h = holder_of("0123abcd:7:host-1", 3, ttl).expect("a holder's value");
        assert_eq!(
            (h.holder.as_str(), h.token.get(), h.version),
            ("host-1", 7, 3)
        );
        assert_eq!(
            holder_of("repair-blocker:7:unknown: restored by a repair", 1, ttl),
            None,
            "a blocker is nobody's lease, though it carries a real token"
        );
    }

    #[test]
    fn the_holder_is_the_value_a_majority_holds() {
        let held = |value: &str, version: u64| KeyState::Held {
            value: value.into(),
            version,
            ttl: Duration::from_millis(900),
        };
        let (a5, a6, b1) = (held("a", 5), held("a", 6), held("b", 1));
        let absent = KeyState::Absent;
        assert_eq!(
            majority_value(&[&a5, &a6, &absent], 2),
            Some(("a", 5, Duration::from_millis(900))),
            "the lowest version a majority shows"
        );
        assert_eq!(majority_value(&[&a5, &b1, &absent], 2), None);
        assert_eq!(majority_value(&[&absent, &absent, &a5], 2), None);
    }

    #[test]
    fn a_watching_read_stops_as_soon_as_it_can_tell() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ms = Duration::from_millis;
        let holder = |unchanged: Option<u64>| Holder {
            holder: "h".into(),
            token: FencingToken::new(7),
            version: 3,
            ttl: ms(800),
            unchanged_for: unchanged.map(ms),
        };
        let first = holder(None);
        let deadline = at(5000);
        let step =
            |latest: Option<&Holder>, now: u64| watch_step(&first, t0, latest, at(now), deadline);
        // Unchanged so far: read again a poll later (an eighth of 800 ms).
        assert_eq!(
            step(Some(&holder(Some(300))), 300),
            WatchStep::ReadAt(at(400))
        );
        // Close to the window (800 ms + 1 % + 2 ms): read again exactly when it is over.
        assert_eq!(
            step(Some(&holder(Some(760))), 760),
            WatchStep::ReadAt(at(810))
        );
        // Unchanged for the TTL plus drift: it looks abandoned, the answer is known.
        assert!(holder(Some(810)).looks_abandoned() && !holder(Some(809)).looks_abandoned());
        assert_eq!(step(Some(&holder(Some(810))), 810), WatchStep::Done);
        // The lease changed since the first read (a shorter span): its holder is alive.
        assert_eq!(step(Some(&holder(Some(0))), 300), WatchStep::Done);
        assert_eq!(step(Some(&holder(Some(100))), 300), WatchStep::Done);
        // Released, or another lease.
        assert_eq!(step(None, 300), WatchStep::Done);
        let other = Holder {
            token: FencingToken::new(8),
            ..holder(Some(300))
        };
        assert_eq!(step(Some(&other), 300), WatchStep::Done);
        // The watch is over.
        assert_eq!(
            watch_step(&first, t0, Some(&holder(Some(300))), at(300), at(300)),
            WatchStep::Done
        );
        assert_eq!(
            watch_step(&first, t0, Some(&holder(Some(250))), at(250), at(300)),
            WatchStep::ReadAt(at(300)),
            "never past the deadline"
        );
        // A history from before the watch: its first span counts.
        let warm = holder(Some(500));
        assert_eq!(
            watch_step(&warm, t0, Some(&holder(Some(700))), at(200), deadline),
            WatchStep::ReadAt(at(300))
        );
        assert_eq!(
            watch_step(&warm, t0, Some(&holder(Some(650))), at(200), deadline),
            WatchStep::Done,
            "shorter than the history plus the watch: it changed"
        );
    }
}
