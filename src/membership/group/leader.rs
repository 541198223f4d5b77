//! The group leader's step: judge the members from their beats, seal the next view,
//! activate a prepared one when the barrier allows.

use super::*;

/// A term's sequence numbers above this are not used (a view token holds 20 bits of seq).
pub(super) const SEQ_ROLLOVER: u64 = (1 << 20) - 16;

/// Whether this member still leads in `term` with a margin of its lease left (one node timeout,
/// at most an eighth of the interval): room for a seal to land while the lease holds. A seal
/// that lands later is still harmless (the compare-and-set on its base refuses it wherever a
/// newer leader sealed); the margin only avoids wasted seals.
pub(super) fn still_leading(shared: &Shared, term: u64) -> bool {
    let guard = shared.leadership.lock().unwrap_or_else(|p| p.into_inner());
    let margin = shared
        .client
        .config()
        .node_timeout
        .min(shared.opts.interval / 8);
    guard.as_ref().is_some_and(|l| {
        l.is_leader() && l.term().get() == term && l.guard().valid_until() > Instant::now() + margin
    })
}

pub(super) fn leader_term(shared: &Shared) -> Option<u64> {
    let guard = shared.leadership.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .filter(|l| l.is_leader())
        .map(|l| l.term().get())
}

/// Members that acknowledged the prepared `view` on any node of a majority.
pub(super) async fn acknowledged(shared: &Shared, view: &View) -> Result<BTreeSet<String>, Error> {
    let token = view.version.token().map(|t| t.get()).unwrap_or(u64::MAX);
    let digest = view.content_digest();
    let read = Step::read(vec![hgetall(&shared.ack_key)], |_, v| {
        decode::value::<std::collections::HashMap<String, String>>(v)
    });
    let tally = shared
        .client
        .decide(Request::vote("group.acks"), read)
        .await?;
    Ok(tally
        .replies()
        .flat_map(|(_, acks)| acked_members(acks, token, &digest))
        .collect())
}

pub(super) async fn ack(shared: &Shared, version: ViewVersion, digest: Arc<str>) -> bool {
    let Some(token) = version.token() else {
        return false;
    };
    let id = &shared.key;
    let companion = (
        format!("{id}{ACK_DIGEST}"),
        format!("{}:{digest}", token.get()),
    );
    let step = crate::jobs::record_step(
        &shared.ack_key,
        id,
        token.get(),
        Some((&companion.0, &companion.1)),
    );
    shared
        .client
        .send(Request::vote("group.ack"), step)
        .await
        .reached()
}

/// The leader's judgement of the group from one round of beat readings: the live members
/// (present on an answering node, or in the view and not yet gone) and the gone ones (beat
/// unchanged on a majority for the lease time + drift, on the leader's own clock). No node
/// clock plays any part. Two live processes with one member ID are reported.
pub(super) fn judge_members(
    shared: &Shared,
    view: &View,
    readings: &[BeatReading],
    lease: Duration,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut in_view: BTreeSet<String> = view.members.keys().cloned().collect();
    in_view.extend(view.draining.iter().cloned());
    let (live, gone) = if shared.client.config().server_clock_leases {
        judge_by_presence(readings, &in_view)
    } else {
        judge_by_watch(shared, readings, &in_view, lease)
    };
    report_duplicates(shared, &live);
    (live, gone)
}

/// TEST ONLY: the old unsafe rule, "gone when absent on a majority of the answers".
fn judge_by_presence(
    readings: &[BeatReading],
    in_view: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let present: BTreeSet<String> = readings
        .iter()
        .flat_map(|(_, _, b)| {
            b.iter()
                .filter(|(_, v)| &***v != LEFT)
                .map(|(k, _)| k.clone())
        })
        .collect();
    let gone = in_view.difference(&present).cloned().collect();
    (present, gone)
}

/// The rule: a member is gone when it left (wrote "left" itself, after it stopped owning), or
/// its beat stayed unchanged on a majority, on one node incarnation, for the lease time +
/// drift on this leader's clock (`lease::Beats`). The entries of gone members that no view
/// names any more are collected in the background (guarded: an entry that changed since,
/// because the member beat again, is kept).
fn judge_by_watch(
    shared: &Shared,
    readings: &[BeatReading],
    in_view: &BTreeSet<String>,
    lease: Duration,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let needed = shared.client.majority().needed();
    let nodes = shared.client.node_urls().len();
    let answered: Vec<usize> = readings.iter().map(|(n, _, _)| *n).collect();
    let window = lease::watch_window(lease);
    let mut beats = shared.beats.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    beats.observe(nodes, readings, in_view, now);
    // A read is due when a member that stopped beating (unchanged for three quarters of an
    // interval, where a live one beats every interval) could be judged gone.
    let silent = shared.opts.interval * 3 / 4;
    *shared.judge_at.lock().unwrap_or_else(|p| p.into_inner()) =
        beats.next_judgement(in_view, &answered, needed, (silent, window), now);
    let mut candidates = beats.present(&answered);
    candidates.extend(in_view.iter().cloned());
    // A member that left wrote "left" itself, after it stopped owning: gone at once.
    let left: BTreeSet<&String> = readings
        .iter()
        .flat_map(|(_, _, b)| b.iter().filter(|(_, v)| &***v == LEFT).map(|(k, _)| k))
        .collect();
    // A buried member stays gone only while no view names it (see `Beats::is_buried`).
    let gone: BTreeSet<String> = candidates
        .iter()
        .filter(|m| {
            left.contains(m)
                || beats.gone(m, &answered, needed, window)
                || (!in_view.contains(*m) && beats.is_buried(m))
        })
        .cloned()
        .collect();
    for m in gone.iter().filter(|m| !in_view.contains(*m)) {
        beats.bury(m);
    }
    beats.prune(&answered, needed, window, in_view);
    let garbage: BeatGarbage = gone
        .iter()
        .filter(|m| !in_view.contains(*m))
        .map(|m| (m.clone(), beats.last_values(m, &answered)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    drop(beats);
    if !garbage.is_empty() {
        let client = shared.client.clone();
        let key = shared.members_key.clone();
        tokio::spawn(collect_garbage(client, key, garbage));
    }
    (candidates.difference(&gone).cloned().collect(), gone)
}

/// Warn (and count) when two live processes use one member ID, once per change of the set.
fn report_duplicates(shared: &Shared, live: &BTreeSet<String>) {
    let dups = decide::duplicate_keys(live);
    let mut reported = shared
        .duplicates_reported
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if !dups.is_empty() && *reported != dups {
        shared
            .duplicates
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(group = %shared.group, processes = ?dups, "two live processes use one member ID: each is a separate member");
    }
    *reported = dups;
}

/// What the leader knows of the group in one step, read after the view it judges.
struct Judged {
    live: BTreeSet<String>,
    gone: BTreeSet<String>,
    /// Acknowledgements of a prepared view (empty for an active one).
    acks: BTreeSet<String>,
}

/// The leader's step: seal a new view when membership changed; activate a prepared view once
/// the barrier allows. `readings`: the beats read with the view, when that view was on a
/// majority before the read began (so every reading is later than its seal); else the step
/// reads them. Returns the view now current (Err carries the unchanged view).
pub(super) async fn leader_step(
    shared: &Shared,
    view: View,
    term: u64,
    lease: Duration,
    readings: Option<Vec<BeatReading>>,
) -> Result<View, View> {
    if term < view.version.term {
        return Err(view); // a newer leader sealed this view: we are deposed
    }
    let Some(Judged { live, gone, acks }) = judge(shared, &view, lease, readings).await else {
        return Err(view);
    };
    // A pool's planner proposes the unit lists for the live members.
    let planned = match &shared.tables {
        None => None,
        Some(tables) => match tables.plan(&view, &live).await {
            Ok(p) => p,
            Err(e) => {
                // The view's lists stand; activation and membership changes still go on.
                tracing::warn!(pool = %shared.group, error = %e, "leader: cannot plan the table");
                None
            }
        },
    };
    let barrier = shared.opts.barrier;
    let lists = planned.as_ref().map(|p| &p.lists);
    let Some(next) = decide::leader_decision(&view, &live, &gone, &acks, term, barrier, lists)
    else {
        return Err(view);
    };
    // Terms roll over before a term's sequence numbers run out: step down, so the next
    // campaign seals under a new term.
    if next.version.seq >= SEQ_ROLLOVER {
        tracing::warn!(group = %shared.group, version = ?next.version, "view sequence of this term nearly exhausted: stepping down for a new term");
        step_down(shared).await;
        return Err(view);
    }
    // The lists a new view names are on a majority before the view is sealed.
    if let (Some(tables), Some(planned)) = (&shared.tables, &planned) {
        if next.lists == planned.lists && next.lists != view.lists {
            if let Err(e) = tables.write(planned).await {
                tracing::debug!(pool = %shared.group, error = %e, "leader: cannot write the table");
                return Err(view);
            }
        }
    }
    // Still the leader, with room for the write to land within the lease.
    if !still_leading(shared, term) {
        return Err(view);
    }
    seal(shared, next).await.ok_or(view)
}

/// The members judged from beats read AFTER `view` was on a majority (when a prepared view is
/// judged, every reading is later than its seal: the barrier's argument needs it): `readings`
/// taken with a view read that began after it was, or a read of the beats now; and, for a
/// prepared view, its acknowledgements. None when either read fails.
async fn judge(
    shared: &Shared,
    view: &View,
    lease: Duration,
    readings: Option<Vec<BeatReading>>,
) -> Option<Judged> {
    let readings = match readings {
        Some(r) => r,
        None => match read_beats(shared).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(group = %shared.group, error = %e, "leader: cannot read members");
                return None;
            }
        },
    };
    let (live, gone) = judge_members(shared, view, &readings, lease);
    tracing::trace!(group = %shared.group, version = ?view.version, state = ?view.state, draining = ?view.draining, live = ?live, "leader step");
    // Acknowledgements matter only for a prepared view.
    let acks = match view.state {
        ViewState::Prepare => match acknowledged(shared, view).await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(group = %shared.group, error = %e, "leader: cannot read acknowledgements");
                return None;
            }
        },
        ViewState::Active => BTreeSet::new(),
    };
    Some(Judged { live, gone, acks })
}

/// Seal `next` (the register's compare-and-set on its base), tell the members, and after an
/// activation drop the acknowledgements below it and let the pool collect. None when the seal
/// failed.
async fn seal(shared: &Shared, next: View) -> Option<View> {
    let next = match shared.register.seal(next).await {
        Err(e) => {
            tracing::debug!(group = %shared.group, error = %e, "leader: cannot write the view");
            return None;
        }
        Ok(next) => next,
    };
    run::committed(shared, next.version);
    tracing::info!(group = %shared.group, version = ?next.version, state = ?next.state, replicas = next.replicas(), "view sealed");
    crate::metrics::view_change(match next.state {
        ViewState::Prepare => crate::metrics::ViewChange::SealedPrepare,
        ViewState::Active => crate::metrics::ViewChange::SealedActive,
    });
    hints::publish(shared).await;
    // Acknowledgements below an active view's token can never matter again (only a later
    // prepared view's, with a higher token, are read): drop them, so the hash does not grow
    // with every process that ever joined.
    if let (ViewState::Active, Some(token)) = (next.state, next.version.token()) {
        let (client, key) = (shared.client.clone(), shared.ack_key.clone());
        tokio::spawn(crate::jobs::prune(client, key, token.get(), 0));
        if let Some(tables) = &shared.tables {
            tables.clone().activated(&next);
        }
    }
    Some(next)
}

/// Resign the group's leadership, if this member holds it.
pub(super) async fn step_down(shared: &Shared) {
    let leadership = shared
        .leadership
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(l) = leadership {
        let _ = l.resign().await;
    }
}
