//! Group membership with one agreed view, sealed by the group's leader, and the two-phase
//! transition the library enforces. No decision reads a node's clock.
//!
//! The guarantees are documented on `Member`.
//!
//! - `mod.rs`: [`Member`], [`Assignment`], joining and leaving.
//! - `options.rs`: [`GroupOptions`], [`Drain`], [`DrainHook`].
//! - `beats.rs`: the member's beats on their own timer; reading the group's beats.
//! - `run.rs`: the member's loop (read the view, drain, acknowledge, publish).
//! - `leader.rs`: the group leader's step (judge members, seal, activate).
//! - The pure decisions are in `membership/decide.rs`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::{Ownership, View, ViewState, ViewVersion};
use crate::client::{decode, script_call, Client, Guard, Request, Step, Steps};
use crate::clock::Stamp;
use crate::election::{Election, Leadership};
use crate::error::Error;
use crate::keys::{KeyKind, Name};
use crate::lease::{self, BeatGarbage, BeatReading, Beats};
use crate::lock::{Lock, LockOptions};
use crate::scripts::MEMBER_BEAT;

use super::assignment::Assignment;
use super::register::{self, beat_reading, ViewRegister};
use super::tables::Tables;

mod beats;
mod campaign;
mod hints;
mod leader;
mod options;
mod run;

pub use options::{Drain, DrainHook, GroupOptions};

use super::decide::{self, acked_members, ACK_DIGEST};
use beats::{beat, beat_loop, collect_garbage, hgetall, read_beats, LEFT};
use leader::{ack, leader_step, leader_term};
use run::member_loop;

/// The ownership checks that read the clocks (the rest of [`Assignment`] is pure, in
/// `membership/assignment.rs`).
impl Assignment {
    /// End of ownership under this assignment, as an instant of this process's monotonic
    /// clock, unless the membership lease is refreshed (a later assignment then carries the
    /// later end): the earlier of the end on the monotonic clock and the end on the boot clock
    /// (`CLOCK_BOOTTIME`, which counts the time the host was suspended). After a suspend it is
    /// shortened by the suspended time, and in the past when the suspend outlasted it.
    /// Computed when called: each call reads both clocks. [`owns`](Self::owns) and
    /// [`owns_unit`](Self::owns_unit) are false from this instant on.
    pub fn valid_until(&self) -> Instant {
        self.until.end()
    }

    /// Whether this member owns task `task_id` now (false once `valid_until` has passed, on
    /// the monotonic or the boot clock).
    pub fn owns(&self, task_id: u64) -> bool {
        !self.until.passed() && self.covers(task_id)
    }

    /// Work distribution: whether this member owns `unit` now (false once `valid_until` has
    /// passed, on the monotonic or the boot clock).
    pub fn owns_unit(&self, unit: &str) -> bool {
        !self.until.passed() && self.covers_unit(unit)
    }
}

/// Group membership with one agreed view, sealed by the group's leader, and the two-phase
/// transition the library enforces. No decision reads a node's clock.
///
/// Each process that joins gets a member key `<id>#<random nonce>` (two processes with one ID
/// are two members; the leader reports them). It beats every interval, on a timer of its own,
/// with the seed's random constant skew: a beat writes a sequence number that grows with every
/// beat into a hash on every node (`member_beat.lua`), with no expiry. Its own validity is the
/// send time of its last beat a majority applied, plus the lease (1.25 intervals), minus drift,
/// on its monotonic clock (and the boot clock).
///
/// Members campaign for the group's leader lease (a [`crate::Lock`]), watching it from their
/// view reads and trying only when it is free or was left unchanged for its TTL plus drift.
/// The leader judges a member **gone** only when, on a majority of the nodes it just read, it
/// has seen the member's beat (or its absence) unchanged, on one node incarnation, for the
/// lease plus drift on its own monotonic clock (`lease::Beats`; the view's deputies keep this
/// watch warm from their view reads, so a deputy that becomes the leader judges without
/// waiting a whole lease first). The leader seals views (`prepare`), waits until every member
/// of the last active view has drained and acknowledged or is gone, then activates them. Views
/// live in a quorum register (a compare-and-set on each view's base on every node, committed
/// on a majority, see `register.rs`); readers take the highest version from a majority and
/// write it back to a majority (unless a majority answered with it) before adopting it, so no
/// two instances adopt views in opposite orders and views cannot fork.
///
/// # Why the barrier holds without node clocks
/// A member M owns tasks of the active view V1 only through an assignment published after a
/// view read that returned V1, carrying the validity of a beat whose reply arrived before that
/// read started (the loop snapshots the validity first). Suppose the leader activates the
/// prepared V2 because M is gone: on a majority R of nodes read after V2 was sealed, M's beat
/// stayed unchanged from a first reading r_n to a last f_n, at least lease + drift apart. Take
/// any beat b of M that a majority applied; it shares a node n with R. If b reached n before
/// r_n, it was sent before r_n, so M's validity from it ends (on real time) before f_n and
/// before the activation. It cannot have reached n between r_n and f_n (the value would have
/// changed; sequence numbers never repeat, and a wipe changes the run_id, which restarts the
/// watch). If it reached n after f_n, which is after V2 was sealed, M's next view read starts
/// after b's reply and returns V2 or newer, so b never backs a V1 assignment. Either way M
/// owns no V1 task once V2 is active. A member that acknowledged V2 had already narrowed to the
/// tasks both views give it.
///
/// A member owns tasks under an **active** view that contains it (and, while a new view is
/// prepared, only the tasks both views give it), and only while its own membership lease is
/// valid; its assignment carries the view version as a fencing token, so a stale owner's
/// writes are rejected by the resource guards.
///
/// Assumptions, beyond the crate's: clients' monotonic clocks run within
/// [`MAX_DRIFT_RATE`](crate::MAX_DRIFT_RATE) of real time; nodes' wall clocks may step at any
/// time. Not guaranteed: progress without a majority; a graceful leave or a crash is seen only
/// after the lease time (about 1.3 intervals) has passed unchanged.
///
/// A member of a group. Dropping it stops heartbeats (its lease then expires); prefer
/// [`leave`](Member::leave).
#[must_use = "the member leaves the group when this is dropped"]
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
    /// Woken by the leader's hint that it sealed a view ([`hints`]).
    hinted: tokio::sync::Notify,
    /// Nodes this member is subscribed to for hints.
    hints_live: std::sync::atomic::AtomicUsize,
    /// The leader's watch over the group's beats (kept warm by a deputy's view reads).
    beats: Mutex<Beats>,
    /// The highest view version this member knows a majority holds (it sealed it, wrote it
    /// back, or read it from a majority): readings taken after it are later than its seal.
    committed: Mutex<Option<ViewVersion>>,
    /// Leader: when a member that stopped beating could next be judged gone (a read is due
    /// then).
    judge_at: Mutex<Option<Instant>>,
    /// Whether this member is a deputy of its view (see [`decide::Role`]).
    deputy: std::sync::atomic::AtomicBool,
    /// Woken by every view read that carried the leader lease (the campaign plans again).
    lease_seen: tokio::sync::Notify,
    /// When a view read last carried the leader lease.
    lease_seen_at: Mutex<Option<Instant>>,
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
    /// Work distribution: the unit lists this group's views carry (`None`: a plain group).
    tables: Option<Arc<dyn Tables>>,
}

/// The key kinds of a group's registers: a plain group's, or a pool's (so a pool and a group
/// with one name never share a key).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupKinds {
    pub(crate) members: KeyKind,
    pub(crate) view: KeyKind,
    pub(crate) ack: KeyKind,
    pub(crate) lock: KeyKind,
    pub(crate) fence: KeyKind,
}

impl GroupKinds {
    const GROUP: GroupKinds = GroupKinds {
        members: KeyKind::Members,
        view: KeyKind::View,
        ack: KeyKind::Ack,
        lock: KeyKind::GroupLock,
        fence: KeyKind::GroupFence,
    };

    pub(crate) const POOL: GroupKinds = GroupKinds {
        members: KeyKind::PoolMembers,
        view: KeyKind::PoolView,
        ack: KeyKind::PoolAck,
        lock: KeyKind::PoolLock,
        fence: KeyKind::PoolFence,
    };
}

/// How a member joins: its registers, its work-distribution side, and a suffix of its member
/// key (a pool member's weight).
pub(crate) struct JoinAs {
    pub(crate) kinds: GroupKinds,
    pub(crate) what: &'static str,
    pub(crate) tables: Option<Arc<dyn Tables>>,
    pub(crate) key_suffix: String,
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
        let plain = JoinAs {
            kinds: GroupKinds::GROUP,
            what: "group",
            tables: None,
            key_suffix: String::new(),
        };
        Member::join_as(client, group, id, opts, plain)
    }

    /// Join as a plain group member or as a pool member (`as_`).
    pub(crate) fn join_as(
        client: &Client,
        group: &str,
        id: &str,
        opts: GroupOptions,
        as_: JoinAs,
    ) -> Result<Member, Error> {
        let group = Name::new(as_.what, group)?;
        let member = Name::new("member", id)?;
        if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&opts.interval) {
            return Err(Error::InvalidArgument(format!(
                "{} interval {:?} is outside 100ms..=1h",
                as_.what, opts.interval
            )));
        }
        let kinds = as_.kinds;
        let election = leader_election(client, &group, &member, opts.interval, kinds)?;
        let (tx, _) = watch::channel(None);
        let (view_changes, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            // TEST ONLY (the unsafe classic design): one key per ID, shared by every process
            // that joins with it.
            key: member_key(client, &member, &as_.key_suffix),
            beat_until: Mutex::new(None),
            beaten: tokio::sync::Notify::new(),
            hinted: tokio::sync::Notify::new(),
            hints_live: std::sync::atomic::AtomicUsize::new(0),
            beats: Mutex::new(Beats::default()),
            committed: Mutex::new(None),
            judge_at: Mutex::new(None),
            deputy: std::sync::atomic::AtomicBool::new(false),
            lease_seen: tokio::sync::Notify::new(),
            lease_seen_at: Mutex::new(None),
            duplicates: std::sync::atomic::AtomicUsize::new(0),
            duplicates_reported: Mutex::new(Vec::new()),
            client: client.clone(),
            members_key: group.key(kinds.members).into(),
            register: ViewRegister::new(
                client,
                group.key(kinds.view).into(),
                group.key(kinds.members).into(),
                opts.forkable_views,
            ),
            ack_key: group.key(kinds.ack).into(),
            id: member.as_str().into(),
            group,
            opts,
            tx,
            election,
            leadership: Mutex::new(None),
            view_changes,
            history: Mutex::new(Vec::new()),
            frozen_until: Mutex::new(None),
            tables: as_.tables,
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(member_loop(shared.clone(), stop.clone()));
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
            .filter(|a| !a.until.passed())
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

    /// Whether this member holds the group's leader lease now (it seals the views). For
    /// observation only: leadership can end at any moment.
    pub fn is_leader(&self) -> bool {
        leader::leader_term(&self.shared).is_some()
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

/// The group leader's election: a lease under the group's own key kinds, held in the name of
/// this member's ID.
fn leader_election(
    client: &Client,
    group: &Name,
    member: &Name,
    interval: Duration,
    kinds: GroupKinds,
) -> Result<Election, Error> {
    let candidate = Election::candidate_label(member.as_str())?;
    let lock = Lock::with_kinds(
        client,
        group.as_str(),
        interval,
        LockOptions::default().with_holder(&candidate),
        kinds.lock,
        kinds.fence,
    )?;
    Ok(Election::on_lock(lock, candidate))
}

/// This process's member key, `<id>#<64 random bits><suffix>`, so two processes with one ID
/// are two members (TEST ONLY, in the unsafe classic design: the ID itself, shared by them).
fn member_key(client: &Client, member: &Name, suffix: &str) -> Arc<str> {
    if client.config().server_clock_leases {
        return member.as_str().into();
    }
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = rand::random();
    }
    format!(
        "{}#{:016x}{suffix}",
        member.as_str(),
        u64::from_le_bytes(bytes)
    )
    .into()
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

fn publish(shared: &Shared, assignment: Option<Assignment>) {
    shared.tx.send_if_modified(|cur| {
        let same = decide::same_assignment(cur.as_ref(), assignment.as_ref());
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
