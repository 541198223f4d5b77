//! redquorum beside etcd 3.4, in one run on one machine: three etcd members (one Raft group)
//! and three `redis-server` nodes (AOF, appendfsync always; client-side majority quorums), all
//! on loopback and on the same disk, measured by the same timed concurrent loop:
//!
//! - IDs: etcd's `put` on one key (the ID is the reply header's revision) against
//!   `IdGenerator::next_id` on one sequence (default options; and with lookahead 0, every ID a
//!   write round), at 1 and 64 callers;
//! - lock+unlock cycles, each caller on its own lock name: etcd's lock service (lease grant
//!   10 s, `lock`, `unlock`, lease revoke; and `lock` + `unlock` on a caller's long-lived
//!   lease) against `Lock::acquire` + `LockGuard::release` (TTL 10 s; and `try_acquire`, the
//!   acquisition round without the waiter's release watch), at 1 and 16 callers;
//! - election hand-over after a resign: the time from the leader's `resign` call until the
//!   waiting candidate's `campaign` returns, etcd's election service against
//!   `redquorum::Election`.
//!
//! Run: `scripts/bench.sh etcd [--quick]` (installs etcd-server, protobuf-compiler and
//! redis-server when missing), or `cargo run --release --manifest-path etcd-bench/Cargo.toml
//! -- [--quick]`. See `etcd-bench/README.md` for what is and is not comparable.

mod etcd;
mod measure;

use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client as EtcdClient, LockOptions as EtcdLockOptions, ResignOptions};
use redquorum::{Client, Config, Election, IdGenerator, IdOptions, Lock};
use redquorum_testkit::LocalNodes;

use measure::{measure, Figures, Monotonic, Slots};

/// Members of the etcd cluster and nodes of redquorum's cluster.
const NODES: usize = 3;
/// Concurrent callers of the ID cells.
const ID_CALLERS: [usize; 2] = [1, 64];
/// Concurrent callers of the lock cells (each on its own lock name).
const LOCK_CALLERS: [usize; 2] = [1, 16];
/// The lease time of both systems' locks and leaderships.
const TTL: Duration = Duration::from_secs(10);
/// How long redquorum's `acquire` may wait (the locks are uncontended: it never waits).
const ACQUIRE_WAIT: Duration = Duration::from_secs(5);
/// Each cell first runs this long unmeasured (connections opened, caches warm).
const WARMUP: Duration = Duration::from_millis(200);
/// How long the second candidate campaigns before the leader resigns.
const SETTLE: Duration = Duration::from_millis(300);
/// The election both systems' candidates campaign in.
const ELECTION: &str = "redquorum-bench-handover";

/// One call of a measured loop: how many operations it completed, or why it failed.
type Call = std::pin::Pin<Box<dyn Future<Output = Result<u64, String>> + Send>>;

/// How long each cell runs.
struct Settings {
    measure: Duration,
    handovers: usize,
    quick: bool,
}

/// One throughput cell: both systems under the same load.
struct RateRow {
    what: &'static str,
    callers: usize,
    etcd: Figures,
    ours: Figures,
}

/// Hand-over times of one system.
struct Handovers {
    p50_ms: f64,
    max_ms: f64,
    count: usize,
}

fn parse_args() -> Settings {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => {
                println!("usage: redquorum-etcd-bench [--quick]\n  --quick  0.7 s per cell instead of 2 s, 10 hand-overs instead of 20");
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument {other:?}; usage: redquorum-etcd-bench [--quick]");
                std::process::exit(2);
            }
        }
    }
    Settings {
        measure: Duration::from_millis(if quick { 700 } else { 2000 }),
        handovers: if quick { 10 } else { 20 },
        quick,
    }
}

#[tokio::main]
async fn main() {
    let settings = parse_args();
    // On Ctrl-C the run is dropped, and with it the clusters' guards: no server outlives us.
    tokio::select! {
        () = run(settings) => {}
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: stopping the etcd members and redis-server nodes");
        }
    }
}

async fn run(s: Settings) {
    let etcd_version = etcd::version();
    let mut cluster = etcd::EtcdCluster::start(NODES);
    cluster.wait_healthy().await;
    let nodes = LocalNodes::start(NODES);
    let urls = nodes.urls();
    print_header(&s, &etcd_version, &cluster, &nodes);

    let ec = EtcdClient::connect(cluster.endpoints(), None)
        .await
        .expect("connect to the etcd cluster");
    let rq = rq_client(&urls).await;

    let mut rows = id_rows(&s, &ec, &rq).await;
    rows.extend(lock_rows(&s, &ec, &rq).await);
    let etcd_handover = etcd_handovers(&cluster.endpoints(), s.handovers).await;
    eprintln!(
        "  handover   etcd                                  p50 {:.2} ms  max {:.2} ms",
        etcd_handover.p50_ms, etcd_handover.max_ms
    );
    let ours_handover = rq_handovers(&urls, s.handovers).await;
    eprintln!(
        "  handover   redquorum                             p50 {:.2} ms  max {:.2} ms",
        ours_handover.p50_ms, ours_handover.max_ms
    );
    print_tables(&rows, &etcd_handover, &ours_handover);
    println!();
    println!("load average (1, 5, 15 min) at the end: {}", load_average());
}

/// The ID cells: etcd's put revision beside `next_id` (default options, and lookahead 0).
async fn id_rows(s: &Settings, ec: &EtcdClient, rq: &Client) -> Vec<RateRow> {
    let mut rows = Vec::new();
    for callers in ID_CALLERS {
        let etcd = cell(callers, s.measure, etcd_id_call(ec)).await;
        progress("IDs", "etcd put revision", callers, etcd);
        let default =
            IdGenerator::new(rq, &format!("bench-ids-{callers}")).expect("a valid sequence name");
        let ours = cell(callers, s.measure, rq_id_call(default)).await;
        progress("IDs", "redquorum next_id", callers, ours);
        rows.push(RateRow {
            what: "IDs: put revision / next_id (default)",
            callers,
            etcd,
            ours,
        });
        let options = IdOptions::default()
            .with_lookahead(0)
            .expect("lookahead 0 is valid");
        let written =
            IdGenerator::with_options(rq, &format!("bench-ids-written-{callers}"), options)
                .expect("a valid sequence name");
        let ours = cell(callers, s.measure, rq_id_call(written)).await;
        progress("IDs", "redquorum next_id, lookahead 0", callers, ours);
        rows.push(RateRow {
            what: "IDs: put revision / next_id (lookahead 0)",
            callers,
            etcd,
            ours,
        });
    }
    rows
}

/// The lock cells: etcd's full cycle and its session-lease cycle beside acquire+release.
async fn lock_rows(s: &Settings, ec: &EtcdClient, rq: &Client) -> Vec<RateRow> {
    let mut rows = Vec::new();
    for callers in LOCK_CALLERS {
        let full = cell(callers, s.measure, etcd_lock_call(ec, callers)).await;
        progress("locks", "etcd grant+lock+unlock+revoke", callers, full);
        let (session_call, leases) = etcd_session_lock_call(ec, callers).await;
        let session = cell(callers, s.measure, session_call).await;
        revoke_all(ec, leases).await;
        progress(
            "locks",
            "etcd lock+unlock (session lease)",
            callers,
            session,
        );
        let ours = cell(
            callers,
            s.measure,
            rq_lock_call(rq, callers, Some(ACQUIRE_WAIT)),
        )
        .await;
        progress("locks", "redquorum acquire+release", callers, ours);
        let single = cell(callers, s.measure, rq_lock_call(rq, callers, None)).await;
        progress("locks", "redquorum try_acquire+release", callers, single);
        rows.push(RateRow {
            what: "lock cycle: grant+lock+unlock+revoke / acquire+release",
            callers,
            etcd: full,
            ours,
        });
        rows.push(RateRow {
            what: "lock cycle: lock+unlock on a session lease / acquire+release",
            callers,
            etcd: session,
            ours,
        });
        rows.push(RateRow {
            what: "lock cycle: lock+unlock on a session lease / try_acquire+release",
            callers,
            etcd: session,
            ours: single,
        });
    }
    rows
}

async fn rq_client(urls: &[String]) -> Client {
    Client::connect(Config::from_urls(urls).expect("valid redis-server node URLs"))
        .await
        .expect("connect a redquorum client to the local redis-server nodes")
}

/// A warm-up of [`WARMUP`], then the measurement.
async fn cell<F, Fut>(callers: usize, dur: Duration, call: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    measure(callers, WARMUP, call.clone()).await;
    measure(callers, dur, call).await
}

fn progress(section: &str, what: &str, callers: usize, f: Figures) {
    eprintln!(
        "  {section:<10} {what:<36} {callers:>3} callers: {:>9.0}/s  p50 {:>7.2} ms  p99 {:>7.2} ms  failed {}",
        f.ops_per_s, f.p50_ms, f.p99_ms, f.failures
    );
}

// ---- IDs ----------------------------------------------------------------------------------

/// One etcd ID: a put on one key; the ID is the revision in the reply's header.
fn etcd_id_call(c: &EtcdClient) -> impl Fn() -> Call + Clone {
    let (c, seen) = (c.clone(), Monotonic::default());
    move || {
        let (mut c, seen) = (c.clone(), seen.clone());
        Box::pin(async move {
            let floor = seen.floor();
            let reply = c
                .put("redquorum-bench/id", "x", None)
                .await
                .map_err(|e| format!("etcd put: {e}"))?;
            let revision = reply
                .header()
                .ok_or_else(|| "etcd put: a reply without a header".to_string())?
                .revision();
            let id = u64::try_from(revision)
                .map_err(|_| format!("etcd put: negative revision {revision}"))?;
            seen.check(floor, id)
        })
    }
}

/// One redquorum ID from `generator` (shared by every caller: clones share rounds).
fn rq_id_call(generator: IdGenerator) -> impl Fn() -> Call + Clone {
    let seen = Monotonic::default();
    move || {
        let (generator, seen) = (generator.clone(), seen.clone());
        Box::pin(async move {
            let floor = seen.floor();
            let id = generator
                .next_id()
                .await
                .map_err(|e| format!("redquorum next_id: {e}"))?;
            seen.check(floor, id)
        })
    }
}

// ---- Locks --------------------------------------------------------------------------------

/// One full etcd lock cycle on a free lock name: grant a 10 s lease, `lock` with it, `unlock`,
/// revoke the lease (four requests, each a Raft write).
fn etcd_lock_call(c: &EtcdClient, callers: usize) -> impl Fn() -> Call + Clone {
    let (c, slots) = (c.clone(), Slots::new(callers));
    let ttl = TTL.as_secs() as i64;
    move || {
        let (mut c, slots) = (c.clone(), slots.clone());
        Box::pin(async move {
            let i = slots.take();
            let name = format!("redquorum-bench/lock-{callers}/{i}");
            let result: Result<u64, String> = async {
                let lease = c
                    .lease_grant(ttl, None)
                    .await
                    .map_err(|e| format!("etcd lease grant: {e}"))?
                    .id();
                let cycle = async {
                    let locked = c
                        .lock(name, Some(EtcdLockOptions::new().with_lease(lease)))
                        .await
                        .map_err(|e| format!("etcd lock: {e}"))?;
                    c.unlock(locked.key().to_vec())
                        .await
                        .map_err(|e| format!("etcd unlock: {e}"))
                }
                .await;
                let revoked = c.lease_revoke(lease).await;
                cycle?;
                revoked.map_err(|e| format!("etcd lease revoke: {e}"))?;
                Ok(1)
            }
            .await;
            slots.put(i);
            result
        })
    }
}

/// An etcd lock cycle as a long-lived session does it: `lock` with the caller's lease
/// (granted once per lock name before the cell, revoked after it), then `unlock` (two Raft
/// writes). Returns the call and the leases to revoke.
async fn etcd_session_lock_call(
    c: &EtcdClient,
    callers: usize,
) -> (impl Fn() -> Call + Clone, Vec<i64>) {
    let mut leases = Vec::new();
    let mut granting = c.clone();
    for _ in 0..callers {
        // Longer than the cell (warm-up and measurement), so no lease expires inside it.
        let lease = granting
            .lease_grant(60, None)
            .await
            .expect("etcd: grant a session lease")
            .id();
        leases.push(lease);
    }
    let shared = Arc::new(leases.clone());
    let (c, slots) = (c.clone(), Slots::new(callers));
    let call = move || {
        let (mut c, slots, leases) = (c.clone(), slots.clone(), shared.clone());
        Box::pin(async move {
            let i = slots.take();
            let name = format!("redquorum-bench/session-lock-{callers}/{i}");
            let result: Result<u64, String> = async {
                let locked = c
                    .lock(name, Some(EtcdLockOptions::new().with_lease(leases[i])))
                    .await
                    .map_err(|e| format!("etcd lock: {e}"))?;
                c.unlock(locked.key().to_vec())
                    .await
                    .map_err(|e| format!("etcd unlock: {e}"))?;
                Ok(1)
            }
            .await;
            slots.put(i);
            result
        }) as Call
    };
    (call, leases)
}

async fn revoke_all(c: &EtcdClient, leases: Vec<i64>) {
    let mut c = c.clone();
    for lease in leases {
        c.lease_revoke(lease)
            .await
            .expect("etcd: revoke a session lease");
    }
}

/// One redquorum lock cycle on a free lock name: `acquire(wait)` (TTL 10 s; uncontended, so
/// one acquisition round; a non-zero wait also starts the release watch a waiter listens on),
/// or `try_acquire` (the single round alone) when `wait` is `None`; then `release`. The `Lock`
/// handles are made once per name.
fn rq_lock_call(
    client: &Client,
    callers: usize,
    wait: Option<Duration>,
) -> impl Fn() -> Call + Clone {
    let kind = if wait.is_some() { "wait" } else { "try" };
    let locks: Vec<Lock> = (0..callers)
        .map(|i| {
            Lock::new(client, &format!("bench-lock-{kind}-{callers}-{i}"), TTL)
                .expect("a valid lock name and TTL")
        })
        .collect();
    let (locks, slots) = (Arc::new(locks), Slots::new(callers));
    move || {
        let (locks, slots) = (locks.clone(), slots.clone());
        Box::pin(async move {
            let i = slots.take();
            let result: Result<u64, String> = async {
                let acquired = match wait {
                    Some(wait) => locks[i].acquire(wait).await,
                    None => locks[i].try_acquire().await,
                };
                let guard = acquired.map_err(|e| format!("redquorum acquire: {e}"))?;
                match guard.release().await {
                    Ok(true) => Ok(1),
                    Ok(false) => Err("redquorum release: a majority no longer held it".into()),
                    Err(e) => Err(format!("redquorum release: {e}")),
                }
            }
            .await;
            slots.put(i);
            result
        }) as Call
    }
}

// ---- Election hand-over -------------------------------------------------------------------

/// etcd: candidate A (its own client and 10 s lease) campaigns and wins; B (another client,
/// another lease) campaigns and waits; A resigns. Timed from A's `resign` call to the return
/// of B's `campaign`. Then B resigns and both leases are revoked.
async fn etcd_handovers(endpoints: &[String], reps: usize) -> Handovers {
    let connect = || async {
        EtcdClient::connect(endpoints, None)
            .await
            .expect("connect an etcd candidate's client")
    };
    let (mut a, mut b) = (connect().await, connect().await);
    let ttl = TTL.as_secs() as i64;
    let mut times = Vec::new();
    for _ in 0..reps {
        let lease_a = a
            .lease_grant(ttl, None)
            .await
            .expect("etcd: grant A's lease")
            .id();
        let lease_b = b
            .lease_grant(ttl, None)
            .await
            .expect("etcd: grant B's lease")
            .id();
        let mut won = a
            .campaign(ELECTION, "a", lease_a)
            .await
            .expect("etcd: A's campaign");
        let key_a = won
            .take_leader()
            .expect("etcd: A's campaign reply without its leader key");
        let mut b2 = b.clone();
        let waiting = tokio::spawn(async move {
            let won = b2.campaign(ELECTION, "b", lease_b).await;
            (won, Instant::now())
        });
        tokio::time::sleep(SETTLE).await;
        assert!(!waiting.is_finished(), "etcd: B became leader while A led");
        let resigned_at = Instant::now();
        a.resign(Some(ResignOptions::new().with_leader(key_a)))
            .await
            .expect("etcd: A's resign");
        let (won, at) = waiting.await.expect("etcd: B's campaign task");
        times.push(at.saturating_duration_since(resigned_at));
        let key_b = won
            .expect("etcd: B's campaign")
            .take_leader()
            .expect("etcd: B's campaign reply without its leader key");
        b.resign(Some(ResignOptions::new().with_leader(key_b)))
            .await
            .expect("etcd: B's resign");
        a.lease_revoke(lease_a)
            .await
            .expect("etcd: revoke A's lease");
        b.lease_revoke(lease_b)
            .await
            .expect("etcd: revoke B's lease");
    }
    summarize(times)
}

/// redquorum: candidate A (its own client) campaigns and wins; B (another client) campaigns
/// and waits; A resigns. Timed from A's `resign` call to the return of B's `campaign`. Then B
/// resigns.
async fn rq_handovers(urls: &[String], reps: usize) -> Handovers {
    let (ca, cb) = (rq_client(urls).await, rq_client(urls).await);
    let a = Election::new(&ca, ELECTION, TTL, "candidate-a").expect("redquorum: A's election");
    let b = Election::new(&cb, ELECTION, TTL, "candidate-b").expect("redquorum: B's election");
    let mut times = Vec::new();
    for _ in 0..reps {
        let lead_a = a.campaign().await.expect("redquorum: A's campaign");
        let b2 = b.clone();
        let waiting = tokio::spawn(async move {
            let won = b2.campaign().await;
            (won, Instant::now())
        });
        tokio::time::sleep(SETTLE).await;
        assert!(
            !waiting.is_finished(),
            "redquorum: B became leader while A led"
        );
        let resigned_at = Instant::now();
        lead_a.resign().await.expect("redquorum: A's resign");
        let (won, at) = waiting.await.expect("redquorum: B's campaign task");
        times.push(at.saturating_duration_since(resigned_at));
        won.expect("redquorum: B's campaign")
            .resign()
            .await
            .expect("redquorum: B's resign");
    }
    summarize(times)
}

fn summarize(mut times: Vec<Duration>) -> Handovers {
    times.sort();
    let ms = |d: Option<&Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    Handovers {
        p50_ms: ms(times.get(times.len().saturating_sub(1) / 2)),
        max_ms: ms(times.last()),
        count: times.len(),
    }
}

// ---- Output -------------------------------------------------------------------------------

fn print_header(s: &Settings, etcd_version: &str, cluster: &etcd::EtcdCluster, nodes: &LocalNodes) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "redquorum vs etcd ({})",
        if s.quick { "--quick" } else { "full run" }
    );
    println!(
        "machine: {cores} cores; load average (1, 5, 15 min) at the start: {}",
        load_average()
    );
    println!(
        "etcd {etcd_version}: {NODES} members, one static cluster on 127.0.0.1 (Debian's \
         etcd-server, default settings)"
    );
    // "Redis server v=7.0.15 sha=..." gives "7.0.15".
    let redis_line = first_line("redis-server", &["--version"]);
    let redis_version = redis_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or(&redis_line);
    println!(
        "redquorum: {NODES} local redis-server {redis_version} nodes (AOF, appendfsync always), \
         one Client"
    );
    println!(
        "same disk, fsync on every write: etcd fsyncs its WAL before it acknowledges a write, \
         redis-server its AOF (appendfsync always)"
    );
    println!("  etcd data:  {}", filesystem(cluster.dir()));
    println!("  redis data: {}", filesystem(nodes.data_dir(0)));
    println!(
        "cells: {:.1} s each after a {:.1} s warm-up, run one after the other (etcd, then \
         redquorum); every system's callers share one client; hand-over: {} repetitions",
        s.measure.as_secs_f64(),
        WARMUP.as_secs_f64(),
        s.handovers
    );
    println!();
}

fn print_tables(rows: &[RateRow], etcd: &Handovers, ours: &Handovers) {
    println!();
    println!("Throughput (operations/s: IDs or lock+unlock cycles; higher is better) and latency:");
    println!();
    println!(
        "| cell | callers | etcd ops/s | etcd p50 | etcd p99 | redquorum ops/s | redquorum p50 \
         | redquorum p99 | failed (etcd / ours) | ops/s ours / etcd | p50 ours / etcd |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {} | {:.2} ms | {:.2} ms | {} / {} | {:.2}x | {:.2}x |",
            r.what,
            r.callers,
            thousands(r.etcd.ops_per_s),
            r.etcd.p50_ms,
            r.etcd.p99_ms,
            thousands(r.ours.ops_per_s),
            r.ours.p50_ms,
            r.ours.p99_ms,
            r.etcd.failures,
            r.ours.failures,
            r.ours.ops_per_s / r.etcd.ops_per_s,
            r.ours.p50_ms / r.etcd.p50_ms,
        );
    }
    println!();
    println!(
        "Election hand-over after resign (from the leader's resign call to the waiting \
         candidate's campaign returning; lower is better):"
    );
    println!();
    println!("| cell | runs | etcd p50 | etcd max | redquorum p50 | redquorum max | p50 ours / etcd | max ours / etcd |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| hand-over after resign | {} / {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2}x | {:.2}x |",
        etcd.count,
        ours.count,
        etcd.p50_ms,
        etcd.max_ms,
        ours.p50_ms,
        ours.max_ms,
        ours.p50_ms / etcd.p50_ms,
        ours.max_ms / etcd.max_ms,
    );
}

/// 12345.6 as "12,346".
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The device, file system type and mount point holding `path` (`df`).
fn filesystem(path: &Path) -> String {
    let out = Command::new("df")
        .args(["--output=source,fstype,target"])
        .arg(path)
        .output();
    let described = out.ok().and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .nth(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    });
    format!(
        "{} on {}",
        path.display(),
        described.unwrap_or_else(|| "(df failed)".into())
    )
}

fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_else(|e| format!("({program}: {e})"))
}
