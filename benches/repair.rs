//! Repair that scales: the time to repair a wiped node holding many keys (default 1,000,000 ID
//! sequences; `--quick` 100,000), against the cheapest copy of the same keys in the same run
//! (SCAN + MGET from one node, pipelined MSET into an empty one): the ratio is the figure.
//!
//! Run: `scripts/bench.sh repair [--quick]` (or `cargo bench --bench repair`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use redquorum_testkit::LocalNodes;

use redis::aio::MultiplexedConnection;
use redquorum::{Config, IdGenerator};

async fn conn(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

/// Write `keys` ID sequences (as if a majority had accepted them) on a node, 10,000 per script.
async fn populate(con: &mut MultiplexedConnection, keys: u64) {
    let script = redis::Script::new(
        "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('SET', 'rq:id:bench-' .. i, tostring(i * 7 + 3)) end return 1",
    );
    let mut from = 0;
    while from < keys {
        let to = (from + 10_000).min(keys) - 1;
        let _: i64 = script
            .arg(from)
            .arg(to)
            .invoke_async(con)
            .await
            .expect("populate");
        from = to + 1;
    }
}

async fn used_memory(con: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(con)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The cheapest copy: SCAN + MGET one node, pipelined MSET into another, 1,000 keys a page.
async fn baseline_copy(from: &mut MultiplexedConnection, to: &mut MultiplexedConnection) -> u64 {
    let mut cursor: u64 = 0;
    let mut copied = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("rq:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(from)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(from)
                .await
                .expect("MGET");
            let mut mset = redis::cmd("MSET");
            for (k, v) in keys.iter().zip(values) {
                if let Some(v) = v {
                    mset.arg(k).arg(v);
                    copied += 1;
                }
            }
            let _: () = mset.query_async(to).await.expect("MSET");
        }
        if next == 0 {
            return copied;
        }
        cursor = next;
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let keys: u64 = if quick { 100_000 } else { 1_000_000 };
    let nodes = LocalNodes::start(4);
    let urls: Vec<String> = nodes.urls()[..3].to_vec();
    let client = support::connect(Config::from_urls(&urls).expect("valid"))
        .await
        .expect("connects");
    // One ID through the cluster, so every node is marked before the bulk keys arrive.
    IdGenerator::new(&client, "warm")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");
    let mut cons = Vec::new();
    for p in nodes.ports() {
        cons.push(conn(p).await);
    }
    for con in cons.iter_mut().take(3) {
        populate(con, keys).await;
    }
    let before = used_memory(&mut cons[0]).await;
    println!(
        "{keys} ID sequences on each of 3 nodes ({:.1} MiB each)",
        before as f64 / 1048576.0
    );

    let t0 = Instant::now();
    let (a, b) = cons.split_at_mut(3);
    let copied = baseline_copy(&mut a[0], &mut b[0]).await;
    let baseline = t0.elapsed();
    println!(
        "baseline (SCAN+MGET -> MSET, one node to an empty one): {copied} keys in {:.2} s",
        baseline.as_secs_f64()
    );

    // Wipe node 2 (its marker goes with its data); a new client repairs it.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut cons[2])
        .await
        .expect("FLUSHALL");
    let t0 = Instant::now();
    let _repairer = support::connect(Config::from_urls(&urls).expect("valid"))
        .await
        .expect("connects");
    loop {
        let marker: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut cons[2])
            .await
            .expect("GET");
        if marker.is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1800),
            "repair did not finish in 30 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let repair = t0.elapsed();
    let dbsize: u64 = redis::cmd("DBSIZE")
        .query_async(&mut cons[2])
        .await
        .expect("DBSIZE");
    println!(
        "repair of the wiped node: {dbsize} keys in {:.2} s ({:.0} keys/s); ratio to the baseline copy {:.2}x",
        repair.as_secs_f64(),
        dbsize as f64 / repair.as_secs_f64(),
        repair.as_secs_f64() / baseline.as_secs_f64()
    );
}
