//! Work distribution's assignment table against the seed's Distributor (as the article
//! describes it: each unit on a hash ring with 50 points, services sorted, each service in
//! turn takes the unit nearest to its hash, which then leaves the ring) and against rendezvous
//! hashing with bounded loads (capacity 1.05x the mean), on the same inputs: the busiest
//! member against the mean, units moved by a join, a leave, one unit added, one removed (and
//! the minimum the balance needs), weighted members, and computation time (pure computation).
//! Then, on three local `redis-server` nodes, for pools of 2, 10 and 32 members: the node calls
//! per member per second in steady state with their breakdown by source, and the time from a
//! member's crash (or the leader's) to an active table without it, in heartbeat intervals.
//!
//! Run: `scripts/bench.sh distribution` (or `cargo bench --bench distribution`; `-- --quick`
//! skips the 100,000 x 1,000 case).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

#[path = "support/calls.rs"]
mod calls;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use redquorum::{distribution_table, MemberWeight, TableInputs, UnitTable};
use redquorum::{Config, PoolMember, PoolOptions, Units, ViewState};
use redquorum_testkit::LocalNodes;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

type Assign = fn(Option<&UnitTable>, &[MemberWeight], &BTreeSet<String>) -> UnitTable;

fn ours(prev: Option<&UnitTable>, m: &[MemberWeight], u: &BTreeSet<String>) -> UnitTable {
    distribution_table(&TableInputs {
        previous: prev,
        members: m,
        units: u,
        pins: None,
    })
}

/// The seed's Distributor: stateless, unweighted.
fn seed(_: Option<&UnitTable>, m: &[MemberWeight], u: &BTreeSet<String>) -> UnitTable {
    let units: Vec<&String> = u.iter().collect();
    let mut ring: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, unit) in units.iter().enumerate() {
        for k in 0..50 {
            ring.insert(xxh3_64(format!("{unit}#{k}").as_bytes()), i);
        }
    }
    let mut services: Vec<&String> = m.iter().map(|x| &x.id).collect();
    services.sort();
    let mut table = UnitTable::new();
    while !ring.is_empty() {
        for s in &services {
            let h = xxh3_64(s.as_bytes());
            let Some((_, &i)) = ring.range(h..).next().or_else(|| ring.iter().next()) else {
                break;
            };
            table.insert(units[i].clone(), (*s).clone());
            for k in 0..50 {
                ring.remove(&xxh3_64(format!("{}#{k}", units[i]).as_bytes()));
            }
        }
    }
    table
}

/// Rendezvous hashing with bounded loads: each unit (in hash order) goes to its
/// highest-scoring member with room under 1.05x the weighted mean.
fn bounded(_: Option<&UnitTable>, m: &[MemberWeight], u: &BTreeSet<String>) -> UnitTable {
    let total: f64 = m.iter().map(|x| f64::from(x.weight)).sum();
    let caps: Vec<usize> = m
        .iter()
        .map(|x| ((u.len() as f64 * f64::from(x.weight) / total) * 1.05).ceil() as usize)
        .collect();
    let mut loads = vec![0usize; m.len()];
    let mut order: Vec<&String> = u.iter().collect();
    order.sort_by_key(|x| xxh3_64(x.as_bytes()));
    let mut table = UnitTable::new();
    for unit in order {
        let mut best: Option<(u64, usize)> = None;
        for (i, x) in m.iter().enumerate() {
            if loads[i] >= caps[i] {
                continue;
            }
            let score = xxh3_64_with_seed(unit.as_bytes(), xxh3_64(x.id.as_bytes()));
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, i));
            }
        }
        if let Some((_, i)) = best {
            loads[i] += 1;
            table.insert(unit.clone(), m[i].id.clone());
        }
    }
    table
}

fn members(n: usize, weighted: bool) -> Vec<MemberWeight> {
    (0..n)
        .map(|i| MemberWeight {
            id: format!("member-{i:05}"),
            weight: if weighted { (i % 3) as u32 + 1 } else { 1 },
        })
        .collect()
}

fn units(n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("unit-{i:07}")).collect()
}

/// The busiest member's load against its weighted share (1.0 is perfect).
fn max_over_share(t: &UnitTable, m: &[MemberWeight], n: usize) -> f64 {
    let total: f64 = m.iter().map(|x| f64::from(x.weight)).sum();
    let mut loads: BTreeMap<&str, usize> = BTreeMap::new();
    for owner in t.values() {
        *loads.entry(owner).or_insert(0) += 1;
    }
    m.iter()
        .map(|x| {
            let share = n as f64 * f64::from(x.weight) / total;
            loads.get(x.id.as_str()).copied().unwrap_or(0) as f64 / share
        })
        .fold(0.0, f64::max)
}

fn moved(a: &UnitTable, b: &UnitTable) -> usize {
    a.iter()
        .filter(|(u, m)| b.get(*u).is_some_and(|n| n != *m))
        .count()
}

struct Row {
    name: &'static str,
    balance: f64,
    join: usize,
    leave: usize,
    add: usize,
    remove: usize,
    time: Duration,
}

fn measure(name: &'static str, f: Assign, m: &[MemberWeight], u: &BTreeSet<String>) -> Row {
    let start = Instant::now();
    let base = f(None, m, u);
    let time = start.elapsed();
    let mut joined = m.to_vec();
    joined.push(MemberWeight {
        id: "member-joined".into(),
        weight: 1,
    });
    let join = moved(&base, &f(Some(&base), &joined, u));
    let left = &m[1..];
    let own = base.values().filter(|o| **o == m[0].id).count();
    let leave = moved(&base, &f(Some(&base), left, u)).saturating_sub(own);
    let mut plus = u.clone();
    plus.insert("unit-added".into());
    let add = moved(&base, &f(Some(&base), m, &plus));
    let mut minus = u.clone();
    let gone = u.iter().next().cloned().unwrap();
    minus.remove(&gone);
    let remove = moved(&base, &f(Some(&base), m, &minus));
    Row {
        name,
        balance: max_over_share(&base, m, u.len()),
        join,
        leave,
        add,
        remove,
        time,
    }
}

fn main() {
    calls::install();
    let quick = std::env::args().any(|a| a == "--quick");
    let mut scales = vec![(1_000, 10), (10_000, 100)];
    if !quick {
        scales.push((100_000, 1_000));
    }
    println!(
        "work distribution: the table against the seed's Distributor and bounded-load rendezvous"
    );
    println!("moves beyond the leaver's own units; minimum for a join = the newcomer's share, for a leave / unit change = 0\n");
    println!("units x members | algorithm | busiest / share | join moves (min) | leave extra moves | +1 unit moves | -1 unit moves | table time");
    for (n_units, n_members) in scales {
        let m = members(n_members, false);
        let u = units(n_units);
        let join_min = n_units / (n_members + 1);
        for (name, f) in [
            ("redquorum", ours as Assign),
            ("seed", seed as Assign),
            ("rendezvous 1.05", bounded as Assign),
        ] {
            if name == "seed" && n_units > 10_000 {
                println!("{n_units} x {n_members} | seed | (skipped: minutes at this size)");
                continue;
            }
            let r = measure(name, f, &m, &u);
            println!(
                "{n_units} x {n_members} | {} | {:.3}x | {} ({join_min}) | {} | {} | {} | {:.1} ms",
                r.name,
                r.balance,
                r.join,
                r.leave,
                r.add,
                r.remove,
                r.time.as_secs_f64() * 1e3
            );
        }
        let w = members(n_members, true);
        let t = ours(None, &w, &u);
        println!(
            "{n_units} x {n_members} | redquorum, weights 1/2/3 | {:.3}x of the weighted share",
            max_over_share(&t, &w, n_units)
        );
    }
    real_nodes(quick);
}

/// Wait until every member is active under one version and together they hold `units` units
/// (sizes only); how long it took.
async fn settled(members: &[PoolMember], units: usize, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let a: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let versions: BTreeSet<_> = a.iter().map(|x| x.as_ref().map(|x| x.version)).collect();
        let held: Option<usize> = a
            .iter()
            .map(|x| {
                let x = x.as_ref().filter(|x| x.state == ViewState::Active)?;
                Some(x.units()?.len())
            })
            .sum();
        if versions.len() == 1 && held == Some(units) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Crash-to-active on real nodes: `n_units` units, `n_members` members, `rounds` crashes of a
/// member that does not lead and as many of the leader (a replacement joins after each).
async fn crash_to_active(n_units: usize, n_members: usize, rounds: usize) {
    let interval = Duration::from_millis(500);
    let nodes = LocalNodes::start(3);
    let urls = nodes.urls();
    let client = || async {
        support::connect(Config::from_urls(&urls).unwrap())
            .await
            .unwrap()
    };
    let units = Units::new(&client().await, "bench").unwrap();
    let all: Vec<String> = (0..n_units).map(|i| format!("unit-{i:06}")).collect();
    units.add(&all).await.unwrap();
    let opts = PoolOptions::default().with_interval(interval);
    let join = |i: usize| {
        let c = client();
        let opts = opts.clone();
        async move {
            PoolMember::join(&c.await, "bench", &format!("m{i}"), opts)
                .await
                .unwrap()
        }
    };
    let mut members = Vec::new();
    let mut next_id = 0;
    for _ in 0..n_members {
        members.push(join(next_id).await);
        next_id += 1;
    }
    let limit = Duration::from_secs(60);
    settled(&members, n_units, limit)
        .await
        .expect("initial table");
    // Steady state: two intervals to settle in, then eight measured.
    tokio::time::sleep(interval * 2).await;
    let window = calls::measure(&urls, n_members, interval * 8).await;
    let per_member = window.per_member();
    let cpu = window.node_cpu_ms_per_member();
    println!(
        "{n_units} x {n_members} | {per_member:.1} node calls/s per member (steady, 3 nodes); \
         nodes' CPU {cpu:.2} ms/s per member"
    );
    window.print_breakdown("    ");
    let (mut member_t, mut leader_t) = (Vec::new(), Vec::new());
    for round in 0..rounds * 2 {
        let leader = round % 2 == 1;
        let victim = members
            .iter()
            .position(|m| m.is_leader() == leader)
            .expect("a victim");
        let crashed = members.remove(victim);
        let t0 = Instant::now();
        crashed.crash_for_tests();
        let t = settled(&members, n_units, limit)
            .await
            .expect("a table without it");
        let intervals = t0.elapsed().max(t).as_secs_f64() / interval.as_secs_f64();
        if leader {
            leader_t.push(intervals)
        } else {
            member_t.push(intervals)
        }
        members.push(join(next_id).await);
        next_id += 1;
        settled(&members, n_units, limit)
            .await
            .expect("a table with the replacement");
    }
    let fmt = |v: &mut Vec<f64>| calls::median_max(v);
    println!(
        "{n_units} x {n_members} | member crash: {} intervals | leader crash: {} intervals ({rounds} each) | {per_member:.1} node calls/s per member",
        fmt(&mut member_t),
        fmt(&mut leader_t)
    );
    for m in members {
        m.leave().await;
    }
}

fn real_nodes(quick: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("\nsteady-state node calls (every command the nodes ran, those inside scripts included, INFO excluded, summed over the 3 nodes) and the time from a crash to an active table without the crashed member (interval 500 ms, 3 local nodes)");
    println!("units x members | member crash | leader crash | node calls/s per member");
    rt.block_on(async {
        let rounds = if quick { 3 } else { 7 };
        crash_to_active(1_000, 2, rounds).await;
        crash_to_active(1_000, 10, rounds).await;
        if !quick {
            crash_to_active(1_000, 32, rounds).await;
            crash_to_active(100_000, 10, 5).await;
        }
    });
}
