//! The member's loop: read the view (at once after a beat, on the leader's hint, and at the
//! tick its role sets), drain and acknowledge a prepared view, publish the assignment.

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
    /// This member's role as of its last round.
    role: Option<decide::Role>,
}

/// How a round ended: whether all is settled, and an instant before the tick at which the
/// loop must run again (the end of the published assignment's validity, or, for a leader,
/// when a silent member can be judged gone).
struct Ended {
    settled: bool,
    due: Option<Instant>,
}

/// The member's loop, until `stop`; then it leaves.
pub(super) async fn member_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.opts.interval;
    // A membership lease outlives one missed beat by a quarter interval, so a crashed member's
    // lease is gone, and the view without it active, within two intervals.
    let lease = interval + interval / 4;
    let mut progress = Progress::default();
    let _beater = AbortOnDrop(tokio::spawn(beat_loop(shared.clone(), lease)));
    let _campaigner = AbortOnDrop(tokio::spawn(campaign::campaign(
        shared.clone(),
        stop.clone(),
    )));
    let _hints = hints::watch(&shared);
    let mut after_beat = false;
    loop {
        if let Some(until) = frozen_until(&shared) {
            tokio::time::sleep_until(until).await;
        }
        let ended = round(&shared, &mut progress, lease).await;
        let role = progress.role.unwrap_or(decide::Role::Member);
        // TEST ONLY: the classic design's leader (presence on a majority of answers, no watch
        // to say when a judgement is due) polls at the fast tick, as it always did.
        let classic = shared.client.config().server_clock_leases && role == decide::Role::Leader;
        let busy = !ended.settled || !hints::heard(&shared) || classic;
        let now = Instant::now();
        let tick = now + decide::member_tick(interval, role, busy, after_beat);
        // A due instant never makes the loop spin (a leader whose seal failed reads again at
        // its tick, not at once).
        let due = ended.due.map(|d| d.max(now + interval / 32));
        // Next round at the tick (see `decide::member_tick`), or sooner when due; at once after
        // a beat (an assignment's validity comes only from a beat sent before a view read, so a
        // fresh beat needs a fresh read to count), or on the leader's hint of a new view.
        after_beat = tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(due.map_or(tick, |d| d.min(tick))) => false,
            _ = shared.beaten.notified() => true,
            _ = shared.hinted.notified() => false,
        };
    }
    drop(_campaigner);
    drop(_beater);
    leave(&shared).await;
}

/// One round: read the view (leading if this member leads), publish the assignment it gives,
/// drain and acknowledge a prepared view.
async fn round(shared: &Shared, progress: &mut Progress, lease: Duration) -> Ended {
    // The validity an assignment may carry comes from a beat sent BEFORE the view read below
    // (the barrier's argument depends on it): snapshot it first.
    let beat_until = *shared.beat_until.lock().unwrap_or_else(|p| p.into_inner());
    let role = progress.role.unwrap_or(decide::Role::Member);
    let read = match read_view(shared, role).await {
        Ok(read) => read,
        Err(e) => {
            tracing::debug!(group = %shared.group, member = %shared.key, error = %e, "cannot read the view");
            if beat_until.is_none_or(|u| u.passed()) {
                publish(shared, None);
            }
            return Ended {
                settled: false,
                due: None,
            };
        }
    };
    let (view, sealed, due) = match leader_term(shared) {
        Some(term) => {
            let readings = read.beats;
            let stepped = leader_step(shared, read.view, term, lease, readings).await;
            // Taken, not read: a round that returned before judging (deposed, acknowledgements
            // unread) leaves no stale instant that would make every later round read at once.
            let due = shared
                .judge_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            match stepped {
                Ok(v) => (v, true, due),
                Err(v) => (v, false, due),
            }
        }
        None => (read.view, false, None),
    };
    let leading = leader_term(shared).is_some();
    progress.role = Some(decide::role(leading, view.index_of(&shared.key)));
    let deputy = progress.role == Some(decide::Role::Deputy);
    if shared
        .deputy
        .swap(deputy, std::sync::atomic::Ordering::AcqRel)
        != deputy
    {
        shared.lease_seen.notify_one(); // the campaign plans again in its new role
    }
    let (settled, valid_until) = publish_round(shared, progress, &view, beat_until).await;
    Ended {
        settled: settled && !sealed,
        due: [due, valid_until].into_iter().flatten().min(),
    }
}

/// The rest of a round under the adopted `view`: publish the assignment it gives (with the
/// validity snapshotted before the read), drain and acknowledge a prepared view. Returns
/// whether all is settled (the view is active and this member drains nothing) and the end of
/// the published assignment's validity.
async fn publish_round(
    shared: &Shared,
    progress: &mut Progress,
    view: &View,
    beat_until: Option<Stamp>,
) -> (bool, Option<Instant>) {
    shared.view_changes.send_if_modified(|v| {
        let changed = v.as_ref() != Some(view);
        if changed {
            *v = Some(view.clone());
            crate::metrics::view_change(crate::metrics::ViewChange::Adopted);
        }
        changed
    });
    let beat_valid = beat_until.is_some_and(|u| !u.passed());
    let ownership = shared.opts.ownership;
    // A pool member loads the units the view gives it; if it cannot, it owns nothing.
    let held = match &shared.tables {
        None => None,
        Some(tables) => match tables.load(view, &shared.key).await {
            Ok(held) => Some(held),
            Err(e) => {
                tracing::debug!(pool = %shared.group, member = %shared.key, error = %e, "cannot load this member's units");
                publish(shared, None);
                drain_and_ack(shared, progress, view, &None).await;
                return (false, None);
            }
        },
    };
    let assignment = decide::assignment(
        view,
        &shared.key,
        beat_until,
        beat_valid,
        ownership,
        held.as_ref(),
    );
    drain_and_ack(shared, progress, view, &assignment).await;
    if assignment
        .as_ref()
        .is_some_and(|a| a.state == ViewState::Active)
    {
        progress.last_active = assignment.clone();
    }
    let valid_until = assignment.as_ref().map(|a| a.valid_until());
    publish(shared, assignment);
    (
        view.state == ViewState::Active && progress.draining.is_none(),
        valid_until,
    )
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
    if beat(shared, 0, true).await {
        // The leader reads every half interval; the hint has it judge the leave at once.
        hints::publish(shared).await;
    }
    leader::step_down(shared).await;
}

/// A view read and what rode along.
pub(super) struct Read {
    pub(super) view: View,
    /// The beats read with it, when they may be judged from: the read carried them, and
    /// `view` was known to be on a majority before the read began, so that every reading is
    /// later than the view's seal.
    pub(super) beats: Option<Vec<BeatReading>>,
}

/// Read the view from a majority, take the highest version and write it back to a majority
/// (unless a majority answered with it already) before returning it, so every later reader
/// sees at least this view. What rides along depends on the `role` (`register::Extras`): the
/// beats, for a leader's judgement and a deputy's warm watch of them; the leader lease, which
/// every member but the leader watches for its campaign.
pub(super) async fn read_view(shared: &Shared, role: decide::Role) -> Result<Read, Error> {
    let watch_beats = !shared.client.config().server_clock_leases;
    let role = match leader_term(shared) {
        Some(_) => decide::Role::Leader,
        None => role,
    };
    let extras = register::Extras {
        beats: role != decide::Role::Member,
        lease: (role != decide::Role::Leader).then(|| shared.election.lock().lease_read()),
        linger: (role == decide::Role::Leader).then_some(shared.opts.interval / 8),
    };
    let known = *shared.committed.lock().unwrap_or_else(|p| p.into_inner());
    let (view, reading) = shared
        .register
        .read_adopted(&extras, |reading| {
            if !reading.lease.is_empty() {
                shared
                    .election
                    .lock()
                    .observe_readings(&reading.lease, reading.at);
                *shared
                    .lease_seen_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(reading.at);
                shared.lease_seen.notify_one();
            }
            if !watch_beats || reading.beats.is_empty() {
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
        .await?;
    committed(shared, view.version);
    let judgeable = extras.beats && known == Some(view.version);
    Ok(Read {
        beats: judgeable.then_some(reading.beats),
        view,
    })
}

/// Note that a majority holds `version` (sealed, written back, or read from a majority).
pub(super) fn committed(shared: &Shared, version: ViewVersion) {
    let mut c = shared.committed.lock().unwrap_or_else(|p| p.into_inner());
    if c.is_none_or(|c| c < version) {
        *c = Some(version);
    }
}
