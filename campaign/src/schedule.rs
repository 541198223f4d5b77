//! The nemesis's schedule, pure: a seeded list of faults with their start and duration, never
//! more than a minority of nodes faulty for any client at any instant (node faults count for
//! every client; a client's network faults count for that client only; the `redquorum serve`
//! processes are clients of the nodes like the others, and the processes that call them over
//! HTTP reach no node). The same seed and the same settings give the same schedule.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Node `0`: kill -9, restarted with its data at the end.
    Kill(usize),
    /// Node: SIGSTOP, SIGCONT at the end.
    Freeze(usize),
    /// Node: kill -9, data deleted, restarted empty at once (faulty until repaired: the
    /// duration).
    Wipe(usize),
    /// Node: FLUSHALL without a restart (every key gone, the marker too, the run_id kept);
    /// faulty until repaired: the duration.
    Flush(usize),
    /// Node, aimed at a repair's copy: kill -9 and restart with its data (its run_id changes,
    /// so a client repairs it), wait until the repair's claim shows on the node (the copy is
    /// writing), then FLUSHALL it: the target is emptied mid-copy.
    FlushMidRepair(usize),
    /// Node, aimed at a beat: wait until a member's beat on the node changes (one just
    /// landed), then FLUSHALL it: the restore must not bring the beat back to a value the
    /// leader already saw.
    FlushAfterBeat(usize),
    /// Node: wall clock stepped by the milliseconds given, stepped back at the end.
    ClockStep(usize, i64),
    /// Client `0` cut off from node `1` (silent partition).
    Partition(usize, usize),
    /// Client `0`'s requests reach node `1`, the replies are lost.
    DropReplies(usize, usize),
    /// Client `0` sees the milliseconds of latency each way to node `1`.
    Latency(usize, usize, u64),
    /// Client process killed with -9, started again at the end.
    ClientKill(usize),
    /// Client process frozen (SIGSTOP) for the duration (past its leases).
    ClientFreeze(usize),
    /// A wiped node after a missed grant, aimed: lease holder `0` is cut off from node `1`
    /// until it acquires the lease (so that node misses the grant), then frozen (SIGSTOP for
    /// the duration) and reconnected, and node `2` is wiped and restarted at once. Node `1`
    /// is faulty for client `0` only before the wipe, so at every instant one node is faulty;
    /// no other node fault overlaps it. Without the quarantine of wiped nodes, another
    /// holder gets the lease from the two nodes that lack it while the frozen one still
    /// holds it.
    WipeAfterMissedGrant(usize, usize, usize),
    /// `redquorum serve` process `0`: kill -9, started again on its port at the end (its
    /// callers' streams end at once; its leases are taken over after their TTL).
    ServeKill(usize),
    /// `serve` process `0`: SIGSTOP, SIGCONT at the end (its leases lapse and are taken over;
    /// its callers' calls wait).
    ServeFreeze(usize),
    /// Aimed at a lease held through `serve` process `0`: wait (up to 2 s) until HTTP lease
    /// holder `1` (a caller of that server) holds its lease, freeze the holder (SIGSTOP) and
    /// then the server, for the duration (past the TTL); at the end thaw the holder, then the
    /// server. Both paused, as when the host they share is: the lease lapses and another holder
    /// takes it over and writes; the thawed holder's write comes late with the older token,
    /// which the fencing must refuse, and its validity must have ended before the takeover.
    ServeFreezeHolding(usize, usize),
}

impl Fault {
    /// The fault's kind, for the summary.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "node kill -9 + restart",
            Fault::Freeze(_) => "node SIGSTOP",
            Fault::Wipe(_) => "node wipe + restart",
            Fault::Flush(_) => "node FLUSHALL",
            Fault::FlushMidRepair(_) => "node FLUSHALL mid-repair (aimed)",
            Fault::FlushAfterBeat(_) => "node FLUSHALL after a beat (aimed)",
            Fault::ClockStep(..) => "node wall-clock step",
            Fault::Partition(..) => "client-node partition",
            Fault::DropReplies(..) => "dropped replies",
            Fault::Latency(..) => "latency spike",
            Fault::ClientKill(_) => "client kill -9",
            Fault::ClientFreeze(_) => "client SIGSTOP",
            Fault::WipeAfterMissedGrant(..) => "wipe after a missed grant",
            Fault::ServeKill(_) => "serve kill -9 + restart",
            Fault::ServeFreeze(_) => "serve SIGSTOP",
            Fault::ServeFreezeHolding(..) => "serve SIGSTOP with its lease holder (aimed)",
        }
    }

    /// The `serve` process this fault hits.
    pub fn serve(&self) -> Option<usize> {
        match *self {
            Fault::ServeKill(v) | Fault::ServeFreeze(v) | Fault::ServeFreezeHolding(v, _) => {
                Some(v)
            }
            _ => None,
        }
    }

    /// The node this fault makes faulty, and for which client (`None`: every client).
    fn faulty_node(&self) -> Option<(usize, Option<usize>)> {
        match *self {
            Fault::Kill(n)
            | Fault::Freeze(n)
            | Fault::Wipe(n)
            | Fault::Flush(n)
            | Fault::FlushMidRepair(n)
            | Fault::FlushAfterBeat(n)
            | Fault::ClockStep(n, _)
            | Fault::WipeAfterMissedGrant(_, _, n) => Some((n, None)),
            Fault::Partition(c, n) | Fault::DropReplies(c, n) | Fault::Latency(c, n, _) => {
                Some((n, Some(c)))
            }
            Fault::ClientKill(_)
            | Fault::ClientFreeze(_)
            | Fault::ServeKill(_)
            | Fault::ServeFreeze(_)
            | Fault::ServeFreezeHolding(..) => None,
        }
    }

    fn client(&self) -> Option<usize> {
        match *self {
            Fault::ClientKill(c)
            | Fault::ClientFreeze(c)
            | Fault::WipeAfterMissedGrant(c, ..)
            | Fault::ServeFreezeHolding(_, c) => Some(c),
            _ => None,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::Kill(n) => write!(f, "kill -9 node {n}"),
            Fault::Freeze(n) => write!(f, "freeze node {n}"),
            Fault::Wipe(n) => write!(f, "wipe node {n}"),
            Fault::Flush(n) => write!(f, "FLUSHALL node {n}"),
            Fault::FlushMidRepair(n) => {
                write!(f, "restart node {n}, FLUSHALL it while its repair copies")
            }
            Fault::FlushAfterBeat(n) => write!(f, "FLUSHALL node {n} right after a beat"),
            Fault::ClockStep(n, ms) => write!(f, "step node {n}'s wall clock by {ms:+} ms"),
            Fault::Partition(c, n) => write!(f, "cut client {c} off from node {n}"),
            Fault::DropReplies(c, n) => write!(f, "drop node {n}'s replies to client {c}"),
            Fault::Latency(c, n, ms) => {
                write!(f, "{ms} ms latency between client {c} and node {n}")
            }
            Fault::ClientKill(c) => write!(f, "kill -9 client {c}"),
            Fault::ClientFreeze(c) => write!(f, "freeze client {c}"),
            Fault::WipeAfterMissedGrant(c, m, w) => write!(
                f,
                "cut holder {c} off from node {m} until it acquires, freeze it, wipe node {w}"
            ),
            Fault::ServeKill(v) => write!(f, "kill -9 serve process {v}"),
            Fault::ServeFreeze(v) => write!(f, "freeze serve process {v}"),
            Fault::ServeFreezeHolding(v, c) => write!(
                f,
                "freeze HTTP holder {c} while it holds, and its serve process {v}"
            ),
        }
    }
}

/// A fault at an offset from the campaign's start, for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// When it starts.
    pub at: Duration,
    /// How long it lasts.
    pub lasts: Duration,
    /// What.
    pub fault: Fault,
}

/// What the schedule is drawn for.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Nodes.
    pub nodes: usize,
    /// Clients the network faults may hit (each reaches the nodes through its own proxies).
    pub clients: usize,
    /// Of those, the first this many are processes the client faults may kill or freeze.
    pub processes: usize,
    /// How long the campaign runs.
    pub duration: Duration,
    /// The mean gap between fault starts.
    pub gap: Duration,
    /// Allow more than a minority faulty (the beyond-the-model mode).
    pub beyond_minority: bool,
    /// The clients `holders.0..holders.1` are lease holders (aimed faults need one).
    pub holders: (usize, usize),
    /// `redquorum serve` processes (the `serve` faults hit them; their node connections are
    /// clients among `clients`).
    pub serves: usize,
    /// The clients `http_callers.0..http_callers.1` are processes that call a `serve` process
    /// and reach no node (no network fault is drawn for them; client faults are).
    pub http_callers: (usize, usize),
    /// Of those, `http_holders.0..http_holders.1` hold leases through a `serve` process:
    /// holder `c` through [`Settings::serve_of`]`(c)`.
    pub http_holders: (usize, usize),
}

impl Settings {
    /// The `serve` process HTTP lease holder `c` calls: they alternate between the servers.
    pub fn serve_of(&self, c: usize) -> usize {
        c.saturating_sub(self.http_holders.0) % self.serves.max(1)
    }
}

/// Draw the schedule for `seed`.
pub fn draw(seed: u64, s: &Settings) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let minority = s.nodes.saturating_sub(1) / 2;
    let mut out: Vec<Planned> = Vec::new();
    let mean = s.gap.as_millis().max(2) as u64;
    let mut t = Duration::from_millis(rng.random_range(mean / 2..=mean));
    while t < s.duration {
        let fault = pick(&mut rng, s);
        let lasts = Duration::from_millis(match fault {
            Fault::Wipe(_)
            | Fault::Flush(_)
            | Fault::FlushMidRepair(_)
            | Fault::FlushAfterBeat(_) => rng.random_range(1_500..=3_000),
            Fault::ClientFreeze(_)
            | Fault::WipeAfterMissedGrant(..)
            | Fault::ServeFreeze(_)
            | Fault::ServeFreezeHolding(..) => rng.random_range(2_000..=5_000),
            Fault::ClientKill(_) => rng.random_range(200..=1_000),
            Fault::ServeKill(_) => rng.random_range(300..=1_500),
            _ => rng.random_range(300..=2_500),
        });
        if let Fault::WipeAfterMissedGrant(..) = fault {
            // Aimed at a healthy cluster: wait until every node fault drawn so far is over.
            if let Some(end) = out
                .iter()
                .filter(|p| p.fault.faulty_node().is_some())
                .map(|p| p.at + p.lasts)
                .max()
            {
                t = t.max(end);
            }
            if t >= s.duration {
                break;
            }
        }
        let active: Vec<&Planned> = out.iter().filter(|p| p.at + p.lasts > t).collect();
        if admissible(&fault, &active, s, minority) {
            out.push(Planned {
                at: t,
                lasts,
                fault,
            });
        }
        t += Duration::from_millis(rng.random_range(mean / 2..=mean * 3 / 2));
    }
    every_data_loss(&mut out);
    every_serve_fault(&mut out, s);
    out
}

/// Make sure every kind of data loss is played at least once, however short the campaign: a
/// kind the draw missed replaces a node kill, freeze or clock step (the same node, the same
/// time, so the minority rule still holds), the earliest one that lasts long enough for the
/// node's repair (1.5 s, as a drawn data loss).
fn every_data_loss(plan: &mut [Planned]) {
    let kinds: [fn(usize) -> Fault; 4] = [
        Fault::Flush,
        Fault::FlushMidRepair,
        Fault::FlushAfterBeat,
        Fault::Wipe,
    ];
    for make in kinds {
        if plan.iter().any(|p| p.fault.kind() == make(0).kind()) {
            continue;
        }
        if let Some(p) = plan.iter_mut().find(|p| {
            p.lasts >= Duration::from_millis(1_500)
                && matches!(
                    p.fault,
                    Fault::Kill(_) | Fault::Freeze(_) | Fault::ClockStep(..)
                )
        }) {
            if let Fault::Kill(n) | Fault::Freeze(n) | Fault::ClockStep(n, _) = p.fault {
                p.fault = make(n);
            }
        }
    }
}

/// Make sure every kind of `serve` fault is played at least once (when there are `serve`
/// processes), however short the campaign: a kind the draw missed replaces a network fault
/// (one node faulty for one client the less: the minority rule still holds), the earliest one
/// where it fits (no other fault on the same `serve` process, nor on its holder, meanwhile).
fn every_serve_fault(plan: &mut [Planned], s: &Settings) {
    if s.serves == 0 {
        return;
    }
    let mut wanted = vec![
        (Fault::ServeKill(0), Duration::from_millis(1_000)),
        (
            Fault::ServeFreeze(s.serves - 1),
            Duration::from_millis(3_000),
        ),
    ];
    if s.http_holders.1 > s.http_holders.0 {
        let c = s.http_holders.0;
        wanted.push((
            Fault::ServeFreezeHolding(s.serve_of(c), c),
            Duration::from_millis(3_000),
        ));
    }
    for (fault, lasts) in wanted {
        if plan.iter().any(|p| p.fault.kind() == fault.kind()) {
            continue;
        }
        let fits = |i: usize, plan: &[Planned]| {
            let (at, end) = (plan[i].at, plan[i].at + lasts);
            plan.iter().enumerate().all(|(j, q)| {
                j == i
                    || q.at >= end
                    || q.at + q.lasts <= at
                    || (q.fault.serve().is_none_or(|v| Some(v) != fault.serve())
                        && q.fault.client().is_none_or(|c| Some(c) != fault.client()))
            })
        };
        let found = (0..plan.len()).find(|&i| {
            matches!(
                plan[i].fault,
                Fault::Partition(..) | Fault::DropReplies(..) | Fault::Latency(..)
            ) && fits(i, plan)
        });
        if let Some(i) = found {
            plan[i].fault = fault;
            plan[i].lasts = lasts;
        }
    }
}

fn pick(rng: &mut StdRng, s: &Settings) -> Fault {
    let node = rng.random_range(0..s.nodes);
    // A network fault's client: any but the HTTP callers (they reach no node).
    let (h0, h1) = s.http_callers;
    let http = h1.saturating_sub(h0);
    let client = rng.random_range(0..s.clients.saturating_sub(http).max(1));
    let client = if client >= h0 { client + http } else { client };
    match rng.random_range(0..100) {
        0..13 => Fault::Kill(node),
        13..23 => Fault::Freeze(node),
        23..26 => Fault::Wipe(node),
        26..28 => Fault::Flush(node),
        28..30 => Fault::FlushMidRepair(node),
        30..32 => Fault::FlushAfterBeat(node),
        32..36 if s.holders.1 > s.holders.0 && s.nodes > 1 => {
            let holder = rng.random_range(s.holders.0..s.holders.1);
            let missed = (node + rng.random_range(1..s.nodes)) % s.nodes;
            Fault::WipeAfterMissedGrant(holder, missed, node)
        }
        32..36 => Fault::Flush(node),
        36..50 => {
            let ms = match rng.random_range(0..4) {
                0 => 120_000,
                1 => -120_000,
                2 => 86_400_000,
                _ => -3_000,
            };
            Fault::ClockStep(node, ms)
        }
        50..62 => Fault::Partition(client, node),
        62..72 => Fault::DropReplies(client, node),
        72..77 => Fault::Latency(client, node, rng.random_range(20..=300)),
        77..80 if s.serves > 0 => {
            let serve = rng.random_range(0..s.serves);
            match rng.random_range(0..3) {
                0 => Fault::ServeKill(serve),
                1 => Fault::ServeFreeze(serve),
                _ if s.http_holders.1 > s.http_holders.0 => {
                    let c = rng.random_range(s.http_holders.0..s.http_holders.1);
                    Fault::ServeFreezeHolding(s.serve_of(c), c)
                }
                _ => Fault::ServeFreeze(serve),
            }
        }
        77..80 => Fault::Latency(client, node, rng.random_range(20..=300)),
        80..90 if s.processes > 0 => Fault::ClientKill(rng.random_range(0..s.processes)),
        // Half the freezes are aimed at lease holders (frozen past their TTL while holding).
        90.. if s.holders.1 > s.holders.0 && rng.random_bool(0.5) => {
            Fault::ClientFreeze(rng.random_range(s.holders.0..s.holders.1))
        }
        90.. if s.processes > 0 => Fault::ClientFreeze(rng.random_range(0..s.processes)),
        _ => Fault::Latency(client, node, rng.random_range(20..=300)),
    }
}

/// Whether `fault` may start while `active` run: for every client, the nodes faulty for it
/// stay within a minority (unless beyond it), one fault per node or client at a time.
fn admissible(fault: &Fault, active: &[&Planned], s: &Settings, minority: usize) -> bool {
    let aimed = |f: &Fault| matches!(f, Fault::WipeAfterMissedGrant(..));
    // One fault per `serve` process at a time.
    if fault
        .serve()
        .is_some_and(|v| active.iter().any(|p| p.fault.serve() == Some(v)))
    {
        return false;
    }
    if let Some(c) = fault.client() {
        if active.iter().any(|p| p.fault.client() == Some(c)) {
            return false;
        }
        if !aimed(fault) {
            return true;
        }
        // Aimed: no other node fault may overlap it (its two nodes are faulty in turn).
        return active.iter().all(|p| p.fault.faulty_node().is_none());
    }
    if fault.faulty_node().is_some() && active.iter().any(|p| aimed(&p.fault)) {
        return false;
    }
    let Some((node, only)) = fault.faulty_node() else {
        return true;
    };
    // One fault per node (for a client) at a time.
    if active.iter().any(|p| {
        p.fault
            .faulty_node()
            .is_some_and(|(n, c)| n == node && (c.is_none() || only.is_none() || c == only))
    }) {
        return false;
    }
    if s.beyond_minority {
        return true;
    }
    (0..s.clients.max(1)).all(|client| {
        if only.is_some_and(|c| c != client) {
            return true;
        }
        let mut faulty: Vec<usize> = active
            .iter()
            .filter_map(|p| p.fault.faulty_node())
            .filter(|(_, c)| c.is_none_or(|c| c == client))
            .map(|(n, _)| n)
            .collect();
        faulty.push(node);
        faulty.sort_unstable();
        faulty.dedup();
        faulty.len() <= minority
    })
}

/// How far a schedule goes beyond the fault model: the faults that start while, for some
/// client, more than a minority of nodes is faulty (counting the new one), and the total time
/// during which that holds. (0, zero) for every schedule drawn with the minority rule.
pub fn beyond_the_model(plan: &[Planned], s: &Settings) -> (usize, Duration) {
    let minority = s.nodes.saturating_sub(1) / 2;
    let too_many = |t: Duration| {
        (0..s.clients.max(1)).any(|client| faulty_at(plan, t, client).len() > minority)
    };
    // The set of faulty nodes changes only at a fault's start or end.
    let mut cuts: Vec<Duration> = plan.iter().flat_map(|p| [p.at, p.at + p.lasts]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let total = cuts
        .windows(2)
        .filter(|w| too_many(w[0]))
        .map(|w| w[1] - w[0])
        .sum();
    let starts = plan.iter().filter(|p| too_many(p.at)).count();
    (starts, total)
}

/// The nodes faulty for `client` at `t` in `plan`, sorted, each once.
pub fn faulty_at(plan: &[Planned], t: Duration, client: usize) -> Vec<usize> {
    let mut faulty: Vec<usize> = plan
        .iter()
        .filter(|q| q.at <= t && t < q.at + q.lasts)
        .filter_map(|q| q.fault.faulty_node())
        .filter(|(_, c)| c.is_none_or(|c| c == client))
        .map(|(n, _)| n)
        .collect();
    faulty.sort_unstable();
    faulty.dedup();
    faulty
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients: an ID process, two holders, an HTTP ID caller, two HTTP holders, the CLI, two
    /// `serve` processes.
    fn settings(nodes: usize) -> Settings {
        Settings {
            nodes,
            clients: 9,
            processes: 6,
            duration: Duration::from_secs(600),
            gap: Duration::from_millis(700),
            beyond_minority: false,
            holders: (1, 3),
            serves: 2,
            http_callers: (3, 6),
            http_holders: (4, 6),
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let s = settings(3);
        assert_eq!(draw(7, &s), draw(7, &s));
        assert_ne!(draw(7, &s), draw(8, &s));
    }

    #[test]
    fn never_more_than_a_minority_of_nodes_is_faulty_for_any_client() {
        for nodes in [3, 5] {
            let s = settings(nodes);
            for seed in 0..20 {
                let plan = draw(seed, &s);
                assert!(plan.len() > 100, "seed {seed}: {} faults", plan.len());
                for p in &plan {
                    let t = p.at;
                    for client in 0..s.clients {
                        let faulty = faulty_at(&plan, t, client);
                        assert!(
                            faulty.len() <= (nodes - 1) / 2,
                            "seed {seed}, N={nodes}: at {t:?} client {client} sees {faulty:?} faulty"
                        );
                    }
                }
            }
        }
    }

    /// The `--long` campaign's settings (3 ID workers, 8 holders, 3 + 3 members, 2 runners,
    /// 2 + 2 HTTP callers, the CLI client, 2 `serve` processes) draw at least the faults the
    /// README's figures promise, whatever the seed: 200 faults, 50 node clock steps, 100
    /// holder freezes past their TTL.
    #[test]
    fn a_long_campaign_draws_the_faults_its_figures_promise() {
        let s = Settings {
            nodes: 3,
            clients: 26,
            processes: 23,
            duration: Duration::from_secs(20 * 60),
            gap: Duration::from_millis(600),
            beyond_minority: false,
            holders: (3, 11),
            serves: 2,
            http_callers: (19, 23),
            http_holders: (21, 23),
        };
        for seed in [1, 2, 3, 42, 2026] {
            let plan = draw(seed, &s);
            let count = |f: &dyn Fn(&Fault) -> bool| plan.iter().filter(|p| f(&p.fault)).count();
            let steps = count(&|f| matches!(f, Fault::ClockStep(..)));
            let freezes = count(
                &|f| matches!(f, Fault::ClientFreeze(c) | Fault::WipeAfterMissedGrant(c, ..) if (3..11).contains(c)),
            );
            println!(
                "seed {seed}: {} faults, {steps} clock steps, {freezes} holder freezes",
                plan.len()
            );
            assert!(plan.len() >= 200, "seed {seed}: {} faults", plan.len());
            assert!(steps >= 50, "seed {seed}: {steps} clock steps");
            assert!(freezes >= 100, "seed {seed}: {freezes} holder freezes");
        }
    }

    /// A "wipe after a missed grant" makes two nodes faulty in turn (the missed one for its
    /// holder, then the wiped one): the minority rule holds only because no other node fault
    /// overlaps it, and no other fault hits its holder.
    #[test]
    fn no_fault_overlaps_an_aimed_wipe_on_its_nodes_or_its_holder() {
        for nodes in [3, 5] {
            for beyond in [false, true] {
                let s = Settings {
                    beyond_minority: beyond,
                    ..settings(nodes)
                };
                for seed in 0..20 {
                    let plan = draw(seed, &s);
                    let aimed: Vec<&Planned> = plan
                        .iter()
                        .filter(|p| matches!(p.fault, Fault::WipeAfterMissedGrant(..)))
                        .collect();
                    assert!(!aimed.is_empty(), "seed {seed}: no aimed fault drawn");
                    for a in &aimed {
                        let Fault::WipeAfterMissedGrant(holder, ..) = a.fault else {
                            continue;
                        };
                        for p in &plan {
                            if std::ptr::eq(p, *a)
                                || p.at >= a.at + a.lasts
                                || a.at >= p.at + p.lasts
                            {
                                continue;
                            }
                            assert!(
                                p.fault.faulty_node().is_none() && p.fault.client() != Some(holder),
                                "seed {seed}, N={nodes}: {} overlaps {}",
                                p.fault,
                                a.fault
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn beyond_the_model_is_measured_only_when_the_rule_is_lifted() {
        let s = settings(3);
        let plan = draw(5, &s);
        assert_eq!(beyond_the_model(&plan, &s), (0, Duration::ZERO));
        let beyond = Settings {
            beyond_minority: true,
            ..s
        };
        let (starts, total) = beyond_the_model(&draw(5, &beyond), &beyond);
        assert!(starts > 0 && total > Duration::ZERO, "{starts} {total:?}");
    }

    #[test]
    fn every_kind_of_data_loss_is_played_even_in_a_short_campaign() {
        let s = Settings {
            duration: Duration::from_secs(60),
            gap: Duration::from_millis(600),
            ..settings(3)
        };
        for seed in 0..50 {
            let plan = draw(seed, &s);
            for kind in ["node FLUSHALL", "node wipe + restart"] {
                assert!(
                    plan.iter().any(|p| p.fault.kind().starts_with(kind)),
                    "seed {seed}: no {kind} in {plan:?}"
                );
            }
            for aimed in [Fault::FlushMidRepair(0), Fault::FlushAfterBeat(0)] {
                assert!(
                    plan.iter().any(|p| p.fault.kind() == aimed.kind()),
                    "seed {seed}: no {}",
                    aimed.kind()
                );
            }
        }
    }

    #[test]
    fn every_kind_of_fault_is_drawn() {
        let plan = draw(1, &settings(3));
        let kinds: std::collections::BTreeSet<&str> = plan.iter().map(|p| p.fault.kind()).collect();
        assert_eq!(kinds.len(), 16, "{kinds:?}");
    }

    /// The quick campaign's settings (3 ID workers, 3 holders, 3 + 3 members, 2 runners, 2 + 2
    /// HTTP callers, the CLI, 2 `serve` processes; a minute): every `serve` fault is played,
    /// never two at once on one server, an aimed one on a holder of that server and on no
    /// holder another client fault hits meanwhile; no network fault on an HTTP caller.
    #[test]
    fn every_serve_fault_is_played_in_a_quick_campaign_one_at_a_time_per_server() {
        let s = Settings {
            nodes: 3,
            clients: 21,
            processes: 18,
            duration: Duration::from_secs(60),
            gap: Duration::from_millis(600),
            beyond_minority: false,
            holders: (3, 6),
            serves: 2,
            http_callers: (14, 18),
            http_holders: (16, 18),
        };
        let overlap = |a: &Planned, b: &Planned| a.at < b.at + b.lasts && b.at < a.at + a.lasts;
        for seed in 0..50 {
            let plan = draw(seed, &s);
            for kind in [
                Fault::ServeKill(0),
                Fault::ServeFreeze(0),
                Fault::ServeFreezeHolding(0, 16),
            ] {
                assert!(
                    plan.iter().any(|p| p.fault.kind() == kind.kind()),
                    "seed {seed}: no {}",
                    kind.kind()
                );
            }
            for (i, a) in plan.iter().enumerate() {
                if let Fault::Partition(c, _) | Fault::DropReplies(c, _) | Fault::Latency(c, ..) =
                    a.fault
                {
                    assert!(
                        !(14..18).contains(&c),
                        "seed {seed}: {} hits an HTTP caller",
                        a.fault
                    );
                }
                if let Fault::ServeFreezeHolding(v, c) = a.fault {
                    assert!(
                        (16..18).contains(&c) && s.serve_of(c) == v,
                        "seed {seed}: {}",
                        a.fault
                    );
                }
                for b in &plan[i + 1..] {
                    if !overlap(a, b) {
                        continue;
                    }
                    assert!(
                        a.fault.serve().is_none() || a.fault.serve() != b.fault.serve(),
                        "seed {seed}: {} overlaps {}",
                        a.fault,
                        b.fault
                    );
                    assert!(
                        a.fault.client().is_none() || a.fault.client() != b.fault.client(),
                        "seed {seed}: {} overlaps {}",
                        a.fault,
                        b.fault
                    );
                }
            }
        }
    }
}
