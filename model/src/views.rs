//! The view register of peer indexing and its prepare/active transition barrier: views sealed
//! by a leader as a compare-and-set on their base, read and written back by the members,
//! drained and acknowledged, activated only once every draining member acknowledged or is
//! judged gone; members own tasks only while their membership lease is valid.
//!
//! Mirrors: the node step `src/scripts/view_write.lua` ([`view_write`]) and, for the
//! acknowledgements, `src/scripts/record.lua` ([`record`]), both compared with the real
//! scripts on a real node by `tests/conformance_views.rs`; the pure decisions of
//! `src/membership/assign.rs` (`View::next`, `View::activated`, `View::above_attempts`,
//! `sticky_indexes`, `Ownership::Modulo`, `transition_ready`) and `src/membership/decide.rs`
//! (`leader_decision` with its `barrier` switch, `assignment`, `starts_drain`,
//! `acked_members`), here over two members and two tasks ([`ViewRec`], [`leader_decision`],
//! [`has_assignment`], [`covers`], [`acked`]); `register::pick` (the highest version; two
//! views at one version refused); the member's loop in `src/membership/group/run.rs`
//! (snapshot the beat validity, read the view from a majority, write it back to a majority,
//! adopt it, publish the assignment, drain and acknowledge a prepared view it drains from); the
//! leader's step in `src/membership/group/leader.rs` (read the view and write it back, then
//! judge the members from their beats and read the acknowledgements, then seal, above every
//! version it tried this term); the beats (`member_beat.lua`, `group/beats.rs`) with the drift
//! rule of `src/lease/mod.rs`; the view part of the repair (`src/repair/plan.rs`,
//! `copy.rs`: the newest view a majority of the other marked nodes holds, written with
//! `view_write.lua`'s compare-and-set and `"*"`, and no copy while it has a sibling there;
//! beats copied where absent; acknowledgements raised).
//!
//! The cast: 3 nodes; 2 members, A and B; 2 tasks, owned by `Modulo` (task `t` belongs to
//! index `t % replicas`). The group starts in the active view #1 = `{A:0}` (term 1, seq 1),
//! held by every node, under which A owns both tasks with a beat sent at tick 0. B then beats,
//! so the leader seals the prepared `{A:0, B:1}` (A keeps task 0; nobody holds task 1 while A
//! drains), and activates it once A acknowledged or is judged gone: task 1 moves from A to B.
//! Everything else the bounds allow happens too (B or A judged gone, re-prepares, views with
//! no members, a second term, a node that lags).
//!
//! Explored: every interleaving of the members' beats and rounds, the leader's steps, and the
//! delivery of every seal in any order; seals lost or never delivered; writes that land on
//! some nodes only; node crash and restart (the register is kept: AOF
//! `appendfsync always`); node wipe (restarts empty and unmarked: it refuses every write
//! until the repair marks it) and its repair; FLUSHALL (the node loses every key, its marker
//! included, and keeps running and its run_id); a second leader term while the deposed
//! leader's seals are still in flight; and time.
//!
//! Time: real time is a global tick counter `now`, up to a horizon. A member may beat once a
//! tick. Its membership validity from a beat sent at tick `s` that a majority applied runs
//! until `s + validity` (the holder side of the drift rule: `ttl - drift` from the send); it
//! owns tasks while `now < until`. The leader may judge a member gone once, on every node of
//! the majority it just read, the member's beat value (or its absence) has stayed unchanged for
//! `window` ticks (the watcher side: `ttl + drift` from the receipt of the first reply that
//! showed it). The honest design is `validity <= window`: the worst case of both drift
//! margins, in real time. The leader's watch is over-approximated: it is taken to have read
//! each node at the moment its value last changed (so it judges as early as any real leader
//! could); a node's restart or wipe restarts the watch of it (a new `run_id`).
//!
//! Properties: [`OWNERS`], no task has two owners (at no moment is a task covered by the
//! published assignments of two members whose validity is running); [`ORDER`], views are
//! adopted in one order (every member adopts views of increasing versions, and one version
//! names one adopted view: so no two members adopt two views in opposite orders); and
//! [`MOVED`], a `sometimes` property (a view sealed after the first becomes active and a member
//! owns a task under it), so a vacuous model cannot pass. Planted bugs ([`Bug`]): the barrier
//! off, the forkable register, a reader that does not write back, a validity longer than the
//! watch window.
//!
//! Abstractions, stated (what is NOT explored):
//! - The leader election is given, not modelled: terms increase, at most one leader takes
//!   steps at a time (the lease's guarantee); a deposed leader takes no new step, but its seals
//!   still in flight land whenever the network delivers them, with its old term.
//! - A leader's step reads one majority at one instant: the view (picked and written back on
//!   those two nodes), the beats and the acknowledgements; then it decides and sends the seal to
//!   every node. The real leader reads the beats and acknowledgements after the write-back, at
//!   later instants: only those fresher readings are not explored. The leader takes its next
//!   step only once every copy of its seal was delivered or lost (the real one may time out and
//!   read again while a copy is still in flight; the deposed leader's late copies are explored).
//! - A member's steps are atomic on the nodes they reach: a round reads a majority at one
//!   instant; its write-back lands on a majority, on all nodes, or on none (never on one node
//!   only), at one instant, and counts at once; a beat lands on every node that is up (a beat
//!   on a minority only is not explored; one on exactly a majority is the same, for every
//!   majority the leader reads, as one on all); an acknowledgement lands on every node up or on
//!   none. So no member's write is in flight across other steps: late beats (the case the
//!   "snapshot the validity before the read" rule exists for) and late write-backs are not
//!   explored, and the repair's wait for writes in flight is not needed here (`ids.rs`
//!   explores that wait). The real reader skips the write-back when a majority answered with the
//!   view it picked: the same as a write-back on that read majority right after the round,
//!   which is explored.
//! - The drain hook is instantaneous (a member narrows its assignment when it adopts the
//!   prepared view, then acknowledges); graceful leave ("left"), the burial of gone members no
//!   view names, the garbage collection of beat entries, duplicate member keys, and
//!   work-distribution lists are not modelled. A repair is one step. A restart keeps the marker
//!   (as in `ids.rs`).
//! - FLUSHALL is, in this model, a wipe without the restart, and observably the same: the
//!   watches of the node restart (its beats are gone, and the repair writes a new epoch into
//!   the marker, which restarts every watch as a new run_id does), and the seals in flight to
//!   it are refused wherever they land (before its repair: no marker; after it: the new epoch),
//!   so they are dropped at once, as a restart loses them. Since the repair is one step, a
//!   FLUSHALL of one of its *sources* never falls between its reads and its mark (the copy
//!   model, `copy.rs`, explores that interleaving).
//! - A view's digest is its id in the model's table (one version and one content: one id);
//!   tokens are `term * 16 + seq`.

use std::fmt;

use stateright::{Model, Property};

/// Nodes.
pub const NODES: usize = 3;
/// Members (A and B).
pub const MEMBERS: usize = 2;
/// Tasks.
pub const TASKS: u8 = 2;
/// A majority of the nodes.
const NEEDED: u32 = 2;
/// The first view, active `{A:0}`, sealed in term 1: its id in the table.
pub const FIRST_VIEW: u8 = 1;

// ---------------------------------------------------------------------------------------------
// The node steps.

/// A node's view register: the token of the view it holds (absent = 0), that view's digest
/// (the model uses the view's id), and whether its marker is the one the clients expect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ViewRegister {
    pub token: u64,
    pub hash: u64,
    pub marked: bool,
}

/// The base a view is written against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Base {
    /// The token of the version the view was derived from.
    Token(u64),
    /// TEST ONLY `"-"`: the forkable register (set-if-greater; an equal token counts as held
    /// whatever its content).
    Forkable,
}

/// What `view_write.lua` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteReply {
    /// `{1, previous}`: stored, or already held: the node now holds this view (in `"-"` mode:
    /// a view at this token, whatever its content).
    Held { previous: u64 },
    /// `{0, current}`: the node holds a newer view, or a sibling (`current > base`).
    Newer { current: u64 },
    /// `{-2, current}`: another view at this very version: a fork refused.
    Fork { current: u64 },
    /// `{-1, current}`: marker missing or stale.
    Refused { current: u64 },
    /// An error reply: token below 1.
    BadToken,
    /// An error reply: a base that is not below the token.
    BadBase,
}

/// `view_write.lua`, line for line: the token check, the marker check (skipped when
/// `check_marker` is false, the script's `"*"`), the test-only `"-"` mode, the base check,
/// then "already held or a fork" at an equal token, else the compare-and-set on the base.
pub fn view_write(
    reg: &mut ViewRegister,
    token: u64,
    hash: u64,
    base: Base,
    check_marker: bool,
) -> WriteReply {
    if token < 1 {
        return WriteReply::BadToken;
    }
    let current = reg.token;
    if check_marker && !reg.marked {
        return WriteReply::Refused { current };
    }
    let base = match base {
        Base::Forkable => {
            if token > current {
                reg.token = token;
                reg.hash = hash;
            }
            if token >= current {
                return WriteReply::Held { previous: current };
            }
            return WriteReply::Newer { current };
        }
        Base::Token(b) => b,
    };
    if base >= token {
        return WriteReply::BadBase;
    }
    if token == current {
        if reg.hash == hash {
            return WriteReply::Held { previous: current };
        }
        return WriteReply::Fork { current };
    }
    if current <= base {
        reg.token = token;
        reg.hash = hash;
        return WriteReply::Held { previous: current };
    }
    WriteReply::Newer { current }
}

/// One member's acknowledgement field on a node (`rq:ack:<group>`): the highest view token it
/// acknowledged (absent = 0), and its companion `<token>:<digest>` as last written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AckRecord {
    pub token: u64,
    pub companion: Option<(u64, u64)>,
}

/// What `record.lua` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordReply {
    /// `{1, previous}`: the field now holds at least the value (never lowered).
    Recorded { previous: u64 },
    /// `{-1, current}`: marker missing or stale.
    Refused { current: u64 },
}

/// `record.lua`, line for line, for an acknowledgement: raise the field to `token` (never
/// lower it), and set the companion to `(token, digest)` as it is.
pub fn record(
    rec: &mut AckRecord,
    marked: bool,
    token: u64,
    digest: u64,
    check_marker: bool,
) -> RecordReply {
    let current = rec.token;
    if check_marker && !marked {
        return RecordReply::Refused { current };
    }
    if current < token {
        rec.token = token;
    }
    rec.companion = Some((token, digest));
    RecordReply::Recorded { previous: current }
}

/// `acked_members` for one field: the acknowledgement covers the prepared view `token` with
/// content `digest` when it is above it, or this token with no companion for it or the same
/// digest.
pub fn acked(rec: &AckRecord, token: u64, digest: u64) -> bool {
    rec.token > token
        || (rec.token == token
            && rec
                .companion
                .is_none_or(|(t, d)| t != rec.token || d == digest))
}

// ---------------------------------------------------------------------------------------------
// Views and the pure decisions.

/// A view: `assign.rs`'s `View` over two members (an index per member, `None` = not a member).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ViewRec {
    pub term: u8,
    pub seq: u8,
    pub active: bool,
    pub members: [Option<u8>; MEMBERS],
    /// Members (bit mask) of the last active view, which must acknowledge or be gone.
    pub draining: u8,
    /// The last active view's indexes (what `draining` worked under).
    pub previous: [Option<u8>; MEMBERS],
    /// The token of the version this view was derived from.
    pub base: u64,
}

impl ViewRec {
    /// The empty view every group starts from (token 0).
    pub fn empty() -> ViewRec {
        ViewRec {
            term: 0,
            seq: 0,
            active: true,
            members: [None; MEMBERS],
            draining: 0,
            previous: [None; MEMBERS],
            base: 0,
        }
    }

    /// The version as one token, ordered like versions (`term * 2^20 + seq` in the code; here
    /// `term * 16 + seq`, with fewer than 16 views a term).
    pub fn token(&self) -> u64 {
        (u64::from(self.term) << 4) | u64::from(self.seq)
    }

    fn member_mask(&self) -> u8 {
        mask_of(&self.members)
    }

    /// `View::next`: the next view for `live`, sealed in `term`: sticky indexes, prepare,
    /// draining the members of the last ACTIVE view.
    pub fn next(&self, live: u8, term: u8) -> ViewRec {
        let seq = if term == self.term { self.seq + 1 } else { 1 };
        let previous = if self.active {
            self.members
        } else {
            self.previous
        };
        ViewRec {
            term,
            seq,
            active: false,
            members: sticky_indexes(&self.members, live),
            draining: mask_of(&previous),
            previous,
            base: self.token(),
        }
    }

    /// `View::activated`: the same members, active, under a new version.
    pub fn activated(&self, term: u8) -> ViewRec {
        let seq = if term == self.term { self.seq + 1 } else { 1 };
        ViewRec {
            term,
            seq,
            active: true,
            members: self.members,
            draining: 0,
            previous: [None; MEMBERS],
            base: self.token(),
        }
    }

    /// `View::above_attempts`: a sequence number above every one its sealer tried this term.
    pub fn above_attempts(mut self, attempted: Option<(u8, u8)>) -> ViewRec {
        if let Some((_, s)) = attempted.filter(|(t, _)| *t == self.term) {
            self.seq = self.seq.max(s.saturating_add(1));
        }
        self
    }
}

fn mask_of(indexes: &[Option<u8>; MEMBERS]) -> u8 {
    (0..MEMBERS)
        .filter(|&m| indexes[m].is_some())
        .fold(0, |acc, m| acc | (1 << m))
}

/// `sticky_indexes`: a member keeps its index while it is below the new count and free; the
/// others fill the free indexes in ID order.
pub fn sticky_indexes(previous: &[Option<u8>; MEMBERS], members: u8) -> [Option<u8>; MEMBERS] {
    let n = members.count_ones() as u8;
    let mut out = [None; MEMBERS];
    let mut taken = 0u8;
    for m in (0..MEMBERS).filter(|m| members & (1 << m) != 0) {
        if let Some(i) = previous[m] {
            if i < n && taken & (1 << i) == 0 {
                taken |= 1 << i;
                out[m] = Some(i);
            }
        }
    }
    let mut free = (0..n).filter(|i| taken & (1 << i) == 0);
    for m in (0..MEMBERS).filter(|m| members & (1 << m) != 0) {
        if out[m].is_none() {
            out[m] = free.next();
        }
    }
    out
}

/// `View::owner` under `Ownership::Modulo`: the member whose index is `task % replicas`.
pub fn owner(indexes: &[Option<u8>; MEMBERS], task: u8) -> Option<usize> {
    let replicas = indexes.iter().flatten().count() as u8;
    if replicas == 0 {
        return None;
    }
    (0..MEMBERS).find(|&m| indexes[m] == Some(task % replicas))
}

/// `Assignment::covers`: under an active view, the tasks the view gives `m`; under a prepared
/// one, only those both it and the last active view give `m`.
pub fn covers(view: &ViewRec, m: usize, task: u8) -> bool {
    let mine = owner(&view.members, task) == Some(m);
    if view.active {
        mine
    } else {
        mine && owner(&view.previous, task) == Some(m)
    }
}

/// `decide::assignment` (without the clock): `m` holds an assignment under `view` when it has
/// an index in it, its beat validity is running, and the view is active or `m` drains from it.
pub fn has_assignment(view: &ViewRec, m: usize, beat_valid: bool) -> bool {
    view.members[m].is_some() && beat_valid && (view.active || view.draining & (1 << m) != 0)
}

/// `transition_ready`: every draining member acknowledged or is gone.
pub fn transition_ready(view: &ViewRec, acks: u8, gone: u8) -> bool {
    view.draining & !(acks | gone) == 0
}

/// `decide::leader_decision` for a plain group (no lists): `None` when nothing changes.
pub fn leader_decision(
    view: &ViewRec,
    live: u8,
    gone: u8,
    acks: u8,
    term: u8,
    barrier: bool,
) -> Option<ViewRec> {
    let same_members = live == view.member_mask();
    if !view.active {
        if transition_ready(view, acks, gone) {
            return Some(view.activated(term));
        }
        if !same_members {
            return Some(view.next(live, term));
        }
        return None;
    }
    if same_members {
        None
    } else if barrier {
        Some(view.next(live, term))
    } else {
        Some(view.next(live, term).activated(term))
    }
}

// ---------------------------------------------------------------------------------------------
// The model.

/// A protection switched off, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// `GroupOptions::without_barrier_for_tests` (`leader_decision` with `barrier: false`): a
    /// new view is active at once.
    BarrierOff,
    /// `GroupOptions::with_forkable_views_for_tests`: `view_write.lua`'s `"-"` base
    /// (set-if-greater, an equal token counts as held) and a sealer that reuses a version
    /// after a seal that reached only some nodes.
    ForkableRegister,
    /// A reader adopts the view a majority named without writing it back first.
    NoWriteBack,
    /// A membership validity longer than the leader's watch window (`validity = window + 1`):
    /// the drift margins taken the wrong way round.
    ValidityBeyondWindow,
}

/// The bounds of one exploration.
#[derive(Clone, Debug)]
pub struct ViewModel {
    /// Ticks of real time explored (`now` runs from 0 to `horizon`).
    pub horizon: u8,
    /// A member's validity after the send of a beat a majority applied, in ticks.
    pub validity: u8,
    /// How long the leader must see a beat unchanged before it judges the member gone.
    pub window: u8,
    /// Leader steps that seal a view, in all.
    pub seals: u8,
    /// Leader elections after the first (each deposes the current leader).
    pub elections: u8,
    /// Seals the network may lose, in all.
    pub losses: u8,
    /// Node crashes (each may restart), in all.
    pub crashes: u8,
    /// Node wipes, in all.
    pub wipes: u8,
    /// FLUSHALLs, in all (the node loses every key, its marker included, and keeps running).
    pub flushes: u8,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
}

impl ViewModel {
    /// CI bounds for the network: A in the first view and B joining, one tick of real time
    /// (validity = window = 1 tick), two seals, one lost seal, and a second leader term (the
    /// deposed leader's seals still in flight). Measured: 1,393,390 distinct states
    /// (15.8 million generated), complete, 22 s on 2 threads (dev profile) alone, 33 s beside
    /// another check in `cargo test`.
    pub fn ci() -> Self {
        ViewModel {
            horizon: 1,
            validity: 1,
            window: 1,
            seals: 2,
            elections: 1,
            losses: 1,
            crashes: 0,
            wipes: 0,
            flushes: 0,
            bug: None,
        }
    }

    /// CI bounds for a crash: the same cast, one node crash (and restart with its data), no
    /// other fault. Measured: 1,747,707 distinct states (15.0 million generated), complete,
    /// 19 s on 2 threads alone, 35 s beside another check.
    pub fn ci_crash() -> Self {
        ViewModel {
            elections: 0,
            losses: 0,
            crashes: 1,
            ..ViewModel::ci()
        }
    }

    /// CI bounds for amnesia: one node wipe with its quarantine and repair, no other fault.
    /// Measured: 808,028 distinct states (9.0 million generated), complete, 10 s on 2 threads
    /// alone, 18 s beside another check.
    pub fn ci_amnesia() -> Self {
        ViewModel {
            elections: 0,
            losses: 0,
            wipes: 1,
            ..ViewModel::ci()
        }
    }

    /// CI bounds for FLUSHALL: one flush with its quarantine and repair, no other fault (the
    /// amnesia set with a flush for the wipe; in this model a flush is observably a wipe, see
    /// the module docs, and the two sets explore the same 808,028 distinct states; with a crash
    /// as well, 17,177,037 distinct states took 148 s: not for CI).
    pub fn ci_flush() -> Self {
        ViewModel {
            elections: 0,
            losses: 0,
            flushes: 1,
            ..ViewModel::ci()
        }
    }

    /// The bounds the planted bugs are checked in: one tick, two seals, two lost seals (a
    /// seal that reaches one node only, which the forkable register needs). Passing without a
    /// bug: 591,400 distinct states, 6 s on 2 threads. With a bug the exploration runs to its
    /// end too (the property that holds is never discovered): 0.4 to 13 s each.
    pub fn planted() -> Self {
        ViewModel {
            elections: 0,
            losses: 2,
            ..ViewModel::ci()
        }
    }

    /// Larger bounds (`rq-model --deep`): every fault of the CI bound sets at once (a lost
    /// seal, a second term, a crash, a wipe). Not exhausted on CI hardware: after 25 million
    /// states (5,632,652 distinct, 33 s on 2 threads) it was still going, with no violation
    /// found; a run stopped after about 200 s had reached 11 GB of memory.
    pub fn deep() -> Self {
        ViewModel {
            crashes: 1,
            wipes: 1,
            ..ViewModel::ci()
        }
    }

    /// The same bounds with `bug` planted.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        if bug == Bug::ValidityBeyondWindow {
            self.validity = self.window + 1;
        }
        self
    }

    fn forkable(&self) -> bool {
        self.bug == Some(Bug::ForkableRegister)
    }
}

/// A leader's seal in flight: `view_write.lua` of view `view` on `node`, by the leader of
/// term `term`. (Members' writes land within their step: see the actions.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seal {
    pub node: u8,
    pub view: u8,
    pub term: u8,
}

/// A member's beat entry on a node: present or absent, and the tick it last changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BeatEntry {
    pub present: bool,
    pub since: u8,
}

/// A node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The id of the view it holds (0: none).
    pub view: u8,
    pub marked: bool,
    pub up: bool,
    pub beats: [BeatEntry; MEMBERS],
    pub acks: [AckRecord; MEMBERS],
}

/// Where a member's loop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    /// It read `view` from a majority (with the validity snapshotted before the read) and is
    /// writing it back.
    WritingBack {
        snapshot: Option<u8>,
        view: u8,
    },
    /// It adopted the prepared `view`, drains from it, and is acknowledging it.
    Acking {
        view: u8,
    },
}

/// A member process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// The view it adopted (0: none yet).
    pub view: u8,
    /// Its published assignment: the view and the end of its validity.
    pub assignment: Option<(u8, u8)>,
    /// The end of the validity of its last beat a majority applied (`None` once passed).
    pub beat_until: Option<u8>,
    /// The tick of its latest beat.
    pub beat: Option<u8>,
    /// The last prepared view it acknowledged.
    pub acked: u8,
    pub phase: Phase,
}

/// The leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Leader {
    pub term: u8,
    /// The highest version it tried to seal in its term.
    pub attempted: Option<(u8, u8)>,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupState {
    pub now: u8,
    /// Every view sealed so far, by id (0: the empty view; 1: the first view).
    pub views: Vec<ViewRec>,
    pub nodes: Vec<Node>,
    pub members: Vec<Member>,
    pub leader: Leader,
    /// Ghost: the views (bit mask of ids) some member adopted, and whether a member adopted a
    /// view whose version is not above the one it held, or a view whose version names another
    /// adopted view.
    pub adopted: u16,
    pub out_of_order: bool,
    /// Seals in flight, sorted (a multiset).
    pub net: Vec<Seal>,
    pub seals: u8,
    pub elections: u8,
    pub losses: u8,
    pub crashes: u8,
    pub wipes: u8,
    pub flushes: u8,
}

/// What the leader saw and did in one step (carried by the action, for a readable trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaderStep {
    pub term: u8,
    /// The majority it read (bit mask).
    pub read: u8,
    /// The view it read and wrote back.
    pub current: u8,
    pub live: u8,
    pub gone: u8,
    pub acks: u8,
    /// The id of the view it seals, and the view.
    pub seals: u8,
    pub view: ViewRec,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Real time advances one tick.
    Tick,
    /// A member beats (`member_beat.lua`); the beat lands on the nodes in the mask (to the
    /// others it is lost), and counts if a majority applied it.
    Beat(u8, u8),
    /// A member starts a round: it snapshots its validity, then reads the view from the
    /// majority in the mask and takes the highest.
    Round(u8, u8),
    /// The member's write-back (`view_write.lua`) lands on the nodes in the mask (the others'
    /// are lost or given up); with a majority holding the view, the member adopts it and
    /// publishes its assignment.
    WriteBack(u8, u8),
    /// A member that drains from the prepared view it adopted (its assignment narrowed) has its
    /// acknowledgement (`record.lua`) land on the nodes in the mask.
    Ack(u8, u8),
    /// The network delivers a seal.
    Deliver(Seal),
    /// The network loses a seal.
    Lose(Seal),
    /// The leader's step.
    Lead(LeaderStep),
    /// A new leader is elected, with the next term; the old one is deposed.
    Elect,
    Crash(u8),
    Restart(u8),
    Wipe(u8),
    /// FLUSHALL: a running node loses every key, its marker included (quarantined).
    Flush(u8),
    /// The repair reads the nodes in the mask and copies onto the node, then marks it.
    Repair(u8, u8),
}

fn name(m: u8) -> char {
    (b'A' + m) as char
}

fn members_of(mask: u8) -> String {
    let names: Vec<String> = (0..MEMBERS as u8)
        .filter(|m| mask & (1 << m) != 0)
        .map(|m| name(m).to_string())
        .collect();
    format!("{{{}}}", names.join(", "))
}

fn nodes_of(mask: u8) -> String {
    let names: Vec<String> = (0..NODES as u8)
        .filter(|n| mask & (1 << n) != 0)
        .map(|n| n.to_string())
        .collect();
    format!("[{}]", names.join(", "))
}

impl fmt::Display for ViewRec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let idx = |ix: &[Option<u8>; MEMBERS]| {
            let parts: Vec<String> = (0..MEMBERS)
                .filter_map(|m| ix[m].map(|i| format!("{}:{i}", name(m as u8))))
                .collect();
            format!("{{{}}}", parts.join(", "))
        };
        write!(
            f,
            "({},{}) {} {}",
            self.term,
            self.seq,
            if self.active { "active" } else { "prepare" },
            idx(&self.members)
        )?;
        if !self.active {
            write!(f, " draining {}", members_of(self.draining))?;
        }
        Ok(())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Tick => write!(f, "a tick of real time passes"),
            Action::Beat(m, on) => write!(f, "member {} beats; nodes {} apply it", name(m), nodes_of(on)),
            Action::Round(m, read) => write!(
                f,
                "member {} snapshots its validity and reads the view from nodes {}",
                name(m),
                nodes_of(read)
            ),
            Action::WriteBack(m, on) => write!(
                f,
                "member {}'s write-back of that view lands on nodes {}",
                name(m),
                nodes_of(on)
            ),
            Action::Ack(m, on) => write!(
                f,
                "member {} drains and its acknowledgement lands on nodes {}",
                name(m),
                nodes_of(on)
            ),
            Action::Deliver(Seal { node, view, term }) => write!(
                f,
                "node {node} applies the term-{term} leader's seal of view #{view}"
            ),
            Action::Lose(Seal { node, view, term }) => write!(
                f,
                "the network loses the term-{term} leader's seal of view #{view} to node {node}"
            ),
            Action::Lead(s) => write!(
                f,
                "the term-{} leader reads nodes {} and writes back view #{} there, judges live {} and gone {}, sees acknowledgements from {}, and seals view #{} = {}",
                s.term,
                nodes_of(s.read),
                s.current,
                members_of(s.live),
                members_of(s.gone),
                members_of(s.acks),
                s.seals,
                s.view
            ),
            Action::Elect => write!(
                f,
                "a new leader is elected with the next term (the old one is deposed)"
            ),
            Action::Crash(n) => write!(f, "node {n} crashes"),
            Action::Restart(n) => write!(f, "node {n} restarts with its data"),
            Action::Wipe(n) => write!(f, "node {n} loses its data and restarts empty"),
            Action::Flush(n) => write!(f, "FLUSHALL on node {n} (every key lost, still running)"),
            Action::Repair(n, from) => write!(
                f,
                "the repair reads nodes {}, copies onto node {n} and marks it",
                nodes_of(from)
            ),
        }
    }
}

/// Every subset (bit mask) of the nodes in `of`.
fn subsets(of: u8) -> impl Iterator<Item = u8> {
    (0u8..(1 << NODES)).filter(move |m| m & !of == 0)
}

fn nodes_in(mask: u8) -> impl Iterator<Item = usize> {
    (0..NODES).filter(move |n| mask & (1 << n) != 0)
}

impl ViewModel {
    fn register(&self, s: &GroupState, n: usize) -> ViewRegister {
        let node = &s.nodes[n];
        ViewRegister {
            token: s.views[node.view as usize].token(),
            hash: u64::from(node.view),
            marked: node.marked,
        }
    }

    /// `view_write.lua` of view `view` on node `n`, as the code calls it (with its base, or
    /// `"-"` in the forkable register; the marker checked unless `check_marker` is false).
    fn write(&self, s: &mut GroupState, n: usize, view: u8, check_marker: bool) -> WriteReply {
        let mut reg = self.register(s, n);
        let v = s.views[view as usize];
        let base = if self.forkable() {
            Base::Forkable
        } else {
            Base::Token(v.base)
        };
        let reply = view_write(&mut reg, v.token(), u64::from(view), base, check_marker);
        s.nodes[n].view = reg.hash as u8;
        reply
    }

    /// The view a set of answers names (`register::pick`): the highest version; `None` for
    /// two different views at one version.
    fn pick(s: &GroupState, answers: impl Iterator<Item = u8>) -> Option<u8> {
        let mut best: u8 = 0;
        for v in answers {
            let (t, b) = (s.views[v as usize].token(), s.views[best as usize].token());
            if t == b && v != best {
                return None;
            }
            if t > b {
                best = v;
            }
        }
        Some(best)
    }

    fn up(s: &GroupState) -> u8 {
        (0..NODES)
            .filter(|&n| s.nodes[n].up)
            .fold(0, |acc, n| acc | (1 << n))
    }

    /// Every majority of voting (up and marked) nodes (bit masks of exactly `NEEDED` nodes).
    fn majorities(s: &GroupState) -> Vec<u8> {
        let voting = (0..NODES)
            .filter(|&n| s.nodes[n].up && s.nodes[n].marked)
            .fold(0, |acc, n| acc | (1 << n));
        subsets(voting)
            .filter(|m| m.count_ones() == NEEDED)
            .collect()
    }

    /// The leader's step on the majority `read`, if it seals something.
    fn leader_step(&self, s: &GroupState, read: u8) -> Option<LeaderStep> {
        if s.seals >= self.seals {
            return None;
        }
        // It waits for its last seal: every copy delivered or lost (then it reads again).
        if s.net.iter().any(|seal| seal.term == s.leader.term) {
            return None;
        }
        let current = Self::pick(s, nodes_in(read).map(|n| s.nodes[n].view))?;
        // `read_adopted`: the write-back must hold on both nodes read.
        if current != 0 {
            let mut probe = s.clone();
            for n in nodes_in(read) {
                if !matches!(
                    self.write(&mut probe, n, current, true),
                    WriteReply::Held { .. }
                ) {
                    return None;
                }
            }
        }
        let view = s.views[current as usize];
        let term = s.leader.term;
        if term < view.term {
            return None; // a newer leader sealed this view: deposed
        }
        // `judge_members`: present on a node read, or named by the view; gone when unchanged
        // on every node read for the window.
        let in_view = mask_of(&view.members) | view.draining;
        let mut present = 0u8;
        let mut gone = 0u8;
        for m in 0..MEMBERS {
            if nodes_in(read).any(|n| s.nodes[n].beats[m].present) {
                present |= 1 << m;
            }
            let unchanged = nodes_in(read)
                .filter(|&n| s.now.saturating_sub(s.nodes[n].beats[m].since) >= self.window)
                .count() as u32;
            if (in_view | present) & (1 << m) != 0 && unchanged >= NEEDED {
                gone |= 1 << m;
            }
        }
        let live = (present | in_view) & !gone;
        // `acknowledged`: on any node read.
        let mut acks = 0u8;
        if !view.active {
            for m in 0..MEMBERS {
                if nodes_in(read)
                    .any(|n| acked(&s.nodes[n].acks[m], view.token(), u64::from(current)))
                {
                    acks |= 1 << m;
                }
            }
        }
        let barrier = self.bug != Some(Bug::BarrierOff);
        let next = leader_decision(&view, live, gone, acks, term, barrier)?;
        // `ViewRegister::seal`: above every version tried this term (not in the forkable one).
        let next = if self.forkable() {
            next
        } else {
            next.above_attempts(s.leader.attempted)
        };
        let seals = match s.views.iter().position(|v| *v == next) {
            Some(i) => i as u8,
            None => s.views.len() as u8,
        };
        Some(LeaderStep {
            term,
            read,
            current,
            live,
            gone,
            acks,
            seals,
            view: next,
        })
    }

    /// The member adopts `view` (read with the validity `snapshot`): publish its assignment;
    /// drain and acknowledge if it drains from it (`starts_drain`).
    fn adopt(&self, s: &mut GroupState, m: usize, view: u8, snapshot: Option<u8>) {
        let now = s.now;
        let v = s.views[view as usize];
        // The order of adoptions (ghost state): a member's versions must increase, and one
        // version must name one adopted view.
        let held = s.members[m].view;
        if view != held {
            if s.views[held as usize].token() >= v.token() {
                s.out_of_order = true;
            }
            let token = v.token();
            if (0..s.views.len()).any(|w| {
                s.adopted & (1 << w) != 0 && w != view as usize && s.views[w].token() == token
            }) {
                s.out_of_order = true;
            }
            s.adopted |= 1 << view;
        }
        let member = &mut s.members[m];
        member.view = view;
        let valid = snapshot.filter(|u| *u > now);
        member.assignment = if has_assignment(&v, m, valid.is_some()) {
            valid.map(|u| (view, u))
        } else {
            None
        };
        member.phase = if !v.active && v.draining & (1 << m) != 0 && member.acked != view {
            Phase::Acking { view }
        } else {
            Phase::Idle
        };
    }

    /// Canonical form: validities that have passed are forgotten, and a beat entry's age
    /// counts only up to the window.
    fn canonical(&self, s: &mut GroupState) {
        let now = s.now;
        let passed = |u: &mut Option<u8>| {
            if u.is_some_and(|u| u <= now) {
                *u = None;
            }
        };
        for member in s.members.iter_mut() {
            passed(&mut member.beat_until);
            if member.beat.is_some_and(|at| at < now) {
                member.beat = None; // only "beat this tick" matters
            }
            if member.assignment.is_some_and(|(_, u)| u <= now) {
                member.assignment = None;
            }
            if let Phase::WritingBack { snapshot, .. } = &mut member.phase {
                passed(snapshot);
            }
        }
        // A seal that can no longer change its node is dropped: a marked node's token only
        // grows (no wipe is left), so once it is above the seal's base (or, in the forkable
        // register, at the seal's token) the seal is refused or a no-op forever.
        if s.wipes >= self.wipes && s.flushes >= self.flushes {
            let forkable = self.forkable();
            let (views, nodes) = (&s.views, &s.nodes);
            s.net.retain(|seal| {
                let node = &nodes[seal.node as usize];
                let current = views[node.view as usize].token();
                let v = views[seal.view as usize];
                !node.marked
                    || if forkable {
                        current < v.token()
                    } else {
                        current <= v.base
                    }
            });
        }
        let floor = now.saturating_sub(self.window);
        for node in s.nodes.iter_mut() {
            for b in node.beats.iter_mut() {
                b.since = b.since.max(floor);
            }
        }
    }

    /// The repair's copy onto node `n` from the nodes in `from`, unless the newest view of the
    /// sources has a sibling there (`plan::newest_has_sibling`: the repair then waits).
    fn repaired(&self, s: &GroupState, n: usize, from: u8) -> Option<GroupState> {
        let held: Vec<u8> = nodes_in(from).map(|o| s.nodes[o].view).collect();
        let newest = *held.iter().max_by_key(|v| s.views[**v as usize].token())?;
        let nv = s.views[newest as usize];
        let sibling = held.iter().any(|&v| {
            let w = s.views[v as usize];
            v != 0 && w.token() != nv.token() && w.base == nv.base
        });
        if newest != 0 && sibling {
            return None;
        }
        let mut t = s.clone();
        if newest != 0 {
            // The view register's own compare-and-set on the base, with "*" (unmarked node).
            self.write(&mut t, n, newest, false);
        }
        for m in 0..MEMBERS {
            // Beats: copied where the node has none. Acknowledgements: the highest field; a
            // companion where the node has none.
            if !t.nodes[n].beats[m].present && nodes_in(from).any(|o| s.nodes[o].beats[m].present) {
                t.nodes[n].beats[m] = BeatEntry {
                    present: true,
                    since: s.now,
                };
            }
            let highest = nodes_in(from)
                .map(|o| s.nodes[o].acks[m].token)
                .max()
                .unwrap_or(0);
            let rec = &mut t.nodes[n].acks[m];
            rec.token = rec.token.max(highest);
            if rec.companion.is_none() {
                rec.companion = nodes_in(from).find_map(|o| s.nodes[o].acks[m].companion);
            }
        }
        t.nodes[n].marked = true;
        Some(t)
    }
}

impl Model for ViewModel {
    type State = GroupState;
    type Action = Action;

    fn init_states(&self) -> Vec<GroupState> {
        let first = ViewRec {
            term: 1,
            seq: 1,
            active: true,
            members: [Some(0), None],
            draining: 0,
            previous: [None; MEMBERS],
            base: 0,
        };
        let beat = |present| BeatEntry { present, since: 0 };
        let node = Node {
            view: FIRST_VIEW,
            marked: true,
            up: true,
            beats: [beat(true), beat(false)],
            acks: [AckRecord::default(); MEMBERS],
        };
        let a = Member {
            view: FIRST_VIEW,
            assignment: Some((FIRST_VIEW, self.validity)),
            beat_until: Some(self.validity),
            beat: Some(0),
            acked: 0,
            phase: Phase::Idle,
        };
        let b = Member {
            view: 0,
            assignment: None,
            beat_until: None,
            beat: None,
            acked: 0,
            phase: Phase::Idle,
        };
        vec![GroupState {
            now: 0,
            views: vec![ViewRec::empty(), first],
            nodes: vec![node; NODES],
            members: vec![a, b],
            adopted: 1 << FIRST_VIEW,
            out_of_order: false,
            leader: Leader {
                term: 1,
                attempted: Some((1, 1)),
            },
            net: Vec::new(),
            seals: 0,
            elections: 0,
            losses: 0,
            crashes: 0,
            wipes: 0,
            flushes: 0,
        }]
    }

    fn actions(&self, s: &GroupState, out: &mut Vec<Action>) {
        if s.now < self.horizon {
            out.push(Action::Tick);
        }
        let up = Self::up(s);
        for (m, member) in s.members.iter().enumerate() {
            let m8 = m as u8;
            if member.beat.is_none_or(|at| at < s.now) {
                // On every node that is up (a beat lost everywhere is a beat not sent; one that
                // lands on a majority is, for every majority the leader reads, the same as one
                // that lands on all; a beat on a minority only is not explored).
                out.push(Action::Beat(m8, up));
            }
            match member.phase {
                Phase::Idle => {
                    for read in Self::majorities(s) {
                        if Self::pick(s, nodes_in(read).map(|n| s.nodes[n].view)).is_some() {
                            out.push(Action::Round(m8, read));
                        }
                    }
                }
                Phase::WritingBack { .. } => {
                    // On a majority or more (a write-back on one node only is not explored),
                    // or on none (lost, or given up).
                    for on in subsets(up).filter(|on| *on == 0 || on.count_ones() >= NEEDED) {
                        out.push(Action::WriteBack(m8, on));
                    }
                }
                Phase::Acking { .. } => {
                    // On every node up, or on none (an acknowledgement on some nodes only is
                    // not explored).
                    out.push(Action::Ack(m8, up));
                    out.push(Action::Ack(m8, 0));
                }
            }
        }
        let mut last: Option<&Seal> = None;
        for seal in &s.net {
            if last != Some(seal) {
                out.push(Action::Deliver(*seal));
                if s.losses < self.losses {
                    out.push(Action::Lose(*seal));
                }
            }
            last = Some(seal);
        }
        for read in Self::majorities(s) {
            if let Some(step) = self.leader_step(s, read) {
                out.push(Action::Lead(step));
            }
        }
        if s.elections < self.elections {
            out.push(Action::Elect);
        }
        for (n, node) in s.nodes.iter().enumerate() {
            let n8 = n as u8;
            if node.up && s.crashes < self.crashes {
                out.push(Action::Crash(n8));
            }
            if !node.up {
                out.push(Action::Restart(n8));
            }
            if node.up && s.wipes < self.wipes {
                out.push(Action::Wipe(n8));
            }
            if node.up && s.flushes < self.flushes {
                out.push(Action::Flush(n8));
            }
            if node.up && !node.marked {
                // A majority of the OTHER voting nodes.
                for from in Self::majorities(s) {
                    if from & (1 << n) == 0 && self.repaired(s, n, from).is_some() {
                        out.push(Action::Repair(n8, from));
                    }
                }
            }
        }
    }

    fn next_state(&self, s: &GroupState, action: Action) -> Option<GroupState> {
        let mut s = s.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Beat(m, on) => {
                let now = s.now;
                let mut applied = 0;
                for n in nodes_in(on) {
                    // member_beat.lua, mode "0": the marker check, then set.
                    if s.nodes[n].marked {
                        s.nodes[n].beats[m as usize] = BeatEntry {
                            present: true,
                            since: now,
                        };
                        applied += 1;
                    }
                }
                let member = &mut s.members[m as usize];
                member.beat = Some(now);
                if applied >= NEEDED {
                    let until = now + self.validity;
                    if member.beat_until.is_none_or(|u| u < until) {
                        member.beat_until = Some(until);
                    }
                }
            }
            Action::Round(m, read) => {
                let snapshot = s.members[m as usize].beat_until;
                let view = Self::pick(&s, nodes_in(read).map(|n| s.nodes[n].view))?;
                if view == 0 || self.bug == Some(Bug::NoWriteBack) {
                    // No view yet: `View::empty()`, nothing to write back.
                    self.adopt(&mut s, m as usize, view, snapshot);
                } else {
                    s.members[m as usize].phase = Phase::WritingBack { snapshot, view };
                }
            }
            Action::WriteBack(m, on) => {
                let Phase::WritingBack { snapshot, view } = s.members[m as usize].phase else {
                    return None;
                };
                let mut held = 0;
                for n in nodes_in(on) {
                    if matches!(self.write(&mut s, n, view, true), WriteReply::Held { .. }) {
                        held += 1;
                    }
                }
                if held >= NEEDED {
                    self.adopt(&mut s, m as usize, view, snapshot);
                } else {
                    s.members[m as usize].phase = Phase::Idle;
                }
            }
            Action::Ack(m, on) => {
                let Phase::Acking { view } = s.members[m as usize].phase else {
                    return None;
                };
                let token = s.views[view as usize].token();
                let mut recorded = 0;
                for n in nodes_in(on) {
                    let node = &mut s.nodes[n];
                    let reply = record(
                        &mut node.acks[m as usize],
                        node.marked,
                        token,
                        u64::from(view),
                        true,
                    );
                    if matches!(reply, RecordReply::Recorded { .. }) {
                        recorded += 1;
                    }
                }
                if recorded >= NEEDED {
                    s.members[m as usize].acked = view;
                }
                s.members[m as usize].phase = Phase::Idle;
            }
            Action::Deliver(seal) => {
                let i = s.net.iter().position(|x| *x == seal)?;
                s.net.remove(i);
                if s.nodes[seal.node as usize].up {
                    self.write(&mut s, seal.node as usize, seal.view, true);
                }
            }
            Action::Lose(seal) => {
                let i = s.net.iter().position(|x| *x == seal)?;
                s.net.remove(i);
                s.losses += 1;
            }
            Action::Lead(step) => {
                // The write-back on the nodes read (it holds on both: `leader_step`).
                if step.current != 0 {
                    for n in nodes_in(step.read) {
                        self.write(&mut s, n, step.current, true);
                    }
                }
                if step.seals as usize == s.views.len() {
                    s.views.push(step.view);
                }
                s.seals += 1;
                let v = step.view;
                if s.leader.attempted.is_none_or(|a| a < (v.term, v.seq)) {
                    s.leader.attempted = Some((v.term, v.seq));
                }
                for n in nodes_in(Self::up(&s)) {
                    s.net.push(Seal {
                        node: n as u8,
                        view: step.seals,
                        term: step.term,
                    });
                }
                s.net.sort();
            }
            Action::Elect => {
                s.elections += 1;
                s.leader = Leader {
                    term: s.leader.term + 1,
                    attempted: None,
                };
            }
            Action::Crash(n) => {
                s.nodes[n as usize].up = false;
                s.crashes += 1;
                s.net.retain(|seal| seal.node != n);
            }
            Action::Restart(n) => {
                let now = s.now;
                let node = &mut s.nodes[n as usize];
                node.up = true;
                // A new run_id: every watch of this node restarts.
                for b in node.beats.iter_mut() {
                    b.since = now;
                }
            }
            Action::Wipe(n) | Action::Flush(n) => {
                s.nodes[n as usize] = Node {
                    view: 0,
                    marked: false,
                    up: true,
                    beats: [BeatEntry {
                        present: false,
                        since: s.now,
                    }; MEMBERS],
                    acks: [AckRecord::default(); MEMBERS],
                };
                if let Action::Flush(_) = action {
                    // The node keeps running, so seals in flight to it still land: refused
                    // (before its repair for its missing marker, after it for the new epoch
                    // the repair writes into the marker), so changing nothing: dropped now.
                    s.flushes += 1;
                } else {
                    s.wipes += 1;
                }
                s.net.retain(|seal| seal.node != n);
            }
            Action::Repair(n, from) => s = self.repaired(&s, n as usize, from)?,
        }
        self.canonical(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(OWNERS, |_, s: &GroupState| {
                (0..TASKS).all(|t| owners(s, t).count_ones() <= 1)
            }),
            Property::always(ORDER, |_, s: &GroupState| !s.out_of_order),
            Property::sometimes(MOVED, |_, s: &GroupState| {
                s.members.iter().any(|m| {
                    m.assignment
                        .is_some_and(|(v, _)| v > FIRST_VIEW && s.views[v as usize].active)
                })
            }),
        ]
    }
}

/// The property: at no tick is a task covered by the published assignments of two members
/// whose validity is running.
pub const OWNERS: &str = "no task has two owners";
/// The property: views are adopted in one order. Checked as: every member adopts views of
/// increasing versions, and one version names one adopted view. Together these put every
/// member's adoptions in the order of the versions, so no two members adopt two views in
/// opposite orders (and no member adopts `x`, `y`, then `x` again); the check is stronger than
/// that (a fork adopted by two members fails it even before anyone adopts both sides).
pub const ORDER: &str = "views are adopted in one order";
/// The `sometimes` property: a view sealed after the first becomes active and a member owns a
/// task under it.
pub const MOVED: &str = "a new view becomes active and a member owns a task under it";

/// The members (bit mask) that own `task` now: a published assignment covering it whose
/// validity is running.
pub fn owners(s: &GroupState, task: u8) -> u8 {
    s.members
        .iter()
        .enumerate()
        .filter(|(m, member)| {
            member
                .assignment
                .is_some_and(|(v, until)| s.now < until && covers(&s.views[v as usize], *m, task))
        })
        .fold(0, |acc, (m, _)| acc | (1 << m))
}
