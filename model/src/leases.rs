//! Fenced leases: Redlock without server-side expiry, a fencing token minted inside each
//! grant, takeover only after watching the holder's value unchanged, extension, release, and
//! quarantine and repair of a node that restarted or lost its data.
//!
//! Mirrors: the node steps `src/scripts/lock_acquire.lua` ([`lock_acquire`]),
//! `lock_extend.lua` ([`lock_extend`]), `lock_release.lua` ([`lock_release`] in modes `"fold"`
//! and `"keep"`, [`lock_collect`] in mode `"collect"`, [`lock_undo`] in mode `"undo"`, a round's
//! undo: a rollback to the fence key the grant recorded in the copy's `p` where the grant is
//! untouched, a fold elsewhere), the repair's `restore.lua` lease mode
//! ([`restore_lease`]) and the resource guard `fenced_set.lua` ([`fenced_set`]), each compared
//! with the real script on a real node by `tests/conformance_leases.rs`; the client's rounds in
//! `src/lock/acquire.rs` (plan from the watch as `lease::plan_with`, learn from the replies,
//! release a round that was not granted), the extension verdict of `lease::judge_extension`,
//! the release modes of `src/lock/fold.rs` (a holder's release keeps or folds the fence key, a
//! round's undo rolls back or folds it, `src/lock/undo.rs`; a client that kept one owes a collect, sent later to every voting
//! node), and the repair in `src/repair/` (raise the fence to the highest a majority of the
//! *other* marked nodes hold, restore the lease copy where the node has none and its fence
//! allows (the sources' value if they agree, a blocker `v0` that no client holds if they
//! disagree: [`restored_copy`]), then mark).
//!
//! Explored: every interleaving of two (or three) clients' acquisition rounds, extensions,
//! fenced writes, releases (a holder's in either mode) and collects (up to `collects`), the
//! delivery of every request in any order, lost requests and lost replies, a client that
//! decides a round with only some replies in (its timeout, or a pause), node crash and restart
//! (data kept; the restarted node is quarantined until a repair marks it, as its run_id
//! changed), node wipe (restarts empty and unmarked), FLUSHALL (a running node loses every key,
//! its marker included, and keeps its run_id; requests in flight to it still land on it and
//! are refused), and repair.
//!
//! **Time as bounded-drift steps.** Real time advances only by `Tick`, without a horizon: every
//! time in the state is relative (ticks of validity left, ticks a value has been watched),
//! clamped where only a comparison matters, so unbounded time has finitely many states. A
//! holder's validity runs `validity` ticks from the *send* of its last write a
//! majority applied; a watcher may swap a held key only after seeing it unchanged for `window`
//! ticks from the *receipt* of the first reply that showed it. The library's margins
//! (`src/lease/mod.rs`: validity `ttl - drift`, window `ttl + drift`, drift = 1 % + 2 ms, for
//! clock rates within 0.5 % of real time) make the holder's longest validity in real time at
//! most the watcher's shortest window; the model gives every holder that longest validity and
//! every watcher that shortest window (`validity == window`), the extremes of any drift within
//! the bound, so a violation under any allowed drift shows here. The planted bug
//! [`Bug::NoDriftMargin`] gives the holder one tick more than the watcher waits.
//!
//! Properties: at most one valid holder at any tick; tokens increase with real time (every
//! grant's token is above every earlier grant's); no stale fenced write accepted (the resource
//! never accepts a write of a lease granted before one whose write it already accepted).
//!
//! Abstractions, stated: one lock name (its fence key and its floor bucket are modelled; the
//! old single floor, never written any more, is 0); a round proposes just above the highest fence known (the real client adds a random spread on a
//! retry, which only raises the token); a node's reply reaches its client in the step that
//! applies the request (a slow reply is a client deciding without it); a grant is kept if any
//! validity is left when it is decided (the real client asks for half the TTL: fewer grants);
//! a client that kept a fence may collect it at any time after (the real one waits until its
//! handle released nothing for `HOT_WINDOW`: a subset); a repair is one step (so no collect
//! falls between its raise and its restore: the real collect's marker check refuses a node
//! under repair), and a request sent before a wipe is given up by its client when the
//! repair of that node reads (the real repair waits one node timeout, the longest a client
//! counts a reply); the resource (the fenced store) does not fail. Because the repair is one
//! step, a FLUSHALL of one of its *sources* never falls between its reads and its mark (the
//! copy model, `copy.rs`, explores that interleaving for the register a node-list change
//! copies; the real copy reads every source behind its census incarnation). A node's `run`
//! stands for its incarnation, `<run_id>.<epoch>` in the real marker: a FLUSHALL keeps the
//! run_id, but the repair that follows writes a new epoch, so the model gives the flushed node
//! a new `run` at once (every expectation and watch of the old incarnation is refused or
//! restarted, as the real client's are).

use std::fmt;

use stateright::{Model, Property, Representative};

use crate::symmetry::{ranks, remap_mask};

/// A lease copy on one node (`rq:lock:<name>`: value, version; the token is part of the value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The acquisition round's value (fresh for every round).
    pub value: u8,
    /// The fencing token inside the value.
    pub token: u8,
    /// Raised by every extension.
    pub version: u8,
}

/// What one node stores for the lock (kept across a crash: AOF `appendfsync always`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Data {
    /// The lease copy, if any.
    pub key: Option<Key>,
    /// The lock's fence key (`rq:fence:<name>`): the token of its latest grant here; deleted
    /// (0) by a release, which first raises the floor to it.
    pub fence: u8,
    /// The lock's fence floor bucket (`rq:floor:<bucket>`; the old single floor is never
    /// written any more, so it is 0 here).
    pub floor: u8,
    /// The run_id the node was last verified on (`rq:marker`), lost with the data.
    pub marker: Option<u8>,
    /// The copy's field `p`: the fence key before the grant that wrote the copy (0: none),
    /// written only by `lock_acquire.lua` ([`lock_acquire`]); `None` without a copy, and on a
    /// copy re-created by an extension or restored by a repair. A round's undo rolls back to it
    /// ([`lock_undo`]).
    pub prev: Option<u8>,
}

/// What the node is asked to grant on (`lock_acquire.lua`'s mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ask {
    /// `"absent"`: grant only if there is no key.
    Absent,
    /// `"swap"`: grant only if the key is exactly this value at this version.
    Swap { value: u8, version: u8 },
    /// `"read"`: change nothing.
    Read,
}

/// `lock_acquire.lua`'s status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// 1: granted.
    Granted,
    /// 0: the key is not as expected (or a read).
    NotAsExpected,
    /// -2: as expected, but the fence is at or above the token.
    TokenLow,
    /// -1: marker missing or stale.
    Refused,
}

/// `lock_acquire.lua`'s reply: the status, the fence before the call, the key before the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    pub status: Status,
    pub fence: u8,
    pub key: Option<Key>,
}

/// `lock_acquire.lua`, line for line: read the fence and the key, check the marker (`None` is
/// the script's `"*"`), compare the key with the ask, check the token against the fence, then
/// grant (key at version 1, fence = token).
pub fn lock_acquire(d: &mut Data, value: u8, token: u8, expect: Option<u8>, ask: Ask) -> Grant {
    let fence = d.fence.max(d.floor);
    let key = d.key;
    if expect.is_some() && d.marker != expect {
        return Grant {
            status: Status::Refused,
            fence,
            key,
        };
    }
    let expected = match ask {
        Ask::Absent => key.is_none(),
        Ask::Swap {
            value: v,
            version: n,
        } => key.is_some_and(|k| k.value == v && k.version == n),
        Ask::Read => false,
    };
    if !expected {
        return Grant {
            status: Status::NotAsExpected,
            fence,
            key,
        };
    }
    if fence >= token {
        return Grant {
            status: Status::TokenLow,
            fence,
            key,
        };
    }
    d.key = Some(Key {
        value,
        token,
        version: 1,
    });
    d.prev = Some(d.fence);
    d.fence = token;
    Grant {
        status: Status::Granted,
        fence,
        key,
    }
}

/// `lock_extend.lua`'s status: 1 extended, 2 re-created, 0 another value, -2 fence above the
/// token, -1 marker missing or stale.
pub fn lock_extend(d: &mut Data, value: u8, version: u8, token: u8, expect: Option<u8>) -> i8 {
    if expect.is_some() && d.marker != expect {
        return -1;
    }
    match d.key {
        Some(ref mut k) if k.value == value => {
            if version > k.version {
                k.version = version;
            }
            1
        }
        Some(_) => 0,
        None => {
            let fence = d.fence.max(d.floor);
            if fence > token {
                return -2;
            }
            d.key = Some(Key {
                value,
                token,
                version,
            });
            d.prev = None;
            if fence < token {
                d.fence = token;
            }
            2
        }
    }
}

/// `lock_release.lua`'s mode for a holder's release (`ARGV[3]`; `"collect"` is [`lock_collect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Release {
    /// `"fold"` (also an absent `ARGV[3]`): delete the copy, fold the fence key into the floor.
    Fold,
    /// `"keep"`: delete the copy only; the fence key stays (rewritten by the lock's next grant,
    /// or folded later by a collect).
    Keep,
}

/// `lock_release.lua` in mode `"fold"` or `"keep"`, line for line: compare-and-delete (0
/// unless the key holds the value); in `"keep"`, the copy's `DEL` only; in `"fold"`, the copy's
/// `DEL`, the floor raised to the fence key (if above), the fence key's `DEL` (an absent fence
/// key is 0 here, which raises nothing). No marker check.
pub fn lock_release(d: &mut Data, value: u8, mode: Release) -> bool {
    if d.key.is_none_or(|k| k.value != value) {
        return false;
    }
    d.key = None;
    d.prev = None;
    if mode == Release::Keep {
        return true;
    }
    fold_fence(d);
    true
}

/// `lock_release.lua` in mode `"collect"` (`ARGV[1]` is `""`, ignored), line for line: -1 if the
/// marker is missing or stale (`None` is the script's `"*"`); 0 if the node holds a copy of
/// the lock (anyone's: `EXISTS`); 0 if there is no fence key (0 here: a token is at least 1);
/// else the floor raised to the fence key (if above), the fence key's `DEL`, 1. Nothing
/// changes unless it returns 1; no `PUBLISH`.
pub fn lock_collect(d: &mut Data, expect: Option<u8>) -> i8 {
    if expect.is_some() && d.marker != expect {
        return -1;
    }
    if d.key.is_some() {
        return 0;
    }
    i8::from(fold_fence(d))
}

/// `lock_release.lua` in mode `"undo"` (a round's undo), line for line: 0 unless the key holds
/// the value; where the copy is at version 1 with its `p` and the fence key holds exactly the
/// round's token, the copy deleted and the fence key set back to `p` (deleted for 0; left as
/// it is if `p` were not below the token), the floor untouched: 2; anywhere else the fold of
/// mode `"fold"`: 1. No marker check. `unchecked` plants [`Bug::UndoUnchecked`]: the rollback
/// wherever the copy has a `p`, whatever its version and the fence key.
pub fn lock_undo(d: &mut Data, value: u8, token: u8, unchecked: bool) -> i8 {
    let Some(k) = d.key.filter(|k| k.value == value) else {
        return 0;
    };
    match d.prev {
        Some(p) if unchecked || (k.version == 1 && d.fence == token) => {
            d.key = None;
            d.prev = None;
            if p < token {
                d.fence = p;
            }
            2
        }
        _ => i8::from(lock_release(d, value, Release::Fold)),
    }
}

/// The fold both share: the floor raised to the fence key, then the fence key deleted; false
/// (nothing changed) when there is no fence key.
fn fold_fence(d: &mut Data) -> bool {
    if d.fence == 0 {
        return false;
    }
    d.floor = d.floor.max(d.fence);
    d.fence = 0;
    true
}

/// `restore.lua` in mode `"lease"`: nothing where the node has a key; the copy where its
/// (already raised) fence KEY is at most the copy's token (the script reads the fence key
/// only, not the floor); a [`BLOCKER`] with the fence's token where the fence is above it.
pub fn restore_lease(d: &mut Data, copy: Key) -> bool {
    if d.key.is_some() {
        return false;
    }
    if d.fence > copy.token {
        d.key = Some(Key {
            value: BLOCKER,
            token: d.fence,
            version: 1,
        });
        return true;
    }
    d.key = Some(copy);
    if d.fence < copy.token {
        d.fence = copy.token;
    }
    true
}

/// The value of a repair's blocker: a lease copy no client holds, so none can release or
/// extend it; it leaves only by a takeover (a watcher sees it unchanged for the window).
pub const BLOCKER: u8 = 0;

/// The lease copy a repair restores from the copies its sources hold (`repair::plan`): if
/// they all hold one value, its newest version; if they hold different values, a blocker
/// with the highest token, since the wiped node may have granted any of them (and a copy of
/// the wrong one could be released by a client that never held the lease, freeing the node
/// for a second holder). `newest` plants the old rule: the highest token, then version.
pub fn restored_copy(copies: &[Key], newest: bool) -> Option<Key> {
    let top = copies
        .iter()
        .copied()
        .max_by_key(|k| (k.token, k.version))?;
    if newest || copies.iter().all(|k| k.value == top.value) {
        return Some(top);
    }
    Some(Key {
        value: BLOCKER,
        token: top.token,
        version: 1,
    })
}

/// `fenced_set.lua`: apply a write only if its token is at least the highest seen.
pub fn fenced_set(highest: &mut u8, token: u8) -> bool {
    if token < *highest {
        return false;
    }
    *highest = token;
    true
}

/// A protection switched off, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A watcher swaps a held key as soon as it has seen it (`Config::without_takeover_wait_for_tests`).
    TakeoverWithoutWait,
    /// No drift margin: the holder's validity lasts one tick longer than the watcher's wait
    /// (both use the bare TTL, their clocks drifting apart).
    NoDriftMargin,
    /// No marker check, no quarantine: a restarted or wiped node votes at once.
    NoQuarantine,
    /// The resource accepts every write (no fencing token check).
    FencingOff,
    /// A quorum of N/2 (at least 1) instead of a majority.
    QuorumHalf,
    /// The repair marks the node without restoring any lease copy (`restore.lua`).
    RepairWithoutRestore,
    /// The repair restores the newest lease copy (highest token, then version) even where
    /// the sources hold different values (the rule before 2026-11-24): the wiped node may
    /// have granted the other one.
    RestoreNewest,
    /// The repair marks the node without raising its fence key and floor (`raise.lua`).
    RepairWithoutRaise,
    /// A collect (`lock_release.lua` in mode `"collect"`) folds the fence key into the floor
    /// even where the node holds a copy of the lock (anyone's): a copy's fence key is then
    /// below its token, and a repair that reads the node raises a wiped node's fence key less
    /// (`restore.lua` chooses between the sources' copy and a blocker by that fence key).
    /// No counterexample within these bounds (`ci_collect`, `ci_amnesia` and `ci_repair` with
    /// collects, checked exhaustively): a repair reads a majority of the other nodes, so a
    /// lease a majority still holds always shows among its sources' copies
    /// ([`restored_copy`] already blocks when they differ), and the fence key only chooses
    /// between a copy and a blocker for a lease no valid holder has. No planted-bug test.
    CollectBesideCopy,
    /// A holder's release rolls its grant back as a round's undo does (`lock_release.lua`'s mode
    /// `"undo"` sent for a lease a caller was given): its fence key goes back below its token,
    /// so a later grant can get a token at or below one a holder already used.
    UndoOfHeldLease,
    /// A round's undo rolls the grant back wherever the copy still has its `p`, without
    /// checking that it is at version 1 and that the fence key still holds the round's token.
    /// No counterexample within these bounds, as expected: only the undone round's own client
    /// names its value, that value is never extended (no caller holds it), and a later grant
    /// on the node replaces the copy (and its `p`) whole; the checks guard against what the
    /// model does not produce (a stray undo of a value that was extended). No planted-bug test.
    UndoUnchecked,
}

/// The bounds of one exploration.
#[derive(Clone, Debug)]
pub struct LeaseModel {
    /// Nodes (3).
    pub nodes: usize,
    /// Clients (separate processes, each with its own watch).
    pub clients: usize,
    /// Acquisition rounds the clients may start, in all.
    pub rounds: u8,
    /// Extension rounds the holders may start, in all.
    pub extensions: u8,
    /// Ticks a holder's lease stays valid after the send of its last applied write.
    pub validity: u8,
    /// Ticks a watcher must see a held key unchanged before it may swap it.
    pub window: u8,
    /// Requests or replies the network may lose, in all.
    pub losses: u8,
    /// Collects (`lock_release.lua` in mode `"collect"`) that fold a fence, one node each, in
    /// all. A real collect round sends one to every voting node, but nothing is decided from
    /// their replies: each acts on its own node as if sent alone, so a round is `nodes` of
    /// these. Each is sent and applied in one step ([`Action::Collect`]), which loses nothing:
    /// a collect carries no value and nothing of its sender's state, so one that lands later
    /// acts as one sent then, and one that lands on a later incarnation of its node is refused
    /// by its marker check, as a lost one (never taken here). A collect that would fold
    /// nothing is not taken either (it would only spend the bound).
    pub collects: u8,
    /// Node crashes (each may restart), in all.
    pub crashes: u8,
    /// Node wipes, in all.
    pub wipes: u8,
    /// FLUSHALLs, in all (the node loses every key, its marker included, and keeps running).
    pub flushes: u8,
    /// Whether holders send fenced writes to the resource (off where only the holders are
    /// in question: fewer states).
    pub fenced_writes: bool,
    /// Whether a holder's release may keep the fence key (`lock_release.lua` in mode `"keep"`,
    /// as `lock::fold` sends a release soon after the handle's previous one) as well as fold
    /// it; a round's undo always folds. Off, every release folds (as a handle's first one
    /// does) and no collect is sent. On where a repair can run: elsewhere nothing reads the
    /// fence key but as max(fence key, floor), which neither mode nor a collect changes, so
    /// the modes would only multiply states that behave alike.
    pub release_modes: bool,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
}

impl LeaseModel {
    /// CI bounds for takeover: 3 nodes, 2 clients, 3 acquisition rounds in all (one to
    /// grant, one to see the holder's key, one to swap it), a fenced write per lease, a
    /// lease of one tick, no fault but reordering and pauses.
    pub fn ci_takeover() -> Self {
        LeaseModel {
            nodes: 3,
            clients: 2,
            rounds: 3,
            extensions: 0,
            validity: 1,
            window: 1,
            losses: 0,
            collects: 0,
            crashes: 0,
            wipes: 0,
            flushes: 0,
            fenced_writes: true,
            release_modes: false,
            bug: None,
        }
    }

    /// CI bounds for the network: 2 acquisition rounds and one extension in all, one lost
    /// request or reply (or a client that stops waiting).
    pub fn ci_network() -> Self {
        LeaseModel {
            rounds: 2,
            extensions: 1,
            losses: 1,
            ..LeaseModel::ci_takeover()
        }
    }

    /// CI bounds for node faults: 2 acquisition rounds, one node crash (restart under a new
    /// run_id, quarantine, repair) and one wipe (restarts empty, quarantine, repair); a
    /// holder's release keeps or folds the fence key (no collect: [`LeaseModel::ci_collect`]).
    pub fn ci_amnesia() -> Self {
        LeaseModel {
            rounds: 2,
            crashes: 1,
            wipes: 1,
            release_modes: true,
            ..LeaseModel::ci_takeover()
        }
    }

    /// CI bounds for FLUSHALL: 2 acquisition rounds and one flush (the node loses every key,
    /// keeps running; requests in flight to it land on it, refused), quarantine and repair; a
    /// holder's release keeps or folds the fence key.
    pub fn ci_flush() -> Self {
        LeaseModel {
            rounds: 2,
            flushes: 1,
            release_modes: true,
            ..LeaseModel::ci_takeover()
        }
    }

    /// CI bounds for kept fences and their collects: [`LeaseModel::ci_flush`] with two
    /// collects (on two nodes, or twice on one), at any time after a holder kept a fence. A
    /// set of its own: each collect about doubles the states, which the other sets, already
    /// about doubled by the release modes, would not bear within CI's time.
    pub fn ci_collect() -> Self {
        LeaseModel {
            collects: 2,
            ..LeaseModel::ci_flush()
        }
    }

    /// Bounds for a takeover after a repair: 3 acquisition rounds and one wipe (the planted
    /// repair bugs; a contender needs a round to learn the raised fence and one to win), no
    /// fenced writes (the takeover bounds check those; here only the holders matter).
    pub fn ci_repair() -> Self {
        LeaseModel {
            wipes: 1,
            fenced_writes: false,
            ..LeaseModel::ci_takeover()
        }
    }

    /// Larger bounds (`rq-model leases --deep`): takeover with an extension and a lost
    /// message.
    pub fn deep() -> Self {
        LeaseModel {
            extensions: 1,
            losses: 1,
            ..LeaseModel::ci_takeover()
        }
    }

    /// The same bounds with `bug` planted.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        self
    }

    fn needed(&self) -> usize {
        match self.bug {
            Some(Bug::QuorumHalf) => (self.nodes / 2).max(1),
            _ => self.nodes / 2 + 1,
        }
    }

    fn window(&self) -> u8 {
        match self.bug {
            Some(Bug::TakeoverWithoutWait) => 0,
            _ => self.window,
        }
    }

    fn validity(&self) -> u8 {
        match self.bug {
            Some(Bug::NoDriftMargin) => self.window + 1,
            _ => self.validity,
        }
    }

    fn collect_beside_copy(&self) -> bool {
        self.bug == Some(Bug::CollectBesideCopy)
    }

    fn quarantine(&self) -> bool {
        self.bug != Some(Bug::NoQuarantine)
    }

    /// Whether a client sends to `node`: it is up and, under quarantine, verified.
    fn reachable(&self, node: &Node) -> bool {
        node.up && (!self.quarantine() || node.verified())
    }
}

/// A request in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// `lock_acquire.lua` from a client's round (its value is fresh: it names the round).
    Acquire {
        client: u8,
        node: u8,
        value: u8,
        token: u8,
        ask: Ask,
        /// The marker the call expects (`None`: `"*"`).
        expect: Option<u8>,
        /// The node's run_id on the connection that sent it.
        conn: u8,
        /// The nodes (bit mask) wiped while this request was in flight.
        wiped: u8,
    },
    /// `lock_extend.lua` from a holder's extension round (named by the version it raises to).
    Extend {
        client: u8,
        node: u8,
        value: u8,
        version: u8,
        token: u8,
        expect: Option<u8>,
        wiped: u8,
    },
    /// `lock_release.lua` in mode `"keep"` or `"fold"` (no reply counted).
    Release { node: u8, value: u8, mode: Release },
    /// `lock_release.lua` in mode `"undo"`: a round's undo (no reply counted).
    Undo { node: u8, value: u8, token: u8 },
    /// A holder's fenced write to the resource: `fenced_set.lua` with its token.
    Write { grant: u8, token: u8 },
}

impl Msg {
    fn node(&self) -> Option<u8> {
        match *self {
            Msg::Acquire { node, .. }
            | Msg::Extend { node, .. }
            | Msg::Release { node, .. }
            | Msg::Undo { node, .. } => Some(node),
            Msg::Write { .. } => None,
        }
    }

    fn wiped_mut(&mut self) -> Option<&mut u8> {
        match self {
            Msg::Acquire { wiped, .. } | Msg::Extend { wiped, .. } => Some(wiped),
            _ => None,
        }
    }
}

/// A node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub data: Data,
    /// Its current run_id (a new one at every restart).
    pub run: u8,
    pub up: bool,
}

impl Node {
    /// Verified: its marker names its current run (clients send only to verified nodes).
    fn verified(&self) -> bool {
        self.up && self.data.marker == Some(self.run)
    }
}

/// What a watcher saw on one node, on which incarnation, and for how many ticks since the
/// receipt of the first reply that showed it (counted up to the window: only that comparison
/// matters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Watched {
    pub run: u8,
    pub key: Option<Key>,
    pub age: u8,
}

/// An acquisition round in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AcqRound {
    pub value: u8,
    pub token: u8,
    /// Ticks of validity a grant would have left (the validity counted from the send, down
    /// to 0).
    pub left: u8,
    /// Every ask was a read.
    pub only_reads: bool,
    /// Nodes that granted, nodes whose reply counts no more (bit masks).
    pub acks: u8,
    pub replied: u8,
    /// Some node granted by swapping a key it held (a takeover).
    pub swapped: bool,
}

/// An extension round in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtRound {
    /// Ticks of validity the extension would give (counted from its send, down to 0).
    pub left: u8,
    pub applied: u8,
    pub rejected: u8,
    pub replied: u8,
}

/// A lease held (valid while `left > 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hold {
    pub value: u8,
    pub token: u8,
    /// Its place in the order of grants.
    pub grant: u8,
    /// Ticks of validity left.
    pub left: u8,
    pub version: u8,
    pub ext: Option<ExtRound>,
    pub wrote: bool,
}

/// What a client is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Doing {
    Idle,
    Acquiring(AcqRound),
    Holding(Hold),
}

/// A client process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// The highest fence known.
    pub known: u8,
    pub watch: Vec<Option<Watched>>,
    pub doing: Doing,
}

/// What the properties need of the past (kept small: a history that differs makes states
/// differ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Past {
    /// Leases granted so far, and the last one's token.
    pub grants: u8,
    pub last_token: u8,
    /// A grant had a token at or below an earlier grant's.
    pub token_order_broken: bool,
    /// Some lease was granted by swapping a key another value held (a takeover).
    pub took_over: bool,
    /// The latest grant (by its place in the order of grants) whose write the resource
    /// accepted.
    pub last_accepted: Option<u8>,
    /// The resource accepted a write of a lease granted before one whose write it had
    /// already accepted.
    pub stale_accepted: bool,
    /// The resource refused a write.
    pub refused: bool,
    /// An extension was decided as extended.
    pub extended: bool,
    /// A repair marked a node.
    pub repaired: bool,
    /// Some client sent a release in mode `"keep"` (recorded while a collect may follow).
    pub kept: bool,
    /// A round's undo rolled a grant back on some node.
    pub rolled_back: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseState {
    pub nodes: Vec<Node>,
    pub clients: Vec<Client>,
    /// Requests in flight, sorted (a multiset).
    pub net: Vec<Msg>,
    /// The resource's highest token (`fenced_set.lua`'s fence key).
    pub resource: u8,
    pub past: Past,
    /// Acquisition and extension rounds started.
    pub rounds: u8,
    pub extensions: u8,
    pub losses: u8,
    /// Collects taken ([`LeaseModel::collects`]).
    pub collects: u8,
    pub crashes: u8,
    pub wipes: u8,
    pub flushes: u8,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Real time advances one tick.
    Tick,
    /// A client starts an acquisition round, planned from its watch.
    Round(u8),
    /// A holder starts an extension round.
    Extend(u8),
    /// A client decides its round: a majority answered alike, or no reply can still come.
    Decide(u8),
    /// A client decides its round without the replies still to come (its node timeout:
    /// counted as a loss, as a lost reply would be).
    Timeout(u8),
    /// A holder, while valid, sends a fenced write to the resource.
    Write(u8),
    /// A holder releases its lease (valid or not), in mode `"keep"` or `"fold"`.
    Release(u8, Release),
    /// A client that kept a fence collects it on a voting node (one node's part of a collect
    /// round; sent and applied in one step, see [`LeaseModel::collects`]).
    Collect(u8),
    /// The network delivers a request; the node applies it and the client hears the reply.
    Deliver(Msg),
    /// The network delivers a request; the node applies it; the reply is lost.
    DeliverLosingReply(Msg),
    /// The network loses a request.
    Lose(Msg),
    /// A node crashes; requests to it are lost.
    Crash(u8),
    /// A crashed node restarts with its data, under a new run_id (quarantined).
    Restart(u8),
    /// A node loses its data and restarts empty (unmarked: quarantined).
    Wipe(u8),
    /// FLUSHALL: a running node loses every key, its marker included (quarantined); requests
    /// in flight to it still land, and are refused.
    Flush(u8),
    /// A repair reads the nodes in the mask (a majority of the other verified nodes), raises
    /// the node's fence, restores the newest lease copy if allowed, and marks it.
    Repair(u8, u8),
}

fn ask_text(ask: Ask) -> String {
    match ask {
        Ask::Absent => "grant if free".into(),
        Ask::Swap { value, version } => format!("swap v{value}.{version}"),
        Ask::Read => "read".into(),
    }
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Msg::Acquire {
                client,
                node,
                value,
                token,
                ask,
                ..
            } => write!(
                f,
                "client {client}'s acquire of v{value} (token {token}, {}) to node {node}",
                ask_text(ask)
            ),
            Msg::Extend {
                client,
                node,
                value,
                version,
                ..
            } => write!(
                f,
                "client {client}'s extension of v{value} to version {version} to node {node}"
            ),
            Msg::Release { node, value, mode } => {
                write!(
                    f,
                    "the {} release of v{value} to node {node}",
                    mode_text(mode)
                )
            }
            Msg::Undo { node, value, token } => {
                write!(
                    f,
                    "the undo of v{value} (token {token}, roll back if untouched) to node {node}"
                )
            }
            Msg::Write { grant, token } => {
                write!(
                    f,
                    "lease #{grant}'s write with token {token} to the resource"
                )
            }
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Tick => write!(f, "time passes (one tick)"),
            Action::Round(c) => write!(f, "client {c} starts an acquisition round"),
            Action::Extend(c) => write!(f, "client {c} starts extending its lease"),
            Action::Decide(c) => write!(f, "client {c} decides its round"),
            Action::Timeout(c) => write!(
                f,
                "client {c} stops waiting for the replies still to come and decides its round"
            ),
            Action::Write(c) => {
                write!(f, "client {c}, holding a valid lease, sends a fenced write")
            }
            Action::Release(c, mode) => {
                write!(f, "client {c} releases its lease ({})", mode_text(mode))
            }
            Action::Collect(n) => write!(f, "a client that kept a fence collects it on node {n}"),
            Action::Deliver(m @ (Msg::Acquire { .. } | Msg::Extend { .. })) => {
                write!(f, "delivered: {m}; its reply heard")
            }
            Action::Deliver(m) => write!(f, "delivered: {m}"),
            Action::DeliverLosingReply(m) => write!(f, "delivered: {m}; its reply lost"),
            Action::Lose(m) => write!(f, "lost: {m}"),
            Action::Crash(n) => write!(f, "node {n} crashes"),
            Action::Restart(n) => write!(f, "node {n} restarts with its data (quarantined)"),
            Action::Wipe(n) => write!(f, "node {n} loses its data and restarts empty"),
            Action::Flush(n) => write!(f, "FLUSHALL on node {n} (every key lost, still running)"),
            Action::Repair(n, from) => write!(
                f,
                "a repair reads nodes {:?}, copies onto node {n} and marks it",
                (0..8).filter(|o| from & (1 << o) != 0).collect::<Vec<_>>()
            ),
        }
    }
}

/// [`lock_collect`], or with [`Bug::CollectBesideCopy`] the fold as if the node held no copy:
/// whether it folded.
fn collect(d: &mut Data, expect: Option<u8>, beside_copy: bool) -> bool {
    if !beside_copy {
        return lock_collect(d, expect) == 1;
    }
    let key = d.key.take();
    let folded = lock_collect(d, expect) == 1;
    d.key = key;
    folded
}

fn mode_text(mode: Release) -> &'static str {
    match mode {
        Release::Fold => "fold",
        Release::Keep => "keep",
    }
}

fn remove(net: &mut Vec<Msg>, m: &Msg) {
    if let Some(i) = net.iter().position(|x| x == m) {
        net.remove(i);
    }
}

impl LeaseModel {
    /// `lease::plan_with`: per node, grant if free (never seen, or seen free), swap a key seen
    /// unchanged for the window, or read; only reads when a majority cannot be ready yet.
    fn plan(&self, s: &LeaseState, c: usize) -> Vec<(Ask, Option<u8>)> {
        let client = &s.clients[c];
        let window = self.window();
        let mut asks = Vec::with_capacity(self.nodes);
        let mut ready = 0;
        let mut later = 0;
        for (n, node) in s.nodes.iter().enumerate() {
            let current = self.quarantine().then_some(node.run);
            match client.watch[n] {
                None => {
                    asks.push((Ask::Absent, current));
                    ready += 1;
                }
                Some(Watched { key: None, .. }) => {
                    asks.push((Ask::Absent, current));
                    ready += 1;
                }
                Some(Watched {
                    run,
                    key: Some(k),
                    age,
                }) => {
                    if age >= window {
                        let watched = self.quarantine().then_some(run);
                        asks.push((
                            Ask::Swap {
                                value: k.value,
                                version: k.version,
                            },
                            watched,
                        ));
                        ready += 1;
                    } else {
                        asks.push((Ask::Read, current));
                        later += 1;
                    }
                }
            }
        }
        let needed = self.needed();
        if ready < needed && later >= needed - ready {
            // `Plan::WaitUntil`: the round only refreshes what the nodes hold.
            for (n, a) in asks.iter_mut().enumerate() {
                *a = (Ask::Read, self.quarantine().then_some(s.nodes[n].run));
            }
        }
        asks
    }

    fn start_round(&self, s: &mut LeaseState, c: usize) {
        let asks = self.plan(s, c);
        s.rounds += 1;
        let value = s.rounds; // fresh for every round
        let client = &mut s.clients[c];
        let token = client.known + 1;
        let only_reads = asks.iter().all(|(a, _)| *a == Ask::Read);
        client.doing = Doing::Acquiring(AcqRound {
            value,
            token,
            left: self.validity(),
            only_reads,
            acks: 0,
            replied: 0,
            swapped: false,
        });
        for (n, (ask, expect)) in asks.into_iter().enumerate() {
            let node = &s.nodes[n];
            if !self.reachable(node) {
                continue; // quarantined or unreachable: not asked
            }
            s.net.push(Msg::Acquire {
                client: c as u8,
                node: n as u8,
                value,
                token,
                ask,
                expect,
                conn: node.run,
                wiped: 0,
            });
        }
        s.net.sort();
    }

    /// Whether a request of the round named by `name` (an acquisition's value, an
    /// extension's version) of client `c` to a node not in `replied` is in flight.
    fn pending(&self, s: &LeaseState, c: u8, name: u8, replied: u8) -> bool {
        s.net.iter().any(|m| match *m {
            Msg::Acquire {
                client,
                node,
                value,
                ..
            } => client == c && value == name && replied & (1 << node) == 0,
            Msg::Extend {
                client,
                node,
                version,
                ..
            } => client == c && version == name && replied & (1 << node) == 0,
            _ => false,
        })
    }

    /// The release of `value` in `mode` to every up node not in `skip`; a keep leaves a fence
    /// its client owes a collect for.
    fn send_releases(&self, s: &mut LeaseState, value: u8, mode: Release, skip: u8) {
        for n in 0..self.nodes {
            if s.nodes[n].up && skip & (1 << n) == 0 {
                s.net.push(Msg::Release {
                    node: n as u8,
                    value,
                    mode,
                });
            }
        }
        s.net.sort();
        // Recorded only while a collect may still be sent (fewer states).
        if mode == Release::Keep && s.collects < self.collects {
            s.past.kept = true;
        }
    }

    /// The undo of the round of `value` and `token` to every up node not in `skip`.
    fn send_undos(&self, s: &mut LeaseState, value: u8, token: u8, skip: u8) {
        for n in 0..self.nodes {
            if s.nodes[n].up && skip & (1 << n) == 0 {
                s.net.push(Msg::Undo {
                    node: n as u8,
                    value,
                    token,
                });
            }
        }
        s.net.sort();
    }

    /// Decide an acquisition round (`decide::after_round`; a round not granted is released
    /// everywhere unless it only read).
    fn decide_acquisition(&self, s: &mut LeaseState, c: usize, r: AcqRound) {
        let granted = r.acks.count_ones() as usize >= self.needed();
        let valid_left = r.left > 0;
        let client = &mut s.clients[c];
        client.known = client.known.max(if r.acks != 0 { r.token } else { 0 });
        if granted && valid_left {
            let p = &mut s.past;
            let grant = p.grants;
            p.token_order_broken |= p.grants > 0 && r.token <= p.last_token;
            p.grants += 1;
            p.last_token = r.token;
            p.took_over |= r.swapped;
            s.clients[c].doing = Doing::Holding(Hold {
                value: r.value,
                token: r.token,
                grant,
                left: r.left,
                version: 1,
                ext: None,
                wrote: false,
            });
            return;
        }
        s.clients[c].doing = Doing::Idle;
        if !r.only_reads {
            // Undone on every node that may hold it: those that granted or did not answer
            // (one that answered otherwise did not take this fresh value; the real client
            // sends it there too, where it changes nothing). In mode "undo"
            // (`Lock::undo_round`): rolled back where untouched, else folded (a losing token's
            // fence key left behind would make a repair restore a blocker where the holder's
            // copy belongs).
            let refused = r.replied & !r.acks;
            self.send_undos(s, r.value, r.token, refused);
        }
    }

    /// `lease::judge_extension`.
    fn decide_extension(&self, s: &mut LeaseState, c: usize) {
        let needed = self.needed();
        let nodes = self.nodes;
        if let Doing::Holding(h) = &mut s.clients[c].doing {
            let Some(e) = h.ext.take() else {
                return;
            };
            if e.rejected.count_ones() as usize > nodes - needed {
                h.left = 0; // conflict: the lease is lost
            } else if e.applied.count_ones() as usize >= needed && h.left > 0 {
                h.left = e.left;
                s.past.extended = true;
            }
        }
    }

    fn observe(&self, s: &mut LeaseState, c: usize, n: usize, run: u8, key: Option<Key>) {
        let w = &mut s.clients[c].watch[n];
        match w {
            Some(old) if old.run == run && old.key == key => {}
            _ => *w = Some(Watched { run, key, age: 0 }),
        }
    }

    fn deliver(&self, s: &mut LeaseState, m: Msg, hear: bool) {
        match m {
            Msg::Write { grant, token } => {
                let applied = if self.bug == Some(Bug::FencingOff) {
                    true
                } else {
                    fenced_set(&mut s.resource, token)
                };
                let p = &mut s.past;
                if applied {
                    p.stale_accepted |= p.last_accepted.is_some_and(|last| grant < last);
                    p.last_accepted = Some(p.last_accepted.map_or(grant, |l| l.max(grant)));
                } else {
                    p.refused = true;
                }
            }
            Msg::Release { node, value, mode } => {
                let n = &mut s.nodes[node as usize];
                if n.up {
                    lock_release(&mut n.data, value, mode);
                }
            }
            Msg::Undo { node, value, token } => {
                let unchecked = self.bug == Some(Bug::UndoUnchecked);
                let n = &mut s.nodes[node as usize];
                if n.up && lock_undo(&mut n.data, value, token, unchecked) == 2 {
                    s.past.rolled_back = true;
                }
            }
            Msg::Acquire {
                client,
                node,
                value,
                token,
                ask,
                expect,
                conn,
                ..
            } => {
                let nd = &mut s.nodes[node as usize];
                if !nd.up {
                    return;
                }
                let g = lock_acquire(&mut nd.data, value, token, expect, ask);
                if !hear {
                    return;
                }
                let c = client as usize;
                let Doing::Acquiring(mut r) = s.clients[c].doing else {
                    return;
                };
                if r.value != value || r.replied & (1 << node) != 0 {
                    return; // an older round's reply, or one given up
                }
                r.replied |= 1 << node;
                let known = &mut s.clients[c].known;
                *known = (*known).max(g.fence);
                match g.status {
                    Status::Granted => {
                        r.acks |= 1 << node;
                        r.swapped |= matches!(ask, Ask::Swap { .. });
                        s.clients[c].watch[node as usize] = None;
                    }
                    Status::Refused => s.clients[c].watch[node as usize] = None,
                    Status::NotAsExpected | Status::TokenLow => {
                        self.observe(s, c, node as usize, conn, g.key)
                    }
                }
                s.clients[c].doing = Doing::Acquiring(r);
            }
            Msg::Extend {
                client,
                node,
                value,
                version,
                token,
                expect,
                ..
            } => {
                let nd = &mut s.nodes[node as usize];
                if !nd.up {
                    return;
                }
                let status = lock_extend(&mut nd.data, value, version, token, expect);
                if !hear {
                    return;
                }
                if let Doing::Holding(h) = &mut s.clients[client as usize].doing {
                    let current = h.value == value && h.version == version;
                    if let Some(e) = h.ext.as_mut().filter(|_| current) {
                        if e.replied & (1 << node) == 0 {
                            e.replied |= 1 << node;
                            match status {
                                1 | 2 => e.applied |= 1 << node,
                                -1 => {}
                                _ => e.rejected |= 1 << node,
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Model for LeaseModel {
    type State = LeaseState;
    type Action = Action;

    fn init_states(&self) -> Vec<LeaseState> {
        vec![LeaseState {
            nodes: vec![
                Node {
                    data: Data {
                        key: None,
                        fence: 0,
                        floor: 0,
                        marker: Some(0),
                        prev: None,
                    },
                    run: 0,
                    up: true,
                };
                self.nodes
            ],
            clients: vec![
                Client {
                    known: 0,
                    watch: vec![None; self.nodes],
                    doing: Doing::Idle,
                };
                self.clients
            ],
            net: Vec::new(),
            resource: 0,
            past: Past::default(),
            rounds: 0,
            extensions: 0,
            losses: 0,
            collects: 0,
            crashes: 0,
            wipes: 0,
            flushes: 0,
        }]
    }

    fn actions(&self, s: &LeaseState, out: &mut Vec<Action>) {
        out.push(Action::Tick);
        for (c, client) in s.clients.iter().enumerate() {
            let c = c as u8;
            match client.doing {
                Doing::Idle if s.rounds < self.rounds => out.push(Action::Round(c)),
                Doing::Idle => {}
                Doing::Acquiring(r) => {
                    if r.acks.count_ones() as usize >= self.needed()
                        || !self.pending(s, c, r.value, r.replied)
                    {
                        out.push(Action::Decide(c));
                    } else if s.losses < self.losses {
                        out.push(Action::Timeout(c));
                    }
                }
                Doing::Holding(h) => {
                    let valid = h.left > 0;
                    match h.ext {
                        Some(e) => {
                            if e.applied.count_ones() as usize >= self.needed()
                                || e.rejected.count_ones() as usize > self.nodes - self.needed()
                                || !self.pending(s, c, h.version, e.replied)
                            {
                                out.push(Action::Decide(c));
                            } else if s.losses < self.losses {
                                out.push(Action::Timeout(c));
                            }
                        }
                        None if valid && s.extensions < self.extensions => {
                            out.push(Action::Extend(c))
                        }
                        None => {}
                    }
                    if valid && !h.wrote && self.fenced_writes {
                        out.push(Action::Write(c));
                    }
                    // Either mode: the real client keeps a release that follows its
                    // previous one quickly, and folds any other (`lock::fold`).
                    if self.release_modes {
                        out.push(Action::Release(c, Release::Keep));
                    }
                    out.push(Action::Release(c, Release::Fold));
                }
            }
        }
        let mut last: Option<&Msg> = None;
        for m in &s.net {
            if last == Some(m) {
                continue;
            }
            last = Some(m);
            out.push(Action::Deliver(*m));
            if s.losses < self.losses {
                out.push(Action::Lose(*m));
                if matches!(m, Msg::Acquire { .. } | Msg::Extend { .. }) {
                    out.push(Action::DeliverLosingReply(*m));
                }
            }
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
            // To a voting node only (`Lock::collect_when_idle`), and only a collect that folds:
            // one that changes nothing is a collect lost (and would only spend the bound).
            if self.reachable(node)
                && s.past.kept
                && s.collects < self.collects
                && collect(
                    &mut node.data.clone(),
                    self.quarantine().then_some(node.run),
                    self.collect_beside_copy(),
                )
            {
                out.push(Action::Collect(n8));
            }
            if self.quarantine() && node.up && !node.verified() {
                let others: Vec<usize> = (0..self.nodes)
                    .filter(|&o| o != n && s.nodes[o].verified())
                    .collect();
                for mask in 0u32..(1 << others.len()) {
                    if mask.count_ones() as usize != self.needed() {
                        continue;
                    }
                    let from = others
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask & (1 << i) != 0)
                        .fold(0u8, |acc, (_, &o)| acc | (1 << o));
                    out.push(Action::Repair(n8, from));
                }
            }
        }
    }

    fn next_state(&self, s: &LeaseState, action: Action) -> Option<LeaseState> {
        let mut s = s.clone();
        match action {
            Action::Tick => {
                let window = self.window();
                for client in s.clients.iter_mut() {
                    for w in client.watch.iter_mut().flatten() {
                        w.age = (w.age + 1).min(window);
                    }
                    match &mut client.doing {
                        Doing::Idle => {}
                        Doing::Acquiring(r) => r.left = r.left.saturating_sub(1),
                        Doing::Holding(h) => {
                            h.left = h.left.saturating_sub(1);
                            if let Some(e) = h.ext.as_mut() {
                                e.left = e.left.saturating_sub(1);
                            }
                        }
                    }
                }
            }
            Action::Round(c) => self.start_round(&mut s, c as usize),
            Action::Extend(c) => {
                let c = c as usize;
                let quarantine = self.quarantine();
                s.extensions += 1;
                let client = &mut s.clients[c];
                let Doing::Holding(h) = &mut client.doing else {
                    return None;
                };
                h.version += 1;
                h.ext = Some(ExtRound {
                    left: self.validity(),
                    applied: 0,
                    rejected: 0,
                    replied: 0,
                });
                let (value, version, token) = (h.value, h.version, h.token);
                for (n, node) in s.nodes.iter().enumerate() {
                    if !self.reachable(node) {
                        continue;
                    }
                    s.net.push(Msg::Extend {
                        client: c as u8,
                        node: n as u8,
                        value,
                        version,
                        token,
                        expect: quarantine.then_some(node.run),
                        wiped: 0,
                    });
                }
                s.net.sort();
            }
            Action::Decide(c) | Action::Timeout(c) => {
                if matches!(action, Action::Timeout(_)) {
                    s.losses += 1;
                }
                let c = c as usize;
                match s.clients[c].doing {
                    Doing::Acquiring(r) => self.decide_acquisition(&mut s, c, r),
                    Doing::Holding(_) => self.decide_extension(&mut s, c),
                    Doing::Idle => return None,
                }
            }
            Action::Write(c) => {
                let Doing::Holding(h) = &mut s.clients[c as usize].doing else {
                    return None;
                };
                h.wrote = true;
                let m = Msg::Write {
                    grant: h.grant,
                    token: h.token,
                };
                s.net.push(m);
                s.net.sort();
            }
            Action::Release(c, mode) => {
                let Doing::Holding(h) = s.clients[c as usize].doing else {
                    return None;
                };
                s.clients[c as usize].doing = Doing::Idle;
                if self.bug == Some(Bug::UndoOfHeldLease) {
                    self.send_undos(&mut s, h.value, h.token, 0);
                } else {
                    self.send_releases(&mut s, h.value, mode, 0);
                }
            }
            Action::Collect(n) => {
                s.collects += 1;
                if s.collects == self.collects {
                    s.past.kept = false; // read no more: fewer states
                }
                let node = &mut s.nodes[n as usize];
                let expect = self.quarantine().then_some(node.run);
                collect(&mut node.data, expect, self.collect_beside_copy());
            }
            Action::Deliver(m) | Action::DeliverLosingReply(m) => {
                remove(&mut s.net, &m);
                let hear = matches!(action, Action::Deliver(_));
                if !hear {
                    s.losses += 1;
                }
                self.deliver(&mut s, m, hear);
            }
            Action::Lose(m) => {
                remove(&mut s.net, &m);
                s.losses += 1;
            }
            Action::Crash(n) => {
                s.nodes[n as usize].up = false;
                s.crashes += 1;
                s.net.retain(|m| m.node() != Some(n));
            }
            Action::Restart(n) => {
                let node = &mut s.nodes[n as usize];
                node.up = true;
                node.run += 1;
                if !self.quarantine() {
                    node.data.marker = Some(node.run);
                }
            }
            Action::Wipe(n) => {
                let node = &mut s.nodes[n as usize];
                node.up = true;
                node.run += 1;
                node.data = Data {
                    key: None,
                    fence: 0,
                    floor: 0,
                    marker: (!self.quarantine()).then_some(node.run),
                    prev: None,
                };
                s.wipes += 1;
                s.net.retain(|m| m.node() != Some(n));
                for m in s.net.iter_mut() {
                    if let Some(w) = m.wiped_mut() {
                        *w |= 1 << n;
                    }
                }
                s.net.sort();
            }
            Action::Flush(n) => {
                // The run_id stays, but the node's incarnation (`<run_id>.<epoch>` in the
                // marker) is new once it is repaired: `run` stands for that incarnation, so
                // every expectation and watch of the old one is refused or restarted, as in the
                // real client. Requests in flight are not lost (no restart): they land on the
                // flushed node and are refused by its marker check.
                let node = &mut s.nodes[n as usize];
                node.run += 1;
                node.data = Data {
                    key: None,
                    fence: 0,
                    floor: 0,
                    marker: (!self.quarantine()).then_some(node.run),
                    prev: None,
                };
                s.flushes += 1;
                for m in s.net.iter_mut() {
                    if let Some(w) = m.wiped_mut() {
                        *w |= 1 << n;
                    }
                }
                s.net.sort();
            }
            Action::Repair(n, from) => {
                // Requests in flight since the wipe: their clients gave them up (a client
                // counts a reply only within its node timeout, which the repair waited).
                let mut given_up = Vec::new();
                for m in s.net.iter_mut() {
                    let bit = 1 << n;
                    match m {
                        Msg::Acquire {
                            client,
                            node,
                            value,
                            wiped,
                            ..
                        } if *wiped & bit != 0 => {
                            *wiped &= !bit;
                            given_up.push((*client, *node, *value, None));
                        }
                        Msg::Extend {
                            client,
                            node,
                            value,
                            version,
                            wiped,
                            ..
                        } if *wiped & bit != 0 => {
                            *wiped &= !bit;
                            given_up.push((*client, *node, *value, Some(*version)));
                        }
                        _ => {}
                    }
                }
                s.net.sort();
                for (client, node, value, version) in given_up {
                    match &mut s.clients[client as usize].doing {
                        Doing::Acquiring(r) if version.is_none() && r.value == value => {
                            r.replied |= 1 << node
                        }
                        Doing::Holding(h) if h.value == value && Some(h.version) == version => {
                            if let Some(e) = h.ext.as_mut() {
                                e.replied |= 1 << node
                            }
                        }
                        _ => {}
                    }
                }
                let read: Vec<Data> = (0..self.nodes)
                    .filter(|o| from & (1 << o) != 0)
                    .map(|o| s.nodes[o].data)
                    .collect();
                // `raise.lua` on every register a source holds (the fence key, the floor),
                // then `restore.lua` for the newest lease copy (highest token, then version).
                let fence = read.iter().map(|d| d.fence).max().unwrap_or(0);
                let floor = read.iter().map(|d| d.floor).max().unwrap_or(0);
                let copies: Vec<Key> = read.iter().filter_map(|d| d.key).collect();
                let newest = restored_copy(&copies, self.bug == Some(Bug::RestoreNewest));
                let node = &mut s.nodes[n as usize];
                if self.bug != Some(Bug::RepairWithoutRaise) {
                    node.data.fence = node.data.fence.max(fence);
                    node.data.floor = node.data.floor.max(floor);
                }
                if let Some(copy) = newest.filter(|_| self.bug != Some(Bug::RepairWithoutRestore)) {
                    restore_lease(&mut node.data, copy);
                }
                node.data.marker = Some(node.run);
                s.past.repaired = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut v = vec![
            Property::always("at most one valid holder", |_, s: &LeaseState| {
                s.clients
                    .iter()
                    .filter(|c| matches!(c.doing, Doing::Holding(h) if h.left > 0))
                    .count()
                    <= 1
            }),
            Property::always("tokens increase with real time", |_, s: &LeaseState| {
                !s.past.token_order_broken
            }),
            Property::always("no stale fenced write accepted", |_, s: &LeaseState| {
                !s.past.stale_accepted
            }),
            Property::sometimes("a lease is granted", |_, s: &LeaseState| s.past.grants > 0),
        ];
        // Witnesses that the bounds exercise what they are meant to (a model that cannot
        // reach them would pass vacuously).
        if self.rounds >= 3 {
            // One round to see the holder's key, one to swap it.
            v.push(Property::sometimes(
                "a lease is taken over",
                |_, s: &LeaseState| s.past.took_over,
            ));
            if self.fenced_writes {
                v.push(Property::sometimes(
                    "a stale write is refused",
                    |_, s: &LeaseState| s.past.refused,
                ));
            }
        }
        if self.rounds >= 2 {
            // Two clients' rounds split the nodes: the loser's undo rolls its grant back.
            v.push(Property::sometimes(
                "an undone round is rolled back",
                |_, s: &LeaseState| s.past.rolled_back,
            ));
        }
        if self.extensions > 0 {
            v.push(Property::sometimes(
                "a lease is extended",
                |_, s: &LeaseState| s.past.extended,
            ));
        }
        if self.collects > 0 && self.release_modes {
            v.push(Property::sometimes(
                "a fence is collected",
                |_, s: &LeaseState| s.collects > 0,
            ));
        }
        if self.crashes + self.wipes + self.flushes > 0 && self.quarantine() {
            v.push(Property::sometimes(
                "a node is repaired",
                |_, s: &LeaseState| s.past.repaired,
            ));
        }
        v
    }
}

impl LeaseState {
    /// The same state with node `i` renamed `node[i]` and client `j` renamed `client[j]`.
    fn renamed(&self, node: &[usize], client: &[usize]) -> LeaseState {
        let mut s = self.clone();
        for (i, n) in self.nodes.iter().enumerate() {
            s.nodes[node[i]] = *n;
        }
        for (j, c) in self.clients.iter().enumerate() {
            let mut c = c.clone();
            for (i, w) in self.clients[j].watch.iter().enumerate() {
                c.watch[node[i]] = *w;
            }
            match &mut c.doing {
                Doing::Idle => {}
                Doing::Acquiring(r) => {
                    r.acks = remap_mask(r.acks, node);
                    r.replied = remap_mask(r.replied, node);
                }
                Doing::Holding(h) => {
                    if let Some(e) = h.ext.as_mut() {
                        e.applied = remap_mask(e.applied, node);
                        e.rejected = remap_mask(e.rejected, node);
                        e.replied = remap_mask(e.replied, node);
                    }
                }
            }
            s.clients[client[j]] = c;
        }
        for m in s.net.iter_mut() {
            match m {
                Msg::Acquire {
                    client: c,
                    node: n,
                    wiped,
                    ..
                }
                | Msg::Extend {
                    client: c,
                    node: n,
                    wiped,
                    ..
                } => {
                    *c = client[*c as usize] as u8;
                    *n = node[*n as usize] as u8;
                    *wiped = remap_mask(*wiped, node);
                }
                Msg::Release { node: n, .. } | Msg::Undo { node: n, .. } => {
                    *n = node[*n as usize] as u8
                }
                Msg::Write { .. } => {}
            }
        }
        s.net.sort();
        s
    }
}

/// Nodes are interchangeable, and so are clients (values and tokens are global): the
/// representative renames them in the order of their own state (ties keep their order), so
/// the checker visits states that differ only by such a renaming once. (Any member of the
/// class is a sound representative; this one is cheap, and sorts most classes alike.)
impl Representative for LeaseState {
    fn representative(&self) -> Self {
        let node = ranks(self.nodes.len(), |i| {
            (
                self.nodes[i],
                self.clients.iter().map(|c| c.watch[i]).collect::<Vec<_>>(),
            )
        });
        let client = ranks(self.clients.len(), |j| {
            (self.clients[j].doing, self.clients[j].known)
        });
        self.renamed(&node, &client)
    }
}
