//! The campaign for the group's leader lease. A member does not poll the lease with
//! acquisition rounds of its own: its view reads carry the lease (`register::Extras`) and feed
//! the lock's watch ([`Lock::observe_readings`](crate::Lock)), and it tries (one acquisition
//! round) only when that watch says the lease could be won: free on a majority, or unchanged
//! there for its TTL plus drift (a crashed leader's). The round itself decides, exactly as any
//! acquisition: a takeover is the compare-and-swap of the state watched, on the incarnation it
//! was watched on. A resigning leader's release hint wakes every contender at once.

use std::sync::atomic::Ordering;

use tokio::sync::Notify;

use super::*;

/// Campaign for the group's leader lease until `stop`, holding leadership while it lasts.
pub(super) async fn campaign(shared: Arc<Shared>, stop: CancellationToken) {
    let released = Arc::new(Notify::new());
    let _released = shared.election.lock().release_watch(released.clone());
    loop {
        let won = tokio::select! {
            _ = stop.cancelled() => return,
            won = contend(&shared, &released) => won,
        };
        let lost = won.lost();
        *shared.leadership.lock().unwrap_or_else(|p| p.into_inner()) = Some(won);
        // Lead at once: the member's loop takes its first leader step now.
        shared.hinted.notify_one();
        tokio::select! { _ = stop.cancelled() => return, _ = lost => {} }
        shared
            .leadership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// Wait until the lease could be won (see `decide::campaign_wake`), or, for a deputy, its
/// holder released it, then try once; again until a try wins. A try that loses taught the
/// watch what the nodes hold; the next one waits at least a random delay (as a waiting
/// `Lock::acquire` does). Members that are not deputies stand back (a release hint does not
/// wake them, and they try only a slack after the lease became winnable), so that when the
/// lease is free or lapsed, the deputies' tries do not meet every member's at once.
async fn contend(shared: &Shared, released: &Notify) -> Leadership {
    let interval = shared.opts.interval;
    let lock = shared.election.lock();
    // Since when this member has seen the lease winnable, without a newer reading saying
    // otherwise.
    let mut winnable_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let deputy = shared.deputy.load(Ordering::Acquire);
        let ready = match lock.ready_at(now) {
            Some(t) => {
                winnable_since = None;
                t
            }
            None => *winnable_since.get_or_insert(now),
        };
        let seen = *shared
            .lease_seen_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let at = decide::campaign_wake(ready, deputy, seen, now, interval);
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            // A view read brought news of the lease: plan again.
            _ = shared.lease_seen.notified() => continue,
            _ = released.notified(), if deputy => {}
        }
        match shared.election.campaign_once().await {
            Ok(won) => return won,
            Err(e) => {
                tracing::trace!(group = %shared.group, member = %shared.key, error = %e, "leader lease not won");
            }
        }
        let base = (lock.ttl() / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let delay = base.mul_f64(0.5 + rand::random::<f64>());
        let deputy = shared.deputy.load(Ordering::Acquire);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = released.notified(), if deputy => {}
        }
    }
}
