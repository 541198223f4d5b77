//! The ID register: antirez's majority set-if-less-than for a block, guarded by the node
//! marker, with quarantine and repair of a node that lost its data.
//!
//! Mirrors: the node step `src/scripts/id_propose.lua` ([`propose`], compared with the real
//! script on a real node by `tests/conformance.rs`); the client's rounds in `src/id/round.rs`
//! and `src/id/decide.rs` (reserve above what is known, count the replies, learn from them,
//! propose again); the repair in `src/repair/` (copy the highest value a majority of the
//! *other* marked nodes hold, then mark).
//!
//! Explored: every interleaving of the clients' calls, the delivery of every request and
//! reply in any order, lost requests and lost replies, a client that stops waiting for a node
//! (its timeout), node crash and restart (the register is kept: AOF `appendfsync always`),
//! node wipe (restarts empty and unmarked), FLUSHALL (a running node loses every key, its
//! marker included, and keeps its run_id: the proposals in flight to it land and are refused,
//! before its repair for the missing marker, after it for the new epoch the repair writes),
//! and repair. A client's pause is any interleaving
//! in which it takes no step.
//!
//! Properties: every ID returned is unique, and in real-time order (a call that started after
//! another returned gets larger IDs).
//!
//! Abstractions, stated: a repair reads its sources and marks in one step (after its wait),
//! so a FLUSHALL of a *source* never falls between its read and its mark (the copy model,
//! `copy.rs`, explores that interleaving, and the real copy reads every source behind its
//! census incarnation); a repair is one atomic step (the real one copies, waits one node
//! timeout for writes in flight, then marks; `README.md` lists the in-flight race as argued);
//! a retry proposes just above what is known (the real client may add a random spread after a
//! lost round, which only raises the block); blocks have a fixed size.

use std::fmt;

use stateright::{Model, Property, Representative};

use crate::symmetry::{ranks, remap_mask};

/// A node's register for one sequence, and whether its marker is the one the clients expect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Register {
    /// The highest ID the node accepted (absent = 0).
    pub value: u64,
    /// The node's marker is the one the clients verified (false after a wipe, until repair).
    pub marked: bool,
}

/// What the node step answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// `{1, previous}`: the node now stores `last`.
    Accepted { previous: u64 },
    /// `{0, current}`: `current >= base`; nothing changed.
    Behind { current: u64 },
    /// `{-1, current}`: the marker is missing or differs; nothing changed.
    Refused { current: u64 },
}

impl Reply {
    /// The value the node reported.
    pub fn value(self) -> u64 {
        match self {
            Reply::Accepted { previous } => previous,
            Reply::Behind { current } | Reply::Refused { current } => current,
        }
    }
}

/// `id_propose.lua`, line for line: the marker check (skipped when `check_marker` is false,
/// the script's `"*"`), then set-if-less-than for the block `base..=last`.
pub fn propose(reg: &mut Register, base: u64, last: u64, check_marker: bool) -> Reply {
    let current = reg.value;
    if check_marker && !reg.marked {
        return Reply::Refused { current };
    }
    if current < base {
        reg.value = last;
        Reply::Accepted { previous: current }
    } else {
        Reply::Behind { current }
    }
}

/// The read that validates a spare block (`src/id/round.rs`, `read_step`: `GET` of the
/// register behind a read of the marker, in one transaction): the node's value, refused while
/// its marker is missing or stale.
pub fn read(reg: &Register, check_marker: bool) -> Reply {
    let current = reg.value;
    if check_marker && !reg.marked {
        Reply::Refused { current }
    } else {
        Reply::Behind { current }
    }
}

/// A protection switched off, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A quorum of N/2 (at least 1) instead of a majority.
    QuorumHalf,
    /// No marker check, no quarantine: a wiped node votes at once (the script's `"*"`).
    NoQuarantine,
    /// The repair reads the other nodes at once, without waiting one node timeout for the
    /// proposals in flight (the hole the shipped repair had before the wait).
    RepairWithoutWait,
    /// IDs from a spare block are handed out without the validating read.
    SpareWithoutRead,
    /// The validating read accepts one node's value instead of a majority's.
    SpareReadFromOne,
}

/// The bounds of one exploration.
#[derive(Clone, Debug)]
pub struct IdModel {
    /// Nodes (3 or 5).
    pub nodes: usize,
    /// Clients (separate processes, each with its own knowledge).
    pub clients: usize,
    /// Calls each client makes.
    pub calls: u8,
    /// Further calls the first client makes (its budget is part of its state, so the clients
    /// stay interchangeable for the symmetry reduction).
    pub extra_calls: u8,
    /// IDs per call (the block size).
    pub block: u64,
    /// Rounds a call may take before it gives up.
    pub rounds: u8,
    /// Requests or replies the network may lose, in all.
    pub losses: u8,
    /// Node crashes (each may restart), in all.
    pub crashes: u8,
    /// Node wipes, in all.
    pub wipes: u8,
    /// FLUSHALLs, in all (the node loses every key, its marker included, and keeps running).
    pub flushes: u8,
    /// Extra IDs a write round reserves beyond its callers' (0: none). A later call takes its
    /// IDs from that spare block after a majority *read* shows no register above the block's
    /// end: no block above it was accepted by a majority before the read, so none of its IDs
    /// was returned before the call started.
    pub lookahead: u64,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
}

impl IdModel {
    /// CI bounds for the network: 3 nodes, 2 clients with a call of 2 IDs each, 2 rounds a
    /// call, one lost request or reply, one node crash (and restart). About 12 million
    /// distinct states, under a minute on 2 cores.
    pub fn ci_network() -> Self {
        IdModel {
            nodes: 3,
            clients: 2,
            calls: 1,
            block: 2,
            rounds: 2,
            losses: 1,
            crashes: 1,
            wipes: 0,
            flushes: 0,
            lookahead: 0,
            extra_calls: 0,
            bug: None,
        }
    }

    /// CI bounds for amnesia: the same clients, one node wipe with its quarantine and repair
    /// (and no other fault). About 8 million distinct states.
    pub fn ci_amnesia() -> Self {
        IdModel {
            losses: 0,
            crashes: 0,
            wipes: 1,
            ..IdModel::ci_network()
        }
    }

    /// CI bounds for FLUSHALL: the same clients, one flush (the node keeps running: proposals
    /// in flight to it land and are refused) with its quarantine and repair, no other fault.
    pub fn ci_flush() -> Self {
        IdModel {
            wipes: 0,
            flushes: 1,
            ..IdModel::ci_amnesia()
        }
    }

    /// Bounds for spare blocks validated by a read: 2 clients with a call of one ID each and
    /// one more call for the first (from its spare block), a write round reserving one spare
    /// ID, 2 rounds a call, no lost message (with one, the run does not finish in 20 minutes on
    /// 2 cores; `rq-model ids --spare --losses 1` runs it).
    pub fn ci_spare() -> Self {
        IdModel {
            block: 1,
            lookahead: 1,
            extra_calls: 1,
            crashes: 0,
            losses: 0,
            ..IdModel::ci_network()
        }
    }

    /// Larger bounds (`rq-model --deep`): every fault of both CI bound sets at once.
    pub fn deep() -> Self {
        IdModel {
            wipes: 1,
            ..IdModel::ci_network()
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

    /// Replies a validating read needs.
    fn read_needed(&self) -> usize {
        match self.bug {
            Some(Bug::SpareReadFromOne) => 1,
            _ => self.needed(),
        }
    }

    fn check_marker(&self) -> bool {
        self.bug != Some(Bug::NoQuarantine)
    }
}

/// A message in flight: a client's proposal of `base..=last` to a node, in the client's round
/// `seq`. (A node's reply reaches its client in the same step as the node applies the
/// proposal, unless that step loses it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Propose {
        client: u8,
        node: u8,
        seq: u8,
        base: u64,
        last: u64,
        /// The nodes (bit mask) whose repair began while this proposal was in flight.
        before_repair_of: u8,
        /// A validating read (`base..=last` are then the IDs it would hand out), not a
        /// proposal.
        read: bool,
    },
}

/// A node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// Its register (kept across a crash: AOF `appendfsync always`).
    pub reg: Register,
    /// Running.
    pub up: bool,
    /// A repair of this node has begun (the proposals in flight then carry its mark: the
    /// repair waits one node timeout before it reads, so each of them has either landed or
    /// been given up by its client when the repair reads).
    pub repairing: bool,
    /// Flushed and not repaired since: the proposals in flight to it carry the marker of its
    /// old incarnation, which its repair replaces (a new epoch).
    pub flushed: bool,
}

/// A call in progress: its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Round {
    /// The client's round counter (replies of older rounds are ignored).
    pub seq: u8,
    /// Rounds this call has taken, this one included.
    pub rounds: u8,
    /// The block proposed.
    pub base: u64,
    pub last: u64,
    /// The highest ID any call had returned when this call started (real-time order).
    pub floor: u64,
    /// Nodes that accepted, and nodes that replied (bit masks).
    pub acks: u8,
    pub replied: u8,
    /// The highest value a reply reported.
    pub learned: u64,
    /// A validating read of the spare block ending here, not a proposal.
    pub read_end: Option<u64>,
}

/// A client process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// Calls made (returned or given up).
    pub calls: u8,
    /// The highest value known (the generator's `known_max`, with its high-water mark).
    pub known: u64,
    /// Its round counter.
    pub seq: u8,
    /// The call in progress.
    pub call: Option<Round>,
    /// The rest of its last block a majority accepted: `(next, end)`.
    pub spare: Option<(u64, u64)>,
    /// Calls it may make.
    pub budget: u8,
}

/// A call that returned its IDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Returned {
    pub client: u8,
    pub base: u64,
    pub last: u64,
    /// The highest ID returned before this call started.
    pub floor: u64,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdState {
    pub nodes: Vec<Node>,
    pub clients: Vec<Client>,
    /// Messages in flight, sorted (a multiset).
    pub net: Vec<Msg>,
    pub returned: Vec<Returned>,
    pub losses: u8,
    pub crashes: u8,
    pub wipes: u8,
    pub flushes: u8,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client starts a call (`next_ids(block)`).
    Call(u8),
    /// The network delivers a proposal; the node applies it and the client hears its reply.
    Deliver(Msg),
    /// The network delivers a proposal; the node applies it; its reply is lost.
    DeliverLosingReply(Msg),
    /// The network loses a message.
    Lose(Msg),
    /// A client stops waiting for the nodes that have not answered (its node timeout).
    Timeout(u8),
    /// A node crashes (kill -9); messages to it are lost.
    Crash(u8),
    /// A crashed node restarts with its register.
    Restart(u8),
    /// A node loses its data and restarts empty (unmarked: quarantined).
    Wipe(u8),
    /// FLUSHALL: a running node loses every key, its marker included (quarantined); the
    /// proposals in flight to it still land on it, and are refused.
    Flush(u8),
    /// A repair of a quarantined node begins (its census), and waits one node timeout.
    RepairBegin(u8),
    /// After the wait, the repair reads the nodes in the mask (a majority of the other marked
    /// nodes), raises the node to the highest value read, and marks it. Proposals that were in
    /// flight when it began and still are now were given up by their clients (their node
    /// timeout is at most the wait): a reply to them no longer counts.
    Repair(u8, u8),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Call(c) => write!(f, "client {c} calls next_ids"),
            Action::Deliver(Msg::Propose {
                client,
                node,
                base,
                last,
                read: true,
                ..
            }) => write!(
                f,
                "node {node} answers client {client}'s read validating {base}..={last}, and client {client} hears it"
            ),
            Action::DeliverLosingReply(Msg::Propose {
                client,
                node,
                base,
                last,
                read: true,
                ..
            })
            | Action::Lose(Msg::Propose {
                client,
                node,
                base,
                last,
                read: true,
                ..
            }) => write!(
                f,
                "client {client}'s read validating {base}..={last} to node {node} or its reply is lost"
            ),
            Action::Deliver(Msg::Propose {
                client,
                node,
                base,
                last,
                ..
            }) => write!(
                f,
                "node {node} applies client {client}'s proposal {base}..={last}, and client {client} hears the reply"
            ),
            Action::DeliverLosingReply(Msg::Propose {
                client,
                node,
                base,
                last,
                ..
            }) => write!(
                f,
                "node {node} applies client {client}'s proposal {base}..={last}; the reply is lost"
            ),
            Action::Lose(Msg::Propose {
                client, node, base, last, ..
            }) => write!(
                f,
                "the network loses client {client}'s proposal {base}..={last} to node {node}"
            ),
            Action::Timeout(c) => write!(f, "client {c} stops waiting (node timeout)"),
            Action::Crash(n) => write!(f, "node {n} crashes"),
            Action::Restart(n) => write!(f, "node {n} restarts with its data"),
            Action::Wipe(n) => write!(f, "node {n} loses its data and restarts empty"),
            Action::Flush(n) => write!(f, "FLUSHALL on node {n} (every key lost, still running)"),
            Action::RepairBegin(n) => write!(f, "a repair of node {n} begins (and waits one node timeout)"),
            Action::Repair(n, from) => write!(
                f,
                "the repair reads nodes {:?}, copies onto node {n} and marks it",
                (0..8).filter(|o| from & (1 << o) != 0).collect::<Vec<_>>()
            ),
        }
    }
}

impl IdModel {
    /// Start round `rounds` of client `c`'s call: validate IDs from its spare block with a
    /// read if it holds enough (first round only), else propose just above what it knows
    /// (with the lookahead).
    fn start_round(&self, s: &mut IdState, c: usize, rounds: u8, floor: u64) {
        let client = &mut s.clients[c];
        client.seq += 1;
        let spare = client
            .spare
            .filter(|(next, end)| rounds == 1 && next + self.block - 1 <= *end);
        let (base, last, read_end) = match spare {
            Some((next, end)) => {
                // The IDs are taken from the spare now: a failed read leaves them a gap.
                let last = next + self.block - 1;
                client.spare = (last < end).then_some((last + 1, end));
                (next, last, Some(end))
            }
            None => {
                client.spare = None;
                let base = client.known + 1;
                (base, base + self.block - 1 + self.lookahead, None)
            }
        };
        client.call = Some(Round {
            seq: client.seq,
            rounds,
            base,
            last,
            floor,
            acks: 0,
            replied: 0,
            learned: 0,
            read_end,
        });
        if read_end.is_some() && self.bug == Some(Bug::SpareWithoutRead) {
            // The planted bug: no read at all, the IDs are returned at once.
            if let Some(r) = client.call.as_mut() {
                r.acks = (1 << self.nodes) - 1;
            }
            self.settle(s, c, false);
            return;
        }
        for n in 0..self.nodes {
            s.net.push(Msg::Propose {
                client: c as u8,
                node: n as u8,
                seq: client.seq,
                base,
                last,
                before_repair_of: 0,
                read: read_end.is_some(),
            });
        }
        s.net.sort();
    }

    /// After a reply or a timeout: return, go again, or give up (as `src/id/round.rs`).
    fn settle(&self, s: &mut IdState, c: usize, timed_out: bool) {
        let Some(r) = s.clients[c].call else {
            return;
        };
        let acks = r.acks.count_ones() as usize;
        let unanswered = self.nodes - r.replied.count_ones() as usize;
        let needed = if r.read_end.is_some() {
            self.read_needed()
        } else {
            self.needed()
        };
        if acks >= needed {
            // A write round hands out its first `block` IDs and keeps the rest as spare.
            let handed = if r.read_end.is_some() {
                r.last
            } else {
                r.base + self.block - 1
            };
            s.returned.push(Returned {
                client: c as u8,
                base: r.base,
                last: handed,
                floor: r.floor,
            });
            let client = &mut s.clients[c];
            client.known = client.known.max(r.last);
            if r.read_end.is_none() && handed < r.last {
                client.spare = Some((handed + 1, r.last));
            }
            client.calls += 1;
            client.call = None;
            return;
        }
        if !timed_out && acks + unanswered >= needed {
            return; // still possible: keep waiting
        }
        // The round failed: learn (a node that accepted means the block is taken), then
        // propose again or give up.
        let client = &mut s.clients[c];
        client.spare = None;
        client.known = client
            .known
            .max(r.learned)
            .max(if r.acks > 0 && r.read_end.is_none() {
                r.last
            } else {
                0
            });
        if r.rounds < self.rounds {
            self.start_round(s, c, r.rounds + 1, r.floor);
        } else {
            let client = &mut s.clients[c];
            client.calls += 1;
            client.call = None;
        }
    }

    /// The initial state: every node up and marked at 0, every client idle.
    fn initial(&self) -> IdState {
        IdState {
            nodes: vec![
                Node {
                    reg: Register {
                        value: 0,
                        marked: true,
                    },
                    up: true,
                    repairing: false,
                    flushed: false,
                };
                self.nodes
            ],
            clients: vec![
                Client {
                    calls: 0,
                    known: 0,
                    seq: 0,
                    call: None,
                    spare: None,
                    budget: self.calls,
                };
                self.clients
            ],
            net: Vec::new(),
            returned: Vec::new(),
            losses: 0,
            crashes: 0,
            wipes: 0,
            flushes: 0,
        }
    }

    fn remove(net: &mut Vec<Msg>, m: &Msg) -> bool {
        match net.iter().position(|x| x == m) {
            Some(i) => {
                net.remove(i);
                true
            }
            None => false,
        }
    }
}

impl Model for IdModel {
    type State = IdState;
    type Action = Action;

    fn init_states(&self) -> Vec<IdState> {
        let mut init = self.initial();
        if let Some(first) = init.clients.first_mut() {
            first.budget += self.extra_calls;
        }
        vec![init]
    }

    fn actions(&self, s: &IdState, out: &mut Vec<Action>) {
        for (c, client) in s.clients.iter().enumerate() {
            match client.call {
                None if client.calls < client.budget => out.push(Action::Call(c as u8)),
                Some(r) if r.replied.count_ones() as usize != self.nodes => {
                    out.push(Action::Timeout(c as u8))
                }
                _ => {}
            }
        }
        let mut last: Option<&Msg> = None;
        for m in &s.net {
            if last == Some(m) {
                continue; // the same message twice: one action
            }
            last = Some(m);
            out.push(Action::Deliver(*m));
            if s.losses < self.losses {
                out.push(Action::Lose(*m));
                out.push(Action::DeliverLosingReply(*m));
            }
        }
        for (n, node) in s.nodes.iter().enumerate() {
            if node.up && s.crashes < self.crashes {
                out.push(Action::Crash(n as u8));
            }
            if !node.up {
                out.push(Action::Restart(n as u8));
            }
            if s.wipes < self.wipes {
                out.push(Action::Wipe(n as u8));
            }
            if node.up && s.flushes < self.flushes {
                out.push(Action::Flush(n as u8));
            }
            let no_wait = self.bug == Some(Bug::RepairWithoutWait);
            if node.up && !node.reg.marked && self.check_marker() && !node.repairing && !no_wait {
                out.push(Action::RepairBegin(n as u8));
            }
            if node.up && !node.reg.marked && self.check_marker() && (node.repairing || no_wait) {
                // Every set of exactly `needed` other nodes, up and marked, is a possible
                // read set.
                let others: Vec<usize> = (0..self.nodes)
                    .filter(|&o| o != n && s.nodes[o].up && s.nodes[o].reg.marked)
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
                    out.push(Action::Repair(n as u8, from));
                }
            }
        }
    }

    fn next_state(&self, s: &IdState, action: Action) -> Option<IdState> {
        let mut s = s.clone();
        match action {
            Action::Call(c) => {
                let floor = s.returned.iter().map(|r| r.last).max().unwrap_or(0);
                self.start_round(&mut s, c as usize, 1, floor);
            }
            Action::Deliver(m) | Action::DeliverLosingReply(m) => {
                Self::remove(&mut s.net, &m);
                let lose_reply = matches!(action, Action::DeliverLosingReply(_));
                if lose_reply {
                    s.losses += 1;
                }
                let Msg::Propose {
                    client,
                    node,
                    seq,
                    base,
                    last,
                    read: is_read,
                    ..
                } = m;
                let check = self.check_marker();
                let n = &mut s.nodes[node as usize];
                if !n.up {
                    return Some(s);
                }
                let reply = if is_read {
                    read(&n.reg, check)
                } else {
                    propose(&mut n.reg, base, last, check)
                };
                if lose_reply {
                    return Some(s);
                }
                // The reply reaches the client at once (its delivery is a local step of the
                // client; a lost reply is `DeliverLosingReply`, a slow one a `Timeout`).
                let c = client as usize;
                let Some(r) = s.clients[c].call.as_mut() else {
                    return Some(s);
                };
                if r.seq != seq || r.replied & (1 << node) != 0 {
                    // An older round's reply, or one its client already gave up: ignored.
                    return Some(s);
                }
                r.replied |= 1 << node;
                r.learned = r.learned.max(reply.value());
                let ack = match (reply, r.read_end) {
                    // A read counts a verified node whose register is at most the block's end.
                    (Reply::Behind { current }, Some(end)) => current <= end,
                    (reply, None) => matches!(reply, Reply::Accepted { .. }),
                    _ => false,
                };
                if ack {
                    r.acks |= 1 << node;
                }
                self.settle(&mut s, c, false);
            }
            Action::Lose(m) => {
                Self::remove(&mut s.net, &m);
                s.losses += 1;
            }
            Action::Timeout(c) => self.settle(&mut s, c as usize, true),
            Action::Crash(n) => {
                s.nodes[n as usize].up = false;
                s.nodes[n as usize].repairing = false;
                s.crashes += 1;
                s.net.retain(|Msg::Propose { node, .. }| *node != n);
            }
            Action::Restart(n) => s.nodes[n as usize].up = true,
            Action::Wipe(n) => {
                s.nodes[n as usize] = Node {
                    reg: Register {
                        value: 0,
                        marked: !self.check_marker(),
                    },
                    up: true,
                    repairing: false,
                    flushed: false,
                };
                s.wipes += 1;
                s.net.retain(|Msg::Propose { node, .. }| *node != n);
            }
            Action::Flush(n) => {
                let check = self.check_marker();
                let node = &mut s.nodes[n as usize];
                node.reg = Register {
                    value: 0,
                    marked: !check,
                };
                node.repairing = false;
                node.flushed = check;
                s.flushes += 1;
            }
            Action::RepairBegin(n) => {
                s.nodes[n as usize].repairing = true;
                for Msg::Propose {
                    before_repair_of, ..
                } in s.net.iter_mut()
                {
                    *before_repair_of |= 1 << n;
                }
                s.net.sort();
            }
            Action::Repair(n, from) => {
                s.nodes[n as usize].repairing = false;
                // Proposals in flight since the repair began: their clients gave them up.
                let mut given_up = Vec::new();
                for m in s.net.iter_mut() {
                    let Msg::Propose {
                        client,
                        node,
                        seq,
                        before_repair_of,
                        ..
                    } = m;
                    if *before_repair_of & (1 << n) != 0 {
                        *before_repair_of &= !(1 << n);
                        given_up.push((*client, *node, *seq));
                    }
                }
                s.net.sort();
                for (client, node, seq) in given_up {
                    let c = client as usize;
                    if let Some(r) = s.clients[c].call.as_mut() {
                        if r.seq == seq {
                            r.replied |= 1 << node;
                        }
                    }
                }
                for c in 0..s.clients.len() {
                    self.settle(&mut s, c, false);
                }
                let value = (0..self.nodes)
                    .filter(|o| from & (1 << o) != 0)
                    .map(|o| s.nodes[o].reg.value)
                    .max()
                    .unwrap_or(0);
                if s.nodes[n as usize].flushed {
                    // The repair writes a new epoch into the marker: the proposals still in
                    // flight to the node, which expect its old incarnation, are refused
                    // wherever they land from now on (a refusal changes nothing): dropped.
                    s.nodes[n as usize].flushed = false;
                    s.net.retain(|Msg::Propose { node, .. }| *node != n);
                }
                let reg = &mut s.nodes[n as usize].reg;
                reg.value = reg.value.max(value);
                reg.marked = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("IDs unique", |_, s: &IdState| {
                s.returned.iter().enumerate().all(|(i, a)| {
                    s.returned[i + 1..]
                        .iter()
                        .all(|b| a.last < b.base || b.last < a.base)
                })
            }),
            Property::always("IDs in real-time order", |_, s: &IdState| {
                s.returned.iter().all(|r| r.base > r.floor)
            }),
            Property::sometimes("every call returns", |m: &IdModel, s: &IdState| {
                s.returned.len() == m.clients * m.calls as usize + m.extra_calls as usize
            }),
        ]
    }
}

/// Nodes are interchangeable, and so are clients: the representative renames them in the
/// order of their own state (ties keep their order), so the checker visits states that differ
/// only by such a renaming once (any member of the class is a sound representative).
impl Representative for IdState {
    fn representative(&self) -> Self {
        let node = ranks(self.nodes.len(), |i| self.nodes[i].clone());
        let client = ranks(self.clients.len(), |j| self.clients[j]);
        let mut s = self.clone();
        for (i, n) in self.nodes.iter().enumerate() {
            s.nodes[node[i]] = n.clone();
        }
        for (j, c) in self.clients.iter().enumerate() {
            let mut c = *c;
            if let Some(r) = c.call.as_mut() {
                r.acks = remap_mask(r.acks, &node);
                r.replied = remap_mask(r.replied, &node);
            }
            s.clients[client[j]] = c;
        }
        for Msg::Propose {
            client: c,
            node: n,
            before_repair_of,
            ..
        } in s.net.iter_mut()
        {
            *c = client[*c as usize] as u8;
            *n = node[*n as usize] as u8;
            *before_repair_of = remap_mask(*before_repair_of, &node);
        }
        s.net.sort();
        for r in s.returned.iter_mut() {
            r.client = client[r.client as usize] as u8;
        }
        s.returned.sort();
        s
    }
}
