//! Node calls of a group or a pool in steady state, and where they come from: every command
//! the nodes ran (those inside scripts included, INFO excluded, from `INFO commandstats`),
//! and the library's own count of quorum operations by kind (a global `DebuggingRecorder`
//! of the crate's metrics), each kind's operations times its commands per node. Included by the
//! group and pool benches as `mod calls` beside `mod support` (it needs `metrics-util`, which
//! the CLI's benches that share `support` do not have).
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::support::profile::{node_counters, NodeCounters};

/// Commands each node runs for one operation of a kind (the script call or MULTI/EXEC with
/// what runs inside it), for the usual path; a kind not listed is shown by its operations.
pub const COMMANDS_PER_OP: &[(&str, &str, u64)] = &[
    ("group.beat", "beat (EVALSHA member_beat: GET, HSET)", 3),
    (
        "group.view.read",
        "view read (MULTI GET HMGET [HGETALL beats] [HMGET lease] EXEC; counted as 5)",
        5,
    ),
    (
        "group.view.write",
        "view seal/write-back (EVALSHA view_write: HGET, GET, [HGET|HSET])",
        4,
    ),
    (
        "group.members",
        "leader's beats read (MULTI GET HGETALL EXEC)",
        4,
    ),
    (
        "group.acks",
        "leader's acknowledgements read (MULTI GET HGETALL EXEC)",
        4,
    ),
    ("group.ack", "acknowledgement (EVALSHA record)", 5),
    ("group.hint", "hint (PUBLISH)", 1),
    (
        "lock.acquire",
        "leader-lease campaign round (EVALSHA lock_acquire: 3 GET, HMGET, GET)",
        6,
    ),
    (
        "lock.extend",
        "leader-lease extension (EVALSHA lock_extend: GET, HMGET, HSET; 6 before)",
        4,
    ),
];

fn recorder() -> &'static Snapshotter {
    static SNAP: OnceLock<Snapshotter> = OnceLock::new();
    SNAP.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        snapshotter
    })
}

/// Install the recorder (before any client is built, so every operation is counted).
pub fn install() {
    recorder();
}

/// Quorum operations by kind since the last call (a snapshot drains the counters).
fn operations() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in recorder().snapshot().into_vec() {
        let key = key.key();
        if key.name() != "redquorum_quorum_operations_total" {
            continue;
        }
        let Some(kind) = key.labels().find(|l| l.key() == "kind") else {
            continue;
        };
        if let DebugValue::Counter(c) = value {
            *out.entry(kind.value().to_string()).or_default() += c;
        }
    }
    out
}

/// What a window of steady state cost.
#[derive(Debug, Default)]
pub struct Window {
    pub secs: f64,
    pub members: usize,
    pub nodes: usize,
    /// Every node's commands summed (INFO excluded).
    pub calls: u64,
    /// Every node's CPU seconds summed (its idle work included: `serverCron` at `hz 10`).
    pub node_cpu_s: f64,
    /// Per command, summed over the nodes.
    pub by_command: BTreeMap<String, u64>,
    /// Quorum operations by kind (each sent to every node).
    pub operations: BTreeMap<String, u64>,
}

async fn snapshot(urls: &[String]) -> Vec<NodeCounters> {
    let mut all = Vec::new();
    for u in urls {
        all.push(node_counters(u).await);
    }
    all
}

/// Measure `window` of steady state of `members` members on the nodes `urls`.
pub async fn measure(urls: &[String], members: usize, window: Duration) -> Window {
    let first = snapshot(urls).await;
    let _ = operations();
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let operations = operations();
    let secs = t.elapsed().as_secs_f64();
    let last = snapshot(urls).await;
    let mut by_command: BTreeMap<String, u64> = BTreeMap::new();
    let mut node_cpu_s = 0.0;
    for (f, l) in first.iter().zip(&last) {
        node_cpu_s += (l.cpu_s - f.cpu_s).max(0.0);
        for (k, (n, _)) in &l.calls {
            if k == "info" {
                continue;
            }
            let before = f.calls.get(k).map_or(0, |c| c.0);
            *by_command.entry(k.clone()).or_default() += n.saturating_sub(before);
        }
    }
    Window {
        secs,
        members,
        nodes: urls.len(),
        calls: by_command.values().sum(),
        node_cpu_s,
        by_command,
        operations,
    }
}

impl Window {
    /// Node calls per member per second, summed over the nodes.
    pub fn per_member(&self) -> f64 {
        self.calls as f64 / self.secs / self.members as f64
    }

    /// The nodes' CPU per member, in milliseconds per second, summed over the nodes (`INFO
    /// cpu`): what the calls cost them. A count of commands alone would reward moving reads
    /// into a script, which costs a node about three times a transaction's CPU. Each server's
    /// idle work is in it too.
    pub fn node_cpu_ms_per_member(&self) -> f64 {
        1000.0 * self.node_cpu_s / self.secs / self.members as f64
    }

    fn rate(&self, n: u64) -> f64 {
        n as f64 / self.secs / self.members as f64
    }

    /// The breakdown by source: each kind's operations per member per second, and its node
    /// calls (operations x nodes x commands per node); the rest is what no listed kind
    /// accounts for.
    pub fn print_breakdown(&self, indent: &str) {
        let ops = |k: &str| self.operations.get(k).copied().unwrap_or(0);
        let cmd = |k: &str| self.by_command.get(k).copied().unwrap_or(0);
        let nodes = self.nodes as u64;
        let mut accounted = 0u64;
        let mut parts = Vec::new();
        for (kind, what, per) in COMMANDS_PER_OP {
            let n = ops(kind);
            if n == 0 || *per == 0 {
                continue;
            }
            let calls = n * nodes * per;
            accounted += calls;
            parts.push(format!(
                "{what}: {:.2} ops -> {:.1}",
                self.rate(n),
                self.rate(calls)
            ));
        }
        let rest = self.calls.saturating_sub(accounted);
        let other: Vec<String> = self
            .operations
            .iter()
            .filter(|(k, _)| {
                COMMANDS_PER_OP
                    .iter()
                    .all(|(kind, _, per)| kind != k || *per == 0)
            })
            .map(|(k, n)| format!("{k} {:.2} ops", self.rate(*n)))
            .collect();
        println!(
            "{indent}calls/member/s by source (ops/member/s -> node calls/member/s, 3 nodes):"
        );
        for p in parts {
            println!("{indent}  {p}");
        }
        println!(
            "{indent}  the rest ({}): {:.1} (multi {:.1}, exec {:.1}, evalsha {:.1} in all)",
            other.join(", "),
            self.rate(rest),
            self.rate(cmd("multi")),
            self.rate(cmd("exec")),
            self.rate(cmd("evalsha")),
        );
        let mut top: Vec<(&String, &u64)> = self.by_command.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        println!(
            "{indent}by command (per member per second, all nodes): {}",
            top.iter()
                .take(9)
                .map(|(k, n)| format!("{k} {:.1}", self.rate(**n)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The median and the largest of some samples, in intervals.
pub fn median_max(v: &mut [f64]) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort_by(f64::total_cmp);
    format!("median {:.2}, max {:.2}", v[v.len() / 2], v[v.len() - 1])
}
