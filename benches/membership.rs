//! Peer indexing figures: the fraction of tasks that change owner per membership change in
//! both ownership modes, for 2 to 16 instances (pure computation over the view logic); and the
//! time to an active assignment after a join, a leave and a crash, in intervals, on local
//! redis-server nodes.
//!
//! Run: `scripts/bench.sh membership` (or `cargo bench --bench membership`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redquorum_testkit::LocalNodes;

mod support;
use support::profile::node_counters;

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
    println!(
        "\nTime to an active assignment (interval {} ms, 3 local nodes):",
        interval.as_millis()
    );
    let counts: Vec<usize> = if std::env::args().any(|a| a == "--quick") {
        vec![2, 4]
    } else {
        vec![2, 4, 8, 16, 32, 64]
    };
    for n in counts {
        let group = format!("bench-{n}");
        let mut ms = Vec::new();
        for i in 0..n {
            let c = support::connect(Config::from_urls(&urls).unwrap())
                .await
                .unwrap();
            ms.push(
                Member::join(&c, &group, &format!("m{i}"), opts.clone())
                    .await
                    .unwrap(),
            );
        }
        settle(
            &ms.iter().collect::<Vec<_>>(),
            n as u32,
            Duration::from_secs(20),
        )
        .await
        .expect("initial settle");
        // Steady state: node calls per second per member over six intervals (every command
        // the nodes ran, those inside scripts included, INFO excluded).
        let calls = |c: &support::profile::NodeCounters| -> u64 {
            c.calls
                .iter()
                .filter(|(k, _)| k.as_str() != "info")
                .map(|(_, (n, _))| n)
                .sum()
        };
        let snapshot = || async {
            let mut all = Vec::new();
            for u in &urls {
                all.push(node_counters(u).await);
            }
            all
        };
        let first = snapshot().await;
        let window = interval * 6;
        tokio::time::sleep(window).await;
        let last = snapshot().await;
        let before: u64 = first.iter().map(calls).sum();
        let after: u64 = last.iter().map(calls).sum();
        let (first, last) = (&first[0], &last[0]);
        let mut top: Vec<(u64, &String)> = last
            .calls
            .iter()
            .map(|(k, (n, _))| (n - first.calls.get(k).map_or(0, |c| c.0), k))
            .collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        println!(
            "  {n:>2} instances, node 0's busiest commands per second per member: {}",
            top.iter()
                .take(6)
                .map(|(c, k)| format!("{k} {:.1}", *c as f64 / window.as_secs_f64() / n as f64))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let per_member = (after - before) as f64 / window.as_secs_f64() / n as f64;
        let c = support::connect(Config::from_urls(&urls).unwrap())
            .await
            .unwrap();
        let t = Instant::now();
        ms.push(
            Member::join(&c, &group, "joiner", opts.clone())
                .await
                .unwrap(),
        );
        let join = settle(
            &ms.iter().collect::<Vec<_>>(),
            n as u32 + 1,
            Duration::from_secs(20),
        )
        .await
        .map(|_| t.elapsed());
        let leaving = ms.pop().unwrap();
        let t = Instant::now();
        leaving.leave().await;
        let leave = settle(
            &ms.iter().collect::<Vec<_>>(),
            n as u32,
            Duration::from_secs(20),
        )
        .await
        .map(|_| t.elapsed());
        let crashed = ms.pop().unwrap();
        let t = Instant::now();
        crashed.crash_for_tests();
        let crash = settle(
            &ms.iter().collect::<Vec<_>>(),
            n as u32 - 1,
            Duration::from_secs(20),
        )
        .await
        .map(|_| t.elapsed());
        let iv = |d: Option<Duration>| {
            d.map(|d| format!("{:.2}", d.as_secs_f64() / interval.as_secs_f64()))
                .unwrap_or_else(|| "timeout".into())
        };
        println!(
            "  {n:>2} instances: join {} intervals, leave {} intervals, crash {} intervals; \
             {per_member:.1} node calls/s per member (3 nodes, steady)",
            iv(join),
            iv(leave),
            iv(crash)
        );
        for m in ms {
            m.leave().await;
        }
    }
}
