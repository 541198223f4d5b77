//! Peer indexing figures: the fraction of tasks that change owner per membership change in
//! both ownership modes, for 2 to 16 instances (pure computation over the view logic); then, on
//! three local redis-server nodes, for groups of 2 to 64 members: the node calls per member per
//! second in steady state with their breakdown by source, and the time to an active view after
//! a join, a leave, a member's crash and the leader's crash (medians), in intervals.
//!
//! Run: `scripts/bench.sh membership [--quick]` (or `cargo bench --bench membership`; `--quick`:
//! groups of 2, 4 and 8, three crashes of each kind).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redquorum_testkit::LocalNodes;

#[path = "support/calls.rs"]
mod calls;
mod support;

use redquorum::moved_fraction;
use redquorum::Config;
use redquorum::{GroupOptions, Member, Ownership, View};

fn members(n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("m{i:02}")).collect()
}

async fn settle(ms: &[&Member], n: u32, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let a: Vec<_> = ms.iter().map(|m| m.assignment()).collect();
        let versions: BTreeSet<_> = a.iter().map(|x| x.as_ref().map(|x| x.version)).collect();
        if versions.len() == 1
            && a.iter()
                .all(|x| x.as_ref().is_some_and(|x| x.replicas == n))
        {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    calls::install();
    // RUST_LOG=redquorum=info (say) shows the library's log.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    println!("Tasks changing owner per membership change (20,000 tasks; buckets: 1024):");
    println!("  n -> n+1 | modulo  | buckets || n -> n-1 | modulo  | buckets");
    for n in [2usize, 3, 4, 6, 8, 12, 16] {
        let before = View::empty().next(&members(n), 1).activated(1);
        let grown = before.next(&members(n + 1), 1);
        let mut fewer = members(n);
        let gone = fewer.iter().next().cloned().unwrap();
        fewer.remove(&gone);
        let shrunk = before.next(&fewer, 1);
        let m = |a: &View, b: &View, mode| moved_fraction(a, b, 20_000, mode);
        println!(
            "  {n:>2} -> {:>2} | {:>6.1}% | {:>6.1}% || {n:>2} -> {:>2} | {:>6.1}% | {:>6.1}%",
            n + 1,
            100.0 * m(&before, &grown, Ownership::Modulo),
            100.0 * m(&before, &grown, Ownership::Buckets { count: 1024 }),
            n - 1,
            100.0 * m(&before, &shrunk, Ownership::Modulo),
            100.0 * m(&before, &shrunk, Ownership::Buckets { count: 1024 }),
        );
    }

    let interval = Duration::from_millis(500);
    let nodes = LocalNodes::start(3);
    let urls = nodes.urls();
    let opts = GroupOptions::default().with_interval(interval);
    let quick = std::env::args().any(|a| a == "--quick");
    println!(
        "\nSteady-state node calls and time to an active view (interval {} ms, 3 local nodes; \
         node calls: every command the nodes ran, those inside scripts included, INFO excluded, \
         summed over the 3 nodes):",
        interval.as_millis()
    );
    let (mut counts, rounds): (Vec<usize>, usize) = if quick {
        (vec![2, 4, 8], 3)
    } else {
        (vec![2, 4, 8, 16, 32, 64], 7)
    };
    // `--sizes 16,64`: only these group sizes.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sizes") {
        counts = args[i + 1].split(',').map(|n| n.parse().unwrap()).collect();
    }
    let mut summary = Vec::new();
    for n in counts {
        summary.push(group_of(&urls, n, rounds, &opts, interval).await);
    }
    println!(
        "\n  members | node calls/member/s | nodes' CPU ms/s per member | member crash -> active | \
         leader crash -> active (intervals)"
    );
    for line in summary {
        println!("  {line}");
    }
}

async fn join(urls: &[String], group: &str, id: &str, opts: &GroupOptions) -> Member {
    let c = support::connect(Config::from_urls(urls).unwrap())
        .await
        .unwrap();
    Member::join(&c, group, id, opts.clone()).await.unwrap()
}

/// One group of `n`: its steady-state calls, a join and a leave, then `rounds` crashes of a
/// member that does not lead and as many of the leader (a replacement joins after each).
async fn group_of(
    urls: &[String],
    n: usize,
    rounds: usize,
    opts: &GroupOptions,
    interval: Duration,
) -> String {
    let group = format!("bench-{n}");
    let mut ms = Vec::new();
    for i in 0..n {
        ms.push(join(urls, &group, &format!("m{i}"), opts).await);
    }
    let limit = Duration::from_secs(30);
    settle(&ms.iter().collect::<Vec<_>>(), n as u32, limit)
        .await
        .expect("initial settle");
    // Steady state: two intervals to settle in, then eight measured.
    tokio::time::sleep(interval * 2).await;
    let window = calls::measure(urls, n, interval * 8).await;
    let per_member = window.per_member();
    let cpu = window.node_cpu_ms_per_member();
    println!(
        "  {n:>2} members: {per_member:.1} node calls/s per member (steady, 3 nodes); nodes' CPU \
         {cpu:.2} ms/s per member"
    );
    window.print_breakdown("    ");
    let iv = |d: Option<Duration>| {
        d.map(|d| format!("{:.2}", d.as_secs_f64() / interval.as_secs_f64()))
            .unwrap_or_else(|| "timeout".into())
    };
    let t = Instant::now();
    ms.push(join(urls, &group, "joiner", opts).await);
    let joined = settle(&ms.iter().collect::<Vec<_>>(), n as u32 + 1, limit)
        .await
        .map(|_| t.elapsed());
    let leaving = ms.pop().unwrap();
    let t = Instant::now();
    leaving.leave().await;
    let left = settle(&ms.iter().collect::<Vec<_>>(), n as u32, limit)
        .await
        .map(|_| t.elapsed());
    let (mut member_t, mut leader_t) = (Vec::new(), Vec::new());
    let mut next = n;
    for round in 0..rounds * 2 {
        let leader = round % 2 == 1;
        // A group of one has no member besides its leader to crash.
        let Some(victim) = ms.iter().position(|m| m.is_leader() == leader) else {
            continue;
        };
        let crashed = ms.remove(victim);
        crashed.crash_for_tests();
        let Some(t) = settle(&ms.iter().collect::<Vec<_>>(), n as u32 - 1, limit).await else {
            println!("    a crash was not followed by an active view within {limit:?}");
            break;
        };
        let intervals = t.as_secs_f64() / interval.as_secs_f64();
        if leader {
            leader_t.push(intervals)
        } else {
            member_t.push(intervals)
        }
        ms.push(join(urls, &group, &format!("m{next}"), opts).await);
        next += 1;
        settle(&ms.iter().collect::<Vec<_>>(), n as u32, limit)
            .await
            .expect("a view with the replacement");
    }
    let (member, leader) = (
        calls::median_max(&mut member_t),
        calls::median_max(&mut leader_t),
    );
    println!(
        "  {n:>2} members: join {} intervals, leave {} intervals; crash -> active: member {member}, \
         leader {leader} ({rounds} each)",
        iv(joined),
        iv(left),
    );
    for m in ms {
        m.leave().await;
    }
    format!("{n:>7} | {per_member:>19.1} | {cpu:>26.2} | {member:>22} | {leader}")
}
