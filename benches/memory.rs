//! Memory per node over a long run of churn: locks with ever new names, IDs, a periodic job
//! with ever new periods, and group members that join and leave (each a new process key).
//! Garbage collection keeps the state bounded: the figure is the last sample against the
//! first after warm-up (keys and used memory), which should stay near 1.0x.
//!
//! Run: `scripts/bench.sh memory [--quick]` (or `cargo bench --bench memory`): 120 s, or 30 s.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redquorum_testkit::LocalNodes;

use redquorum::{Config, IdGenerator, JobOptions, Lock, PeriodicJob};
use redquorum::{GroupOptions, Member};

async fn sample(port: u16) -> (u64, u64) {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut con)
        .await
        .expect("DBSIZE");
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut con)
        .await
        .expect("INFO");
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (keys, used)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let run = Duration::from_secs(if quick { 30 } else { 120 });
    let nodes = LocalNodes::start(3);
    let client = support::connect(Config::from_urls(nodes.urls()).expect("valid"))
        .await
        .expect("connects");
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Locks with ever new names.
    for w in 0..4 {
        let (c, stop, ops) = (client.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let lock = Lock::new(&c, &format!("order-{w}-{i}"), Duration::from_secs(5))
                    .expect("valid");
                if let Ok(g) = lock.try_acquire().await {
                    let _ = g.release().await;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // IDs on a fixed set of sequences.
    for w in 0..2 {
        let (c, stop, ops) = (client.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let gens: Vec<IdGenerator> = (0..10)
                .map(|s| IdGenerator::new(&c, &format!("seq-{s}")).expect("valid"))
                .collect();
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if gens[i % 10].next_id().await.is_ok() {
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // A job with ever new periods.
    {
        let (c, stop, ops) = (client.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let keep = JobOptions::default().with_retained_records(100);
            let job = PeriodicJob::with_options(&c, "every-period", Duration::from_secs(5), keep)
                .expect("valid");
            let mut p = 0u64;
            while !stop.load(Ordering::Relaxed) {
                p += 1;
                if job
                    .run_period_infallible(&format!("p{p}"), Duration::from_secs(1), |_, _| async {
                    })
                    .await
                    .is_ok()
                {
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Members that join and leave (each a new process key), beside one that stays.
    let stay = Member::join(
        &client,
        "churn",
        "stay",
        GroupOptions::default().with_interval(Duration::from_millis(200)),
    )
    .await
    .expect("joins");
    {
        let (c, stop, ops) = (client.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let m = Member::join(
                    &c,
                    "churn",
                    &format!("temp-{i}"),
                    GroupOptions::default().with_interval(Duration::from_millis(200)),
                )
                .await
                .expect("joins");
                tokio::time::sleep(Duration::from_millis(700)).await;
                m.leave().await;
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first = sample(nodes.port(0)).await;
    let mut last = first;
    let mut peak = first;
    println!("   t (s) | keys on node 0 | used memory (KiB) | operations");
    while started.elapsed() < run {
        tokio::time::sleep(run / 8).await;
        last = sample(nodes.port(0)).await;
        peak = (peak.0.max(last.0), peak.1.max(last.1));
        println!(
            "  {:>6.0} | {:>14} | {:>17} | {}",
            started.elapsed().as_secs_f64(),
            last.0,
            last.1 / 1024,
            ops.load(Ordering::Relaxed)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    stay.leave().await;
    println!(
        "after {} operations: keys {} -> {} ({:.2}x, peak {}), used memory {} KiB -> {} KiB ({:.2}x)",
        ops.load(Ordering::Relaxed),
        first.0,
        last.0,
        last.0 as f64 / first.0.max(1) as f64,
        peak.0,
        first.1 / 1024,
        last.1 / 1024,
        last.1 as f64 / first.1.max(1) as f64
    );
}
