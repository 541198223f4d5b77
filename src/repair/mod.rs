//! Node amnesia: quarantine and repair; and the copies of a cluster's state that `cluster init`
//! and `cluster change` make (set-up and a change of the node list).
//!
//! A node that lost its data (wiped disk, replaced host, FLUSHALL, a restart without its AOF)
//! silently breaks the majority-intersection argument: an ID accepted by {A, B, C} is lost with
//! B, and {B, D, E} could accept it again. So every node carries a marker (`rq:marker`) naming
//! the incarnation last verified to hold every value a majority accepted and its cluster,
//! `<run_id>.<epoch>/<cluster id>` (see `crate::cluster`). Every script that writes or decides
//! refuses to vote unless the marker is the one the client expects; the client quarantines a node
//! whose marker is missing or names another run_id.
//!
//! # How it works
//! 1. **Quarantine** (`decide::need`): a node whose marker is missing or stale is repaired before
//!    it votes again, only by a URL the cluster's descriptor lists.
//! 2. **Claim** (`claim.rs`): one client at a time repairs a node (`rq:repairing`,
//!    `claim.lua`). The claim expires on no node's clock: another repairer takes a silent claim
//!    over after watching it unchanged for its lifetime plus drift on its own monotonic clock.
//!    It decides only who does the work: every write of the copy and the final mark check it
//!    atomically.
//! 3. **Wait** one node timeout (the cluster's: the longest its descriptors record), so that
//!    every write any client counted has reached the nodes it was counted on.
//! 4. **Census and copy** (`copy.rs`, `page.rs`, `plan.rs`): page by page, every key a majority of
//!    the *other* marked nodes hold, each read behind the incarnation the census found for its
//!    source, merged by its kind's rule and written under the claim: monotonic registers raised
//!    to the highest value, views by their own compare-and-set, and what the node lacks of lease
//!    keys, completion records, acknowledgements and beats (at their highest sequence). A lease
//!    key whose sources hold different holders' copies gets a blocker that no client holds and
//!    only a takeover removes.
//! 5. **Mark** (`mark.lua`): the descriptor, then the marker with a new epoch, while the claim
//!    holds; the node votes again.
//!
//! Set-up is never a repair: only `cluster init` (`init.rs`, [`Client::init_cluster`]) marks
//! blank nodes, when every configured node answers, fewer than a majority hold a marker and none
//! holds any register. A change of the node list (`change.rs`, [`Client::change_cluster`])
//! seals a majority of the old nodes (`seal.lua`), waits one node timeout, copies from the sealed
//! majority with the same paged copy, and marks the new nodes under their claims; run again, it
//! resumes. Clients that were running follow it once it is done (`src/client/mod.rs`, "A
//! running client follows a change of its node list").
//!
//! # Guarantees
//! Why a repair is enough: any set M that accepted a value is a majority; M minus the repaired
//! node has `needed - 1` members, the read set R has `needed` members among the other `n - 1`
//! nodes, and `2 * needed - 1 > n - 1`, so R meets M at a node that kept the value. Values
//! accepted while the node was quarantined were accepted by majorities without it, which any
//! later majority meets at a node other than it. Why the wait: a write the node applied just
//! before losing its data may still be travelling to a slow member of M, but a client counts a
//! reply only within its node timeout of sending. Why a blocker: the node may have granted any of
//! the holders its sources show, and the owner of a restored copy who never won could release it
//! and free the node for a second holder. A keyspace of any size finishes (each page has its own
//! deadline). Not guaranteed: a repair while fewer than a majority of the other nodes are marked
//! and reachable (it waits, and says why); anything if more than a minority lost their data at
//! once (such nodes are refused, naming `cluster init`); a stale copy or a blocker costs liveness
//! (a waiter takes it over after watching it for its TTL).
//!
//! # Invariants
//! - Architecture invariant: a node votes only while its marker names its current run_id and the
//!   client's cluster, and the marker is written only after the node holds every value a
//!   majority accepted.
//! - Architecture invariant: a node's marker names its incarnation, with a new epoch at every
//!   repair and set-up: a node that lost its data never shows a marker it showed before, so every
//!   watch keyed by the marker restarts and every request that expected the old one is refused.
//! - Architecture invariant: a copy reads a source only behind the incarnation its census found
//!   (run_id, marker, last-repair nonce, in the same MULTI/EXEC as the read), and writes a target
//!   only while the target carries the repairer's claim (checked in the same script call).
//! - Architecture invariant: every key kind's restore rule is chosen in one exhaustive match
//!   (`plan::rule`); no rule moves a value backwards on a node.
//! - Architecture invariant: no client sets a cluster up implicitly: only
//!   [`Client::init_cluster`] writes a marker on blank nodes, and every repair waits the longest
//!   node timeout its sources record.
//!
//! # What it relies on outside this folder
//! - `crate::cluster` (markers, descriptors, standing, where a change starts), `crate::lease`
//!   (the claim's watch window), `crate::membership` (the view format a copy writes back).
//! - Keys (`src/keys.rs`): `KeyKind::Marker`, `KeyKind::Cluster`, `KeyKind::RepairClaim`,
//!   `KeyKind::Marked` (the node's own, never copied), and every state kind through `plan::rule`
//!   (`KeyKind::of_key`), `all_floor_keys` (the floors read again after the scans) and
//!   `BLOCKER_PREFIX`/`BLOCKER_HOLDER` (the blocker's value).
//! - Scripts: `src/scripts/raise.lua`, `src/scripts/restore.lua`, `src/scripts/view_write.lua`
//!   (in claim mode), `src/scripts/claim.lua`, `src/scripts/mark.lua`,
//!   `src/scripts/cluster_init.lua`, `src/scripts/seal.lua`.
//! - ACL (`src/acl.rs`): the base every client has (`SCAN`, `MULTI`, `EXEC`, the reads and the
//!   scripts): every client repairs the nodes it meets.
//! - Model: `model/src/ids.rs` (repair of the ID register: planted "no quarantine", "repair
//!   without its wait"), `model/src/leases.rs` (lease copies restored, the blocker: "repair
//!   without restore", "restore of the newest of disagreeing copies"), `model/src/copy.rs` (the
//!   copy of a node-list change under FLUSHALL), checked in `model/tests/models.rs`,
//!   `model/tests/leases.rs` and `model/tests/copy.rs`.
//! - Tests: `tests/repair.rs` (at scale), `tests/flushall.rs` (FLUSHALL during copies, claims
//!   and clock steps, with teeth), `tests/floor_repair.rs`, `tests/cluster_init.rs`,
//!   `tests/interrupted_change.rs`, `tests/cluster.rs`, `tests/lease_safety.rs` (the blocker);
//!   `benches/repair.rs`.
//!
//! # Files
//! - `mod.rs`: quarantine, the repair itself (wait, census, copy, mark), [`Census`].
//! - `decide.rs`: the pure decisions (whether a node needs a repair; after the census, copy from
//!   which nodes or wait; `set_up`); table-tested.
//! - `claim.rs`: the repair claim.
//! - `copy.rs`: the paged copy shared by repair and by a change of the node list.
//! - `page.rs`: one page on one node (a read behind the incarnation, the raise under the claim).
//! - `plan.rs`: what a copy writes, decided purely: each key kind's restore rule and a page's
//!   merge.
//! - `init.rs`: `cluster init` ([`ClusterInit`]).
//! - `change.rs`: a change of the node list ([`ClusterChange`]).

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use crate::client::{decode, script_call, Client, Guard, NodeConn, Request, Step, Steps, Targets};
use crate::cluster::{self, Adoption, Descriptor};
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::NodeOutcome;
use crate::scripts::MARK;

mod change;
mod claim;
pub(crate) mod copy;
mod decide;
mod init;
mod page;
mod plan;
pub(crate) use claim::RepairClaim;

pub use change::ClusterChange;
pub use init::ClusterInit;

/// Whether repair copies `key` as state (for unit tests elsewhere).
#[cfg(test)]
pub(crate) fn classify_for_tests(key: &str) -> bool {
    plan::classify(key) == Some(plan::Kind::Register)
}

/// How a repair attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RepairOutcome {
    /// The node was not quarantined (or protection is off).
    NotNeeded,
    /// The node was raised from a majority of the others and marked.
    Repaired { raised: usize },
    /// Not possible now (too few marked nodes reachable); retried on a later operation.
    Deferred(String),
}

impl Client {
    /// Start a repair of node `i` in the background unless one is running.
    /// Returns the task, or None when a repair of the node is already running here.
    pub(crate) fn spawn_repair(&self, i: usize) -> Option<tokio::task::JoinHandle<()>> {
        if !self.pinned {
            // A repair runs on one list: node `i` of the list in use now.
            return self.current().spawn_repair(i);
        }
        if self.inner.read_only {
            return None;
        }
        let node = self.inner.nodes.get(i).cloned()?;
        if node
            .repairing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return None;
        }
        let client = self.clone();
        Some(tokio::spawn(async move {
            let outcome = client.repair(i).await;
            if matches!(outcome, RepairOutcome::Deferred(_)) {
                // Do not hammer the cluster while a repair is impossible.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            node.repairing
                .store(false, std::sync::atomic::Ordering::Release);
        }))
    }

    /// A node refused a vote because of its marker: probe it again (it will show as
    /// quarantined) and repair it.
    pub(crate) fn suspect(&self, i: usize) {
        if !self.pinned {
            return self.current().suspect(i);
        }
        let Some(node) = self.inner.nodes.get(i).cloned() else {
            return;
        };
        // One probe at a time per node: a batch of refusals suspects it once. If a probe is
        // already in flight (perhaps from before the node lost its data), the repair runs its
        // own check (and one repair at a time per node).
        if !node.begin_reprobe() {
            self.spawn_repair(i);
            return;
        }
        let client = self.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(client.inner.config.node_timeout, node.reprobe()).await;
            node.end_reprobe();
            client.spawn_repair(i);
        });
    }

    /// Repair node `i` if it is quarantined. Cancel-safe: an interrupted repair leaves the
    /// node quarantined (the marker is written last).
    pub(crate) async fn repair(&self, i: usize) -> RepairOutcome {
        let outcome = self.try_repair(i).await;
        crate::metrics::repair(match &outcome {
            RepairOutcome::NotNeeded => "not_needed",
            RepairOutcome::Repaired { .. } => "repaired",
            RepairOutcome::Deferred(_) => "deferred",
        });
        let node = &self.inner.nodes[i];
        match &outcome {
            RepairOutcome::NotNeeded => {}
            RepairOutcome::Repaired { raised } => {
                tracing::warn!(node = %node.id, url = %node.url, raised, "quarantined node repaired: it votes again")
            }
            RepairOutcome::Deferred(why) => {
                tracing::warn!(node = %node.id, url = %node.url, why = %why, "quarantined node cannot be repaired yet")
            }
        }
        outcome
    }

    async fn try_repair(&self, i: usize) -> RepairOutcome {
        let (adoption, run_id) = match self.quarantine_need(i).await {
            Ok(need) => need,
            Err(outcome) => return outcome,
        };
        if self.inner.config.implicit_set_up
            && matches!(self.set_up().await, Ok(init) if init.created)
        {
            return RepairOutcome::NotNeeded;
        }
        let Adoption::Adopted(adopted) = &adoption else {
            return RepairOutcome::Deferred(format!(
                "no node reached holds a cluster descriptor: {}",
                cluster::INIT_HINT
            ));
        };
        let (census, plan) = self.settle_and_count(i, &adoption, adopted).await;
        match plan {
            decide::Plan::Copy { sources, cluster } => {
                self.copy_from(i, &census, &sources, cluster, &run_id).await
            }
            decide::Plan::Wait(why) => RepairOutcome::Deferred(why),
        }
    }

    /// Whether node `i` needs a repair, from a fresh probe: the client's adoption and the
    /// incarnation (run_id) to repair, or the outcome when there is nothing to repair now.
    async fn quarantine_need(&self, i: usize) -> Result<(Adoption, String), RepairOutcome> {
        let inner = &self.inner;
        let node = &inner.nodes[i];
        let probe = match node.reprobe().await {
            Ok(p) => p,
            Err(e) => {
                return Err(RepairOutcome::Deferred(format!(
                    "cannot probe the node: {e}"
                )))
            }
        };
        if !inner.config.amnesia_protection {
            return Err(RepairOutcome::NotNeeded);
        }
        let adoption = self.verdicts().adoption.clone();
        let standing =
            cluster::standing(probe.marker.as_deref(), probe.run_id.as_deref(), &adoption);
        let name = inner.config.nodes[i].name().to_string();
        let check_listing = inner.config.cluster_identity;
        let (reason, run_id) = match decide::need(
            &adoption,
            standing,
            probe.run_id.as_deref(),
            &name,
            check_listing,
        ) {
            decide::Need::Done(outcome) => return Err(outcome),
            decide::Need::Repair { reason, run_id } => (reason, run_id),
        };
        // A node without a marker is normal once, in a new cluster: say so quietly here; the
        // outcome (repaired, bootstrapped, deferred) is reported at warn/info by `repair`.
        tracing::info!(node = %node.id, url = %node.url, reason = %reason, "node quarantined");
        Ok((adoption, run_id))
    }

    /// Settle, then take the census and plan the repair of node `i`.
    ///
    /// Settle: a write that the node applied before it lost its data may still be on its way
    /// to the other nodes, and a client counts a reply only within its node timeout of
    /// sending. Reading the others after that long sees every write a client counted. The
    /// margin covers the clients' clock drift (2 % of the timeout, for rates within 0.5 % on
    /// both sides, see `lease::MAX_DRIFT_RATE`) and timer granularity. The node timeout is the
    /// cluster's (the longest its descriptors record, at least this client's): no client with
    /// a longer one is allowed (`Client::judge_node_timeout`). A source recording a longer node
    /// timeout (raised since this client adopted the cluster) makes it wait the difference,
    /// then read again.
    async fn settle_and_count(
        &self,
        i: usize,
        adoption: &Adoption,
        adopted: &Descriptor,
    ) -> (Vec<Census>, decide::Plan) {
        let inner = &self.inner;
        let mut waited = Duration::ZERO;
        let mut settle = cluster::longest_node_timeout(Some(adopted))
            .unwrap_or_default()
            .max(inner.config.node_timeout);
        loop {
            let more = settle.saturating_sub(waited);
            tokio::time::sleep(more + more / 50 + Duration::from_millis(25)).await;
            waited = settle;
            let census = self.census().await;
            let plan = decide::after_census(
                adoption,
                &census,
                i,
                inner.majority.needed(),
                inner.nodes.len(),
            );
            let sources_say = match &plan {
                decide::Plan::Copy { sources, .. } => {
                    let descriptors: Vec<Descriptor> = census
                        .iter()
                        .filter(|c| sources.contains(&c.node))
                        .filter_map(|c| c.descriptor.as_deref())
                        .filter_map(|raw| Descriptor::decode(raw).ok())
                        .collect();
                    cluster::longest_node_timeout(&descriptors).unwrap_or_default()
                }
                decide::Plan::Wait(_) => Duration::ZERO,
            };
            if sources_say <= waited {
                return (census, plan);
            }
            settle = sources_say;
        }
    }

    /// Repair node `i` (incarnation `run_id`) by a copy from the census's nodes `sources`, then
    /// mark it for `cluster`. The descriptor written records the longest node timeout the
    /// census read on the sources and the target (this client's cached one may be older): a
    /// repair never lowers the cluster's node timeout.
    async fn copy_from(
        &self,
        i: usize,
        census: &[Census],
        sources: &[usize],
        cluster: Descriptor,
        run_id: &str,
    ) -> RepairOutcome {
        let recorded = census
            .iter()
            .filter(|c| c.node == i || sources.contains(&c.node))
            .filter_map(|c| Descriptor::decode(c.descriptor.as_deref()?).ok())
            .filter(|d| d.id == cluster.id)
            .filter_map(|d| d.node_timeout())
            .max();
        let cluster = match recorded {
            Some(t) => cluster.with_node_timeout_at_least(t),
            None => cluster,
        };
        let sources = sources_of(census, sources, self.inner.majority.needed());
        let Some(found) = census.iter().find(|c| c.node == i) else {
            return RepairOutcome::Deferred("the node did not answer the census".into());
        };
        let claim = RepairClaim::new(self.clone(), i, found.marker.as_deref());
        self.write_repair(i, sources, &cluster, run_id, claim).await
    }

    /// The marker epoch a repair under `claim` writes (none under the TEST-ONLY switch
    /// `with_repeatable_beats_for_tests`).
    pub(crate) fn epoch(&self, claim: &RepairClaim) -> Option<String> {
        self.inner.config.repair_epochs.then(|| claim.epoch())
    }

    /// Every node's marker and run_id, and whether it holds any state.
    pub(crate) async fn census(&self) -> Vec<Census> {
        self.census_within(self.inner.config.operation_timeout)
            .await
    }

    /// [`census`](Self::census), each node given at most `limit`.
    pub(crate) async fn census_within(&self, limit: Duration) -> Vec<Census> {
        // Several round trips (a SCAN to its end) on nodes that are quarantined precisely
        // because their marker is missing: a session, reporting the marker it read.
        let census = Step::session(|mut nc: NodeConn| async move {
            let (marker, marked, descriptor): (Option<String>, Option<String>, Option<String>) =
                redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg(fixed_key(KeyKind::Marker))
                    .cmd("GET")
                    .arg(fixed_key(KeyKind::Marked))
                    .cmd("GET")
                    .arg(fixed_key(KeyKind::Cluster))
                    .query_async(&mut nc.conn)
                    .await?;
            let has_state = has_state(&mut nc).await?;
            Ok(NodeOutcome::Applied(Census {
                node: nc.node(),
                run_id: nc.run_id().to_string(),
                marker,
                marked,
                descriptor,
                has_state,
            }))
        });
        let request = Request::any_node("repair.census", Targets::All).within(limit);
        let tally = self.send(request, census).await;
        tally.replies().map(|(_, c)| c.clone()).collect()
    }

    /// Copy onto node `i` what `sources` hold, then mark it for cluster `d` (the marker last,
    /// so an interrupted repair leaves the node quarantined). One client at a time: the node
    /// carries a claim while its repair runs.
    async fn write_repair(
        &self,
        i: usize,
        sources: copy::Sources,
        d: &Descriptor,
        run_id: &str,
        claim: RepairClaim,
    ) -> RepairOutcome {
        if !claim.take().await {
            return RepairOutcome::Deferred("another client is repairing this node".into());
        }
        let started = tokio::time::Instant::now();
        let mut targets = BTreeMap::new();
        targets.insert(i, self.copy_target(run_id, &claim));
        let copied = self
            .copy_paged(sources, self, targets, || claim.refresh())
            .await;
        let outcome = match copied {
            Err(why) => RepairOutcome::Deferred(format!("the copy stopped: {why}")),
            Ok(copied) if !copied.complete.contains_key(&i) => {
                RepairOutcome::Deferred("the node restarted during its repair".into())
            }
            Ok(copied) => {
                let mark = Arc::new(Mark {
                    run_id: run_id.to_string(),
                    descriptor: d.encode(),
                    marker: cluster::marker_value(run_id, self.epoch(&claim).as_deref(), &d.id),
                    claim: claim.nonce.clone(),
                });
                if self.mark(Targets::Only(i), mark).await.contains(&i) {
                    tracing::info!(node = %self.inner.nodes[i].id, keys = copied.keys, written = copied.written, elapsed_ms = started.elapsed().as_millis() as u64, "repair copied");
                    RepairOutcome::Repaired {
                        raised: copied.written,
                    }
                } else {
                    RepairOutcome::Deferred("writing the marker failed".into())
                }
            }
        };
        claim.release().await;
        let _ = self.inner.nodes[i].reprobe().await;
        outcome
    }

    /// A copy's target of incarnation `run_id`, written under `claim` (unclaimed with the
    /// test-only switch).
    pub(crate) fn copy_target(&self, run_id: &str, claim: &RepairClaim) -> copy::Target {
        copy::Target {
            run_id: run_id.to_string(),
            claim: if self.inner.config.copy_claimed {
                claim.nonce.clone()
            } else {
                "*".into()
            },
        }
    }

    /// Write the descriptor, then the marker, on the `targets` that are still the incarnation
    /// the mark names (or, with an empty `run_id`, each node's own). Returns the nodes marked.
    pub(crate) async fn mark(&self, targets: Targets, mark: Arc<Mark>) -> Vec<usize> {
        let steps = Steps::per_node(move |ctx| {
            // Only the incarnation the repair copied to.
            (*ctx.run_id == *mark.run_id).then(|| mark.step())
        });
        let request =
            Request::any_node("repair.mark", targets).within(self.inner.config.operation_timeout);
        let tally = self.send(request, steps).await;
        tally
            .results()
            .iter()
            .filter(|r| matches!(r.outcome, NodeOutcome::Applied(())))
            .map(|r| r.node.0)
            .collect()
    }
}

/// What a repair writes last: the descriptor, then the marker, for this incarnation.
pub(crate) struct Mark {
    pub(crate) run_id: String,
    pub(crate) descriptor: String,
    pub(crate) marker: String,
    /// The claim nonce the node must still carry (see `mark.lua`).
    pub(crate) claim: String,
}

impl Mark {
    /// `mark.lua`: the descriptor, then the marker, while the node carries the repairer's
    /// claim (no marker check: the node is being marked because it has none).
    fn step(&self) -> Step<()> {
        script_call(
            &MARK,
            Guard::None("marks a node under repair, guarded by its claim"),
        )
        .marker_key()
        .key(fixed_key(KeyKind::Cluster))
        .key(fixed_key(KeyKind::RepairClaim))
        .key(fixed_key(KeyKind::Marked))
        .arg(&self.marker)
        .arg(&self.descriptor)
        .arg(&self.claim)
        .decode(|_, v| decode::one_applied(v))
    }
}

/// One node as a repair finds it.
#[derive(Clone, Debug)]
pub(crate) struct Census {
    pub(crate) node: usize,
    pub(crate) run_id: String,
    pub(crate) marker: Option<String>,
    /// Its last repair's nonce (`rq:marked`).
    pub(crate) marked: Option<String>,
    /// Its cluster descriptor as stored (`rq:cluster`).
    pub(crate) descriptor: Option<String>,
    pub(crate) has_state: bool,
}

impl Census {
    /// The incarnation a copy must find this node in at every read.
    pub(crate) fn incarnation(&self) -> copy::Incarnation {
        copy::Incarnation {
            run_id: self.run_id.clone(),
            marker: self.marker.clone(),
            marked: self.marked.clone(),
        }
    }
}

/// The copy's sources: the census's nodes `chosen`, each with the incarnation it showed.
pub(crate) fn sources_of(census: &[Census], chosen: &[usize], needed: usize) -> copy::Sources {
    copy::Sources {
        nodes: census
            .iter()
            .filter(|c| chosen.contains(&c.node))
            .map(|c| (c.node, c.incarnation()))
            .collect(),
        needed,
    }
}

/// Whether a node holds any state a copy would carry (a paged scan that stops at the first).
async fn has_state(nc: &mut NodeConn) -> redis::RedisResult<bool> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("rq:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut nc.conn)
            .await?;
        if keys.iter().any(|k| copy::classify(k).is_some()) {
            return Ok(true);
        }
        if next == 0 {
            return Ok(false);
        }
        cursor = next;
    }
}
