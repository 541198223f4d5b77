//! Node amnesia: quarantine and repair.
//!
//! A node that lost its data (wiped disk, replaced host, FLUSHALL, a restart without its AOF)
//! silently breaks the majority-intersection argument: an ID accepted by {A, B, C} is lost
//! with B, and {B, D, E} could accept it again. So every node carries a marker (`rq:marker`)
//! holding the run_id of the incarnation that was last verified to hold every value a
//! majority accepted. The scripts refuse to vote unless the marker equals the run_id the
//! client saw when it connected; the client quarantines a node whose marker is missing or
//! names another run_id (it lost data, or restarted since it was verified).
//!
//! Repair first waits one node timeout, then raises every monotonic register on the node (ID
//! sequences, lock fences, group views) to the largest value read from a majority of the
//! *other* nodes that hold a marker, restores what it lacks of lease keys, completion records,
//! acknowledgements and membership beats, then writes the marker. Why that is
//! enough: any set M that accepted a value is a majority; M minus the repaired node has
//! `needed - 1` members, the read set R has `needed` members among the other `n - 1` nodes,
//! and `2 * needed - 1 > n - 1`, so R meets M at a node that kept the value. Values accepted
//! while the node was quarantined were accepted by majorities without it, which any later
//! majority meets at a node other than it.
//!
//! Why the wait: "M accepted the value" must already be true on the other members of M when R
//! is read. A write the node applied just before losing its data may still be travelling to a
//! slow member of M; but a client counts a reply only within its node timeout of sending, so
//! once that long has passed since the loss (the repair starts after it), every write any client
//! counted is on its nodes. This assumes no client uses a longer node timeout than the
//! repairing one.
//!
//! A lease key is restored only where the node has none and its (raised) fence is at most the
//! lease's token, so a restored copy never blocks the holder of a later grant; a stale copy
//! costs liveness only (a waiter takes it over after watching it for its TTL).
//!
//! Bootstrap (a new cluster): when EVERY configured node answers, fewer than a majority hold
//! a marker, and no node holds any register, no majority can ever have accepted a value (all
//! of its members would have had to lose their data, more than a minority), so every
//! unmarked node is marked without raising anything. Bootstrap needs all nodes, not just a
//! majority: a majority that answers could miss exactly the nodes that hold the values while
//! the others are wiped (a wiped node plus a cut-off one), and safety must not depend on how
//! many nodes are reachable.
//!
//! Architecture invariant: a node votes only while its marker equals its current run_id, and
//! the marker is written only after the node holds every value a majority accepted.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::client::{Client, NodeConn, Targets};
use crate::cluster::{self, Adoption, Descriptor, Standing};
use crate::keys::{fixed_key, KeyKind, KEY_PREFIX};

use crate::config::{Config, ConfigError};
use crate::error::Error;
use crate::quorum::fanout::Wait;
use crate::quorum::NodeOutcome;
use crate::scripts::{CLUSTER_INIT, RAISE, RESTORE, SEAL, VIEW_WRITE};

/// Key patterns of every monotonic register a repair must raise. Fixed strings only: user
/// names never reach a SCAN pattern.
const MONOTONIC_PATTERNS: &[&str] = &["rq:id:*", "rq:fence:*", "rq:gfence:*"];

/// Key pattern of the group view registers (hashes: token, view), raised by version.
const VIEW_PATTERN: &str = "rq:view:*";

/// Key patterns of lease keys (hashes v, n, t), restored when the node lacks them, with the
/// kind word of their fence key.
const LEASE_PATTERNS: &[(&str, &str, &str)] = &[
    ("rq:lock:*", "rq:lock:", "rq:fence:"),
    ("rq:glock:*", "rq:glock:", "rq:gfence:"),
];

/// Hashes restored field by field: completion records and acknowledgements (raised to the
/// highest token), membership beats (filled in where missing).
const HASH_PATTERNS: &[(&str, HashMerge)] = &[
    ("rq:done:*", HashMerge::Max),
    ("rq:ack:*", HashMerge::Max),
    ("rq:members:*", HashMerge::IfAbsent),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HashMerge {
    Max,
    IfAbsent,
}

impl HashMerge {
    fn mode(self) -> &'static str {
        match self {
            HashMerge::Max => "max",
            HashMerge::IfAbsent => "absent",
        }
    }
}

/// A lease key's content: holder value, version, ttl (ms).
type LeaseCopy = (String, u64, u64);

/// What one node holds: its marker and every monotonic register.
#[derive(Clone, Debug, Default)]
struct Holdings {
    run_id: String,
    marker: Option<String>,
    registers: BTreeMap<String, u64>,
    /// Group view registers: key -> (version token, view JSON).
    views: BTreeMap<String, (u64, String)>,
    /// Lease keys: key -> (value, version, ttl ms).
    leases: BTreeMap<String, LeaseCopy>,
    /// Restored hashes: key -> field -> value.
    hashes: BTreeMap<String, BTreeMap<String, String>>,
}

/// The fencing token inside a lease value (`random:token:holder`).
fn lease_token(value: &str) -> u64 {
    value
        .split(':')
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// What a repaired node must be given: per lease key the newest copy (highest token, then
/// highest version) any source holds; per hash field the highest value (or any, for beats).
fn merge_restores(sources: &[&Holdings]) -> Restores {
    let mut leases: BTreeMap<String, LeaseCopy> = BTreeMap::new();
    let mut hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)> = BTreeMap::new();
    for h in sources {
        for (k, copy) in &h.leases {
            let newer = leases
                .get(k)
                .is_none_or(|old| (lease_token(&copy.0), copy.1) > (lease_token(&old.0), old.1));
            if newer {
                leases.insert(k.clone(), copy.clone());
            }
        }
        for (k, fields) in &h.hashes {
            let Some(merge) = HASH_PATTERNS
                .iter()
                .find(|(p, _)| k.starts_with(p.trim_end_matches('*')))
                .map(|(_, m)| *m)
            else {
                continue;
            };
            let entry = hashes
                .entry(k.clone())
                .or_insert_with(|| (merge, BTreeMap::new()));
            for (f, v) in fields {
                match entry.1.get(f) {
                    Some(old)
                        if merge == HashMerge::IfAbsent
                            || old.parse::<u64>().unwrap_or(0) >= v.parse::<u64>().unwrap_or(0) => {
                    }
                    _ => {
                        entry.1.insert(f.clone(), v.clone());
                    }
                }
            }
        }
    }
    Restores { leases, hashes }
}

/// Lease keys and hash entries to restore on a repaired node.
#[derive(Clone, Debug, Default)]
struct Restores {
    leases: BTreeMap<String, LeaseCopy>,
    hashes: BTreeMap<String, (HashMerge, BTreeMap<String, String>)>,
}

/// How a repair attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RepairOutcome {
    /// The node was not quarantined (or protection is off).
    NotNeeded,
    /// The node was raised from a majority of the others and marked.
    Repaired { raised: usize },
    /// A new cluster: the reachable unmarked nodes were marked.
    Bootstrapped { marked: usize },
    /// Not possible now (too few marked nodes reachable); retried on a later operation.
    Deferred(String),
}

impl Client {
    /// Start a repair of node `i` in the background unless one is running.
    pub(crate) fn spawn_repair(&self, i: usize) {
        let Some(node) = self.inner.nodes.get(i).cloned() else {
            return;
        };
        if node
            .repairing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let client = self.clone();
        tokio::spawn(async move {
            let outcome = client.repair(i).await;
            if matches!(outcome, RepairOutcome::Deferred(_)) {
                // Do not hammer the cluster while a repair is impossible.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            node.repairing
                .store(false, std::sync::atomic::Ordering::Release);
        });
    }

    /// A node refused a vote because of its marker: probe it again (it will show as
    /// quarantined) and repair it.
    pub(crate) fn suspect(&self, i: usize) {
        let Some(node) = self.inner.nodes.get(i).cloned() else {
            return;
        };
        let client = self.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(client.inner.config.node_timeout, node.reprobe()).await;
            client.spawn_repair(i);
        });
    }

    /// Repair node `i` if it is quarantined. Cancel-safe: an interrupted repair leaves the
    /// node quarantined (the marker is written last).
    pub(crate) async fn repair(&self, i: usize) -> RepairOutcome {
        let outcome = self.try_repair(i).await;
        let node = &self.inner.nodes[i];
        match &outcome {
            RepairOutcome::NotNeeded => {}
            RepairOutcome::Repaired { raised } => {
                tracing::warn!(node = %node.id, url = %node.url, raised, "quarantined node repaired: it votes again")
            }
            RepairOutcome::Bootstrapped { marked } => {
                tracing::info!(node = %node.id, marked, "new cluster: reachable nodes marked")
            }
            RepairOutcome::Deferred(why) => {
                tracing::warn!(node = %node.id, url = %node.url, why = %why, "quarantined node cannot be repaired yet")
            }
        }
        outcome
    }

    async fn try_repair(&self, i: usize) -> RepairOutcome {
        let inner = &self.inner;
        let node = &inner.nodes[i];
        let probe = match node.reprobe().await {
            Ok(p) => p,
            Err(e) => return RepairOutcome::Deferred(format!("cannot probe the node: {e}")),
        };
        if !inner.config.amnesia_protection {
            return RepairOutcome::NotNeeded;
        }
        let adoption = self.verdicts().adoption.clone();
        let (reason, needs_listing) = match (
            &adoption,
            cluster::standing(probe.marker.as_deref(), probe.run_id.as_deref(), &adoption),
        ) {
            (Adoption::Refused(why), _) => return RepairOutcome::Deferred(why.clone()),
            (_, Standing::Stranger(why)) => return RepairOutcome::Deferred(why),
            (_, Standing::Member) => return RepairOutcome::NotNeeded,
            (
                _,
                Standing::Quarantined {
                    reason,
                    needs_listing,
                },
            ) => (reason, needs_listing),
        };
        let Some(run_id) = probe.run_id.clone() else {
            return RepairOutcome::Deferred("the node reports no run_id".into());
        };
        let name = inner.config.nodes[i].name().to_string();
        if let Adoption::Adopted(d) = &adoption {
            if needs_listing && inner.config.cluster_identity && !d.lists(&name) {
                return RepairOutcome::Deferred(format!(
                    "{name} is not one of the nodes of cluster {} ({}): a client enlists a \
                     node only by a URL the cluster lists",
                    d.id,
                    d.describe()
                ));
            }
        }
        // A node without a marker is normal once, in a new cluster: say so quietly here; the
        // outcome (repaired, bootstrapped, deferred) is reported at warn/info by `repair`.
        tracing::info!(node = %node.id, url = %node.url, reason = %reason, "node quarantined");

        // Settle: a write that the node applied before it lost its data may still be on its
        // way to the other nodes, and a client counts a reply only within its node timeout of
        // sending. Reading the others after that long sees every write a client counted.
        tokio::time::sleep(inner.config.node_timeout + Duration::from_millis(25)).await;
        let deadline = Some(inner.config.operation_timeout);
        let tally = self
            .fan_out_raw(
                "repair.read",
                Wait::All,
                Targets::All,
                deadline,
                |nc: NodeConn| async move { read_holdings(nc).await.map(NodeOutcome::Applied) },
            )
            .await;
        let needed = inner.majority.needed();
        let replies: Vec<(usize, &Holdings)> = tally.replies().map(|(id, h)| (id.0, h)).collect();

        if let Adoption::Adopted(d) = &adoption {
            let sources = choose_sources(&replies, i, &d.id, needed);
            if sources.len() >= needed {
                return self.write_repair(i, &sources, d, &run_id).await;
            }
        }
        // A new cluster (or one whose bootstrap was cut short): every configured node
        // answers, fewer than a majority are marked, and no node holds any register.
        let answered = replies.len();
        let any_registers = replies.iter().any(|(_, h)| !h.registers.is_empty());
        let marked = replies.iter().filter(|(_, h)| h.marker.is_some()).count();
        if answered == inner.nodes.len() && marked < needed && !any_registers {
            let ours: Vec<String> = inner
                .config
                .nodes
                .iter()
                .map(|u| u.name().to_string())
                .collect();
            let descriptor = match &adoption {
                Adoption::Adopted(d) => d.clone(),
                _ => Descriptor::new_cluster(&ours),
            };
            return self.bootstrap(&descriptor).await;
        }
        RepairOutcome::Deferred(format!(
            "{} marked node(s) other than this one answered; {needed} are needed to repair it \
             (or all {} nodes, for a new cluster)",
            match &adoption {
                Adoption::Adopted(d) => choose_sources(&replies, i, &d.id, needed).len(),
                _ => 0,
            },
            inner.nodes.len()
        ))
    }

    /// Raise node `i` to what `sources` hold, restore what it lacks, then mark it for cluster
    /// `d` (the marker last, so an interrupted repair leaves the node quarantined).
    async fn write_repair(
        &self,
        i: usize,
        sources: &[&Holdings],
        d: &Descriptor,
        run_id: &str,
    ) -> RepairOutcome {
        let inner = &self.inner;
        let (pairs, views, restores) = repair_plan(sources, inner.config.server_clock_leases);
        let restores = std::sync::Arc::new(restores);
        let mark = std::sync::Arc::new(Mark {
            run_id: run_id.to_string(),
            descriptor: d.encode(),
            marker: cluster::marker_value(run_id, &d.id),
        });
        let write = self
            .fan_out_raw(
                "repair.raise",
                Wait::All,
                Targets::Only(i),
                Some(inner.config.operation_timeout),
                move |nc: NodeConn| {
                    let (pairs, views, restores, mark) =
                        (pairs.clone(), views.clone(), restores.clone(), mark.clone());
                    async move { raise_and_mark(nc, &pairs, &views, &restores, &mark).await }
                },
            )
            .await;
        let _ = inner.nodes[i].reprobe().await;
        match write.results().get(i).map(|r| &r.outcome) {
            Some(NodeOutcome::Applied(raised)) => RepairOutcome::Repaired { raised: *raised },
            Some(NodeOutcome::Rejected(_)) => {
                RepairOutcome::Deferred("the node restarted during its repair".into())
            }
            other => RepairOutcome::Deferred(format!("writing the repair failed: {other:?}")),
        }
    }

    /// Mark every unmarked node that the descriptor lists (all of them, for a new cluster)
    /// for cluster `d`.
    async fn bootstrap(&self, d: &Descriptor) -> RepairOutcome {
        let inner = &self.inner;
        let listed: std::sync::Arc<Vec<bool>> = std::sync::Arc::new(
            inner
                .config
                .nodes
                .iter()
                .map(|u| !inner.config.cluster_identity || d.lists(u.name()))
                .collect(),
        );
        let (descriptor, id) = (
            std::sync::Arc::<str>::from(d.encode()),
            std::sync::Arc::<str>::from(d.id.as_str()),
        );
        let tally = self
            .fan_out_raw(
                "repair.bootstrap",
                Wait::All,
                Targets::All,
                Some(inner.config.operation_timeout),
                move |mut nc: NodeConn| {
                    let (listed, descriptor, id) = (listed.clone(), descriptor.clone(), id.clone());
                    async move {
                        if !listed.get(nc.node).copied().unwrap_or(false) {
                            return Ok(NodeOutcome::Rejected(()));
                        }
                        let set: i64 = CLUSTER_INIT
                            .key(fixed_key(KeyKind::Marker))
                            .key(fixed_key(KeyKind::Cluster))
                            .arg(cluster::marker_value(&nc.run_id, &id))
                            .arg(&*descriptor)
                            .invoke_async(&mut nc.conn)
                            .await?;
                        Ok(if set == 1 {
                            NodeOutcome::Applied(())
                        } else {
                            NodeOutcome::Rejected(())
                        })
                    }
                },
            )
            .await;
        for n in &inner.nodes {
            let _ = tokio::time::timeout(inner.config.node_timeout, n.reprobe()).await;
        }
        RepairOutcome::Bootstrapped {
            marked: tally.applied(),
        }
    }
}

/// What a repair writes last: the descriptor, then the marker, for this incarnation.
struct Mark {
    run_id: String,
    descriptor: String,
    marker: String,
}

/// The nodes a repair of node `target` reads from: one reply per server, marked for cluster
/// `cluster`. Nodes verified for their current incarnation are preferred; only when fewer
/// than `needed` of them answered are nodes that restarted since (a marker naming an older
/// run_id) used too: after a restart of the whole cluster no node is current, and a restart
/// keeps what the AOF holds. A node restored from an old backup also shows an older run_id;
/// it is taken only in that fallback.
fn choose_sources<'a>(
    replies: &[(usize, &'a Holdings)],
    target: usize,
    cluster: &str,
    needed: usize,
) -> Vec<&'a Holdings> {
    let mut seen = HashSet::new();
    let (mut current, mut restarted) = (Vec::new(), Vec::new());
    for (node, h) in replies {
        if *node == target || !seen.insert(h.run_id.clone()) {
            continue;
        }
        let Some(marker) = h.marker.as_deref() else {
            continue;
        };
        match cluster::parse_marker(marker) {
            (run, Some(c)) if c == cluster && run == h.run_id => current.push(*h),
            (_, Some(c)) if c == cluster => restarted.push(*h),
            _ => {}
        }
    }
    if current.len() < needed {
        current.extend(restarted);
    }
    current
}

/// Read a node's marker and every monotonic register (SCAN with fixed patterns, then MGET).
async fn read_holdings(mut nc: NodeConn) -> redis::RedisResult<Holdings> {
    let mut h = Holdings {
        run_id: nc.run_id.to_string(),
        marker: redis::cmd("GET")
            .arg(fixed_key(KeyKind::Marker))
            .query_async(&mut nc.conn)
            .await?,
        registers: BTreeMap::new(),
        views: BTreeMap::new(),
        leases: BTreeMap::new(),
        hashes: BTreeMap::new(),
    };
    for pattern in MONOTONIC_PATTERNS {
        debug_assert!(pattern.starts_with(KEY_PREFIX));
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(*pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut nc.conn)
                .await?;
            for chunk in keys.chunks(500) {
                let values: Vec<Option<u64>> = redis::cmd("MGET")
                    .arg(chunk)
                    .query_async(&mut nc.conn)
                    .await?;
                for (k, v) in chunk.iter().zip(values) {
                    if let Some(v) = v {
                        h.registers.insert(k.clone(), v);
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    // Group view registers are hashes {token, view}: keep each key's pair.
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(VIEW_PATTERN)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut nc.conn)
            .await?;
        for key in keys {
            let (token, view): (Option<u64>, Option<String>) = redis::cmd("HMGET")
                .arg(&key)
                .arg("token")
                .arg("view")
                .query_async(&mut nc.conn)
                .await?;
            if let (Some(token), Some(view)) = (token, view) {
                h.views.insert(key, (token, view));
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    for (pattern, _, _) in LEASE_PATTERNS {
        for key in scan_hashes(&mut nc, pattern).await? {
            let (value, version, ttl): (Option<String>, Option<u64>, Option<u64>) =
                redis::cmd("HMGET")
                    .arg(&key)
                    .arg("v")
                    .arg("n")
                    .arg("t")
                    .query_async(&mut nc.conn)
                    .await?;
            if let (Some(v), Some(n), Some(t)) = (value, version, ttl) {
                h.leases.insert(key, (v, n, t));
            }
        }
    }
    for (pattern, _) in HASH_PATTERNS {
        for key in scan_hashes(&mut nc, pattern).await? {
            let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut nc.conn)
                .await?;
            h.hashes.insert(key, fields);
        }
    }
    Ok(h)
}

/// Every hash key matching a fixed pattern (SCAN ... TYPE hash: a key of another type, from
/// an older layout, is skipped rather than failing the repair).
async fn scan_hashes(nc: &mut NodeConn, pattern: &str) -> redis::RedisResult<Vec<String>> {
    debug_assert!(pattern.starts_with(KEY_PREFIX));
    let mut out = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("hash")
            .query_async(&mut nc.conn)
            .await?;
        out.extend(keys);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// On the node being repaired: raise every register, then write the marker, but only if the
/// node is still the incarnation that was probed (`run_id`). Applied(raised count), or
/// Rejected when the node restarted meanwhile.
async fn raise_and_mark(
    mut nc: NodeConn,
    pairs: &[(String, u64)],
    views: &[(String, (u64, String))],
    restores: &Restores,
    mark: &Mark,
) -> redis::RedisResult<NodeOutcome<usize>> {
    if *nc.run_id != *mark.run_id {
        return Ok(NodeOutcome::Rejected(0));
    }
    let mut raised = 0usize;
    for chunk in pairs.chunks(200) {
        let mut inv = RAISE.prepare_invoke();
        for (k, v) in chunk {
            inv.key(k).arg(*v);
        }
        raised += inv.invoke_async::<usize>(&mut nc.conn).await?;
    }
    for (key, (token, view)) in views {
        // The view register's own compare-and-set on the view's base, without the marker
        // check: the node is being repaired precisely because its marker is missing or stale.
        let Ok(parsed) = serde_json::from_str::<crate::membership::View>(view) else {
            continue;
        };
        let base = parsed.base.token().map(|t| t.get()).unwrap_or(0);
        let (stored, _): (i64, u64) = VIEW_WRITE
            .key(key)
            .key(fixed_key(KeyKind::Marker))
            .arg(*token)
            .arg(view)
            .arg(crate::membership::View::digest(view))
            .arg(base)
            .arg("*")
            .invoke_async(&mut nc.conn)
            .await?;
        raised += usize::from(stored == 1);
    }
    for (key, (value, version, ttl)) in &restores.leases {
        let Some(fence_key) = LEASE_PATTERNS.iter().find_map(|(_, lock, fence)| {
            key.strip_prefix(lock).map(|name| format!("{fence}{name}"))
        }) else {
            continue;
        };
        let written: usize = RESTORE
            .key(key)
            .key(&fence_key)
            .arg("lease")
            .arg(value)
            .arg(*version)
            .arg(*ttl)
            .arg(lease_token(value))
            .invoke_async(&mut nc.conn)
            .await?;
        raised += written;
    }
    for (key, (merge, fields)) in &restores.hashes {
        for chunk in fields.iter().collect::<Vec<_>>().chunks(200) {
            let mut inv = RESTORE.prepare_invoke();
            inv.key(key).key(key).arg(merge.mode());
            for (f, v) in chunk {
                inv.arg(*f).arg(*v);
            }
            raised += inv.invoke_async::<usize>(&mut nc.conn).await?;
        }
    }
    let _: () = redis::cmd("SET")
        .arg(fixed_key(KeyKind::Cluster))
        .arg(&mark.descriptor)
        .query_async(&mut nc.conn)
        .await?;
    let _: () = redis::cmd("SET")
        .arg(fixed_key(KeyKind::Marker))
        .arg(&mark.marker)
        .query_async(&mut nc.conn)
        .await?;
    Ok(NodeOutcome::Applied(raised))
}

/// What a change of the node list did.
#[derive(Clone, Debug)]
pub struct ClusterChange {
    /// The cluster that was replaced.
    pub from: Descriptor,
    /// The new cluster.
    pub to: Descriptor,
    /// Old nodes sealed (they vote for no client of the old cluster any more).
    pub sealed: usize,
    /// New nodes raised and marked (the others are repaired by the first client that reaches
    /// them, by the URL the new cluster lists).
    pub marked: usize,
}

impl Client {
    /// Change the cluster's node list to `to`'s (add, remove or replace nodes), from a client
    /// of the current cluster. The procedure, safe while clients keep running:
    ///
    /// 1. **Seal** a majority of the old nodes: their marker gets a suffix, so no client of the
    ///    old list gets a majority any more (its operations fail with an error that names both
    ///    lists).
    /// 2. Wait one node timeout, so every write an old client counted is on its nodes.
    /// 3. **Read** every register from the sealed majority (it meets every old majority).
    /// 4. **Raise** every node of the new list it reaches to those values, store the new
    ///    descriptor and mark it; at least a majority of the new list must be marked.
    ///
    /// Clients configured with the new list work once a majority of it is marked; clients
    /// still configured with the old list are refused. A run that fails part-way can be run
    /// again (it resumes: sealed nodes stay sealed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when this client has no cluster yet or `to` lists the same
    /// nodes; [`Error::NoQuorum`] when fewer than a majority of the old nodes could be sealed
    /// or read, or fewer than a majority of the new ones marked.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a dropped call leaves the old cluster sealed and the new one partly
    /// marked; run it again to finish.
    pub async fn change_cluster(&self, to: Config) -> Result<ClusterChange, Error> {
        let inner = &self.inner;
        let from = match &self.verdicts().adoption {
            Adoption::Adopted(d) => d.clone(),
            Adoption::Refused(why) => {
                return Err(Error::Config(ConfigError::ClusterMismatch(why.clone())))
            }
            Adoption::Unknown => {
                return Err(Error::InvalidArgument(
                    "these nodes hold no cluster yet: connect with the new list to set it up"
                        .into(),
                ))
            }
        };
        let names: Vec<String> = to.nodes().iter().map(|u| u.name().to_string()).collect();
        let new = from.succeeding(&names);
        let needed_old = inner.majority.needed();

        // 1. Seal.
        let sealed_marker = |run: &str| {
            format!(
                "{}{}",
                cluster::marker_value(run, &from.id),
                cluster::SEALED
            )
        };
        let seal = self
            .fan_out_raw(
                "cluster.seal",
                Wait::All,
                Targets::All,
                Some(inner.config.operation_timeout),
                move |mut nc: NodeConn| async move {
                    // The marker this node holds while it is verified for the old cluster.
                    let current = nc.marker.to_string();
                    let sealed = format!("{current}{}", cluster::SEALED);
                    let done: i64 = SEAL
                        .key(fixed_key(KeyKind::Marker))
                        .arg(&current)
                        .arg(&sealed)
                        .invoke_async(&mut nc.conn)
                        .await?;
                    Ok(if done == 1 {
                        NodeOutcome::Applied(nc.run_id.to_string())
                    } else {
                        NodeOutcome::Rejected(String::new())
                    })
                },
            )
            .await;
        let mut sealed_servers = HashSet::new();
        for r in seal.results() {
            if let NodeOutcome::Applied(run) = &r.outcome {
                sealed_servers.insert(run.clone());
            }
        }
        if sealed_servers.len() < needed_old {
            return Err(crate::error::NoQuorum::from_tally(
                "cluster.seal",
                &seal,
                &inner.urls,
                |_| "not marked for this cluster (restarted or wiped): repair it first".into(),
            )
            .into());
        }

        // 2. Settle, 3. read the sealed nodes.
        let settle = inner.config.node_timeout.max(to.node_timeout);
        tokio::time::sleep(settle + Duration::from_millis(25)).await;
        let tally = self
            .fan_out_raw(
                "cluster.read",
                Wait::All,
                Targets::All,
                Some(inner.config.operation_timeout),
                |nc: NodeConn| async move { read_holdings(nc).await.map(NodeOutcome::Applied) },
            )
            .await;
        let mut seen = HashSet::new();
        let sources: Vec<&Holdings> = tally
            .replies()
            .map(|(_, h)| h)
            .filter(|h| h.marker.as_deref() == Some(sealed_marker(&h.run_id).as_str()))
            .filter(|h| seen.insert(h.run_id.clone()))
            .collect();
        if sources.len() < needed_old {
            return Err(crate::error::NoQuorum::from_tally(
                "cluster.read",
                &tally,
                &inner.urls,
                |_| String::new(),
            )
            .into());
        }

        // 4. Raise and mark the new nodes.
        let target = Client::open(to, false).await?;
        let (pairs, views, restores) =
            repair_plan(sources.as_slice(), inner.config.server_clock_leases);
        let (pairs, views, restores) = (
            std::sync::Arc::new(pairs),
            std::sync::Arc::new(views),
            std::sync::Arc::new(restores),
        );
        let (descriptor, new_id, old_id): (
            std::sync::Arc<str>,
            std::sync::Arc<str>,
            std::sync::Arc<str>,
        ) = (
            new.encode().into(),
            new.id.as_str().into(),
            from.id.as_str().into(),
        );
        let mark = target
            .fan_out_raw(
                "cluster.mark",
                Wait::All,
                Targets::All,
                Some(target.inner.config.operation_timeout),
                move |mut nc: NodeConn| {
                    let (pairs, views, restores) = (pairs.clone(), views.clone(), restores.clone());
                    let (descriptor, new_id, old_id) =
                        (descriptor.clone(), new_id.clone(), old_id.clone());
                    async move {
                        // Only a node that is new (no marker) or already of this cluster's
                        // lineage is enlisted, never another cluster's node.
                        let marker: Option<String> = redis::cmd("GET")
                            .arg(fixed_key(KeyKind::Marker))
                            .query_async(&mut nc.conn)
                            .await?;
                        let ours = match marker.as_deref().map(cluster::parse_marker) {
                            None => true,
                            Some((_, Some(c))) => {
                                let c = c.strip_suffix(cluster::SEALED).unwrap_or(c);
                                c == &*old_id || c == &*new_id
                            }
                            Some((_, None)) => false,
                        };
                        if !ours {
                            return Ok(NodeOutcome::Rejected(0));
                        }
                        let mark = Mark {
                            run_id: nc.run_id.to_string(),
                            descriptor: descriptor.to_string(),
                            marker: cluster::marker_value(&nc.run_id, &new_id),
                        };
                        raise_and_mark(nc, &pairs, &views, &restores, &mark).await
                    }
                },
            )
            .await;
        let marked: HashSet<&str> = mark
            .results()
            .iter()
            .filter(|r| matches!(r.outcome, NodeOutcome::Applied(_)))
            .map(|r| target.inner.urls[r.node.0].as_str())
            .collect();
        if !mark.reached() {
            return Err(crate::error::NoQuorum::from_tally(
                "cluster.mark",
                &mark,
                &target.inner.urls,
                |_| "marked for another cluster: not enlisted".into(),
            )
            .into());
        }
        tracing::warn!(from = %from.id, to = %new.id, nodes = %new.describe(), "cluster node list changed");
        Ok(ClusterChange {
            sealed: sealed_servers.len(),
            marked: marked.len(),
            from,
            to: new,
        })
    }
}

/// Registers, views and restores that raise a node to what `sources` hold.
type RepairPlan = (Vec<(String, u64)>, Vec<(String, (u64, String))>, Restores);

fn repair_plan(sources: &[&Holdings], server_clock_leases: bool) -> RepairPlan {
    let mut target: BTreeMap<String, u64> = BTreeMap::new();
    for h in sources {
        for (k, v) in &h.registers {
            let e = target.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }
    let mut best_views: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for h in sources {
        for (k, (t, v)) in &h.views {
            if best_views.get(k).is_none_or(|(bt, _)| t > bt) {
                best_views.insert(k.clone(), (*t, v.clone()));
            }
        }
    }
    let restores = if server_clock_leases {
        // TEST ONLY: the unsafe Redlock behaviour, where a lost lease copy or beat stays lost.
        let mut hashes = merge_restores(sources).hashes;
        hashes.retain(|k, _| !k.starts_with("rq:members:"));
        Restores {
            hashes,
            ..Restores::default()
        }
    } else {
        merge_restores(sources)
    };
    (
        target.into_iter().collect(),
        best_views.into_iter().collect(),
        restores,
    )
}
