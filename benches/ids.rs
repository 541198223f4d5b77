//! ID throughput and latency: redquorum's IdGenerator against (a) the seed's algorithm as
//! written (read a majority, take max + 1, set-if-less on a majority; one ID per round) and
//! (b) INCR on one fsync-always node (fast, unsafe: the ceiling users compare with), all in
//! the same run, on the same local redis-server nodes (AOF on, appendfsync always).
//!
//! Run: `scripts/bench.sh ids` (or `cargo bench --bench ids`; `-- --quick` for a short run).
//! Figures are ratios within one run; absolute numbers depend on the machine.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

mod support;
use redis::aio::MultiplexedConnection;
use redquorum::{Client, Config, IdGenerator};
use redquorum_testkit::LocalNodes;
use support::{measure, Figures};

/// The seed's algorithm as written: per ID, read the value from a majority, propose max + 1,
/// set-if-less on every node, succeed with a majority; otherwise retry.
#[derive(Clone)]
struct SeedGenerator {
    conns: Arc<Vec<MultiplexedConnection>>,
    script: Arc<redis::Script>,
    key: String,
}

impl SeedGenerator {
    async fn next_id(&self) -> Result<u64, String> {
        let needed = self.conns.len() / 2 + 1;
        for _ in 0..100 {
            // Read phase: GET from all, use the first majority of replies.
            let mut reads: FuturesUnordered<_> = self
                .conns
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    let key = self.key.clone();
                    async move {
                        redis::cmd("GET")
                            .arg(key)
                            .query_async::<Option<u64>>(&mut c)
                            .await
                    }
                })
                .collect();
            let (mut max, mut got) = (0u64, 0usize);
            while let Some(r) = reads.next().await {
                if let Ok(v) = r {
                    max = max.max(v.unwrap_or(0));
                    got += 1;
                    if got >= needed {
                        break;
                    }
                }
            }
            let proposal = max + 1;
            // Write phase: set-if-less on all, success with a majority.
            let mut writes: FuturesUnordered<_> = self
                .conns
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    let (script, key) = (self.script.clone(), self.key.clone());
                    async move {
                        script
                            .key(&key)
                            .arg(proposal)
                            .invoke_async::<i64>(&mut c)
                            .await
                    }
                })
                .collect();
            let (mut ok, mut no) = (0usize, 0usize);
            while let Some(r) = writes.next().await {
                if matches!(r, Ok(1)) {
                    ok += 1;
                } else {
                    no += 1;
                }
                if ok >= needed || no > self.conns.len() - needed {
                    break;
                }
            }
            if ok >= needed {
                return Ok(proposal);
            }
        }
        Err("gave up after 100 rounds".into())
    }
}

const SET_IF_LESS: &str = "local c = tonumber(redis.call('GET', KEYS[1]) or '0') if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0";

async fn connections(urls: &[String]) -> Vec<MultiplexedConnection> {
    let mut out = Vec::new();
    for u in urls {
        out.push(
            redis::Client::open(u.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    out
}

fn row(label: &str, f: Figures) {
    println!(
        "  {label:<28} {:>10.0} IDs/s   p50 {:>7.2} ms   p99 {:>7.2} ms   failed calls {}",
        f.ids_per_s, f.p50_ms, f.p99_ms, f.failures
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(2)
    };
    let node_counts: &[usize] = if quick { &[3] } else { &[1, 3, 5] };
    let caller_counts: &[usize] = &[1, 8, 64, 256];
    println!("redquorum ID benchmark: {} per measurement, local redis-server nodes (AOF, appendfsync always)", if quick { "0.7 s" } else { "2 s" });
    println!(
        "cores: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let mut summary = Vec::new();
    for &n in node_counts {
        let nodes = LocalNodes::start(n);
        let urls = nodes.urls();
        let client = Client::connect(Config::from_urls(&urls).expect("urls"))
            .await
            .expect("client");
        let conns = Arc::new(connections(&urls).await);

        // Latency floor: one fan-out PING round, and one node's fsync'd write vs its PING.
        let ping = measure(1, dur / 2, {
            let client = client.clone();
            move || {
                let client = client.clone();
                async move { client.ping().await.map(|_| 1).map_err(|e| e.to_string()) }
            }
        })
        .await;
        let mut c0 = conns[0].clone();
        let single_ping = measure(1, dur / 2, move || {
            let mut c = c0.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .map(|_| 1)
                    .map_err(|e| e.to_string())
            }
        })
        .await;
        c0 = conns[0].clone();
        let single_set = measure(1, dur / 2, move || {
            let mut c = c0.clone();
            async move {
                redis::cmd("SET")
                    .arg("bench:fsync")
                    .arg(1)
                    .query_async::<()>(&mut c)
                    .await
                    .map(|_| 1)
                    .map_err(|e| e.to_string())
            }
        })
        .await;
        let fsync_ms = (single_set.p50_ms - single_ping.p50_ms).max(0.0);
        println!("\nN = {n}: fan-out PING p50 {:.3} ms; one node: PING p50 {:.3} ms, fsync'd SET p50 {:.3} ms (fsync ~{:.3} ms)", ping.p50_ms, single_ping.p50_ms, single_set.p50_ms, fsync_ms);

        for &callers in caller_counts {
            println!(" {callers} concurrent callers:");
            let seq = format!("bench-{n}-{callers}");
            let gen = IdGenerator::new(&client, &seq).expect("name");
            let ours = measure(callers, dur, move || {
                let gen = gen.clone();
                async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
            })
            .await;
            row("redquorum IdGenerator", ours);
            let seed = SeedGenerator {
                conns: conns.clone(),
                script: Arc::new(redis::Script::new(SET_IF_LESS)),
                key: format!("seed:{seq}"),
            };
            let seed_f = measure(callers, dur, move || {
                let seed = seed.clone();
                async move { seed.next_id().await.map(|_| 1) }
            })
            .await;
            row("(a) seed algorithm", seed_f);
            let c = conns[0].clone();
            let key = format!("incr:{seq}");
            let incr = measure(callers, dur, move || {
                let (mut c, key) = (c.clone(), key.clone());
                async move {
                    redis::cmd("INCR")
                        .arg(key)
                        .query_async::<u64>(&mut c)
                        .await
                        .map(|_| 1)
                        .map_err(|e| e.to_string())
                }
            })
            .await;
            row("(b) INCR on one node", incr);
            println!(
                "  ratios: ours / seed = {:.1}x   ours / INCR = {:.2}x{}",
                ours.ids_per_s / seed_f.ids_per_s,
                ours.ids_per_s / incr.ids_per_s,
                if callers == 1 {
                    format!(
                        "   ours p50 / (fan-out PING p50 + fsync) = {:.2}",
                        ours.p50_ms / (ping.p50_ms + fsync_ms)
                    )
                } else {
                    String::new()
                }
            );
            summary.push((n, callers, ours, seed_f, incr));
        }
    }
    println!(
        "\nsummary (IDs/s): N callers | redquorum | seed (a) | INCR (b) | ours/seed | ours/INCR"
    );
    for (n, callers, ours, seed, incr) in summary {
        println!(
            "  {n} {callers:>4} | {:>9.0} | {:>8.0} | {:>8.0} | {:>8.1}x | {:>8.2}x",
            ours.ids_per_s,
            seed.ids_per_s,
            incr.ids_per_s,
            ours.ids_per_s / seed.ids_per_s,
            ours.ids_per_s / incr.ids_per_s
        );
    }
}
