//! IDs through `redquorum serve` against the library in-process, in the same run, on the same
//! local redis-server nodes (AOF, appendfsync always): IDs/s, p50 and p99 at 1 and 64
//! concurrent callers of one sequence, and the ratio serve / in-process.
//!
//! - in-process: `IdGenerator::next_id` on a `Client` in this process (default options);
//! - serve: `POST /v1/ids/{sequence}?count=1` to one `redquorum serve` process (this build's
//!   binary, `CARGO_BIN_EXE_redquorum`) over the same nodes, through one `reqwest` client
//!   (HTTP/1.1, keep-alive pool: 64 callers are 64 tasks on 64 connections), every reply's
//!   JSON parsed;
//! - HTTP alone: `POST /v1/ids/{sequence}?count=0` to the same server, refused with a 400
//!   before any node is contacted: the cost of one HTTP call through the same route and
//!   middleware, without the IDs.
//!
//! Each cell also reports where the CPU went (this process, the server, the nodes: cores used
//! and CPU microseconds per ID) and the rounds node 0 served per ID (its `EXEC`s, a read
//! round, and `EVALSHA`s, a write round; below 1 when concurrent callers share rounds), so a
//! gap between the two paths can be read as HTTP work or as lost sharing. In the "HTTP alone"
//! rows the IDs/s column counts calls.
//!
//! With `--etcd` (`scripts/bench.sh serve --etcd` installs Debian's etcd-server) the same run
//! also measures etcd 3.4's JSON gateway: `POST /v3/kv/put`, the revision as the ID, three
//! members on loopback (`etcd_gateway.rs`), the HTTP answer to the same question.
//!
//! Run: `scripts/bench.sh serve` (or `cargo bench -p redquorum-cli --bench serve`; `-- --quick`
//! for a short run, `-- --nodes 5` for five nodes; three by default). Figures are ratios within
//! one run; absolute numbers depend on the machine (the client, the server and the nodes share
//! its cores).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use redquorum::{Config, IdGenerator};
use redquorum_testkit::LocalNodes;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

// The library crate's bench helpers (the timed concurrent loop, node counters, `connect`),
// compiled into this bench as they are into the library's.
#[path = "support/etcd_gateway.rs"]
mod etcd_gateway;
#[path = "../../benches/support/mod.rs"]
mod support;
use support::{measure, Figures};

/// This build's `redquorum` binary (cargo builds it, optimised, before the bench).
const BIN: &str = env!("CARGO_BIN_EXE_redquorum");
/// Concurrent callers of each cell.
const CALLERS: [usize; 2] = [1, 64];
/// Each cell first runs this long unmeasured (connections opened, the first round done).
const WARMUP: Duration = Duration::from_millis(200);

/// CPU seconds (user + system) process `pid` used, from `/proc/PID/stat` (0 when unreadable).
fn process_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// What the machine did during one cell.
#[derive(Clone, Copy, Default)]
struct Cpu {
    bench_s: f64,
    serve_s: f64,
    nodes_s: f64,
    /// Rounds node 0 served: read rounds (`MULTI`/`EXEC`) and script calls.
    node0_rounds: u64,
}

async fn cpu_snapshot(urls: &[String], serve_pid: u32) -> Cpu {
    let mut cpu = Cpu {
        bench_s: support::profile::client_cpu_s(),
        serve_s: process_cpu_s(serve_pid),
        ..Cpu::default()
    };
    for (i, url) in urls.iter().enumerate() {
        let c = support::profile::node_counters(url).await;
        cpu.nodes_s += c.cpu_s;
        if i == 0 {
            cpu.node0_rounds = ["exec", "evalsha", "eval"]
                .iter()
                .filter_map(|cmd| c.calls.get(*cmd))
                .map(|(calls, _)| calls)
                .sum();
        }
    }
    cpu
}

/// One measured cell: its figures and what the machine did meanwhile.
#[derive(Clone, Copy)]
struct Cell {
    f: Figures,
    elapsed_s: f64,
    cpu: Cpu,
}

impl Cell {
    fn ids(&self) -> f64 {
        self.f.ids_per_s * self.elapsed_s
    }
    fn per_id_us(&self, s: f64) -> f64 {
        s * 1e6 / self.ids().max(1.0)
    }
}

/// Warm up, then measure `callers` loops of `call` for `dur`, with the CPU around it.
async fn cell<F, Fut>(
    urls: &[String],
    serve_pid: u32,
    callers: usize,
    dur: Duration,
    call: F,
) -> Cell
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let warm = measure(callers, WARMUP, call.clone()).await;
    if warm.failures > 0 && warm.ids_per_s == 0.0 {
        panic!(
            "every call failed during the warm-up ({} failures)",
            warm.failures
        );
    }
    let before = cpu_snapshot(urls, serve_pid).await;
    let t0 = Instant::now();
    let f = measure(callers, dur, call).await;
    let elapsed_s = t0.elapsed().as_secs_f64();
    let after = cpu_snapshot(urls, serve_pid).await;
    Cell {
        f,
        elapsed_s,
        cpu: Cpu {
            bench_s: after.bench_s - before.bench_s,
            serve_s: after.serve_s - before.serve_s,
            nodes_s: after.nodes_s - before.nodes_s,
            node0_rounds: after.node0_rounds.saturating_sub(before.node0_rounds),
        },
    }
}

fn row(callers: usize, label: &str, c: &Cell) {
    let cores = |s: f64| s / c.elapsed_s;
    println!(
        "  {callers:>7} | {label:<30} | {:>8.0} | {:>7.3} | {:>7.3} | {:>6} | {:>5.2} {:>5.2} {:>5.2} | {:>6.1} {:>6.1} {:>6.1} | {:>6.2}",
        c.f.ids_per_s,
        c.f.p50_ms,
        c.f.p99_ms,
        c.f.failures,
        cores(c.cpu.bench_s),
        cores(c.cpu.serve_s),
        cores(c.cpu.nodes_s),
        c.per_id_us(c.cpu.bench_s),
        c.per_id_us(c.cpu.serve_s),
        c.per_id_us(c.cpu.nodes_s),
        c.cpu.node0_rounds as f64 / c.ids().max(1.0),
    );
}

fn shell(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(2)
    };
    let n: usize = std::env::args()
        .skip_while(|a| a != "--nodes")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    println!(
        "redquorum serve benchmark: IDs through `redquorum serve` (HTTP/1.1 keep-alive, reqwest) \
         against IdGenerator in-process, same run, same nodes"
    );
    println!(
        "{}; {} cores ({cpu_model}); {}; N = {n} local redis-server nodes (AOF, appendfsync always); {} per cell after {} ms warm-up; load average at start {}",
        shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        shell("redis-server", &["--version"])
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        if quick { "0.7 s" } else { "2 s" },
        WARMUP.as_millis(),
        loadavg(),
    );
    println!("server: {BIN}");

    let nodes = tokio::task::spawn_blocking(move || LocalNodes::start(n))
        .await
        .expect("nodes");
    let urls = nodes.urls();
    // `cluster init` (idempotent) and the in-process client.
    let client = support::connect(Config::from_urls(&urls).expect("urls"))
        .await
        .expect("client");

    let mut server = Command::new(BIN)
        .args([
            "--nodes",
            &urls.join(","),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ])
        .env_remove("REDQUORUM_NODES")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start redquorum serve");
    let serve_pid = server.id().expect("server pid");
    // Kept open until the end: the server writes nothing more to stdout, but it may.
    let mut stdout = BufReader::new(server.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .expect("serve prints `listening on` within 20 s")
        .expect("serve's stdout")
        .expect("serve printed a line");
    let base = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("serve's first line is {line:?}"))
        .to_string();
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client");

    let etcd = if std::env::args().any(|a| a == "--etcd") {
        let etcd = etcd_gateway::start(&http).await;
        println!(
            "etcd: {} (3 members on loopback, JSON gateway)",
            etcd_gateway::version()
        );
        Some(etcd)
    } else {
        None
    };

    println!(
        "\n  callers | path                           |    IDs/s | p50 ms  | p99 ms  | failed | cores: bench serve nodes | CPU µs/ID: bench serve nodes | node-0 rounds/ID"
    );
    let mut pairs = Vec::new();
    for callers in CALLERS {
        let gen = IdGenerator::new(&client, &format!("bench-inproc-{callers}")).expect("name");
        let inproc = cell(&urls, serve_pid, callers, dur, move || {
            let gen = gen.clone();
            async move { gen.next_id().await.map(|_| 1).map_err(|e| e.to_string()) }
        })
        .await;
        row(callers, "in-process IdGenerator", &inproc);

        let url = format!("{base}/v1/ids/bench-serve-{callers}?count=1");
        let h = http.clone();
        let served = cell(&urls, serve_pid, callers, dur, move || {
            let (h, url) = (h.clone(), url.clone());
            async move {
                let r = h.post(&url).send().await.map_err(|e| e.to_string())?;
                if r.status() != 200 {
                    return Err(format!("status {}", r.status()));
                }
                let body: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
                match body["ids"].as_array() {
                    Some(ids) if !ids.is_empty() => Ok(ids.len() as u64),
                    _ => Err(format!("no ids in {body}")),
                }
            }
        })
        .await;
        row(callers, "serve POST /v1/ids", &served);

        let url = format!("{base}/v1/ids/bench-refused?count=0");
        let h = http.clone();
        let alone = cell(&urls, serve_pid, callers, dur, move || {
            let (h, url) = (h.clone(), url.clone());
            async move {
                let r = h.post(&url).send().await.map_err(|e| e.to_string())?;
                let status = r.status();
                let _ = r.bytes().await.map_err(|e| e.to_string())?;
                if status == 400 {
                    Ok(1)
                } else {
                    Err(format!("status {status}, expected 400"))
                }
            }
        })
        .await;
        row(callers, "HTTP alone (400, calls/s)", &alone);
        println!(
            "  {callers:>7} | {:<30} | {:>7.2}x | {:>6.2}x | {:>6.2}x |",
            "ratio serve / in-process",
            served.f.ids_per_s / inproc.f.ids_per_s,
            served.f.p50_ms / inproc.f.p50_ms,
            served.f.p99_ms / inproc.f.p99_ms,
        );
        if let Some(etcd) = &etcd {
            let endpoint = etcd.endpoints[0].clone();
            let h = http.clone();
            let put = cell(&urls, serve_pid, callers, dur, move || {
                let (h, endpoint) = (h.clone(), endpoint.clone());
                async move { etcd_gateway::put(&h, &endpoint).await.map(|_| 1) }
            })
            .await;
            row(callers, "etcd gateway put (revision)", &put);
            println!(
                "  {callers:>7} | {:<30} | {:>7.2}x | {:>6.2}x | {:>6.2}x |",
                "ratio serve / etcd gateway",
                served.f.ids_per_s / put.f.ids_per_s,
                served.f.p50_ms / put.f.p50_ms,
                served.f.p99_ms / put.f.p99_ms,
            );
        }
        pairs.push((callers, inproc, served, alone));
    }

    println!("\n  one HTTP call on its own:");
    for (callers, inproc, served, alone) in &pairs {
        let total = |c: &Cell| c.per_id_us(c.cpu.bench_s + c.cpu.serve_s + c.cpu.nodes_s);
        println!(
            "  {callers:>3} caller(s): latency p50 serve - in-process = {:.0} µs (a refused call alone: p50 {:.0} µs)",
            (served.f.p50_ms - inproc.f.p50_ms) * 1e3,
            alone.f.p50_ms * 1e3,
        );
        println!(
            "      CPU per ID: in-process {:.0} µs (library {:.0}, nodes {:.0}); through serve {:.0} µs (HTTP client {:.0}, server {:.0}: {:+.0} beyond the library in-process, nodes {:.0}); a refused call {:.0} µs (client {:.0}, server {:.0})",
            total(inproc),
            inproc.per_id_us(inproc.cpu.bench_s),
            inproc.per_id_us(inproc.cpu.nodes_s),
            total(served),
            served.per_id_us(served.cpu.bench_s),
            served.per_id_us(served.cpu.serve_s),
            served.per_id_us(served.cpu.serve_s) - inproc.per_id_us(inproc.cpu.bench_s),
            served.per_id_us(served.cpu.nodes_s),
            total(alone),
            alone.per_id_us(alone.cpu.bench_s),
            alone.per_id_us(alone.cpu.serve_s),
        );
    }
    println!("\nload average at the end {}", loadavg());

    drop(etcd);
    let _ = server.kill().await;
    drop(stdout);
    drop(client);
    drop(nodes);
}
