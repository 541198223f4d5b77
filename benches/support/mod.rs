//! Shared by the benchmarks: a timed concurrent loop. (The local redis-server nodes they run
//! against are the test kit's second node backend, `redquorum_testkit::LocalNodes`.)
#![allow(dead_code, clippy::expect_used, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub ids_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failures: u64,
}

/// Run `callers` concurrent loops of `call` for `dur`; each call returns how many IDs it got.
pub async fn measure<F, Fut>(callers: usize, dur: Duration, call: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (stop, ids, failures, lat, call) = (
            stop.clone(),
            ids.clone(),
            failures.clone(),
            lat.clone(),
            call.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match call().await {
                    Ok(n) => {
                        ids.fetch_add(n, Ordering::Relaxed);
                        mine.push(t0.elapsed());
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat.lock().expect("latencies").extend(mine);
        }));
    }
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut l = lat.lock().expect("latencies").clone();
    l.sort();
    let pct = |p: f64| {
        l.get(((l.len().saturating_sub(1)) as f64 * p) as usize)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(f64::NAN)
    };
    Figures {
        ids_per_s: ids.load(Ordering::Relaxed) as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        failures: failures.load(Ordering::Relaxed),
    }
}

/// Where the time goes during one measurement: the client's CPU, each node's CPU, script and
/// command calls (Redis `INFO commandstats`), and each node's fsyncs (counted by `perf stat` on
/// the `fdatasync` tracepoint when `perf` is installed and allowed; Redis does not count them).
pub mod profile {
    use std::collections::BTreeMap;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    /// A node to profile: its URL and its server's pid.
    #[derive(Clone, Debug)]
    pub struct Node {
        pub url: String,
        pub pid: u32,
    }

    /// Counters of one node at one instant.
    #[derive(Clone, Debug, Default)]
    pub struct NodeCounters {
        /// CPU seconds (user + system) the server used.
        pub cpu_s: f64,
        /// Per command (`evalsha`, `set`, ...): calls and microseconds spent in them.
        pub calls: BTreeMap<String, (u64, u64)>,
    }

    /// The CPU seconds this process has used (user + system), from `/proc/self/stat`.
    pub fn client_cpu_s() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which is in parentheses and may hold spaces).
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
        (ticks(11) + ticks(12)) / 100.0
    }

    /// One node's counters, through a fresh connection (`INFO cpu`, `INFO commandstats`).
    pub async fn node_counters(url: &str) -> NodeCounters {
        let Ok(client) = redis::Client::open(url) else {
            return NodeCounters::default();
        };
        let Ok(mut con) = client.get_multiplexed_async_connection().await else {
            return NodeCounters::default();
        };
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        let mut out = NodeCounters::default();
        for line in info.lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                out.cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
            } else if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((cmd, fields)) = rest.split_once(':') else {
                    continue;
                };
                let field = |name: &str| {
                    fields
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(name))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                out.calls
                    .insert(cmd.to_string(), (field("calls="), field("usec=")));
            }
        }
        out
    }

    /// `perf stat` counting one server's `fdatasync` calls until [`Fsyncs::stop`].
    pub struct Fsyncs {
        children: Vec<Option<Child>>,
    }

    impl Fsyncs {
        /// Start counting on every node (a node whose counter cannot start counts as unknown).
        pub async fn start(nodes: &[Node]) -> Fsyncs {
            let children = nodes
                .iter()
                .map(|n| {
                    Command::new("perf")
                        .args([
                            "stat",
                            "-x",
                            ",",
                            "-e",
                            "syscalls:sys_enter_fdatasync",
                            "-p",
                        ])
                        .arg(n.pid.to_string())
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped())
                        .spawn()
                        .ok()
                })
                .collect();
            // perf attaches asynchronously; give it a moment before the measurement starts.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            Fsyncs { children }
        }

        /// Stop counting: per node, the fsyncs counted (None when perf was not available).
        pub fn stop(self) -> Vec<Option<u64>> {
            self.children
                .into_iter()
                .map(|c| {
                    let mut c = c?;
                    let _ = Command::new("kill")
                        .args(["-INT", &c.id().to_string()])
                        .status();
                    let _ = c.wait();
                    let mut err = String::new();
                    use std::io::Read;
                    c.stderr.take()?.read_to_string(&mut err).ok()?;
                    err.lines()
                        .find(|l| l.contains("sys_enter_fdatasync"))
                        .and_then(|l| l.split(',').next())
                        .and_then(|v| v.trim().parse().ok())
                })
                .collect()
        }
    }

    /// What the client and the nodes did between [`Profile::start`] and [`Profile::finish`].
    #[derive(Debug)]
    pub struct Report {
        pub elapsed_s: f64,
        /// Cores the client process used on average.
        pub client_cores: f64,
        /// Per node: cores used, calls per second of the commands, µs per call, fsyncs per
        /// second.
        pub nodes: Vec<(f64, f64, f64, Option<f64>)>,
        /// Calls of the commands on node 0 (one per round for a fan-out protocol).
        pub calls_node0: u64,
    }

    pub struct Profile {
        nodes: Vec<Node>,
        commands: Vec<String>,
        started: Instant,
        client_cpu: f64,
        before: Vec<NodeCounters>,
        fsyncs: Fsyncs,
    }

    impl Profile {
        /// Start: snapshot every counter; `commands` are those whose calls are reported
        /// (summed; Redis's lower-case names, e.g. `evalsha`, `set`).
        pub async fn start(nodes: &[Node], commands: &[&str]) -> Profile {
            let mut before = Vec::new();
            for n in nodes {
                before.push(node_counters(&n.url).await);
            }
            let fsyncs = Fsyncs::start(nodes).await;
            Profile {
                nodes: nodes.to_vec(),
                commands: commands.iter().map(|c| c.to_string()).collect(),
                started: Instant::now(),
                client_cpu: client_cpu_s(),
                before,
                fsyncs,
            }
        }

        pub async fn finish(self) -> Report {
            let elapsed_s = self.started.elapsed().as_secs_f64();
            let client_cores = (client_cpu_s() - self.client_cpu) / elapsed_s;
            let fsyncs = self.fsyncs.stop();
            let mut nodes = Vec::new();
            let mut calls_node0 = 0;
            for (i, n) in self.nodes.iter().enumerate() {
                let after = node_counters(&n.url).await;
                let b = &self.before[i];
                let sum = |c: &NodeCounters| {
                    self.commands
                        .iter()
                        .filter_map(|k| c.calls.get(k))
                        .fold((0u64, 0u64), |(n, u), (cn, cu)| (n + cn, u + cu))
                };
                let ((c0, u0), (c1, u1)) = (sum(b), sum(&after));
                let calls = c1.saturating_sub(c0);
                if i == 0 {
                    calls_node0 = calls;
                }
                nodes.push((
                    (after.cpu_s - b.cpu_s) / elapsed_s,
                    calls as f64 / elapsed_s,
                    if calls > 0 {
                        u1.saturating_sub(u0) as f64 / calls as f64
                    } else {
                        0.0
                    },
                    fsyncs
                        .get(i)
                        .copied()
                        .flatten()
                        .map(|f| f as f64 / elapsed_s),
                ));
            }
            Report {
                elapsed_s,
                client_cores,
                nodes,
                calls_node0,
            }
        }
    }

    impl Report {
        /// Print the report; `ids` is how many IDs (or cycles) the run produced.
        pub fn print(&self, what: &str, ids: f64) {
            let node_cores: f64 = self.nodes.iter().map(|n| n.0).sum();
            println!(
                "  profile of {what}: client {:.2} cores, nodes {:.2} cores in all; {:.1} per \
                 call on node 0 ({} calls)",
                self.client_cores,
                node_cores,
                if self.calls_node0 > 0 {
                    ids / self.calls_node0 as f64
                } else {
                    0.0
                },
                self.calls_node0
            );
            for (i, (cores, calls, usec, fsyncs)) in self.nodes.iter().enumerate() {
                println!(
                    "    node {i}: {cores:.2} cores, {calls:.0} calls/s at {usec:.1} µs each \
                     inside Redis, {}",
                    match fsyncs {
                        Some(f) => format!("{f:.0} fsyncs/s ({:.2} calls per fsync)", calls / f),
                        None => "fsyncs not counted (perf unavailable)".to_string(),
                    }
                );
            }
        }
    }
}

/// A client over `config`'s nodes, after the operator's `cluster init` (idempotent: a no-op on
/// a cluster set up already).
pub async fn connect(config: redquorum::Config) -> Result<redquorum::Client, redquorum::Error> {
    redquorum::Client::init_cluster(config.clone()).await?;
    redquorum::Client::connect(config).await
}
