//! The copy of a node-list change under FLUSHALL: the old cluster {A, B, C} is sealed and its
//! ID register copied onto the new list {A, B, D} (C leaves, D is new and blank), while an ID
//! client of the old cluster runs its rounds, requests are lost, and nodes lose every key.
//!
//! Mirrors: `Client::change_cluster` in `src/repair/change.rs` (`seal_for`: seal every
//! verified old node with `seal.lua`, settle one node timeout, take the census of the sealed
//! sources; `enlist`: take a claim on every new-list node of the lineage; `copy_and_mark`: the
//! copy, then mark every target that took all of it, under its claim) and
//! `Client::copy_paged` in `src/repair/copy.rs` (every source read is behind the incarnation
//! the census found, `behind`/`read_keys`: a source that changed is dropped with what it
//! returned, `Sources::drop_changed`, and the copy stops when fewer than a majority of
//! sources are left; `verify_sources` once more after the last page; every write checks the
//! repairer's claim atomically, `raise`, so a target emptied meanwhile takes nothing and is
//! never marked). The old client's rounds are `id_propose.lua` ([`crate::ids::propose`],
//! compared with the real script by `tests/conformance.rs`): set-if-greater on every old
//! node, returned once a majority applied it.
//!
//! Explored: every interleaving of the client's rounds (each request delivered or lost), the
//! seal of each old node (any subset, in any order: a node never sealed was unreachable), the
//! settle, the claims, the read of each source, the write onto each target, the final
//! verification and the mark of each target, each a separate step; and FLUSHALL of any node at
//! any moment (every key lost, the marker and the claim with them; the node keeps its run_id
//! and stays up; it bumps the node's incarnation, as the real marker's epoch and last-repair
//! nonce change).
//!
//! Properties: [`FOLLOWS`], the new cluster follows the old: once a majority of the new list is
//! marked for it, the value a majority of its marked nodes could answer with at the lowest
//! (the `n/2+1`-th lowest register: what a new client's first ID round could start from; as
//! `weakest_majority` in `tests/flushall.rs`) is at least every ID the old cluster returned;
//! and [`COMPLETES`], a `sometimes` property (the change completes after the old cluster
//! returned an ID), so a vacuous model cannot pass. Planted bugs ([`Bug`]): blind copy reads
//! (the hole H1 of issue 27), unclaimed copy writes (M1), and a copy that goes on with fewer
//! than a majority of unchanged sources.
//!
//! Abstractions, stated (what is NOT explored):
//! - One register (one key, so one page): the copy reads it from each source, then writes the
//!   highest value read onto each target. Keys found by one source's scan and read from the
//!   others, and a target that took some pages and not others, are not explored. With one key
//!   a source read behind its incarnation is valid when it is taken, so the final verification
//!   changes nothing here (it is modelled, but no planted bug switches off only it).
//! - One client of the old cluster, its rounds proposing 1, 2, ... (a fresh, higher value each
//!   round; the ID model explores the learning and the blocks). Rounds start only before the
//!   settle: after it a majority of the old list is sealed and refuses them, so none can
//!   return. The settle ends every request in flight: the client has given it up (its node
//!   timeout is at most the settle); one landing later on a sealed or flushed node is refused
//!   anyway, and one landing on the unsealed old node C reaches neither a source nor a target.
//! - No repair inside the old cluster: a node flushed before the seal stays unmarked (the ID
//!   model explores that repair). Sources and targets are always reachable once enlisted, and
//!   copy writes are not lost (a lost write only drops a target). One change attempt: a copy
//!   that stops is not run again.
//! - [`Bug::UnclaimedCopyWrites`] needs two flushes for a counterexample: with one register and
//!   three targets, a single target emptied after its write and still marked misses nothing
//!   that the other two marked targets do not hold (any majority of the new list includes one
//!   of them); it takes a second emptied target to make a whole majority stale.

use std::fmt;

use stateright::{Model, Property};

use crate::ids::{propose, Register, Reply};

/// The old list: A, B, C.
pub const OLD: [usize; 3] = [0, 1, 2];
/// The new list: A, B, D.
pub const NEW: [usize; 3] = [0, 1, 3];
/// A majority of either list.
pub const MAJORITY: usize = 2;
/// The nodes' names, by index.
pub const NAMES: [char; 4] = ['A', 'B', 'C', 'D'];

/// The safety property's name.
pub const FOLLOWS: &str = "the new cluster follows the old";
/// The `sometimes` property's name.
pub const COMPLETES: &str = "the change completes after an ID was returned";

/// A node's marker, as far as the change reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Marker {
    /// Verified for the old cluster (`<run>.<epoch>/<old>`): it votes for the old client.
    Old,
    /// Sealed for the new cluster (`<run>.<epoch>/<old>#sealed:<new>`): it votes for nobody.
    Sealed,
    /// Marked for the new cluster (`<run>.<epoch>/<new>`).
    New,
    /// No marker: blank (D before the change) or flushed.
    Absent,
}

/// One node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// The ID register (its high-water mark; absent = 0).
    pub value: u64,
    pub marker: Marker,
    /// The incarnation the census compares: run_id, marker epoch and last-repair nonce in one
    /// counter, bumped by a flush and by a mark.
    pub incarnation: u8,
    /// The change's repair claim on it (a target's).
    pub claim: bool,
}

/// How far the change got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// No change yet: the old cluster serves its client.
    Open,
    /// Seals sent (some old nodes sealed).
    Sealing,
    /// Settled, census taken: the sources are fixed; the claims are not taken yet.
    Settled,
    /// Claims taken: reading the sources, then writing the targets.
    Copying,
    /// The final verification passed: marking the targets.
    Marking,
    /// A majority of the new list is marked.
    Done,
    /// The change stopped (too few sealed, too few unchanged sources, too few marked).
    Stopped,
}

/// The old client's round in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Round {
    /// The value proposed (the round's number).
    pub value: u64,
    /// Old nodes (bit mask) that applied it, and that have not answered yet.
    pub acks: u8,
    pub open: u8,
}

/// A request in flight: the client's set-if-greater of `value` to `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub node: u8,
    pub value: u64,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyState {
    pub nodes: [Node; 4],
    /// The old client's round, and how many rounds it started.
    pub round: Option<Round>,
    pub started: u8,
    /// The highest ID the old cluster returned (0: none).
    pub returned: u64,
    /// Requests in flight, sorted.
    pub net: Vec<Msg>,
    pub phase: Phase,
    /// The copy's sources still unchanged (bit mask of old nodes), each one's incarnation at
    /// the census, and what each returned.
    pub sources: u8,
    pub census: [u8; 3],
    pub read: [Option<u64>; 3],
    /// The copy's targets still in (bit mask of nodes), those that took the write, those
    /// marked.
    pub targets: u8,
    pub written: u8,
    pub marked: u8,
    pub losses: u8,
    pub flushes: u8,
}

/// A protection switched off, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// Source reads do not compare the source's incarnation with the census, and there is no
    /// final verification (the copy before the fix of issue 27's H1: the TEST-ONLY
    /// `copy_checks` off).
    BlindCopyReads,
    /// Copy writes and the mark do not check the claim: a target flushed mid-copy is still
    /// written and marked (M1: a claim refreshed over the flush).
    UnclaimedCopyWrites,
    /// The copy goes on as long as one unchanged source is left, not a majority
    /// (`Sources::drop_changed` without its count).
    CopyWithoutMajority,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The old client starts a round: set-if-greater of its next value on every old node.
    Round,
    /// A node applies a request (`id_propose.lua`) and the client hears the reply.
    Deliver(Msg),
    /// The network loses a request.
    Lose(Msg),
    /// The change seals an old node (`seal.lua`, behind its marker).
    Seal(u8),
    /// The change settles (one node timeout), then takes the census of the sealed nodes.
    Settle,
    /// The change takes a claim on every new-list node it may copy to.
    Enlist,
    /// The copy reads the register of one source, behind its incarnation.
    Read(u8),
    /// The copy writes the highest value read onto one target, under its claim.
    Write(u8),
    /// After the last page, every source is verified once more.
    Verify,
    /// The change marks a target for the new cluster, under its claim.
    Mark(u8),
    /// FLUSHALL: the node loses every key (marker and claim included), keeps running.
    Flush(u8),
}

fn name(n: u8) -> char {
    NAMES.get(n as usize).copied().unwrap_or('?')
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Round => write!(f, "the old client starts an ID round"),
            Action::Deliver(m) => write!(
                f,
                "node {} gets the old client's set-if-greater {} (and the client its reply)",
                name(m.node),
                m.value
            ),
            Action::Lose(m) => write!(
                f,
                "the network loses the old client's set-if-greater {} to node {}",
                m.value,
                name(m.node)
            ),
            Action::Seal(n) => write!(f, "the change seals node {}", name(n)),
            Action::Settle => write!(
                f,
                "the change settles and takes the census of the sealed sources"
            ),
            Action::Enlist => write!(f, "the change claims the new list's nodes (targets)"),
            Action::Read(n) => write!(
                f,
                "the copy reads source {} (dropped if it changed)",
                name(n)
            ),
            Action::Write(n) => write!(
                f,
                "the copy writes onto target {} (if it holds the claim)",
                name(n)
            ),
            Action::Verify => write!(f, "the copy verifies its sources once more"),
            Action::Mark(n) => write!(
                f,
                "the change marks node {} for the new cluster (if it holds the claim)",
                name(n)
            ),
            Action::Flush(n) => write!(f, "FLUSHALL on node {}", name(n)),
        }
    }
}

/// The bounds of one exploration.
#[derive(Clone, Debug)]
pub struct CopyModel {
    /// Rounds the old client may start.
    pub rounds: u8,
    /// Requests the network may lose, in all.
    pub losses: u8,
    /// FLUSHALLs, in all.
    pub flushes: u8,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
}

impl CopyModel {
    /// CI bounds: 2 rounds of the old client, one lost request, one FLUSHALL (the shape of the
    /// hole H1: a round lost to B, C unsealed, A flushed during the copy).
    pub fn ci() -> Self {
        CopyModel {
            rounds: 2,
            losses: 1,
            flushes: 1,
            bug: None,
        }
    }

    /// CI bounds with two FLUSHALLs (what the unclaimed-writes bug needs).
    pub fn ci_two_flushes() -> Self {
        CopyModel {
            flushes: 2,
            ..CopyModel::ci()
        }
    }

    /// Larger bounds (`rq-model copy --deep`).
    pub fn deep() -> Self {
        CopyModel {
            rounds: 3,
            losses: 2,
            flushes: 2,
            bug: None,
        }
    }

    /// The same bounds with `bug` planted.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        self
    }

    fn compares(&self) -> bool {
        self.bug != Some(Bug::BlindCopyReads)
    }

    fn claims(&self) -> bool {
        self.bug != Some(Bug::UnclaimedCopyWrites)
    }

    /// The old client's round after a reply or a loss: returned, failed, or still open.
    fn resolve(s: &mut CopyState) {
        let Some(r) = s.round else {
            return;
        };
        let acks = r.acks.count_ones() as usize;
        if acks >= MAJORITY {
            s.returned = s.returned.max(r.value);
            s.round = None;
        } else if acks + (r.open.count_ones() as usize) < MAJORITY {
            s.round = None;
        }
    }

    /// The copy stops when fewer than a majority of unchanged sources are left.
    fn drop_source(&self, s: &mut CopyState, n: usize) {
        s.sources &= !(1 << n);
        if let Some(r) = s.read.get_mut(n) {
            *r = None;
        }
        let needed = match self.bug {
            Some(Bug::CopyWithoutMajority) => 1,
            _ => MAJORITY,
        };
        if (s.sources.count_ones() as usize) < needed {
            s.phase = Phase::Stopped;
        }
    }

    fn changed(s: &CopyState, n: usize) -> bool {
        s.census.get(n).copied() != s.nodes.get(n).map(|x| x.incarnation)
    }

    /// Every remaining source read.
    fn all_read(s: &CopyState) -> bool {
        OLD.iter()
            .all(|&n| s.sources & (1 << n) == 0 || s.read[n].is_some())
    }

    /// Every remaining target written.
    fn all_written(s: &CopyState) -> bool {
        s.targets & !s.written == 0
    }

    /// After a mark (or a target dropped): done, stopped, or still marking.
    fn finish_marking(s: &mut CopyState) {
        if s.phase != Phase::Marking || s.targets & !s.marked != 0 {
            return;
        }
        s.phase = if (s.marked.count_ones() as usize) >= MAJORITY {
            Phase::Done
        } else {
            Phase::Stopped
        };
    }
}

/// The value the weakest majority of the new list's marked nodes holds at its highest, when a
/// majority of the new list is marked.
pub fn weakest_majority(s: &CopyState) -> Option<u64> {
    let mut values: Vec<u64> = NEW
        .iter()
        .map(|&n| s.nodes[n])
        .filter(|n| n.marker == Marker::New)
        .map(|n| n.value)
        .collect();
    values.sort_unstable();
    values.get(MAJORITY - 1).copied()
}

impl Model for CopyModel {
    type State = CopyState;
    type Action = Action;

    fn init_states(&self) -> Vec<CopyState> {
        let old = Node {
            value: 0,
            marker: Marker::Old,
            incarnation: 0,
            claim: false,
        };
        let blank = Node {
            marker: Marker::Absent,
            ..old
        };
        vec![CopyState {
            nodes: [old, old, old, blank],
            round: None,
            started: 0,
            returned: 0,
            net: Vec::new(),
            phase: Phase::Open,
            sources: 0,
            census: [0; 3],
            read: [None; 3],
            targets: 0,
            written: 0,
            marked: 0,
            losses: 0,
            flushes: 0,
        }]
    }

    fn actions(&self, s: &CopyState, out: &mut Vec<Action>) {
        let before_settle = matches!(s.phase, Phase::Open | Phase::Sealing);
        if s.round.is_none() && s.started < self.rounds && before_settle {
            out.push(Action::Round);
        }
        let mut last = None;
        for m in &s.net {
            if last == Some(m) {
                continue;
            }
            last = Some(m);
            out.push(Action::Deliver(*m));
            if s.losses < self.losses {
                out.push(Action::Lose(*m));
            }
        }
        match s.phase {
            Phase::Open | Phase::Sealing => {
                for n in OLD {
                    if s.nodes[n].marker == Marker::Old {
                        out.push(Action::Seal(n as u8));
                    }
                }
                if s.phase == Phase::Sealing {
                    out.push(Action::Settle);
                }
            }
            Phase::Settled => out.push(Action::Enlist),
            Phase::Copying => {
                if !Self::all_read(s) {
                    for n in OLD {
                        if s.sources & (1 << n) != 0 && s.read[n].is_none() {
                            out.push(Action::Read(n as u8));
                        }
                    }
                } else if !Self::all_written(s) {
                    for n in NEW {
                        if s.targets & !s.written & (1 << n) != 0 {
                            out.push(Action::Write(n as u8));
                        }
                    }
                } else {
                    out.push(Action::Verify);
                }
            }
            Phase::Marking => {
                for n in NEW {
                    if s.targets & !s.marked & (1 << n) != 0 {
                        out.push(Action::Mark(n as u8));
                    }
                }
            }
            Phase::Done | Phase::Stopped => {}
        }
        if s.flushes < self.flushes {
            for n in 0..s.nodes.len() {
                out.push(Action::Flush(n as u8));
            }
        }
    }

    fn next_state(&self, s: &CopyState, action: Action) -> Option<CopyState> {
        let mut s = s.clone();
        match action {
            Action::Round => {
                s.started += 1;
                let value = u64::from(s.started);
                s.round = Some(Round {
                    value,
                    acks: 0,
                    open: OLD.iter().fold(0, |acc, &n| acc | (1 << n)),
                });
                for n in OLD {
                    s.net.push(Msg {
                        node: n as u8,
                        value,
                    });
                }
                s.net.sort();
            }
            Action::Deliver(m) | Action::Lose(m) => {
                let i = s.net.iter().position(|x| *x == m)?;
                s.net.remove(i);
                let n = m.node as usize;
                let mut applied = false;
                if let Action::Deliver(_) = action {
                    let node = &mut s.nodes[n];
                    let mut reg = Register {
                        value: node.value,
                        marked: node.marker == Marker::Old,
                    };
                    applied = matches!(
                        propose(&mut reg, m.value, m.value, true),
                        Reply::Accepted { .. }
                    );
                    node.value = reg.value;
                } else {
                    s.losses += 1;
                }
                if let Some(r) = s.round.as_mut() {
                    if r.value == m.value && r.open & (1 << n) != 0 {
                        r.open &= !(1 << n);
                        if applied {
                            r.acks |= 1 << n;
                        }
                    }
                }
                Self::resolve(&mut s);
            }
            Action::Seal(n) => {
                // `seal.lua` compares the marker: only a node verified for the old cluster.
                let node = &mut s.nodes[n as usize];
                if node.marker == Marker::Old {
                    node.marker = Marker::Sealed;
                }
                s.phase = Phase::Sealing;
            }
            Action::Settle => {
                // Every request in flight was given up by the client (its node timeout is at
                // most the settle).
                s.net.clear();
                if let Some(r) = s.round.as_mut() {
                    r.open = 0;
                }
                Self::resolve(&mut s);
                for n in OLD {
                    if s.nodes[n].marker == Marker::Sealed {
                        s.sources |= 1 << n;
                        s.census[n] = s.nodes[n].incarnation;
                    }
                }
                s.phase = if (s.sources.count_ones() as usize) < MAJORITY {
                    Phase::Stopped
                } else {
                    Phase::Settled
                };
            }
            Action::Enlist => {
                // Blank nodes, or of the old cluster (verified or sealed for this change).
                for n in NEW {
                    if s.nodes[n].marker != Marker::New {
                        s.nodes[n].claim = true;
                        s.targets |= 1 << n;
                    }
                }
                s.phase = Phase::Copying;
            }
            Action::Read(n) => {
                let n = n as usize;
                if self.compares() && Self::changed(&s, n) {
                    self.drop_source(&mut s, n);
                } else {
                    s.read[n] = Some(s.nodes[n].value);
                }
            }
            Action::Write(n) => {
                let n = n as usize;
                let value = s.read.iter().flatten().copied().max().unwrap_or(0);
                if self.claims() && !s.nodes[n].claim {
                    s.targets &= !(1 << n);
                } else {
                    let node = &mut s.nodes[n];
                    node.value = node.value.max(value);
                    s.written |= 1 << n;
                }
                if s.targets == 0 {
                    s.phase = Phase::Stopped;
                }
            }
            Action::Verify => {
                s.phase = Phase::Marking;
                if self.compares() {
                    for n in OLD {
                        if s.sources & (1 << n) != 0 && Self::changed(&s, n) {
                            self.drop_source(&mut s, n);
                        }
                    }
                }
                Self::finish_marking(&mut s);
            }
            Action::Mark(n) => {
                let n = n as usize;
                if self.claims() && !s.nodes[n].claim {
                    s.targets &= !(1 << n);
                } else {
                    let node = &mut s.nodes[n];
                    node.marker = Marker::New;
                    node.incarnation = node.incarnation.wrapping_add(1);
                    node.claim = false;
                    s.marked |= 1 << n;
                }
                Self::finish_marking(&mut s);
            }
            Action::Flush(n) => {
                let node = &mut s.nodes[n as usize];
                node.value = 0;
                node.marker = Marker::Absent;
                node.claim = false;
                node.incarnation = node.incarnation.wrapping_add(1);
                s.flushes += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FOLLOWS, |_, s: &CopyState| {
                weakest_majority(s).is_none_or(|v| v >= s.returned)
            }),
            Property::sometimes(COMPLETES, |_, s: &CopyState| {
                s.phase == Phase::Done && s.returned > 0
            }),
        ]
    }
}
