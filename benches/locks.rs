//! Lease benchmark: lock+unlock cycles/s and latency, redquorum's `Lock` side by side with
//! rslock 0.10 (the Rust Redlock crate) in the same run, on the same local redis-server nodes
//! (AOF on, appendfsync always), healthy and with one node frozen (SIGSTOP); and fail-over time
//! after the holder dies, against the TTL.
//!
//! The same table runs on Redis, then on Valkey 8 nodes (when `valkey-server` runs:
//! `scripts/bench.sh` installs it), rslock on the same nodes as ours; the held-leases section
//! runs on the first server.
//!
//! Run: `scripts/bench.sh locks` (or `cargo bench --bench locks`; `-- --quick` for a short run;
//! `-- --no-valkey` for Redis only; `-- --soak SECS` runs only N = 5 with 16 callers, healthy,
//! for SECS and prints every failed cycle's error: a healthy cluster should fail none;
//! `-- --healthy` only the healthy cells of N = 3 and 5, for a quick comparison; `-- --phases`
//! where one caller's cycle goes: acquisition and release apart, ours, rslock's, our scripts
//! without our client, and plain `SET NX PX`; `-- --batching` where 16 callers' cycles go: our
//! scripts through plain redis-rs one call each, batched per node, and the leanest fenced
//! scripts we could write, beside our `Lock` and rslock, each row with its client's and nodes'
//! CPU per cycle).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

#[path = "support/servers.rs"]
mod servers;
mod support;
use redquorum_testkit::LocalNodes;
use servers::Server;
use support::profile::{Node, Profile};
use support::{measure, Figures};

use futures::StreamExt;
use redquorum::{Client, Config, Lock};

/// Lock indexes free to take: a cycle takes one and puts it back, so no two concurrent cycles
/// ever use one lock (each caller is uncontended: the cost of the protocol itself).
#[derive(Clone)]
struct Slots(std::sync::Arc<std::sync::Mutex<Vec<usize>>>);

impl Slots {
    fn new(n: usize) -> Slots {
        Slots(std::sync::Arc::new(std::sync::Mutex::new((0..n).collect())))
    }

    fn take(&self) -> usize {
        self.0.lock().unwrap().pop().expect("one slot per caller")
    }

    fn put(&self, i: usize) {
        self.0.lock().unwrap().push(i);
    }
}

fn row(label: &str, f: Figures) {
    println!(
        "  {label:<34} {:>9.0} cycles/s   p50 {:>8.2} ms   p99 {:>8.2} ms   failed {}",
        f.ids_per_s, f.p50_ms, f.p99_ms, f.failures
    );
}

async fn ours(client: &Client, callers: usize, dur: Duration, tag: &str) -> Figures {
    let mut locks = Vec::new();
    for i in 0..callers {
        locks
            .push(Lock::new(client, &format!("bench:{tag}:{i}"), Duration::from_secs(10)).unwrap());
    }
    let locks = std::sync::Arc::new(locks);
    let slots = Slots::new(callers);
    measure(callers, dur, move || {
        let (locks, slots) = (locks.clone(), slots.clone());
        async move {
            let i = slots.take();
            let result = async {
                let g = locks[i].try_acquire().await.map_err(|e| e.to_string())?;
                g.release().await.map_err(|e| e.to_string())
            }
            .await;
            slots.put(i);
            if let Err(e) = &result {
                static SHOWN: std::sync::atomic::AtomicUsize =
                    std::sync::atomic::AtomicUsize::new(0);
                if SHOWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 20 {
                    eprintln!("  (failed cycle: {e})");
                }
            }
            result.map(|_| 1)
        }
    })
    .await
}

async fn rs(manager: &rslock::LockManager, callers: usize, dur: Duration, tag: &str) -> Figures {
    let manager = manager.clone();
    let tag = tag.to_string();
    let slots = Slots::new(callers);
    measure(callers, dur, move || {
        let (manager, tag, slots) = (manager.clone(), tag.clone(), slots.clone());
        async move {
            let i = slots.take();
            let name = format!("rslock:{tag}:{i}");
            let result = match manager.lock(name.as_bytes(), Duration::from_secs(10)).await {
                Ok(lock) => {
                    manager.unlock(&lock).await;
                    Ok(1)
                }
                Err(e) => Err(format!("{e:?}")),
            };
            slots.put(i);
            result
        }
    })
    .await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(2)
    };
    let args: Vec<String> = std::env::args().collect();
    if let Some(secs) = args
        .iter()
        .position(|a| a == "--soak")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<u64>().ok())
    {
        let nodes = LocalNodes::start(5);
        let client = support::connect(Config::from_urls(nodes.urls()).unwrap())
            .await
            .unwrap();
        println!("soak: N = 5, 16 callers each on its own lock, healthy, {secs} s");
        // The lock names of the N = 5, 16-caller cell, two of which share a fence floor
        // bucket (766): the cell where one failed cycle was once seen.
        let f = ours(&client, 16, Duration::from_secs(secs), "h516").await;
        row("redquorum Lock", f);
        return;
    }
    if args.iter().any(|a| a == "--phases") {
        phases().await;
        return;
    }
    if args.iter().any(|a| a == "--batching") {
        batching(dur).await;
        return;
    }
    let servers = servers::servers();
    if args.iter().any(|a| a == "--held") {
        if let Some(first) = servers.first() {
            held(quick, first).await;
        }
        return;
    }
    let names: Vec<String> = servers.iter().map(Server::label).collect();
    println!(
        "redquorum lock benchmark vs rslock 0.10: {:?} per measurement, local nodes (AOF always): {}",
        dur,
        names.join(", then ")
    );
    let mut summary = Vec::new();
    for server in &servers {
        println!(
            "\n===== {} nodes ({}) =====",
            server.label(),
            server.program
        );
        let healthy_only = args.iter().any(|a| a == "--healthy");
        let sizes: &[usize] = if healthy_only { &[3, 5] } else { &[3, 5, 7] };
        for &n in sizes {
            let nodes = LocalNodes::start_with(n, &server.program);
            for (callers, state, a, b) in one_size(&nodes, dur, healthy_only).await {
                summary.push((server.label(), n, callers, state, a, b));
            }
        }
    }
    if let Some(first) = servers
        .first()
        .filter(|_| !args.iter().any(|a| a == "--healthy"))
    {
        held(quick, first).await;
    }
    println!(
        "\nsummary: server N callers state | redquorum cycles/s p50 p99 | rslock cycles/s p50 p99 | ratio"
    );
    for (server, n, callers, state, a, b) in summary {
        println!(
            "  {server:<14} {n} {callers:>2} {state:<8} | {:>7.0} {:>7.2} {:>7.2} | {:>7.0} {:>7.2} {:>7.2} | {:>5.2}x",
            a.ids_per_s,
            a.p50_ms,
            a.p99_ms,
            b.ids_per_s,
            b.p50_ms,
            b.p99_ms,
            a.ids_per_s / b.ids_per_s
        );
    }
}

/// One cluster size on one server: healthy at 1 and 16 callers, the profile at 16, one node
/// frozen, and the fail-over time; the summary's rows (callers, state, ours, rslock).
async fn one_size(
    nodes: &LocalNodes,
    dur: Duration,
    healthy_only: bool,
) -> Vec<(usize, &'static str, Figures, Figures)> {
    let n = nodes.len();
    let urls = nodes.urls();
    let client = support::connect(Config::from_urls(&urls).unwrap())
        .await
        .unwrap();
    let manager = rslock::LockManager::new(urls.clone());
    let mut summary = Vec::new();
    println!("\nN = {n}");
    for callers in [1usize, 16] {
        println!(" healthy, {callers} caller(s), each on its own lock:");
        let a = ours(&client, callers, dur, &format!("h{n}{callers}")).await;
        row("redquorum Lock", a);
        let b = rs(&manager, callers, dur, &format!("h{n}{callers}")).await;
        row("rslock 0.10", b);
        println!(
            "  ratio redquorum / rslock: {:.2}x cycles/s",
            a.ids_per_s / b.ids_per_s
        );
        summary.push((callers, "healthy", a, b));
    }
    if healthy_only {
        return summary;
    }
    // Where the time goes at 16 callers: both again under the profile.
    let probes: Vec<Node> = (0..n)
        .map(|i| Node {
            url: nodes.url(i),
            pid: nodes.pid(i),
        })
        .collect();
    // Top-level calls only: Redis also counts the commands a script runs (its SET, DEL,
    // PUBLISH) under their own names. Ours: a script per acquisition and per release;
    // rslock: SET NX PX, and a script to release.
    let p = Profile::start(&probes, &["evalsha", "eval"]).await;
    let f = ours(&client, 16, dur, &format!("p{n}")).await;
    let r = p.finish().await;
    println!(
        " profile, 16 callers: redquorum {:.0} cycles/s",
        f.ids_per_s
    );
    r.print(
        "redquorum (cycles per node call)",
        f.ids_per_s * r.elapsed_s,
    );
    let p = Profile::start(&probes, &["set", "evalsha", "eval"]).await;
    let f = rs(&manager, 16, dur, &format!("p{n}")).await;
    let r = p.finish().await;
    println!(" profile, 16 callers: rslock {:.0} cycles/s", f.ids_per_s);
    r.print("rslock (cycles per node call)", f.ids_per_s * r.elapsed_s);
    // One node frozen (SIGSTOP). rslock waits for every node; we wait at most the per-node
    // deadline (TTL/10 capped at 250 ms) and return as soon as a majority answered.
    nodes.freeze(n - 1);
    println!(" one node frozen, 1 caller:");
    let a = ours(&client, 1, dur * 2, &format!("f{n}")).await;
    row("redquorum Lock", a);
    let b = rs(&manager, 1, dur * 2, &format!("f{n}")).await;
    row("rslock 0.10", b);
    println!(
        "  ratio redquorum / rslock: {:.2}x cycles/s",
        a.ids_per_s / b.ids_per_s
    );
    summary.push((1, "1 frozen", a, b));
    nodes.thaw(n - 1);
    failover(&client, &urls, n).await;
    summary
}

/// Where a single caller's cycle goes (`-- --phases`): N = 3 Redis nodes, one caller, the
/// median latency of the acquisition and of the release on their own, over 1,000 cycles each,
/// for five paths, in two passes: rslock; redquorum's `Lock`; the same two scripts sent through
/// plain redis-rs connections (no redquorum client: the node's share); the leanest fenced
/// scripts (see [`lean_scripts`]); and plain `SET NX PX` with `DEL` (what a node's fsync costs
/// a write). The raw paths wait as our client does: two grants of three, two release replies
/// (rslock waits for all three, both ways).
async fn phases() {
    let nodes = LocalNodes::start(3);
    let client = support::connect(Config::from_urls(nodes.urls()).unwrap())
        .await
        .unwrap();
    let manager = rslock::LockManager::new(nodes.urls());
    let (conns, markers) = raw_connections(&nodes).await;
    let acquire: &'static redis::Script = Box::leak(Box::new(redis::Script::new(concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/lock_acquire.lua")
    ))));
    let release: &'static redis::Script = Box::leak(Box::new(redis::Script::new(concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/lock_release.lua")
    ))));
    println!("one caller, N = 3 (Redis), medians of 1,000 cycles: acquire, release");
    let show = |label: &str, a: Vec<Duration>, r: Vec<Duration>| {
        println!("  {label:<44} {:.3} ms   {:.3} ms", median(a), median(r))
    };
    for pass in 0..2u64 {
        let (mut a, mut r) = (Vec::new(), Vec::new());
        for _ in 0..1000 {
            let t0 = Instant::now();
            let l = manager
                .lock(
                    format!("rslock:phases:{pass}").as_bytes(),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            let t1 = Instant::now();
            manager.unlock(&l).await;
            a.push(t1 - t0);
            r.push(t1.elapsed());
        }
        show("rslock 0.10 (waits for every node)", a, r);
        let lock = Lock::new(&client, &format!("phases:{pass}"), Duration::from_secs(10)).unwrap();
        let (mut a, mut r) = (Vec::new(), Vec::new());
        for _ in 0..1000 {
            let t0 = Instant::now();
            let g = lock.try_acquire().await.unwrap();
            let t1 = Instant::now();
            g.release().await.unwrap();
            a.push(t1 - t0);
            r.push(t1.elapsed());
        }
        show("redquorum Lock", a, r);
        let (mut a, mut r) = (Vec::new(), Vec::new());
        let name = format!("phases-raw:{pass}");
        let keys = [
            format!("rq:lock:{name}"),
            format!("rq:fence:{name}"),
            "rq:marker".to_string(),
            format!("rq:floor:{name}"),
            "rq:floor".to_string(),
        ];
        for i in 1..=1000u64 {
            let value = format!("{:032x}:{i}:phases", i);
            let t0 = Instant::now();
            let grants = conns.iter().zip(&markers).map(|(c, m)| {
                let mut c = c.clone();
                let mut call = acquire.prepare_invoke();
                for k in &keys {
                    call.key(k);
                }
                call.arg(&value).arg(10_000).arg(i).arg(m);
                call.arg("absent").arg("").arg(0).arg("");
                async move { call.invoke_async::<redis::Value>(&mut c).await }
            });
            let replies = first_of(grants, 2).await;
            assert!(
                replies.iter().all(granted),
                "the raw acquisition was granted on the first two nodes to answer: {replies:?}"
            );
            let t1 = Instant::now();
            let releases = conns.iter().map(|c| {
                let mut c = c.clone();
                let mut call = release.prepare_invoke();
                call.key(&keys[0]).key(&keys[1]).key(&keys[3]);
                call.arg(&value).arg("rq:released:phases");
                async move { call.invoke_async::<redis::Value>(&mut c).await }
            });
            first_of(releases, RELEASE_REPLIES).await;
            a.push(t1 - t0);
            r.push(t1.elapsed());
        }
        show("the same scripts through redis-rs alone", a, r);
        let (a, r) = lean_phases(&conns, &markers, pass).await;
        show("the leanest fenced scripts (not built)", a, r);
        let (mut a, mut r) = (Vec::new(), Vec::new());
        for i in 0..1000u64 {
            let key = format!("phases-set:{pass}:{i}");
            let t0 = Instant::now();
            let sets = conns.iter().map(|c| {
                let mut c = c.clone();
                let cmd = redis::cmd("SET")
                    .arg(&key)
                    .arg("0123456789abcdef0123456789abcdef:1:phases")
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .clone();
                async move { cmd.query_async::<redis::Value>(&mut c).await }
            });
            first_of(sets, 2).await;
            let t1 = Instant::now();
            let dels = conns.iter().map(|c| {
                let mut c = c.clone();
                let cmd = redis::cmd("DEL").arg(&key).clone();
                async move { cmd.query_async::<redis::Value>(&mut c).await }
            });
            first_of(dels, 1).await;
            a.push(t1 - t0);
            r.push(t1.elapsed());
        }
        show("SET NX PX, DEL (no script, no fencing)", a, r);
    }
}

/// Where 16 callers' cycles go (`-- --batching`), N = 3 Redis, 16 callers each on its own lock,
/// each row with its client's and nodes' CPU per cycle: our two scripts sent through plain
/// redis-rs, one call per acquisition (as our client does); the same scripts through a per-node
/// batcher that sends everything queued while its previous call was in flight as one call (a
/// loop over the same script bodies: a design not built); the leanest fenced scripts we could
/// write (one write to acquire, one to release: a lower bound, not safe as it stands); beside
/// our `Lock` and rslock in the same run. A raw cycle counts as failed unless the first two
/// nodes to answer granted it, it waits for two release replies as our client does, and its
/// release is driven to its end on every node (an earlier
/// version dropped the slower releases, which redis-rs then never sent: the leftover copies made
/// most later acquisitions no-ops, and its figures were far too good).
async fn batching(dur: Duration) {
    let nodes = LocalNodes::start(3);
    let setup = support::connect(Config::from_urls(nodes.urls()).unwrap())
        .await
        .unwrap();
    let (conns, markers) = raw_connections(&nodes).await;
    let prelude = include_str!("../src/scripts/prelude.lua");
    let acquire_body = include_str!("../src/scripts/lock_acquire.lua");
    let release_body = include_str!("../src/scripts/lock_release.lua");
    let single: &'static (redis::Script, redis::Script) = Box::leak(Box::new((
        redis::Script::new(&format!("{prelude}{acquire_body}")),
        redis::Script::new(&format!("{prelude}{release_body}")),
    )));
    // One call, many items: ARGV[1] the item count, ARGV[2..] each item's kind ("a" an
    // acquisition, "r" a release), then the items' keys and arguments in order: (5 keys, 8
    // args) for an acquisition, (3 keys, 2 args) for a release. (An item's error aborts the
    // batch: a design built on this would run each item under pcall.)
    let batch = std::sync::Arc::new(redis::Script::new(&format!(
        "{prelude}
local function acquire_one(KEYS, ARGV)
{acquire_body}
end
local function release_one(KEYS, ARGV)
{release_body}
end
local n = tonumber(ARGV[1])
local ki, ai = 1, 2 + n
local out = {{}}
for i = 1, n do
  if ARGV[1 + i] == 'a' then
    out[i] = acquire_one({{KEYS[ki], KEYS[ki + 1], KEYS[ki + 2], KEYS[ki + 3], KEYS[ki + 4]}},
      {{ARGV[ai], ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 3], ARGV[ai + 4], ARGV[ai + 5], ARGV[ai + 6], ARGV[ai + 7]}})
    ki, ai = ki + 5, ai + 8
  else
    out[i] = release_one({{KEYS[ki], KEYS[ki + 1], KEYS[ki + 2]}}, {{ARGV[ai], ARGV[ai + 1]}})
    ki, ai = ki + 3, ai + 2
  end
end
return out"
    )));
    type Item = (
        bool,
        Vec<String>,
        Vec<String>,
        tokio::sync::oneshot::Sender<redis::Value>,
    );
    let mut queues = Vec::new();
    for c in &conns {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Item>();
        let mut c = c.clone();
        let batch = batch.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut items = vec![first];
                while let Ok(more) = rx.try_recv() {
                    items.push(more);
                }
                let mut call = batch.prepare_invoke();
                call.arg(items.len());
                for (is_acquire, _, _, _) in &items {
                    call.arg(if *is_acquire { "a" } else { "r" });
                }
                for (_, keys, _, _) in &items {
                    for k in keys {
                        call.key(k);
                    }
                }
                for (_, _, args, _) in &items {
                    for a in args {
                        call.arg(a);
                    }
                }
                let replies = match call.invoke_async(&mut c).await {
                    Ok(redis::Value::Array(replies)) => replies,
                    other => vec![redis::Value::SimpleString(format!("{other:?}")); items.len()],
                };
                for ((_, _, _, done), reply) in items.into_iter().zip(replies) {
                    let _ = done.send(reply);
                }
            }
        });
        queues.push(tx);
    }
    let lean = lean_scripts();
    // Our release without its fold of the fence into the floor (the fence key stays, to be
    // folded later), and the same publishing only when the channel has subscribers.
    let no_fold: &'static [redis::Script; 2] = Box::leak(Box::new([
        redis::Script::new(
            "if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '1')
return 1",
        ),
        redis::Script::new(
            "if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('PUBSUB', 'NUMSUB', ARGV[2])[2] > 0 then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1",
        ),
    ]));
    let conns = std::sync::Arc::new(conns);
    let markers = std::sync::Arc::new(markers);
    let queues = std::sync::Arc::new(queues);
    let token = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
    println!("batching probe: N = 3 (Redis), 16 callers, {dur:?} each, two passes");
    for (batched, leanest, release) in [
        (false, false, 0),
        (true, false, 0),
        (false, true, 0),
        (false, false, 1),
        (false, false, 2),
    ]
    .repeat(2)
    {
        let (conns, markers, queues, single, token) = (
            conns.clone(),
            markers.clone(),
            queues.clone(),
            single,
            token.clone(),
        );
        let slots = Slots::new(16);
        let label = if batched {
            "our scripts, batched per node"
        } else if leanest {
            "leanest fenced scripts (not built)"
        } else if release == 1 {
            "our acquire, release without the fold"
        } else if release == 2 {
            "our acquire, release without the fold, PUBLISH only to subscribers"
        } else {
            "our scripts, one call each"
        };
        let run = measure(16, dur, move || {
            let (conns, markers, queues, single, token, slots) = (
                conns.clone(),
                markers.clone(),
                queues.clone(),
                single,
                token.clone(),
                slots.clone(),
            );
            async move {
                let i = slots.take();
                let t = token.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let name = format!("batching:{i}");
                let keys = vec![
                    format!("rq:lock:{name}"),
                    format!("rq:fence:{name}"),
                    "rq:marker".to_string(),
                    format!("rq:floor:{name}"),
                    "rq:floor".to_string(),
                ];
                let value = format!("{t:032x}:{t}:batching");
                let acquire_args = |m: &str| {
                    vec![
                        value.clone(),
                        "10000".to_string(),
                        t.to_string(),
                        m.to_string(),
                        "absent".to_string(),
                        String::new(),
                        "0".to_string(),
                        String::new(),
                    ]
                };
                let release_keys = vec![keys[0].clone(), keys[1].clone(), keys[3].clone()];
                let release_args = vec![value.clone(), format!("rq:released:{name}")];
                let granted = if leanest {
                    let (lock, floor) = (format!("rq:lean:{name}"), format!("rq:leanfloor:{name}"));
                    let ok = lean_grant(lean, &conns, &markers, [&lock, &floor], &value, t).await;
                    lean_release(lean, &conns, &lock, &value).await;
                    ok
                } else if batched {
                    let grants = queues.iter().zip(markers.iter()).map(|(q, m)| {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let _ = q.send((true, keys.clone(), acquire_args(m), tx));
                        rx
                    });
                    let replies = first_of(grants, 2).await;
                    let ok = replies
                        .iter()
                        .all(|r| r.as_ref().is_ok_and(|v| granted(&Ok(v.clone()))));
                    let releases = queues.iter().map(|q| {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let _ = q.send((false, release_keys.clone(), release_args.clone(), tx));
                        rx
                    });
                    first_of(releases, RELEASE_REPLIES).await;
                    ok
                } else {
                    let grants = conns.iter().zip(markers.iter()).map(|(c, m)| {
                        let mut c = c.clone();
                        let mut call = single.0.prepare_invoke();
                        for k in &keys {
                            call.key(k);
                        }
                        for a in acquire_args(m) {
                            call.arg(a);
                        }
                        async move { call.invoke_async::<redis::Value>(&mut c).await }
                    });
                    let replies = first_of(grants, 2).await;
                    let ok = replies.iter().all(granted);
                    let releases = conns.iter().map(|c| {
                        let mut c = c.clone();
                        let mut call = match release {
                            0 => single.1.prepare_invoke(),
                            r => no_fold[r - 1].prepare_invoke(),
                        };
                        for k in &release_keys {
                            call.key(k);
                        }
                        for a in &release_args {
                            call.arg(a);
                        }
                        async move { call.invoke_async::<redis::Value>(&mut c).await }
                    });
                    first_of(releases, RELEASE_REPLIES).await;
                    ok
                };
                slots.put(i);
                if granted {
                    Ok(1)
                } else {
                    Err("not granted on the first two nodes to answer".to_string())
                }
            }
        });
        profiled_row(label, &nodes, SCRIPTS, run).await;
    }
    let manager = rslock::LockManager::new(nodes.urls());
    // rslock's calls: `SET NX PX`, and a release script.
    let rslock_calls = &["set", "evalsha", "eval"];
    let f = rs(&manager, 16, dur, "batching");
    profiled_row("rslock 0.10", &nodes, rslock_calls, f).await;
    let f = ours(&setup, 16, dur, "batching");
    profiled_row("redquorum Lock", &nodes, SCRIPTS, f).await;
    let f = rs(&manager, 16, dur, "batching2");
    profiled_row("rslock 0.10", &nodes, rslock_calls, f).await;
}

/// Top-level script calls (a script's inner commands count under their own names).
const SCRIPTS: &[&str] = &["evalsha", "eval"];

/// A row of the probes, with where its CPU went: the client's and the nodes' microseconds per
/// cycle (from /proc and `INFO cpu`).
async fn profiled_row<F: std::future::Future<Output = Figures>>(
    label: &str,
    nodes: &LocalNodes,
    commands: &[&str],
    run: F,
) {
    let probes: Vec<Node> = (0..nodes.len())
        .map(|i| Node {
            url: nodes.url(i),
            pid: nodes.pid(i),
        })
        .collect();
    let p = Profile::start(&probes, commands).await;
    let f = run.await;
    let r = p.finish().await;
    let cycles = f.ids_per_s * r.elapsed_s;
    let node_cores: f64 = r.nodes.iter().map(|n| n.0).sum();
    row(label, f);
    println!(
        "    per cycle: client {:.0} µs of CPU, nodes {:.0} µs; node 0: {:.2} calls, {:.1} µs each inside Redis",
        r.client_cores * r.elapsed_s / cycles * 1e6,
        node_cores * r.elapsed_s / cycles * 1e6,
        r.calls_node0 as f64 / cycles,
        r.nodes.first().map_or(0.0, |n| n.2),
    );
}

/// A plain redis-rs connection to each of `nodes` (no redquorum client) and each node's
/// marker, for sending our scripts by hand (the cluster is set up already).
async fn raw_connections(
    nodes: &LocalNodes,
) -> (Vec<redis::aio::MultiplexedConnection>, Vec<String>) {
    let mut conns = Vec::new();
    let mut markers = Vec::new();
    for url in nodes.urls() {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let marker: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut c)
            .await
            .unwrap();
        markers.push(marker.expect("the cluster is set up"));
        conns.push(c);
    }
    (conns, markers)
}

/// How many release replies a raw path waits for: a majority of three, as our client's
/// release does (it reports whether a majority released; until 2026-11-28 the raw rows waited
/// for one, which made them look about 65 µs per cycle faster than our client at one caller).
const RELEASE_REPLIES: usize = 2;

/// The first `k` answers of `calls`; the others are driven to their end in a task of their own,
/// as our client does (redis-rs never sends a request whose caller went away before its
/// connection wrote it: dropped, a release would leave its copy on that node).
async fn first_of<F>(calls: impl Iterator<Item = F>, k: usize) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut pending: futures::stream::FuturesUnordered<F> = calls.collect();
    let mut first = Vec::new();
    while first.len() < k {
        match pending.next().await {
            Some(answer) => first.push(answer),
            None => break,
        }
    }
    if !pending.is_empty() {
        tokio::spawn(async move { while pending.next().await.is_some() {} });
    }
    first
}

/// Whether a reply of `lock_acquire.lua` is a grant (status 1).
fn granted(reply: &redis::RedisResult<redis::Value>) -> bool {
    matches!(reply, Ok(redis::Value::Array(v)) if v.first() == Some(&redis::Value::Int(1)))
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// The leanest fenced lease we could think of (not built, not safe as it stands: no
/// version, no takeover, no fence collection), as a lower bound for any script design: the
/// acquisition checks the marker, the lease and a floor, and writes one hash (the fence
/// inside it); the release checks the value and clears it with one HDEL (the fence stays).
fn lean_scripts() -> &'static (redis::Script, redis::Script) {
    Box::leak(Box::new((
        redis::Script::new(
            "if redis.call('GET', KEYS[2]) ~= ARGV[4] then return {-1, 0} end
local cur = redis.call('HMGET', KEYS[1], 'v', 'f')
local fence = math.max(tonumber(cur[2] or '0'), tonumber(redis.call('GET', KEYS[3]) or '0'))
if cur[1] then return {0, fence} end
if fence >= tonumber(ARGV[3]) then return {-2, fence} end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'n', '1', 't', ARGV[2], 'f', ARGV[3])
return {1, fence}",
        ),
        redis::Script::new(
            "if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'v')
return 1",
        ),
    )))
}

/// The leanest fenced acquisition of `value` with `token` on lock and floor keys `keys`:
/// whether the first two nodes to answer granted it (the others finish in the background).
async fn lean_grant(
    lean: &'static (redis::Script, redis::Script),
    conns: &[redis::aio::MultiplexedConnection],
    markers: &[String],
    keys: [&str; 2],
    value: &str,
    token: u64,
) -> bool {
    let grants = conns.iter().zip(markers).map(|(c, m)| {
        let mut c = c.clone();
        let mut call = lean.0.prepare_invoke();
        call.key(keys[0]).key("rq:marker").key(keys[1]);
        call.arg(value).arg(10_000).arg(token).arg(m);
        async move { call.invoke_async::<redis::Value>(&mut c).await }
    });
    first_of(grants, 2).await.iter().all(granted)
}

/// The leanest fenced release of `value`, waiting as our client does.
async fn lean_release(
    lean: &'static (redis::Script, redis::Script),
    conns: &[redis::aio::MultiplexedConnection],
    lock: &str,
    value: &str,
) {
    let releases = conns.iter().map(|c| {
        let mut c = c.clone();
        let mut call = lean.1.prepare_invoke();
        call.key(lock).arg(value);
        async move { call.invoke_async::<redis::Value>(&mut c).await }
    });
    first_of(releases, RELEASE_REPLIES).await;
}

/// One caller's lean cycles (`-- --phases`): the leanest fenced scripts (see
/// [`lean_scripts`]), waiting as our client does; the acquisitions' and releases' latencies.
async fn lean_phases(
    conns: &[redis::aio::MultiplexedConnection],
    markers: &[String],
    pass: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let lean = lean_scripts();
    let (lock, floor) = (
        format!("rq:lean:phases:{pass}"),
        format!("rq:leanfloor:phases:{pass}"),
    );
    let (mut a, mut r) = (Vec::new(), Vec::new());
    for i in 1..=1000u64 {
        let value = format!("{:032x}:{i}:phases", i);
        let t0 = Instant::now();
        let ok = lean_grant(lean, conns, markers, [&lock, &floor], &value, i).await;
        assert!(ok, "the lean grant reached the first two nodes to answer");
        let t1 = Instant::now();
        lean_release(lean, conns, &lock, &value).await;
        a.push(t1 - t0);
        r.push(t1.elapsed());
    }
    (a, r)
}

/// Fail-over: the holder dies (stops extending, never releases); how long until a waiting
/// acquirer holds the lock, against the TTL.
async fn failover(client: &Client, urls: &[String], n: usize) {
    let ttl = Duration::from_secs(1);
    let holder = Lock::new(client, &format!("bench:failover:{n}"), ttl)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    holder.suspend_extension_for_tests();
    let died = Instant::now();
    let other = support::connect(Config::from_urls(urls).unwrap())
        .await
        .unwrap();
    let g = Lock::new(&other, &format!("bench:failover:{n}"), ttl)
        .unwrap()
        .acquire(Duration::from_secs(10))
        .await
        .unwrap();
    let took = died.elapsed();
    println!(
        " fail-over after the holder died: {:.0} ms with TTL {:.0} ms ({:.2}x TTL)",
        took.as_secs_f64() * 1e3,
        ttl.as_secs_f64() * 1e3,
        took.as_secs_f64() / ttl.as_secs_f64()
    );
    let _ = g.release().await;
    std::mem::drop(holder);
}

/// Cost as held leases grow: one client holds 1, 100 and 10,000 leases (TTL 10 s, so each
/// extends every 3.3 s) on N = 3; over a window of several extension periods, the script calls
/// per second on each node (extensions of leases due together share one call) and the
/// client's CPU. On `server`'s nodes.
async fn held(quick: bool, server: &Server) {
    let nodes = LocalNodes::start_with(3, &server.program);
    let probes: Vec<Node> = (0..3)
        .map(|i| Node {
            url: nodes.url(i),
            pid: nodes.pid(i),
        })
        .collect();
    let window = Duration::from_secs(if quick { 4 } else { 10 });
    let ttl = Duration::from_secs(10);
    println!(
        "\nheld leases: one client, TTL {} s, N = 3 ({}), measured over {} s",
        ttl.as_secs(),
        server.label(),
        window.as_secs()
    );
    for count in [1usize, 100, 10_000] {
        let client = support::connect(Config::from_urls(nodes.urls()).unwrap())
            .await
            .unwrap();
        let started = Instant::now();
        let guards: Vec<_> = futures::stream::iter(0..count)
            .map(|i| {
                let client = client.clone();
                async move {
                    Lock::new(&client, &format!("held-{count}-{i}"), ttl)
                        .unwrap()
                        .acquire(Duration::from_secs(30))
                        .await
                        .expect("a free lock")
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let acquired_in = started.elapsed();
        // Let the first extensions spread out from the acquisition burst.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let p = Profile::start(&probes, &["evalsha"]).await;
        tokio::time::sleep(window).await;
        let r = p.finish().await;
        let held = guards.iter().filter(|g| g.is_held()).count();
        let per_node: Vec<String> = r.nodes.iter().map(|n| format!("{:.1}", n.1)).collect();
        println!(
            "  {count:>6} leases: script calls/s per node [{}], client {:.1}% of one core; {held} held; acquired in {:.1} s",
            per_node.join(", "),
            r.client_cores * 100.0,
            acquired_in.as_secs_f64()
        );
        futures::stream::iter(guards)
            .map(|g| async move { g.release().await })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await;
    }
}
