//! Group membership with one agreed view, sealed by the group's leader, and the two-phase
//! transition the library enforces.
//!
//! Each member keeps a membership lease (a per-node sorted-set entry that expires on the node's
//! clock) alive every interval, with the seed's random constant skew. Members campaign for the
//! group's leader lease; the leader seals views (`prepare`), waits until every member of the
//! last active view has drained and acknowledged or lost its lease, then activates them. Views
//! live in a quorum register (set-if-version-greater on every node, committed on a majority);
//! readers take the highest version from a majority and write it back to a majority before
//! adopting it, so no two instances adopt views in opposite orders.
//!
//! A member owns tasks under an **active** view that contains it (and, while a new view is
//! prepared, only the tasks both views give it), and only while its own membership lease is
//! valid on its monotonic clock; its assignment carries the view version as
//! a fencing token, so a stale owner's writes are rejected by the resource guards.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::{self, Ownership, View, ViewState, ViewVersion};
use crate::client::{Client, NodeConn};
use crate::election::{Election, Leadership};
use crate::error::{Error, NoQuorum};
use crate::fencing::FencingToken;
use crate::keys::{fixed_key, KeyKind, Name};
use crate::lock::Lock;
use crate::quorum::fanout::Wait;
use crate::quorum::NodeOutcome;
use crate::scripts::{MEMBERS_LIVE, MEMBER_BEAT, VIEW_WRITE};

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

    /// TEST ONLY: use this phase offset instead of the random constant skew (to run members
    /// up to a quarter interval out of phase, as client clock skew would put them).
    #[doc(hidden)]
    pub fn with_skew_for_tests(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// TEST ONLY: record every published assignment with its time (see
    /// [`Member::history_for_tests`]).
    #[doc(hidden)]
    pub fn record_history_for_tests(mut self) -> Self {
        self.record_history = true;
        self
    }

    /// TEST ONLY: activate new views at once, skipping the drain barrier, so a test can show
    /// the double owners the barrier prevents. Never use it in production.
    #[doc(hidden)]
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
    #[doc(hidden)]
    pub fn covers(&self, task_id: u64) -> bool {
        let key = task_id.to_le_bytes();
        let mine = |v: &View| v.owner(&key, task_id, self.ownership) == Some(&*self.member);
        match self.state {
            ViewState::Active => mine(&self.view),
            ViewState::Prepare => mine(&self.view) && self.previous.as_deref().is_some_and(mine),
        }
    }

    /// Whether this member owns task `task_id` now (false once `valid_until` has passed).
    pub fn owns(&self, task_id: u64) -> bool {
        Instant::now() < self.valid_until && self.covers(task_id)
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
    opts: GroupOptions,
    members_key: Arc<str>,
    view_key: Arc<str>,
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
        let shared = Arc::new(Shared {
            client: client.clone(),
            members_key: group.key(KeyKind::Members).into(),
            view_key: group.key(KeyKind::View).into(),
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
    #[doc(hidden)]
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

    /// Leave gracefully: stop owning, drop the membership lease on every node, step down as
    /// leader.
    pub async fn leave(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// TEST ONLY: freeze this member for `d` (no beats, no reads, nothing published), as if
    /// its process were stopped; it resumes on its own.
    #[doc(hidden)]
    pub fn freeze_for_tests(&self, d: Duration) {
        *self
            .shared
            .frozen_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + d);
    }

    /// TEST ONLY: [`leave`](Self::leave), then return the complete history.
    #[doc(hidden)]
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
    #[doc(hidden)]
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

async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.opts.interval;
    // Views are read every tick, so a prepared view is drained and acknowledged, and an
    // acknowledged one activated, within a fraction of an interval.
    let tick = interval / 8;
    // A membership lease outlives one missed beat by a quarter interval, so a crashed member's
    // lease is gone, and the view without it active, within two intervals.
    let lease = interval + interval / 4;
    // The seed's random constant skew, so members do not heartbeat in lockstep.
    let mut skew_left = shared
        .opts
        .skew
        .unwrap_or_else(|| interval.mul_f64(rand::random::<f64>() / 2.0));
    let mut next_beat = Instant::now();
    let mut lease_valid_until: Option<Instant> = None;
    let mut acked: Option<ViewVersion> = None;
    let mut last_active: Option<Assignment> = None;

    // Campaign for the group's leader lease in the background.
    let campaigner = {
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
    };

    loop {
        let frozen = *shared
            .frozen_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(until) = frozen {
            tokio::time::sleep_until(until).await;
        }
        let now = Instant::now();
        if now >= next_beat {
            if beat(&shared, lease, false).await {
                let drift = lease / 100 + Duration::from_millis(2);
                lease_valid_until = Some(now + lease - drift);
            }
            // The first beat goes out at once (a fast join); the skew shifts the phase of the
            // later ones once.
            next_beat = now + interval + std::mem::take(&mut skew_left);
        }
        let read = read_view(&shared).await;
        if let Err(e) = &read {
            tracing::debug!(group = %shared.group, member = %shared.id, error = %e, "cannot read the view");
        }
        if let Ok(view) = read {
            let view = match leader_term(&shared) {
                Some(term) => leader_step(&shared, view, term).await.unwrap_or_else(|v| v),
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
                view.index_of(&shared.id),
                lease_valid_until,
                view.version.token(),
            ) {
                (state, Some(index), Some(valid_until), Some(token))
                    if Instant::now() < valid_until
                        && (*state == ViewState::Active || view.draining.contains(&*shared.id)) =>
                {
                    Some(Assignment {
                        index,
                        replicas: view.replicas(),
                        version: view.version,
                        token,
                        state: *state,
                        valid_until,
                        view: Arc::new(view.clone()),
                        previous: (*state == ViewState::Prepare)
                            .then(|| Arc::new(view.previous_view())),
                        member: shared.id.clone(),
                        ownership: shared.opts.ownership,
                    })
                }
                _ => None,
            };
            // Drain and acknowledge a prepared view that takes over from one we worked under:
            // first narrow what we own to the tasks we keep, then let the user drain the rest.
            if view.state == ViewState::Prepare
                && view.draining.contains(&*shared.id)
                && acked != Some(view.version)
            {
                publish(&shared, assignment.clone());
                if let (Some(hook), Some(from)) = (shared.opts.drain.clone(), last_active.take()) {
                    let drain = Drain {
                        from,
                        keeps: assignment.clone(),
                    };
                    let _ = tokio::time::timeout(shared.opts.drain_timeout, hook(drain)).await;
                }
                if ack(&shared, view.version).await {
                    acked = Some(view.version);
                }
            }
            if assignment
                .as_ref()
                .is_some_and(|a| a.state == ViewState::Active)
            {
                last_active = assignment.clone();
            }
            publish(&shared, assignment);
        } else if lease_valid_until.is_some_and(|v| Instant::now() >= v) {
            publish(&shared, None);
        }
        let wake = (Instant::now() + tick).min(next_beat);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    // Leave: own nothing, drop the lease everywhere, step down.
    publish(&shared, None);
    campaigner.abort();
    let _ = beat(&shared, lease, true).await;
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

fn leader_term(shared: &Shared) -> Option<u64> {
    let guard = shared.leadership.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .filter(|l| l.is_leader())
        .map(|l| l.term().get())
}

/// Refresh (or drop) this member's lease on every voting node; true with a majority.
async fn beat(shared: &Shared, lease: Duration, leave: bool) -> bool {
    let (key, id) = (shared.members_key.clone(), shared.id.clone());
    let ms = lease.as_millis() as u64;
    let tally = shared
        .client
        .fan_out(
            "group.beat",
            if leave { Wait::All } else { Wait::Decided },
            move |mut nc: NodeConn| {
                let (key, id) = (key.clone(), id.clone());
                async move {
                    let _: i64 = MEMBER_BEAT
                        .key(&*key)
                        .arg(&*id)
                        .arg(ms)
                        .arg(if leave { "1" } else { "0" })
                        .invoke_async(&mut nc.conn)
                        .await?;
                    Ok(NodeOutcome::Applied(()))
                }
            },
        )
        .await;
    tally.reached()
}

/// The members live on any node of a majority (a member counts as gone only when every
/// answering node of a majority says its lease expired).
async fn live_members(shared: &Shared) -> Result<BTreeSet<String>, Error> {
    let key = shared.members_key.clone();
    let tally = shared
        .client
        .fan_out("group.members", Wait::All, move |mut nc: NodeConn| {
            let key = key.clone();
            async move {
                let ids: Vec<String> = MEMBERS_LIVE.key(&*key).invoke_async(&mut nc.conn).await?;
                Ok(NodeOutcome::Applied(ids))
            }
        })
        .await;
    let tally = shared
        .client
        .require_majority("group.members", tally, |_| String::new())?;
    Ok(tally
        .replies()
        .flat_map(|(_, ids)| ids.iter().cloned())
        .collect())
}

/// Members that acknowledged `version` on any node of a majority.
async fn acknowledged(shared: &Shared, version: ViewVersion) -> Result<BTreeSet<String>, Error> {
    let key = shared.ack_key.clone();
    let token = version.token().map(|t| t.get()).unwrap_or(u64::MAX);
    let tally = shared
        .client
        .fan_out("group.acks", Wait::All, move |mut nc: NodeConn| {
            let key = key.clone();
            async move {
                let acks: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
                    .arg(&*key)
                    .query_async(&mut nc.conn)
                    .await?;
                Ok(NodeOutcome::Applied(acks))
            }
        })
        .await;
    let tally = shared
        .client
        .require_majority("group.acks", tally, |_| String::new())?;
    Ok(tally
        .replies()
        .flat_map(|(_, acks)| {
            acks.iter()
                .filter(|(_, t)| **t >= token)
                .map(|(m, _)| m.clone())
        })
        .collect())
}

async fn ack(shared: &Shared, version: ViewVersion) -> bool {
    let Some(token) = version.token() else {
        return false;
    };
    let (key, id) = (shared.ack_key.clone(), shared.id.clone());
    let tally = shared
        .client
        .fan_out("group.ack", Wait::Decided, move |mut nc: NodeConn| {
            let (key, id) = (key.clone(), id.clone());
            async move {
                let _: i64 = redis::cmd("HSET")
                    .arg(&*key)
                    .arg(&*id)
                    .arg(token.get())
                    .query_async(&mut nc.conn)
                    .await?;
                Ok(NodeOutcome::Applied(()))
            }
        })
        .await;
    tally.reached()
}

/// Read the view from a majority, take the highest version and write it back to a majority
/// before returning it (so every later reader sees at least this view).
async fn read_view(shared: &Shared) -> Result<View, Error> {
    let key = shared.view_key.clone();
    let tally = shared
        .client
        .fan_out("group.view.read", Wait::All, move |mut nc: NodeConn| {
            let key = key.clone();
            async move {
                let (token, view): (Option<u64>, Option<String>) = redis::cmd("HMGET")
                    .arg(&*key)
                    .arg("token")
                    .arg("view")
                    .query_async(&mut nc.conn)
                    .await?;
                Ok(NodeOutcome::Applied((token.unwrap_or(0), view)))
            }
        })
        .await;
    let tally = shared
        .client
        .require_majority("group.view.read", tally, |_| String::new())?;
    let best = tally
        .replies()
        .filter_map(|(_, (token, json))| {
            json.as_deref()
                .and_then(|j| serde_json::from_str::<View>(j).ok())
                .map(|v| (*token, v))
        })
        .max_by_key(|(t, _)| *t);
    match best {
        None => Ok(View::empty()),
        Some((_, view)) => {
            write_view(shared, &view).await?;
            Ok(view)
        }
    }
}

/// Write `view` to every voting node (set-if-version-greater); Ok when a majority holds it.
async fn write_view(shared: &Shared, view: &View) -> Result<(), Error> {
    let token = view
        .version
        .token()
        .ok_or_else(|| Error::InvalidArgument("view version out of range".into()))?;
    let json: Arc<str> = serde_json::to_string(view)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?
        .into();
    let (key, marker_key): (Arc<str>, Arc<str>) =
        (shared.view_key.clone(), fixed_key(KeyKind::Marker).into());
    let tally = shared
        .client
        .fan_out(
            "group.view.write",
            Wait::Decided,
            move |mut nc: NodeConn| {
                let (key, marker_key, json) = (key.clone(), marker_key.clone(), json.clone());
                async move {
                    let (status, current): (i64, u64) = VIEW_WRITE
                        .key(&*key)
                        .key(&*marker_key)
                        .arg(token.get())
                        .arg(&*json)
                        .arg(&*nc.marker)
                        .invoke_async(&mut nc.conn)
                        .await?;
                    Ok(if status == 1 {
                        NodeOutcome::Applied(current)
                    } else {
                        NodeOutcome::Rejected(current)
                    })
                }
            },
        )
        .await;
    if tally.reached() {
        Ok(())
    } else {
        Err(
            NoQuorum::from_tally("group.view.write", &tally, shared.client.node_urls(), |c| {
                format!("holds newer view {c}")
            })
            .into(),
        )
    }
}

/// The leader's step: seal a new view when membership changed; activate a prepared view once
/// the barrier allows. Returns the view now current (Err carries the unchanged view).
async fn leader_step(shared: &Shared, view: View, term: u64) -> Result<View, View> {
    if term < view.version.term {
        return Err(view); // a newer leader sealed this view: we are deposed
    }
    let live = match live_members(shared).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(group = %shared.group, error = %e, "leader: cannot read members");
            return Err(view);
        }
    };
    tracing::trace!(group = %shared.group, version = ?view.version, state = ?view.state, draining = ?view.draining, live = ?live, "leader step");
    let next = match view.state {
        ViewState::Prepare => {
            let acks = match acknowledged(shared, view.version).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(group = %shared.group, error = %e, "leader: cannot read acknowledgements");
                    return Err(view);
                }
            };
            let expired: BTreeSet<String> = view
                .draining
                .iter()
                .filter(|m| !live.contains(*m))
                .cloned()
                .collect();
            if assign::transition_ready(&view, &acks, &expired) {
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
    match write_view(shared, &next).await {
        Err(e) => {
            tracing::debug!(group = %shared.group, error = %e, "leader: cannot write the view");
            Err(view)
        }
        Ok(()) => {
            tracing::info!(group = %shared.group, version = ?next.version, state = ?next.state, replicas = next.replicas(), "view sealed");
            Ok(next)
        }
    }
}
