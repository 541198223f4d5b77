//! A held lease: extension, the watchdog, the loss signal.

use super::*;
use crate::metrics::{self, Extension};

/// A lease's state, as published on [`LockGuard::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// Held until the instant (monotonic clock), unless extended.
    Held {
        /// End of validity as it was when this status was published (the earlier of the
        /// monotonic and the boot clock's ends, then). A host suspend after that shortens the
        /// validity without a new status: [`LockGuard::valid_until`] and
        /// [`LockGuard::is_held`] read the clocks, and the loss follows within a second of
        /// the resume.
        valid_until: Instant,
    },
    /// Lost or released.
    Lost(LossReason),
}

impl Lock {
    /// Extend this lease on every voting node with the next version (re-creating a missing
    /// copy where safe): alone and at once, or (`batched`) in the client's next extension
    /// call with its other leases due about now (see [`extend`](mod@super::extend)).
    pub(super) async fn send_extend(
        &self,
        value: &Arc<str>,
        token: FencingToken,
        version: u64,
        versioned_at: Stamp,
        until: Stamp,
        batched: bool,
    ) -> extend::Outcome {
        let inner = &self.inner;
        let item = extend::Item {
            key: inner.key.clone(),
            fence: inner.fence_key.clone(),
            floor: inner.floor_key.clone(),
            value: value.clone(),
            version,
            ttl: inner.ttl,
            token: token.get(),
            until,
            versioned_at,
        };
        let (client, deadline, server_clock) =
            (&inner.client, inner.node_deadline, inner.server_clock);
        if batched {
            let batcher = client.shared::<extend::Batcher>();
            return batcher.extend(client, item, deadline, server_clock).await;
        }
        let mut outcomes = extend::send(client, &[item], deadline, server_clock).await;
        outcomes
            .pop()
            .unwrap_or_else(|| Err((false, "lock.extend: no outcome".into())))
    }
}

/// A held lease. Dropping it stops extension and starts a best-effort release in the
/// background; prefer [`release`](LockGuard::release), which reports the outcome.
#[must_use = "a lease is released when its guard is dropped"]
pub struct LockGuard {
    shared: Arc<LeaseShared>,
    released: bool,
}

pub(super) struct LeaseShared {
    lock: Lock,
    value: Arc<str>,
    token: FencingToken,
    acquired_at: Instant,
    times: Mutex<Times>,
    status: watch::Sender<LeaseStatus>,
    cancel: CancellationToken,
    stop: CancellationToken,
    suspended_for_tests: AtomicBool,
    /// The version of the last extension sent (the acquisition is version 1).
    version: AtomicU64,
    /// When the loss was signalled (monotonic clock).
    lost_at: Mutex<Option<Instant>>,
}

#[derive(Clone, Copy)]
pub(super) struct Times {
    /// End of validity on both clocks (see [`crate::clock`]).
    until: Stamp,
    extensions: u32,
}

impl Times {
    /// End of validity on the monotonic clock, judged on both clocks (reads them).
    pub(super) fn valid_until(&self) -> Instant {
        self.until.end()
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.shared.lock.name())
            .field("token", &self.shared.token)
            .field("status", &*self.shared.status.borrow())
            .finish()
    }
}

impl LockGuard {
    pub(super) fn start(
        lock: Lock,
        value: Arc<str>,
        token: FencingToken,
        acquired_at: Instant,
        until: Stamp,
    ) -> LockGuard {
        let (status, _) = watch::channel(LeaseStatus::Held {
            valid_until: until.end(),
        });
        let shared = Arc::new(LeaseShared {
            lock,
            value,
            token,
            acquired_at,
            times: Mutex::new(Times {
                until,
                extensions: 0,
            }),
            status,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
            suspended_for_tests: AtomicBool::new(false),
            version: AtomicU64::new(1),
            lost_at: Mutex::new(None),
        });
        tokio::spawn(watchdog(shared.clone()));
        LockGuard {
            shared,
            released: false,
        }
    }

    /// The fencing token minted with this lease: pass it with every write to a resource.
    pub fn token(&self) -> FencingToken {
        self.shared.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.shared.lock.name()
    }

    /// End of validity, as an instant of this process's monotonic clock (moves forward with
    /// extensions): the earlier of the end on the monotonic clock and the end on the boot
    /// clock (`CLOCK_BOOTTIME`, which counts the time the host was suspended). Without a
    /// suspend the two agree; after one, the validity is shortened by the suspended time, and
    /// is in the past when the suspend outlasted it. Computed when called: each call reads
    /// both clocks.
    ///
    /// Not guaranteed: that the lease is still held up to this instant (a conflict or a lost
    /// majority ends it earlier; [`lost`](Self::lost) and [`is_held`](Self::is_held) say so).
    pub fn valid_until(&self) -> Instant {
        self.shared.times().valid_until()
    }

    /// True while the lease has not been lost and its validity has not ended on either clock
    /// (right at once after a host suspend, before the loss is signalled).
    pub fn is_held(&self) -> bool {
        matches!(*self.shared.status.borrow(), LeaseStatus::Held { .. })
            && !self.shared.times().until.passed()
    }

    /// A channel that carries every status change; it ends in [`LeaseStatus::Lost`].
    pub fn status(&self) -> watch::Receiver<LeaseStatus> {
        self.shared.status.subscribe()
    }

    /// A token cancelled when the lease is lost (or released).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Resolves with the reason once the lease is lost; fires no later than `valid_until`.
    ///
    /// # Cancel safety
    /// Cancel-safe; call it again to wait again.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut rx = self.shared.status.subscribe();
        async move {
            loop {
                if let LeaseStatus::Lost(reason) = &*rx.borrow_and_update() {
                    return reason.clone();
                }
                if rx.changed().await.is_err() {
                    return LossReason::Released;
                }
            }
        }
    }

    /// When the loss (or release) was signalled, on the monotonic clock; `None` while held.
    pub fn lost_at(&self) -> Option<Instant> {
        *self
            .shared
            .lost_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Extend now (the watchdog does this on its own unless auto-extend is off).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the extension failed. On a conflict (a majority holds another
    /// value) the lease is reported lost at once; otherwise (no majority answered in time) it
    /// is not, and the watchdog keeps extending and reports a loss by the validity deadline.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped extension may have reached some nodes, which only lengthens
    /// the copies there; the validity this guard reports is unchanged by it.
    pub async fn extend(&self) -> Result<(), Error> {
        extend_once(&self.shared, false)
            .await
            .map_err(|reason| Error::LeaseLost {
                name: self.name().to_string(),
                reason,
            })
    }

    /// Release the lease (compare-and-delete on every node) and stop extending. Returns
    /// whether a majority still held it.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for reporting release failures.
    ///
    /// # Cancel safety
    /// If cancelled, the lease is no longer extended (nor held), and the release is sent again
    /// in the background.
    pub async fn release(mut self) -> Result<bool, Error> {
        let shared = self.shared.clone();
        shared.stop.cancel();
        shared.signal(LossReason::Released);
        let deleted = shared.lock.release_held(&shared.value).await;
        // Only now: a release dropped before its decision leaves the guard's drop to send it
        // again, in the background.
        self.released = true;
        Ok(deleted >= shared.lock.inner.client.majority().needed())
    }

    /// TEST ONLY: stop extending without signalling, as if this process were paused, so a test
    /// can show what fencing protects against. The loss signal still fires at `valid_until`.
    #[cfg(feature = "test-util")]
    pub fn suspend_extension_for_tests(&self) {
        self.shared
            .suspended_for_tests
            .store(true, Ordering::SeqCst);
    }
}

/// What a write under the lease (a job's completion record) needs of the guard.
impl LockGuard {
    /// The holder's value as the nodes store it.
    pub(crate) fn value(&self) -> Arc<str> {
        self.shared.value.clone()
    }

    /// The end of validity now, on both clocks: a write sent now counts only if a majority
    /// applies it before this passes (judged as an extension is).
    pub(crate) fn validity(&self) -> Stamp {
        self.shared.times().until
    }

    /// The lock this lease is of.
    pub(crate) fn lock(&self) -> &Lock {
        &self.shared.lock
    }

    /// Why the lease ended ([`LossReason::Expired`] if no loss was signalled yet).
    pub(crate) fn loss_reason(&self) -> LossReason {
        match &*self.shared.status.borrow() {
            LeaseStatus::Lost(r) => r.clone(),
            LeaseStatus::Held { .. } => LossReason::Expired,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let shared = self.shared.clone();
        shared.stop.cancel();
        shared.signal(LossReason::Released);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                shared.lock.release_held(&shared.value).await;
            });
        }
    }
}

impl LeaseShared {
    pub(super) fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reason of a signalled loss ([`LossReason::Released`] if none was signalled).
    pub(super) fn lost_reason(&self) -> LossReason {
        match &*self.status.borrow() {
            LeaseStatus::Lost(r) => r.clone(),
            LeaseStatus::Held { .. } => LossReason::Released,
        }
    }

    /// Publish the loss once; later reasons are ignored.
    pub(super) fn signal(&self, reason: LossReason) {
        let now = Instant::now();
        let changed = self.status.send_if_modified(|s| {
            if matches!(s, LeaseStatus::Lost(_)) {
                false
            } else {
                // Recorded and cancelled before the change is published, so whoever sees the
                // loss also sees when, and finds the token cancelled.
                *self.lost_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
                self.cancel.cancel();
                *s = LeaseStatus::Lost(reason.clone());
                true
            }
        });
        // Counted after the loss is published: the application's recorder (which may block
        // or panic) never runs before the holder is told.
        if changed {
            metrics::lease_loss(&reason);
        }
        if changed && reason != LossReason::Released {
            tracing::warn!(lock = %self.lock.name(), token = %self.token, %reason, "lease lost");
        }
    }
}

/// One extension of the lease (`batched`: in the client's next extension call).
pub(super) async fn extend_once(
    shared: &Arc<LeaseShared>,
    batched: bool,
) -> Result<(), LossReason> {
    if let LeaseStatus::Lost(reason) = &*shared.status.borrow() {
        return Err(reason.clone());
    }
    let times = shared.times();
    // The stamp is taken before the version: the extension is sent after both.
    let versioned_at = Stamp::now();
    let version = shared.version.fetch_add(1, Ordering::AcqRel) + 1;
    match shared
        .lock
        .send_extend(
            &shared.value,
            shared.token,
            version,
            versioned_at,
            times.until,
            batched,
        )
        .await
    {
        // An extension decided after the loss was signalled does not revive the lease.
        Ok(_) if matches!(*shared.status.borrow(), LeaseStatus::Lost(_)) => {
            metrics::lease_extension(Extension::Late);
            Err(shared.lost_reason())
        }
        Ok(until) => {
            metrics::lease_extension(Extension::Ok);
            let mut t = shared.times.lock().unwrap_or_else(|p| p.into_inner());
            if until.mono > t.until.mono {
                t.until = until;
            }
            t.extensions += 1;
            let v = t.valid_until();
            drop(t);
            shared.status.send_if_modified(|s| match s {
                LeaseStatus::Held { valid_until } => {
                    *valid_until = v;
                    true
                }
                LeaseStatus::Lost(_) => false,
            });
            Ok(())
        }
        Err((true, _)) => {
            metrics::lease_extension(Extension::Conflict);
            shared.signal(LossReason::Conflict);
            Err(LossReason::Conflict)
        }
        Err((false, why)) => {
            metrics::lease_extension(Extension::NoQuorum);
            Err(LossReason::NoQuorum(why))
        }
    }
}

/// Extends at about TTL/3 and signals loss no later than the validity deadline (the schedule
/// is [`decide::tick`]).
pub(super) async fn watchdog(shared: Arc<LeaseShared>) {
    let lock = shared.lock.inner.clone();
    let mut last_failure: Option<LossReason> = None;
    let mut next_extend = decide::next_extension(Instant::now(), lock.ttl, true);
    let margin = decide::signal_margin(lock.ttl);
    loop {
        let times = shared.times();
        let (check_at, signal_at) = match decide::tick(decide::Watchdog {
            now: Instant::now(),
            boot_now: clock::boot_now(),
            until: times.until,
            acquired_at: shared.acquired_at,
            margin,
            extensions: times.extensions,
            max_hold: lock.max_hold,
            max_extensions: lock.max_extensions,
        }) {
            decide::Tick::Expired => {
                return shared.signal(last_failure.take().unwrap_or(LossReason::Expired))
            }
            decide::Tick::BoundReached => return shared.signal(LossReason::HoldBoundReached),
            decide::Tick::Wait {
                check_at,
                signal_at,
            } => (check_at, signal_at),
        };
        let extending = lock.auto_extend && !shared.suspended_for_tests.load(Ordering::SeqCst);
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep_until(check_at) => {
                let valid_until = shared.times().valid_until();
                if decide::expired_at_check(valid_until, Instant::now(), margin) {
                    return shared.signal(last_failure.take().unwrap_or(LossReason::Expired));
                }
            }
            _ = tokio::time::sleep_until(next_extend), if extending => {
                if shared.suspended_for_tests.load(Ordering::SeqCst) {
                    continue;
                }
                let attempt = tokio::select! {
                    r = extend_once(&shared, true) => Some(r),
                    _ = tokio::time::sleep_until(signal_at) => None,
                    _ = shared.stop.cancelled() => return,
                };
                match attempt {
                    Some(Ok(())) => {
                        last_failure = None;
                        next_extend = decide::next_extension(Instant::now(), lock.ttl, true);
                    }
                    Some(Err(LossReason::Conflict)) => return,
                    Some(Err(other)) => {
                        last_failure = Some(other);
                        next_extend = decide::next_extension(Instant::now(), lock.ttl, false);
                    }
                    None => {
                        return shared.signal(last_failure.take().unwrap_or(LossReason::Expired));
                    }
                }
            }
        }
    }
}
