//! The member's loop: read the view (every tick, and at once after a beat), drain and
//! acknowledge a prepared view, publish the assignment.

use super::*;

/// What the loop carries from one round to the next.
#[derive(Default)]
struct Progress {
    /// The last prepared view this member acknowledged.
    acked: Option<ViewVersion>,
    /// The last assignment under an active view (what a drain hook gives up from).
    last_active: Option<Assignment>,
    /// A prepared view being drained: its version and the running drain hook, if any.
    draining: Option<(ViewVersion, Option<tokio::task::JoinHandle<()>>)>,
    /// When the drain of `draining` started.
    drain_started: Option<Instant>,
}

/// The member's loop, until `stop`; then it leaves.
pub(super) async fn member_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.opts.interval;
    // A membership lease outlives one missed beat by a quarter interval, so a crashed member's
    // lease is gone, and the view without it active, within two intervals.
    let lease = interval + interval / 4;
    let mut progress = Progress::default();
    let _beater = AbortOnDrop(tokio::spawn(beat_loop(shared.clone(), lease)));
    let _campaigner = AbortOnDrop(tokio::spawn(campaign(shared.clone(), stop.clone())));
    let _hints = hints::watch(&shared);
    loop {
        if let Some(until) = frozen_until(&shared) {
            tokio::time::sleep_until(until).await;
        }
        let settled = round(&shared, &mut progress, lease).await;
        let busy = !settled || leader_term(&shared).is_some() || !hints::heard(&shared);
        // Next round at the tick (see `decide::member_tick`), at once after a beat (an
        // assignment's validity comes only from a beat sent before a view read, so a fresh beat
        // needs a fresh read to count), or at once on the leader's hint of a new view.
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(decide::member_tick(interval, busy)) => {}
            _ = shared.beaten.notified() => {}
            _ = shared.hinted.notified() => {}
        }
    }
    drop(_campaigner);
    drop(_beater);
    leave(&shared).await;
}

/// Campaign for the group's leader lease until `stop`, holding leadership while it lasts.
async fn campaign(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            won = shared.election.campaign() => if let Ok(l) = won {
                let lost = l.lost();
                *shared.leadership.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
                tokio::select! { _ = stop.cancelled() => return, _ = lost => {} }
                shared.leadership.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
        }
    }
}

/// One round: read the view (leading if this member leads), publish the assignment it gives,
/// drain and acknowledge a prepared view. Returns whether all is settled: the view read is
/// active and this member drains nothing.
async fn round(shared: &Shared, progress: &mut Progress, lease: Duration) -> bool {
    // The validity an assignment may carry comes from a beat sent BEFORE the view read below
    // (the barrier's argument depends on it): snapshot it first.
    let beat_until = *shared.beat_until.lock().unwrap_or_else(|p| p.into_inner());
    let view = match read_view(shared).await {
        Ok(view) => view,
        Err(e) => {
            tracing::debug!(group = %shared.group, member = %shared.key, error = %e, "cannot read the view");
            if beat_until.is_none_or(|u| u.passed()) {
                publish(shared, None);
            }
            return false;
        }
    };
    let view = match leader_term(shared) {
        Some(term) => leader_step(shared, view, term, lease)
            .await
            .unwrap_or_else(|v| v),
        None => view,
    };
    shared.view_changes.send_if_modified(|v| {
        let changed = v.as_ref() != Some(&view);
        if changed {
            *v = Some(view.clone());
        }
        if changed {
            crate::metrics::view_change(crate::metrics::ViewChange::Adopted);
        }
        changed
    });
    let beat_valid = beat_until.is_some_and(|u| !u.passed());
    let ownership = shared.opts.ownership;
    // A pool member loads the units the view gives it; if it cannot, it owns nothing.
    let held = match &shared.tables {
        None => None,
        Some(tables) => match tables.load(&view, &shared.key).await {
            Ok(held) => Some(held),
            Err(e) => {
                tracing::debug!(pool = %shared.group, member = %shared.key, error = %e, "cannot load this member's units");
                publish(shared, None);
                drain_and_ack(shared, progress, &view, &None).await;
                return false;
            }
        },
    };
    let assignment = decide::assignment(
        &view,
        &shared.key,
        beat_until,
        beat_valid,
        ownership,
        held.as_ref(),
    );
    drain_and_ack(shared, progress, &view, &assignment).await;
    if assignment
        .as_ref()
        .is_some_and(|a| a.state == ViewState::Active)
    {
        progress.last_active = assignment.clone();
    }
    publish(shared, assignment);
    view.state == ViewState::Active && progress.draining.is_none()
}

/// Drain and acknowledge a prepared view that takes over from one we worked under: first
/// narrow what we own to the tasks we keep, then let the user drain the rest. The hook runs in
/// a task of its own, so the loop keeps publishing (and the narrowed assignment keeps its
/// validity) however long the hook takes.
async fn drain_and_ack(
    shared: &Shared,
    progress: &mut Progress,
    view: &View,
    assignment: &Option<Assignment>,
) {
    let draining = progress.draining.as_ref().map(|(v, _)| *v);
    if decide::starts_drain(view, &shared.key, progress.acked, draining) {
        publish(shared, assignment.clone());
        let hook = match (shared.opts.drain.clone(), progress.last_active.take()) {
            (Some(hook), Some(from)) => {
                let drain = Drain {
                    from,
                    keeps: assignment.clone(),
                };
                let timeout = shared.opts.drain_timeout;
                Some(tokio::spawn(async move {
                    let _ = tokio::time::timeout(timeout, hook(drain)).await;
                }))
            }
            _ => None,
        };
        progress.draining = Some((view.version, hook));
        progress.drain_started = Some(Instant::now());
    }
    if let Some((version, hook)) = &progress.draining {
        let done = hook.as_ref().is_none_or(|h| h.is_finished());
        if *version != view.version {
            progress.draining = None; // a newer view replaced it before we acknowledged
        } else if done && ack(shared, *version, view.content_digest().into()).await {
            progress.acked = Some(*version);
            progress.draining = None;
            if let Some(started) = progress.drain_started.take() {
                crate::metrics::view_drain(started.elapsed());
            }
        }
    }
}

/// Leave: own nothing, drop the lease everywhere, step down.
async fn leave(shared: &Shared) {
    publish(shared, None);
    let _ = beat(shared, 0, true).await;
    leader::step_down(shared).await;
}

/// Read the view from a majority, take the highest version and write it back to a majority
/// before returning it (so every later reader sees at least this view). The beats read with it
/// feed this member's watch (a warm watch for when it leads).
pub(super) async fn read_view(shared: &Shared) -> Result<View, Error> {
    let watch_beats = !shared.client.config().server_clock_leases;
    shared
        .register
        .read_adopted(|reading| {
            if !watch_beats {
                return;
            }
            let mut in_view = BTreeSet::new();
            let answers: Vec<_> = reading.views.iter().collect();
            if let Ok(Some(v)) = register::pick(&answers) {
                in_view.extend(v.members.keys().cloned());
                in_view.extend(v.draining.iter().cloned());
            }
            shared
                .beats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(
                    shared.client.node_urls().len(),
                    &reading.beats,
                    &in_view,
                    reading.at,
                );
        })
        .await
}
