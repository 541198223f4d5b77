//! ID throughput and latency: redquorum's IdGenerator against (a) the seed's algorithm as
//! written (read a majority, take max + 1, set-if-less on a majority; one ID per round),
//! (b) INCR on one fsync-always node (fast, unsafe: the ceiling users compare with) and (c) the
//! cheapest majority write: a plain `SET` fanned out to all N nodes and decided at a majority
//! (one call per ID; what any majority-write protocol must pay on this disk), all in the same
//! run, on the same local redis-server nodes (AOF on, appendfsync always). Then a profile of
//! the 64-caller runs: client CPU, node CPU, script calls, fsyncs per node (`perf stat`), IDs
//! per round.
//!
//! The same table runs on Redis, then on Valkey 8 nodes (when `valkey-server` runs:
//! `scripts/bench.sh` installs it), each baseline on the same server as the IDs it is compared
//! with; the profile runs on both, the sequence and contention sections on the first server.
//! Last, what a connect costs: a client over one node opened over TLS (handshake included)
//! beside a plain one, and redis-rs's own connects beside.
//!
//! Run: `scripts/bench.sh ids` (or `cargo bench --bench ids`; `-- --quick` for a short run,
//! `-- --nodes 5` for one cluster size, `-- --no-valkey` for Redis only, `-- --connect` for
//! the connect section only). Figures are ratios within one run; absolute numbers depend on
//! the machine.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

#[path = "support/servers.rs"]
mod servers;
mod support;
use redis::aio::MultiplexedConnection;
use redquorum::{Client, Config, IdGenerator, IdOptions};
use redquorum_testkit::secure::{Pki, TlsNode};
use redquorum_testkit::LocalNodes;
use servers::Server;
use support::profile::{Node, Profile};
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

/// (c) The majority-write floor: `SET` on every node, done when a majority replied OK.
async fn majority_set(
    conns: &[MultiplexedConnection],
    key: &str,
    value: u64,
) -> Result<u64, String> {
    let needed = conns.len() / 2 + 1;
    let mut writes: FuturesUnordered<_> = conns
        .iter()
        .map(|c| {
            let mut c = c.clone();
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .query_async::<()>(&mut c)
                    .await
            }
        })
        .collect();
    let (mut ok, mut no) = (0usize, 0usize);
    while let Some(r) = writes.next().await {
        if r.is_ok() {
            ok += 1;
        } else {
            no += 1;
        }
        if ok >= needed {
            return Ok(1);
        }
        if no > conns.len() - needed {
            break;
        }
    }
    Err("no majority".into())
}

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

/// One summary row: the server, N, callers; redquorum, seed (a), INCR (b), majority SET (c).
struct Row {
    server: String,
    n: usize,
    callers: usize,
    ours: Figures,
    seed: Figures,
    incr: Figures,
    floor: Figures,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--connect") {
        connects(quick).await;
        return;
    }
    let dur = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(2)
    };
    let only: Option<usize> = std::env::args()
        .skip_while(|a| a != "--nodes")
        .nth(1)
        .and_then(|n| n.parse().ok());
    let node_counts: Vec<usize> = match only {
        Some(n) => vec![n],
        None if quick => vec![3],
        None => vec![1, 3, 5, 7],
    };
    let servers = servers::servers();
    let names: Vec<String> = servers.iter().map(Server::label).collect();
    println!(
        "redquorum ID benchmark: {} per measurement, local nodes (AOF, appendfsync always): {}",
        if quick { "0.7 s" } else { "2 s" },
        names.join(", then ")
    );
    println!(
        "cores: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let mut summary = Vec::new();
    for (k, server) in servers.iter().enumerate() {
        println!(
            "\n===== {} nodes ({}) =====",
            server.label(),
            server.program
        );
        for &n in &node_counts {
            let nodes = LocalNodes::start_with(n, &server.program);
            summary.extend(one_size(server, &nodes, dur, only, k == 0).await);
        }
    }
    connects(quick).await;
    print_summary(&summary);
}

/// Every table of one cluster size on one server; the sequence and contention sections only
/// when `extras`.
async fn one_size(
    server: &Server,
    nodes: &LocalNodes,
    dur: Duration,
    only: Option<usize>,
    extras: bool,
) -> Vec<Row> {
    let n = nodes.len();
    let urls = nodes.urls();
    let client = support::connect(Config::from_urls(&urls).expect("urls"))
        .await
        .expect("client");
    let conns = Arc::new(connections(&urls).await);
    latency_floor(&client, &conns, n, dur).await;
    let mut rows = Vec::new();
    for callers in [1, 8, 64, 256] {
        println!(" {callers} concurrent callers:");
        let (ours, seed, incr, floor) = callers_table(&client, &conns, n, callers, dur).await;
        rows.push(Row {
            server: server.label(),
            n,
            callers,
            ours,
            seed,
            incr,
            floor,
        });
    }
    let probes: Vec<Node> = (0..n)
        .map(|i| Node {
            url: nodes.url(i),
            pid: nodes.pid(i),
        })
        .collect();
    if extras && (n == 3 || only.is_some()) {
        sequences(&client, &probes, n, dur).await;
    }
    if extras && n > 1 {
        contention(&urls, n, dur).await;
    }
    if n > 1 {
        profile(&client, &conns, &probes, n, dur).await;
    }
    rows
}

/// Latency floor: one fan-out PING round, and one node's fsync'd write vs its PING.
async fn latency_floor(
    client: &Client,
    conns: &Arc<Vec<MultiplexedConnection>>,
    n: usize,
    dur: Duration,
) {
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
}

/// One caller count's rows: redquorum (and its write path alone at 1 and 64 callers), the
/// seed's algorithm, INCR on one node, the majority SET floor (and the ID script by hand at
/// one caller), and their ratios.
async fn callers_table(
    client: &Client,
    conns: &Arc<Vec<MultiplexedConnection>>,
    n: usize,
    callers: usize,
    dur: Duration,
) -> (Figures, Figures, Figures, Figures) {
    let seq = format!("bench-{n}-{callers}");
    let gen = IdGenerator::new(client, &seq).expect("name");
    let ours = measure(callers, dur, move || {
        let gen = gen.clone();
        async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
    })
    .await;
    row("redquorum IdGenerator", ours);
    let written = if callers == 1 || callers == 64 {
        // The write path alone (no spare IDs: every call is a write round).
        let options = IdOptions::default().with_lookahead(0).expect("0 is valid");
        let gen = IdGenerator::with_options(client, &format!("{seq}-w"), options).expect("name");
        let f = measure(callers, dur, move || {
            let gen = gen.clone();
            async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
        })
        .await;
        row("redquorum, write rounds only", f);
        Some(f)
    } else {
        None
    };
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
    let floor = {
        let conns = conns.clone();
        let key = format!("set:{seq}");
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        measure(callers, dur, move || {
            let (conns, key, counter) = (conns.clone(), key.clone(), counter.clone());
            async move {
                let v = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                majority_set(&conns, &key, v).await
            }
        })
        .await
    };
    row("(c) majority SET (floor)", floor);
    if callers == 1 {
        let bare = by_hand(conns, &seq, dur).await;
        row("(d) id_propose.lua by hand", bare);
    }
    println!(
        "  ratios: ours / seed = {:.1}x   ours / INCR = {:.2}x   ours / majority SET = {:.2}x{}",
        ours.ids_per_s / seed_f.ids_per_s,
        ours.ids_per_s / incr.ids_per_s,
        ours.ids_per_s / floor.ids_per_s,
        if callers == 1 {
            format!(
                "   ours p50 / majority SET p50 = {:.2}",
                ours.p50_ms / floor.p50_ms
            )
        } else {
            String::new()
        }
    );
    if let Some(w) = written {
        println!(
            "  write rounds only: / INCR = {:.2}x   / majority SET = {:.2}x   p50 / majority SET p50 = {:.2}",
            w.ids_per_s / incr.ids_per_s,
            w.ids_per_s / floor.ids_per_s,
            w.p50_ms / floor.p50_ms
        );
    }
    (ours, seed_f, incr, floor)
}

/// (d) The ID script alone: id_propose.lua fanned out by hand, decided at a majority, one ID
/// per call (what our round costs without the library's client).
async fn by_hand(conns: &Arc<Vec<MultiplexedConnection>>, seq: &str, dur: Duration) -> Figures {
    let script = Arc::new(redis::Script::new(concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/id_propose.lua")
    )));
    let mut markers = Vec::new();
    for c in conns.iter() {
        let mut c = c.clone();
        let m: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut c)
            .await
            .expect("GET marker");
        markers.push(m.unwrap_or_else(|| "*".into()));
    }
    let markers = Arc::new(markers);
    let conns = conns.clone();
    let key = format!("rq:id:bare-{seq}");
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    measure(1, dur, move || {
        let (conns, key, next, script, markers) = (
            conns.clone(),
            key.clone(),
            next.clone(),
            script.clone(),
            markers.clone(),
        );
        async move {
            let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let needed = conns.len() / 2 + 1;
            let mut calls: FuturesUnordered<_> = conns
                .iter()
                .zip(markers.iter())
                .map(|(c, m)| {
                    let mut c = c.clone();
                    let mut inv = script.key("rq:marker");
                    inv.key(&key).arg(m.as_str()).arg(id).arg(id);
                    async move { inv.invoke_async::<(i64, u64)>(&mut c).await }
                })
                .collect();
            let mut ok = 0;
            while let Some(r) = calls.next().await {
                if matches!(r, Ok((1, _))) {
                    ok += 1;
                    if ok >= needed {
                        return Ok(1);
                    }
                }
            }
            Err("no majority".to_string())
        }
    })
    .await
}

/// Cost as sequences grow: the same 64 callers spread over 1, 100 and 1,000 sequences of one
/// client (caller i on sequence i mod S); proposals and reads of sequences due together share
/// node calls. With the fast path, and with write rounds only.
async fn sequences(client: &Client, probes: &[Node], n: usize, dur: Duration) {
    println!(" 64 callers over S sequences (node calls/s: script calls + reads, node 0):");
    for lookahead in [redquorum::DEFAULT_LOOKAHEAD, 0] {
        for seqs in [1usize, 100, 1000] {
            let options = IdOptions::default()
                .with_lookahead(lookahead)
                .expect("valid");
            let gens: Arc<Vec<IdGenerator>> = Arc::new(
                (0..seqs)
                    .map(|s| {
                        IdGenerator::with_options(
                            client,
                            &format!("seqs-{n}-{lookahead}-{seqs}-{s}"),
                            options.clone(),
                        )
                        .expect("name")
                    })
                    .collect(),
            );
            let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let p = Profile::start(&probes[..1], &["evalsha", "exec"]).await;
            let f = measure(64, dur, move || {
                let i = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % seqs;
                let gen = gens[i].clone();
                async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
            })
            .await;
            let r = p.finish().await;
            println!(
                "  lookahead {lookahead:>4}, {seqs:>4} sequences: {:>8.0} IDs/s   p50 {:>6.2} ms   node 0: {:>6.0} calls/s ({:.1} IDs per call), client {:.2} cores",
                f.ids_per_s,
                f.p50_ms,
                r.nodes[0].1,
                f.ids_per_s / r.nodes[0].1.max(1.0),
                r.client_cores
            );
        }
    }
}

/// Contention between processes: 8 clients (separate connections and generators, as separate
/// processes would have) share one sequence, 8 callers each. Each client's writes land above
/// the others' spares, so their reads fail; the spare policy then stops reserving spares for a
/// while. Against the write path alone.
async fn contention(urls: &[String], n: usize, dur: Duration) {
    println!(" 8 clients x 8 callers, one sequence:");
    for lookahead in [redquorum::DEFAULT_LOOKAHEAD, 0] {
        let mut gens = Vec::new();
        for _ in 0..8 {
            let c = support::connect(Config::from_urls(urls).expect("urls"))
                .await
                .expect("client");
            let options = IdOptions::default()
                .with_lookahead(lookahead)
                .expect("valid");
            gens.push(
                IdGenerator::with_options(&c, &format!("shared-{n}-{lookahead}"), options)
                    .expect("name"),
            );
        }
        let gens = Arc::new(gens);
        let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let f = measure(64, dur, move || {
            let i = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 8;
            let gen = gens[i].clone();
            async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
        })
        .await;
        row(&format!("redquorum, lookahead {lookahead}"), f);
    }
}

/// Where the time goes at 64 callers: ours, then INCR, each measured again under the profile
/// (perf counting fsyncs costs a little).
async fn profile(
    client: &Client,
    conns: &Arc<Vec<MultiplexedConnection>>,
    probes: &[Node],
    n: usize,
    dur: Duration,
) {
    let gen = IdGenerator::new(client, &format!("profile-{n}")).expect("name");
    let p = Profile::start(probes, &["evalsha", "exec"]).await;
    let f = measure(64, dur, move || {
        let gen = gen.clone();
        async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
    })
    .await;
    let r = p.finish().await;
    println!(
        " profile, N = {n}, 64 callers: redquorum {:.0} IDs/s",
        f.ids_per_s
    );
    r.print("redquorum (IDs per round)", f.ids_per_s * r.elapsed_s);
    let c = conns[0].clone();
    let p = Profile::start(&probes[..1], &["incr"]).await;
    let f = measure(64, dur, move || {
        let mut c = c.clone();
        async move {
            redis::cmd("INCR")
                .arg("profile-incr")
                .query_async::<u64>(&mut c)
                .await
                .map(|_| 1)
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let r = p.finish().await;
    println!(
        " profile, 64 callers: INCR on node 0 {:.0} IDs/s",
        f.ids_per_s
    );
    r.print("INCR (IDs per call)", f.ids_per_s * r.elapsed_s);
}

/// The summary: every server's rows, in run order; then, when both ran, Valkey against Redis.
fn print_summary(summary: &[Row]) {
    println!(
        "\nsummary (IDs/s): server N callers | redquorum | seed (a) | INCR (b) | majority SET (c) | ours/seed | ours/INCR | ours/SET | p50 ours/SET"
    );
    for r in summary {
        println!(
            "  {:<14} {} {:>4} | {:>9.0} | {:>8.0} | {:>8.0} | {:>16.0} | {:>8.1}x | {:>8.2}x | {:>7.2}x | {:>6.2}x",
            r.server,
            r.n,
            r.callers,
            r.ours.ids_per_s,
            r.seed.ids_per_s,
            r.incr.ids_per_s,
            r.floor.ids_per_s,
            r.ours.ids_per_s / r.seed.ids_per_s,
            r.ours.ids_per_s / r.incr.ids_per_s,
            r.ours.ids_per_s / r.floor.ids_per_s,
            r.ours.p50_ms / r.floor.p50_ms
        );
    }
    let first = summary.first().map(|r| r.server.clone());
    let pairs: Vec<(&Row, &Row)> = summary
        .iter()
        .filter(|r| Some(&r.server) == first.as_ref())
        .filter_map(|a| {
            summary
                .iter()
                .find(|b| b.server != a.server && b.n == a.n && b.callers == a.callers)
                .map(|b| (a, b))
        })
        .collect();
    if let Some((a, b)) = pairs.first() {
        println!(
            "\n{} / {} (IDs/s, same cells): N callers | redquorum | seed (a) | INCR (b) | majority SET (c)",
            b.server, a.server
        );
    }
    for (a, b) in pairs {
        println!(
            "  {} {:>4} | {:>8.2}x | {:>7.2}x | {:>7.2}x | {:>7.2}x",
            a.n,
            a.callers,
            b.ours.ids_per_s / a.ours.ids_per_s,
            b.seed.ids_per_s / a.seed.ids_per_s,
            b.incr.ids_per_s / a.incr.ids_per_s,
            b.floor.ids_per_s / a.floor.ids_per_s
        );
    }
}

/// What a connect costs, on one node of the first server: a client over it opened (TCP, the
/// TLS handshake when TLS, the connection's set-up and the safety probe) and dropped, one
/// after another, plain and over TLS (a CA file, server-only TLS); and redis-rs's own connect
/// plus a PING, plain and over TLS (redis-rs builds its TLS configuration, parsing the
/// system's roots, on every connect, even with a CA file: what the library did before it
/// built it once per client).
async fn connects(quick: bool) {
    let dur = Duration::from_millis(if quick { 1500 } else { 4000 });
    let pki = Pki::generate();
    let tls_node = TlsNode::start(&pki, "no", &[]).await;
    let plain_node = LocalNodes::start(1);
    let plain_url = plain_node.url(0);
    let tls_url = format!("rediss://127.0.0.1:{}", tls_node.port());
    println!(
        "\nconnects: one node ({}), one connect after another, {:.1} s each",
        redquorum_testkit::server_program(),
        dur.as_secs_f64()
    );
    let plain = Config::from_urls([plain_url.as_str()]).expect("url");
    let tls = Config::from_urls([tls_url.as_str()])
        .expect("url")
        .with_ca_file(&pki.ca)
        .expect("CA");
    for config in [&plain, &tls] {
        Client::init_cluster(config.clone())
            .await
            .expect("cluster init");
    }
    let ours_plain = measure(1, dur, library_connect(plain)).await;
    let ours_tls = measure(1, dur, library_connect(tls)).await;
    let ca = std::fs::read(&pki.ca).expect("CA file");
    let rs_plain = measure(1, dur, driver_connect(plain_url, None)).await;
    let rs_tls = measure(1, dur, driver_connect(tls_url, Some(ca))).await;
    let per = |f: &Figures| 1e3 / f.ids_per_s.max(f64::MIN_POSITIVE);
    for (label, f) in [
        ("redquorum Client, plain", &ours_plain),
        ("redquorum Client, TLS", &ours_tls),
        ("redis-rs + PING, plain", &rs_plain),
        ("redis-rs + PING, TLS", &rs_tls),
    ] {
        println!(
            "  {label:<26} {:>7.2} ms per connect (mean)   p50 {:>6.2} ms   p99 {:>6.2} ms   failed {}",
            per(f),
            f.p50_ms,
            f.p99_ms,
            f.failures
        );
    }
    println!(
        "  ratio TLS / plain: redquorum {:.2}x (+{:.2} ms per connect); redis-rs alone {:.2}x (+{:.2} ms: it parses the system's roots on every connect)",
        per(&ours_tls) / per(&ours_plain),
        per(&ours_tls) - per(&ours_plain),
        per(&rs_tls) / per(&rs_plain),
        per(&rs_tls) - per(&rs_plain)
    );
}

/// One connect through the library: a client over the node (it connects and probes before it
/// returns) and a PING, dropped at once.
fn library_connect(
    config: Config,
) -> impl Fn() -> futures::future::BoxFuture<'static, Result<u64, String>> + Clone + Send + 'static
{
    move || {
        let config = config.clone();
        Box::pin(async move {
            let client = Client::connect(config).await.map_err(|e| e.to_string())?;
            client.ping().await.map_err(|e| e.to_string())?;
            Ok(1)
        })
    }
}

/// One connect through redis-rs alone, and a PING; over TLS with `ca` as the root.
fn driver_connect(
    url: String,
    ca: Option<Vec<u8>>,
) -> impl Fn() -> futures::future::BoxFuture<'static, Result<u64, String>> + Clone + Send + 'static
{
    move || {
        let (url, ca) = (url.clone(), ca.clone());
        Box::pin(async move {
            let client = match ca {
                Some(root) => redis::Client::build_with_tls(
                    url.as_str(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(root),
                    },
                ),
                None => redis::Client::open(url.as_str()),
            }
            .map_err(|e| e.to_string())?;
            let mut con = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut con)
                .await
                .map_err(|e| e.to_string())?;
            Ok(1)
        })
    }
}
