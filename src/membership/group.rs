//! Group membership with one agreed view, sealed by the group's leader, and the two-phase
//! transition the library enforces. No decision reads a node's clock.
//!
//! Each process that joins gets a member key `<id>#<random nonce>` (two processes with one ID
//! are two members; the leader reports them). It beats every interval, on a timer of its own,
//! with the seed's random constant skew: a beat writes a sequence number that grows with every
//! beat into a hash on every node (`member_beat.lua`), with no expiry. Its own validity is the
//! send time of its last beat a majority applied, plus the lease (1.25 intervals), minus drift,
//! on its monotonic clock (and the boot clock).
//!
//! Members campaign for the group's leader lease (a [`crate::Lock`]). The leader judges a
//! member **gone** only when, on a majority of the nodes it just read, it has seen the member's
//! beat (or its absence) unchanged, on one node incarnation, for the lease plus drift on its
//! own monotonic clock (`lease::Beats`; every member keeps this watch warm from its view
//! reads, so a new leader judges without waiting a whole lease first). The leader seals views
//! (`prepare`), waits until every member of the last active view has drained and acknowledged
//! or is gone, then activates them. Views live in a quorum register (a compare-and-set on
//! each view's base on every node, committed on a majority, see `register.rs`); readers
//! take the highest version from a majority and write it back to a majority before adopting
//! it, so no two instances adopt views in opposite orders and views cannot fork.
//!
//! # Why the barrier holds without node clocks
//! A member M owns tasks of the active view V1 only through an assignment published after a
//! view read that returned V1, carrying the validity of a beat whose reply arrived before that
//! read started (the loop snapshots the validity first). Suppose the leader activates the
//! prepared V2 because M is gone: on a majority R of nodes read after V2 was sealed, M's beat
//! stayed unchanged from a first reading r_n to a last f_n, at least lease + drift apart. Take
//! any beat b of M that a majority applied; it shares a node n with R. If b reached n before
//! r_n, it was sent before r_n, so M's validity from it ends (on real time) before f_n and
//! before the activation. It cannot have reached n between r_n and f_n (the value would have
//! changed; sequence numbers never repeat, and a wipe changes the run_id, which restarts the
//! watch). If it reached n after f_n, which is after V2 was sealed, M's next view read starts
//! after b's reply and returns V2 or newer, so b never backs a V1 assignment. Either way M
//! owns no V1 task once V2 is active. A member that acknowledged V2 had already narrowed to the
//! tasks both views give it.
//!
//! A member owns tasks under an **active** view that contains it (and, while a new view is
//! prepared, only the tasks both views give it), and only while its own membership lease is
//! valid; its assignment carries the view version as a fencing token, so a stale owner's
//! writes are rejected by the resource guards.
//!
//! Assumptions, beyond the crate's: clients' monotonic clocks run within
//! [`MAX_DRIFT_RATE`](crate::MAX_DRIFT_RATE) of real time; nodes' wall clocks may step at any
//! time. Not guaranteed: progress without a majority; a graceful leave or a crash is seen only
//! after the lease time (about 1.3 intervals) has passed unchanged.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::{self, Ownership, View, ViewState, ViewVersion};
use crate::client::{decode, script_call, Client, Guard, NodeCtx, Request, Step, Steps};
use crate::clock::Stamp;
use crate::election::{Election, Leadership};
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::keys::{KeyKind, Name};
use crate::lease::{self, BeatGarbage, BeatReading, Beats};
use crate::lock::Lock;
use crate::scripts::MEMBER_BEAT;

use super::register::{self, ViewRegister};

/// A user hook run when this member must drain: it must stop the work on the tasks it gives
/// up before it returns (bounded by the drain timeout). See [`Drain`].
pub type DrainHook = Arc<dyn Fn(Drain) -> BoxFuture<'static, ()> + Send + Sync>;

/// What a draining member gives up: tasks that [`from`](Drain::from) owns and
/// [`keeps`](Drain::keeps) does not ([`Drain::gives_up`]).
#[derive(Clone, Debug)]
pub struct Drain {
    /// The assignment this member worked under (the last active view).
    pub from: Assignment,
    /// The narrowed assignment it keeps while the new view is prepared (`None` if it keeps
    /// nothing, e.g. it is not in the new view).
    pub keeps: Option<Assignment>,
}

impl Drain {
    /// Whether task `task_id` moves away from this member (so its work must stop now).
    pub fn gives_up(&self, task_id: u64) -> bool {
        self.from.covers(task_id) && !self.keeps.as_ref().is_some_and(|k| k.covers(task_id))
    }
}

/// Options of a group member.
#[derive(Clone)]
pub struct GroupOptions {
    interval: Duration,
    ownership: Ownership,
    drain_timeout: Duration,
    drain: Option<DrainHook>,
    barrier: bool,
    record_history: bool,
    skew: Option<Duration>,
    forkable_views: bool,
}

impl std::fmt::Debug for GroupOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOptions")
            .field("interval", &self.interval)
            .field("ownership", &self.ownership)
            .field("drain_timeout", &self.drain_timeout)
            .finish()
    }
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            interval: Duration::from_secs(2),
            ownership: Ownership::Modulo,
            drain_timeout: Duration::from_secs(1),
            drain: None,
            barrier: true,
            record_history: false,
            skew: None,
            forkable_views: false,
        }
    }
}

impl GroupOptions {
    /// The heartbeat interval (default 2 s, between 100 ms and 1 h). Membership leases last
    /// 1.25 intervals; a change becomes active within 2 intervals.
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// The ownership mode (default [`Ownership::Modulo`], the seed's rule).
    pub fn with_ownership(mut self, mode: Ownership) -> Self {
        self.ownership = mode;
        self
    }

    /// The drain hook and its timeout (default: none, 1 s).
    pub fn with_drain(mut self, timeout: Duration, hook: DrainHook) -> Self {
        self.drain = Some(hook);
        self.drain_timeout = timeout;
        self
    }

    /// TEST ONLY: the forkable view register (set-if-greater; an equal version counts as held
    /// whatever its content; a version is reused after a seal that reached only some nodes),
    /// so a test can show the fork the compare-and-set prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn with_forkable_views_for_tests(mut self) -> Self {
        self.forkable_views = true;
        self
    }

    /// TEST ONLY: use this phase offset instead of the random constant skew (to run members
    /// up to a quarter interval out of phase, as client clock skew would put them).
    #[cfg(feature = "test-util")]
    pub fn with_skew_for_tests(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// TEST ONLY: record every published assignment with its time (see
    /// [`Member::history_for_tests`]).
    #[cfg(feature = "test-util")]
    pub fn record_history_for_tests(mut self) -> Self {
        self.record_history = true;
        self
    }

    /// TEST ONLY: activate new views at once, skipping the drain barrier, so a test can show
    /// the double owners the barrier prevents. Never use it in production.
    #[cfg(feature = "test-util")]
    pub fn without_barrier_for_tests(mut self) -> Self {
        self.barrier = false;
        self
    }
}

/// What a member may do: its place in the active view.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// This member's dense index, `0..replicas`.
    pub index: u32,
    /// Members in the view.
    pub replicas: u32,
    /// The view's version.
    pub version: ViewVersion,
    /// The version as a fencing token: pass it with every write of a task's effects.
    pub token: FencingToken,
    /// [`ViewState::Active`]: owns what the view gives it. [`ViewState::Prepare`]: a
    /// transition is draining; owns only the tasks the last active view and the new one both
    /// give it.
    pub state: ViewState,
    /// Ownership ends here unless the membership lease is refreshed (monotonic clock).
    pub valid_until: Instant,
    /// The same end on the boot clock (counts host suspend).
    until: Stamp,
    view: Arc<View>,
    /// For a prepared view: the last active view (a task must be ours under both).
    previous: Option<Arc<View>>,
    member: Arc<str>,
    ownership: Ownership,
}

impl Assignment {
    /// Whether this assignment gives task `task_id` to this member (ignoring time): under an
    /// active view, when the view says so; under a prepared one, only when both it and the last
    /// active view say so (tasks whose owner changes are held by nobody until activation).
    pub fn covers(&self, task_id: u64) -> bool {
        let key = task_id.to_le_bytes();
        let mine = |v: &View| v.owner(&key, task_id, self.ownership) == Some(&*self.member);
        match self.state {
            ViewState::Active => mine(&self.view),
            ViewState::Prepare => mine(&self.view) && self.previous.as_deref().is_some_and(mine),
        }
    }

    /// Whether this member owns task `task_id` now (false once `valid_until` has passed, on
    /// the monotonic or the boot clock).
    pub fn owns(&self, task_id: u64) -> bool {
        !self.until.passed() && self.covers(task_id)
    }
}

/// A member of a group. Dropping it stops heartbeats (its lease then expires); prefer
/// [`leave`](Member::leave).
pub struct Member {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("group", &self.shared.group)
            .field("id", &self.shared.id)
            .finish()
    }
}

struct Shared {
    client: Client,
    group: Name,
    id: Arc<str>,
    /// `<id>#<nonce>`: this process's key in beats, acknowledgements and views. A new process
    /// with the same ID has another nonce, so it is another member.
    key: Arc<str>,
    /// End of this member's lease validity (send of the last beat a majority applied + lease
    /// - drift), written by the beat task.
    beat_until: Mutex<Option<Stamp>>,
    /// Woken by every successful beat, so the loop reads the view and republishes at once.
    beaten: tokio::sync::Notify,
    /// The leader's watch over the group's beats.
    beats: Mutex<Beats>,
    /// How often the leader saw two live processes with one member ID.
    duplicates: std::sync::atomic::AtomicUsize,
    /// The duplicate member keys last reported (reported again only when they change).
    duplicates_reported: Mutex<Vec<String>>,
    opts: GroupOptions,
    members_key: Arc<str>,
    register: ViewRegister,
    ack_key: Arc<str>,
    tx: watch::Sender<Option<Assignment>>,
    election: Election,
    leadership: Mutex<Option<Leadership>>,
    view_changes: watch::Sender<Option<View>>,
    history: Mutex<Vec<(Instant, Option<Assignment>)>>,
    frozen_until: Mutex<Option<Instant>>,
}

impl Member {
    /// Join `group` as `id` and start heartbeating. Returns at once; watch
    /// [`changes`](Self::changes) for the first assignment.
    ///
    /// # Errors
    /// [`Error::Name`] for an invalid group or ID; [`Error::InvalidArgument`] for an interval
    /// outside 100 ms ..= 1 h.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is sent before it returns (the member's tasks start then).
    pub async fn join(
        client: &Client,
        group: &str,
        id: &str,
        opts: GroupOptions,
    ) -> Result<Member, Error> {
        let group = Name::new("group", group)?;
        let member = Name::new("member", id)?;
        if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&opts.interval) {
            return Err(Error::InvalidArgument(format!(
                "group interval {:?} is outside 100ms..=1h",
                opts.interval
            )));
        }
        let lock = Lock::with_kinds(
            client,
            group.as_str(),
            opts.interval,
            KeyKind::GroupLock,
            KeyKind::GroupFence,
        )?;
        let election = Election::on_lock(lock, member.as_str())?;
        let (tx, _) = watch::channel(None);
        let (view_changes, _) = watch::channel(None);
        let nonce = {
            let mut bytes = [0u8; 8];
            if getrandom::fill(&mut bytes).is_err() {
                bytes = rand::random();
            }
            u64::from_le_bytes(bytes)
        };
        let shared = Arc::new(Shared {
            // TEST ONLY (the unsafe classic design): one key per ID, shared by every process
            // that joins with it.
            key: if client.config().server_clock_leases {
                member.as_str().into()
            } else {
                format!("{}#{nonce:016x}", member.as_str()).into()
            },
            beat_until: Mutex::new(None),
            beaten: tokio::sync::Notify::new(),
            beats: Mutex::new(Beats::default()),
            duplicates: std::sync::atomic::AtomicUsize::new(0),
            duplicates_reported: Mutex::new(Vec::new()),
            client: client.clone(),
            members_key: group.key(KeyKind::Members).into(),
            register: ViewRegister::new(
                client,
                group.key(KeyKind::View).into(),
                group.key(KeyKind::Members).into(),
                opts.forkable_views,
            ),
            ack_key: group.key(KeyKind::Ack).into(),
            id: member.as_str().into(),
            group,
            opts,
            tx,
            election,
            leadership: Mutex::new(None),
            view_changes,
            history: Mutex::new(Vec::new()),
            frozen_until: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(shared.clone(), stop.clone()));
        Ok(Member {
            shared,
            stop,
            task: Some(task),
        })
    }

    /// The current assignment, if this member owns anything now.
    pub fn assignment(&self) -> Option<Assignment> {
        self.shared
            .tx
            .borrow()
            .clone()
            .filter(|a| Instant::now() < a.valid_until)
    }

    /// Whether this member owns `task_id` now.
    pub fn owns(&self, task_id: u64) -> bool {
        self.assignment().is_some_and(|a| a.owns(task_id))
    }

    /// Every assignment change (`None`: owns nothing, e.g. while a transition drains).
    pub fn changes(&self) -> watch::Receiver<Option<Assignment>> {
        self.shared.tx.subscribe()
    }

    /// Every view this member adopted (prepare and active), for observers such as `index watch`.
    pub fn views(&self) -> watch::Receiver<Option<View>> {
        self.shared.view_changes.subscribe()
    }

    /// TEST ONLY: every published assignment with the instant it was published (needs
    /// [`GroupOptions::record_history_for_tests`]). Ownership under entry `i` lasts from its
    /// instant until the next entry's instant or its `valid_until`, whichever comes first.
    #[cfg(feature = "test-util")]
    pub fn history_for_tests(&self) -> Vec<(Instant, Option<Assignment>)> {
        self.shared
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// This member's ID.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// This process's member key, `<id>#<nonce>`: how views, beats and acknowledgements name
    /// it ([`View::index_of`] takes it). Two processes that join with one ID get two keys.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// TEST ONLY: how many times this member, while leading, saw two live processes with one
    /// member ID.
    #[cfg(feature = "test-util")]
    pub fn duplicates_seen_for_tests(&self) -> usize {
        self.shared
            .duplicates
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Leave gracefully: stop owning, drop the membership lease on every node, step down as
    /// leader.
    ///
    /// # Cancel safety
    /// Ownership ends before anything is sent; a dropped call leaves the membership lease on
    /// the nodes, and the leader judges the member gone after the lease time.
    pub async fn leave(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// TEST ONLY: freeze this member for `d` (no beats, no reads, nothing published), as if
    /// its process were stopped; it resumes on its own.
    #[cfg(feature = "test-util")]
    pub fn freeze_for_tests(&self, d: Duration) {
        *self
            .shared
            .frozen_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + d);
    }

    /// TEST ONLY: [`leave`](Self::leave), then return the complete history.
    ///
    /// # Cancel safety
    /// As [`leave`](Self::leave).
    #[cfg(feature = "test-util")]
    pub async fn leave_with_history_for_tests(self) -> Vec<(Instant, Option<Assignment>)> {
        let shared = self.shared.clone();
        self.leave().await;
        let h = shared
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        h
    }

    /// TEST ONLY: stop heartbeating and reading, as if the process froze or crashed, without
    /// leaving. The member's lease then expires.
    #[cfg(feature = "test-util")]
    pub fn crash_for_tests(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(l) = self
            .shared
            .leadership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            l.guard().suspend_extension_for_tests();
            std::mem::forget(l);
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Aborts a background task when dropped (also when the member's own task is aborted).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn frozen_until(shared: &Shared) -> Option<Instant> {
    *shared
        .frozen_until
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Beats on a timer of their own (like a lock's watchdog), so that a slow drain hook or slow
/// view reads never delay them: every interval, with the seed's random constant skew once.
async fn beat_loop(shared: Arc<Shared>, lease: Duration) {
    let interval = shared.opts.interval;
    let mut skew_left = shared
        .opts
        .skew
        .unwrap_or_else(|| interval.mul_f64(rand::random::<f64>() / 2.0));
    let mut seq: u64 = 0;
    loop {
        if let Some(until) = frozen_until(&shared) {
            tokio::time::sleep_until(until).await;
        }
        seq += 1;
        let sent = Stamp::now();
        let ok = beat(&shared, seq, false).await;
        if ok {
            let until = sent.after(lease::validity(lease));
            let mut cur = shared.beat_until.lock().unwrap_or_else(|p| p.into_inner());
            if cur.is_none_or(|c| c.mono < until.mono) {
                *cur = Some(until);
            }
            drop(cur);
            shared.beaten.notify_one();
        }
        // The first beat goes out at once (a fast join); the skew shifts the later ones once,
        // EARLIER (one gap shorter than an interval): a later shift would stretch one gap past
        // the lease, which outlives a beat by only a quarter interval.
        // A beat that did not reach a majority is retried soon, well before the lease ends.
        let next = if ok {
            sent.mono + interval.saturating_sub(std::mem::take(&mut skew_left))
        } else {
            Instant::now() + interval / 8
        };
        tokio::time::sleep_until(next).await;
    }
}

async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.opts.interval;
    // Views are read every tick, so a prepared view is drained and acknowledged, and an
    // acknowledged one activated, within a fraction of an interval.
    let tick = interval / 8;
    // A membership lease outlives one missed beat by a quarter interval, so a crashed member's
    // lease is gone, and the view without it active, within two intervals.
    let lease = interval + interval / 4;
    let mut acked: Option<ViewVersion> = None;
    let mut last_active: Option<Assignment> = None;
    // A prepared view being drained: its version and the running drain hook, if any.
    let mut draining: Option<(ViewVersion, Option<tokio::task::JoinHandle<()>>)> = None;

    let _beater = AbortOnDrop(tokio::spawn(beat_loop(shared.clone(), lease)));
    // Campaign for the group's leader lease in the background.
    let _campaigner = AbortOnDrop({
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
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
        })
    });

    loop {
        if let Some(until) = frozen_until(&shared) {
            tokio::time::sleep_until(until).await;
        }
        // The validity an assignment may carry comes from a beat sent BEFORE the view read
        // below (the barrier's argument depends on it): snapshot it first.
        let beat_until = *shared.beat_until.lock().unwrap_or_else(|p| p.into_inner());
        let read = read_view(&shared).await;
        if let Err(e) = &read {
            tracing::debug!(group = %shared.group, member = %shared.key, error = %e, "cannot read the view");
        }
        if let Ok(view) = read {
            let view = match leader_term(&shared) {
                Some(term) => leader_step(&shared, view, term, lease)
                    .await
                    .unwrap_or_else(|v| v),
                None => view,
            };
            shared.view_changes.send_if_modified(|v| {
                if v.as_ref() != Some(&view) {
                    *v = Some(view.clone());
                    true
                } else {
                    false
                }
            });
            let assignment = match (
                &view.state,
                view.index_of(&shared.key),
                beat_until,
                view.version.token(),
            ) {
                (state, Some(index), Some(until), Some(token))
                    if !until.passed()
                        && (*state == ViewState::Active
                            || view.draining.contains(&*shared.key)) =>
                {
                    Some(Assignment {
                        index,
                        replicas: view.replicas(),
                        version: view.version,
                        token,
                        state: *state,
                        valid_until: until.mono,
                        until,
                        view: Arc::new(view.clone()),
                        previous: (*state == ViewState::Prepare)
                            .then(|| Arc::new(view.previous_view())),
                        member: shared.key.clone(),
                        ownership: shared.opts.ownership,
                    })
                }
                _ => None,
            };
            // Drain and acknowledge a prepared view that takes over from one we worked under:
            // first narrow what we own to the tasks we keep, then let the user drain the rest.
            // The hook runs in a task of its own, so this loop keeps publishing (and the
            // narrowed assignment keeps its validity) however long the hook takes.
            if view.state == ViewState::Prepare
                && view.draining.contains(&*shared.key)
                && acked != Some(view.version)
                && draining.as_ref().is_none_or(|(v, _)| *v != view.version)
            {
                publish(&shared, assignment.clone());
                let hook = match (shared.opts.drain.clone(), last_active.take()) {
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
                draining = Some((view.version, hook));
            }
            if let Some((version, hook)) = &draining {
                let done = hook.as_ref().is_none_or(|h| h.is_finished());
                if *version != view.version {
                    draining = None; // a newer view replaced it before we acknowledged
                } else if done && ack(&shared, *version, view.content_digest().into()).await {
                    acked = Some(*version);
                    draining = None;
                }
            }
            if assignment
                .as_ref()
                .is_some_and(|a| a.state == ViewState::Active)
            {
                last_active = assignment.clone();
            }
            publish(&shared, assignment);
        } else if beat_until.is_none_or(|u| u.passed()) {
            publish(&shared, None);
        }
        // Next round at the tick, or at once after a beat: an assignment's validity comes only
        // from a beat sent before a view read, so a fresh beat needs a fresh read to count.
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(tick) => {}
            _ = shared.beaten.notified() => {}
        }
    }
    // Leave: own nothing, drop the lease everywhere, step down.
    publish(&shared, None);
    drop(_campaigner);
    drop(_beater);
    let _ = beat(&shared, 0, true).await;
    let leadership = shared
        .leadership
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(l) = leadership {
        let _ = l.resign().await;
    }
}

fn publish(shared: &Shared, assignment: Option<Assignment>) {
    shared.tx.send_if_modified(|cur| {
        let same = match (cur.as_ref(), assignment.as_ref()) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.version == b.version && a.index == b.index && a.valid_until == b.valid_until
            }
            _ => false,
        };
        if !same {
            if shared.opts.record_history {
                // Recorded before the new value is visible, so the history never starts an
                // ownership later than `owns()` could first report it.
                let mut h = shared.history.lock().unwrap_or_else(|p| p.into_inner());
                h.push((Instant::now(), assignment.clone()));
            }
            *cur = assignment;
        }
        !same
    });
}

/// A term's sequence numbers above this are not used (a view token holds 20 bits of seq).
const SEQ_ROLLOVER: u64 = (1 << 20) - 16;

/// Whether this member still leads in `term` with a margin of its lease left (one node timeout,
/// at most an eighth of the interval): room for a seal to land while the lease holds. A seal
/// that lands later is still harmless (the compare-and-set on its base refuses it wherever a
/// newer leader sealed); the margin only avoids wasted seals.
fn still_leading(shared: &Shared, term: u64) -> bool {
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

fn leader_term(shared: &Shared) -> Option<u64> {
    let guard = shared.leadership.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .filter(|l| l.is_leader())
        .map(|l| l.term().get())
}

/// Refresh (or drop) this member's beat on every voting node; true with a majority.
async fn beat(shared: &Shared, seq: u64, leave: bool) -> bool {
    let mode = if leave { "1" } else { "0" };
    let step = beat_step(&shared.members_key, &shared.key, &seq.to_string(), mode);
    let request = Request::vote("group.beat").wait_all_if(leave);
    shared.client.send(request, step).await.reached()
}

/// `member_beat.lua` for `member` in the hash `key`: a beat (`mode` "0"), a leave ("1"), or
/// garbage collection of the entry where it still holds `value` ("gc").
fn beat_step(key: &str, member: &str, value: &str, mode: &str) -> Step<()> {
    script_call(&MEMBER_BEAT, Guard::Marker)
        .key(key)
        .marker_key()
        .arg(member)
        .arg(value)
        .arg(mode)
        .marker()
        .decode(|_, v| decode::one_applied(v))
}

/// The beat value a member writes when it leaves gracefully.
const LEFT: &str = "left";

/// Remove gone members' beat entries where they still hold the value the leader watched.
async fn collect_garbage(client: Client, key: Arc<str>, garbage: BeatGarbage) {
    let sends = garbage.into_iter().map(|(member, values)| {
        let key = key.clone();
        let steps = Steps::per_node(move |ctx| {
            let (_, v) = values.iter().find(|(n, _)| *n == ctx.node)?;
            Some(beat_step(&key, &member, v, "gc"))
        });
        let client = client.clone();
        async move {
            client
                .send(Request::vote("group.members.gc").wait_all(), steps)
                .await
        }
    });
    futures::future::join_all(sends).await;
}

/// One node's beats as read on the node `ctx` names (its index and incarnation with them).
pub(crate) fn beat_reading(
    ctx: &NodeCtx,
    beats: std::collections::BTreeMap<String, String>,
) -> BeatReading {
    (
        ctx.node,
        ctx.marker.clone(),
        beats
            .into_iter()
            .map(|(k, v)| (k, Arc::<str>::from(v)))
            .collect(),
    )
}

fn hgetall(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HGETALL");
    cmd.arg(key);
    cmd
}

/// The beats a majority holds (the first majority to answer).
async fn read_beats(shared: &Shared) -> Result<Vec<BeatReading>, Error> {
    let read = Step::read(vec![hgetall(&shared.members_key)], |ctx, v| {
        Ok(decode::value(v)?.map(|beats| beat_reading(ctx, beats)))
    });
    let tally = shared
        .client
        .decide(Request::vote("group.members"), read)
        .await?;
    Ok(tally.replies().map(|(_, r)| r.clone()).collect())
}

/// The suffix of an acknowledgement's companion field, `<member>#h` = `<token>:<view digest>`.
const ACK_DIGEST: &str = "#h";

/// Members whose acknowledgement (field `member` = token) covers the prepared view `token`
/// with content `digest`: a token above it, or this token with no digest recorded or the same
/// digest. An acknowledgement of this very token for other content is not counted (a fork
/// would show there; it cannot happen while one version names one view).
pub(crate) fn acked_members(
    acks: &std::collections::HashMap<String, String>,
    token: u64,
    digest: &str,
) -> BTreeSet<String> {
    acks.iter()
        .filter(|(m, _)| !m.ends_with(ACK_DIGEST))
        .filter_map(|(m, t)| Some((m, register::parse_int(t)?)))
        .filter(|(m, t)| {
            *t > token
                || (*t == token
                    && acks
                        .get(&format!("{m}{ACK_DIGEST}"))
                        .and_then(|d| d.split_once(':'))
                        .is_none_or(|(dt, d)| dt != t.to_string() || d == digest))
        })
        .map(|(m, _)| m.clone())
        .collect()
}

/// Members that acknowledged the prepared `view` on any node of a majority.
async fn acknowledged(shared: &Shared, view: &View) -> Result<BTreeSet<String>, Error> {
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

async fn ack(shared: &Shared, version: ViewVersion, digest: Arc<str>) -> bool {
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

/// Read the view from a majority, take the highest version and write it back to a majority
/// before returning it (so every later reader sees at least this view). The beats read with it
/// feed this member's watch (a warm watch for when it leads).
async fn read_view(shared: &Shared) -> Result<View, Error> {
    let reading = shared.register.read().await?;
    if !shared.client.config().server_clock_leases {
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
    }
    shared.register.adopt(&reading).await
}

/// The leader's judgement of the group from one round of beat readings: the live members
/// (present on an answering node, or in the view and not yet gone) and the gone ones (beat
/// unchanged on a majority for the lease time + drift, on the leader's own clock). No node
/// clock plays any part. Two live processes with one member ID are reported.
fn judge_members(
    shared: &Shared,
    view: &View,
    readings: &[BeatReading],
    lease: Duration,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let needed = shared.client.majority().needed();
    let nodes = shared.client.node_urls().len();
    let answered: Vec<usize> = readings.iter().map(|(n, _, _)| *n).collect();
    let mut in_view: BTreeSet<String> = view.members.keys().cloned().collect();
    in_view.extend(view.draining.iter().cloned());
    let window = lease::watch_window(lease);
    let (live, gone) = if shared.client.config().server_clock_leases {
        // TEST ONLY: the old unsafe rule, "gone when absent on a majority of the answers".
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
    } else {
        let mut beats = shared.beats.lock().unwrap_or_else(|p| p.into_inner());
        beats.observe(nodes, readings, &in_view, Instant::now());
        let mut candidates = beats.present(&answered);
        candidates.extend(in_view.iter().cloned());
        // A member that left wrote "left" itself, after it stopped owning: gone at once.
        let left: BTreeSet<&String> = readings
            .iter()
            .flat_map(|(_, _, b)| b.iter().filter(|(_, v)| &***v == LEFT).map(|(k, _)| k))
            .collect();
        let gone: BTreeSet<String> = candidates
            .iter()
            .filter(|m| left.contains(m) || beats.gone(m, &answered, needed, window))
            .cloned()
            .collect();
        beats.prune(&answered, needed, window, &in_view);
        // Clean up the entries of gone members that no view names any more (guarded: an
        // entry that changed since, because the member beat again, is kept).
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
    };
    let mut by_id: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for key in &live {
        let id = key.rsplit_once('#').map_or(key.as_str(), |(id, _)| id);
        by_id.entry(id).or_default().push(key);
    }
    let dups: Vec<String> = by_id
        .iter()
        .filter(|(_, k)| k.len() > 1)
        .flat_map(|(_, k)| k.iter().map(|s| s.to_string()))
        .collect();
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
    drop(reported);
    (live, gone)
}

/// The leader's step: seal a new view when membership changed; activate a prepared view once
/// the barrier allows. Returns the view now current (Err carries the unchanged view).
async fn leader_step(
    shared: &Shared,
    view: View,
    term: u64,
    lease: Duration,
) -> Result<View, View> {
    if term < view.version.term {
        return Err(view); // a newer leader sealed this view: we are deposed
    }
    // Read AFTER the view: when a prepared view is judged below, every reading is later than
    // its seal (the barrier's argument needs it).
    let readings = match read_beats(shared).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(group = %shared.group, error = %e, "leader: cannot read members");
            return Err(view);
        }
    };
    let (live, gone) = judge_members(shared, &view, &readings, lease);
    tracing::trace!(group = %shared.group, version = ?view.version, state = ?view.state, draining = ?view.draining, live = ?live, "leader step");
    let next = match view.state {
        ViewState::Prepare => {
            let acks = match acknowledged(shared, &view).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(group = %shared.group, error = %e, "leader: cannot read acknowledgements");
                    return Err(view);
                }
            };
            if assign::transition_ready(&view, &acks, &gone) {
                view.activated(term)
            } else if live != view.members.keys().cloned().collect::<BTreeSet<_>>() {
                view.next(&live, term) // membership changed again while draining
            } else {
                return Err(view);
            }
        }
        ViewState::Active => {
            if live == view.members.keys().cloned().collect::<BTreeSet<_>>() {
                return Err(view);
            }
            let prepared = view.next(&live, term);
            if shared.opts.barrier {
                prepared
            } else {
                prepared.activated(term)
            }
        }
    };
    // Terms roll over before a term's sequence numbers run out: step down, so the next
    // campaign seals under a new term.
    if next.version.seq >= SEQ_ROLLOVER {
        tracing::warn!(group = %shared.group, version = ?next.version, "view sequence of this term nearly exhausted: stepping down for a new term");
        let leadership = shared
            .leadership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(l) = leadership {
            let _ = l.resign().await;
        }
        return Err(view);
    }
    // Still the leader, with room for the write to land within the lease.
    if !still_leading(shared, term) {
        return Err(view);
    }
    match shared.register.seal(next).await {
        Err(e) => {
            tracing::debug!(group = %shared.group, error = %e, "leader: cannot write the view");
            Err(view)
        }
        Ok(next) => {
            tracing::info!(group = %shared.group, version = ?next.version, state = ?next.state, replicas = next.replicas(), "view sealed");
            // Acknowledgements below an active view's token can never matter again (only a
            // later prepared view's, with a higher token, are read): drop them, so the hash
            // does not grow with every process that ever joined.
            if let (ViewState::Active, Some(token)) = (next.state, next.version.token()) {
                let (client, key) = (shared.client.clone(), shared.ack_key.clone());
                tokio::spawn(crate::jobs::prune(client, key, token.get(), 0));
            }
            Ok(next)
        }
    }
}
