//! Node amnesia: quarantine and repair.
//!
//! A node that lost its data (wiped disk, replaced host, FLUSHALL, a restart without its AOF)
//! silently breaks the majority-intersection argument: an ID accepted by {A, B, C} is lost
//! with B, and {B, D, E} could accept it again. So every node carries a marker (`rq:marker`)
//! holding the run_id of the incarnation that was last verified to hold every value a
//! majority accepted, and the id of its cluster (see [`crate::cluster`]). The scripts refuse
//! to vote unless the marker equals `<run_id>.<epoch>/<cluster id>` as the client expects it; the
//! client quarantines a node whose marker is missing or names another run_id (it lost data, or
//! restarted since it was verified).
//!
//! One client at a time repairs a node (a claim key on the node, [`claim`]: it expires on no
//! node's clock; another repairer takes a silent claim over after watching it unchanged for its
//! lifetime on its own monotonic clock; it decides only who does the work, as every write of
//! the copy and the final mark check it atomically, so a repairer that lost it writes nothing).
//! Repair first waits one node timeout, then copies, page by page ([`copy`]), what a majority
//! of the *other* marked nodes hold, every read behind the incarnation the census found for its
//! source (so a source flushed mid-copy is dropped, never read as empty): every monotonic
//! register (ID sequences, lock fences, group views) raised to the largest value read, and
//! what the node lacks of lease keys, completion records, acknowledgements, and membership
//! beats at their highest sequence; then it writes the descriptor and the marker, with a new
//! epoch (so the marker never repeats on a node that lost its data). Why that is
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
//! A lease key is restored only where the node has none. Where its fence (raised, perhaps from
//! a page read before the lease key's) is above the copy's token, a later grant was made and
//! may since have been released, so `restore.lua` writes a blocker instead of the copy: the
//! node is never left free while some source shows a grant it may have counted. A stale copy or
//! a blocker costs liveness only (a waiter takes it over after watching it for its TTL). Which copy: if
//! every source that holds the key holds one holder's value, that value (a lease that counted
//! the lost grant and is still valid has its value on a source read, by the same intersection
//! argument, so it is this one); if the sources hold different holders' values, a *blocker*
//! no client holds ([`plan`]'s `restored_copy`): the node may have granted any of them, and
//! the owner of a restored copy who never won could release it and free the node for a second
//! holder. Such a page is read again (up to three times, one node timeout apart) before the
//! blocker is planned: any read after the wait is sound, and a losing round is usually
//! released by then.
//!
//! Set-up (a new cluster) is never a repair: only `cluster init` ([`Client::init_cluster`])
//! sets a cluster up, when EVERY configured node answers, fewer than a majority hold a marker,
//! and no node holds any register: no majority can ever have accepted a value (all of its
//! members would have had to lose their data, more than a minority), so every unmarked node
//! is marked without raising anything. Set-up needs all nodes, not just a majority: a
//! majority that answers could miss exactly the nodes that hold the values while the others
//! are wiped (a wiped node plus a cut-off one), and safety must not depend on how many nodes
//! are reachable. A repair that finds fewer than a majority marked waits (its error names
//! `cluster init`): before this rule, a client set a cluster up implicitly, so after every
//! node lost its data IDs and tokens silently started again from 1.
//!
//! Architecture invariant: a node votes only while its marker names its current run_id and the
//! client's cluster, and the marker is written only after the node holds every value a
//! majority accepted.

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
mod plan;
pub(crate) use claim::RepairClaim;
pub(crate) use plan::BLOCKER_PREFIX;

pub use change::ClusterChange;
pub(crate) use decide::INIT_HINT;
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
            decide::Need::Done(outcome) => return outcome,
            decide::Need::Repair { reason, run_id } => (reason, run_id),
        };
        // A node without a marker is normal once, in a new cluster: say so quietly here; the
        // outcome (repaired, bootstrapped, deferred) is reported at warn/info by `repair`.
        tracing::info!(node = %node.id, url = %node.url, reason = %reason, "node quarantined");

        // Settle: a write that the node applied before it lost its data may still be on its
        // way to the other nodes, and a client counts a reply only within its node timeout of
        // sending. Reading the others after that long sees every write a client counted.
        // The margin covers the clients' clock drift (2 % of the timeout, for rates within
        // 0.5 % on both sides, see `lease::MAX_DRIFT_RATE`) and timer granularity. The node
        // timeout is the cluster's (the longest its descriptors record, at least this
        // client's): no client with a longer one is allowed (`Client::judge_node_timeout`).
        let longest = |d: Option<&Descriptor>| {
            cluster::longest_node_timeout(d)
                .unwrap_or_default()
                .max(inner.config.node_timeout)
        };
        if inner.config.implicit_set_up && matches!(self.set_up().await, Ok(init) if init.created) {
            return RepairOutcome::NotNeeded;
        }
        let Adoption::Adopted(adopted) = &adoption else {
            return RepairOutcome::Deferred(format!(
                "no node reached holds a cluster descriptor: {}",
                decide::INIT_HINT
            ));
        };
        let mut waited = Duration::ZERO;
        let mut settle = longest(Some(adopted));
        let (census, plan) = loop {
            let more = settle.saturating_sub(waited);
            tokio::time::sleep(more + more / 50 + Duration::from_millis(25)).await;
            waited = settle;
            let census = self.census().await;
            let plan = decide::after_census(
                &adoption,
                &census,
                i,
                inner.majority.needed(),
                inner.nodes.len(),
            );
            // A source recording a longer node timeout (raised since this client adopted the
            // cluster): wait the difference, then read again.
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
                break (census, plan);
            }
            settle = sources_say;
        };
        match plan {
            decide::Plan::Copy { sources, cluster } => {
                // The descriptor written records the longest node timeout the census read on
                // the sources and the target (this client's cached one may be older): a repair
                // never lowers the cluster's node timeout.
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
                let sources = sources_of(&census, &sources, inner.majority.needed());
                let Some(found) = census.iter().find(|c| c.node == i) else {
                    return RepairOutcome::Deferred("the node did not answer the census".into());
                };
                let claim = RepairClaim::new(self.clone(), i, found.marker.as_deref());
                self.write_repair(i, sources, &cluster, &run_id, claim)
                    .await
            }
            decide::Plan::Wait(why) => RepairOutcome::Deferred(why),
        }
    }

    /// Every node's marker and run_id, and whether it holds any state.
    /// The marker epoch a repair under `claim` writes (none under the TEST-ONLY switch
    /// `with_repeatable_beats_for_tests`).
    pub(crate) fn epoch(&self, claim: &RepairClaim) -> Option<String> {
        self.inner.config.repair_epochs.then(|| claim.epoch())
    }

    pub(crate) async fn census(&self) -> Vec<Census> {
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
        let request = Request::any_node("repair.census", Targets::All)
            .within(self.inner.config.operation_timeout);
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
