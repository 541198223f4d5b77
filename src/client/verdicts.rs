//! What a client concludes from its nodes' latest probes: the cluster it adopts (judged with
//! the pure `cluster` core), which nodes may vote and which are quarantined, cached until a
//! node records a new probe; and [`Client::check`], the findings per node.

use std::sync::Arc;

use super::Client;
use crate::cluster::{self, Adoption, Standing};
use crate::config::SafetyMode;
use crate::quorum::fanout::{self, NodeCall, Wait};
use crate::quorum::{NodeId, NodeOutcome, UnknownCause};
use crate::safety::{duplicate_servers, Finding, NodeReport, Severity};

/// What the client concludes from its nodes' latest probes, recomputed when any node
/// records a new probe.
pub(crate) struct Verdicts {
    /// The sum of node probe versions these verdicts came from.
    version: u64,
    /// The cluster this client works in.
    pub(crate) adoption: Adoption,
    /// The adopted cluster's id, shared by every request of a fan-out.
    pub(crate) cluster_id: Option<Arc<str>>,
    /// Per node: why it may not vote, if it may not.
    exclusions: Vec<Option<String>>,
    /// Per node: why it must be repaired, if it is quarantined (and may be repaired).
    quarantine: Vec<Option<String>>,
    /// Whether some node's probe shows it sealed by a change of the node list (a running
    /// client then looks for the successor, `follow.rs`).
    pub(crate) sealed: bool,
}

impl Client {
    /// Probe every node now (PING, INFO, CONFIG GET) and report its findings, in node order.
    ///
    /// Strict mode excludes a node from every majority while it has an [`Severity::Unsafe`]
    /// finding; the `votes` field of each report says whether it currently counts.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn check(&self) -> Vec<NodeReport> {
        if !self.pinned {
            return Box::pin(self.current().check()).await;
        }
        let calls: Vec<(NodeId, NodeCall<()>)> = self
            .inner
            .nodes
            .iter()
            .map(|node| {
                let id = node.id;
                let node = node.clone();
                let call: NodeCall<()> = Box::pin(async move {
                    match node.reprobe().await {
                        Ok(_) => NodeOutcome::Applied(()),
                        Err(cause) => NodeOutcome::Unknown(cause),
                    }
                });
                (id, call)
            })
            .collect();
        let tally = fanout::fan_out(
            "check",
            self.inner.majority,
            Some(self.inner.config.node_timeout),
            Wait::All,
            calls,
            None,
        )
        .await;
        tally
            .results()
            .iter()
            .map(|r| {
                let mut report = self.report(r.node.0);
                if let NodeOutcome::Unknown(cause) = &r.outcome {
                    report.probe = None;
                    let why = match cause {
                        UnknownCause::Unreachable(e) => e.clone(),
                        other => other.to_string(),
                    };
                    report.findings = vec![Finding::Unreachable(why)];
                    report.votes = false;
                }
                report
            })
            .collect()
    }

    /// Build node `i`'s report from its latest probe.
    fn report(&self, i: usize) -> NodeReport {
        let verdicts = self.verdicts();
        self.report_with(i, &verdicts.adoption)
    }

    /// The cluster these nodes' descriptors name, judged against this client's node list.
    fn judge_adoption(&self) -> Adoption {
        self.judge_adoption_with(true)
    }

    /// As `judge_adoption`; `timeouts` false leaves the node timeout unjudged (`cluster init`
    /// raises the cluster's).
    pub(crate) fn judge_adoption_with(&self, timeouts: bool) -> Adoption {
        let inner = &self.inner;
        let ours = inner.config.node_names();
        let seen = self.seen_descriptors();
        if let Some(id) = &inner.config.adopt_as {
            // The old list's client of a resumed node-list change: the old cluster, where it
            // is seen (its nodes are sealed or of the old cluster still).
            return match seen.iter().flatten().find(|d| d.id == *id) {
                Some(d) => Adoption::Adopted(d.clone()),
                None => Adoption::Refused(format!(
                    "the cluster {id} this node-list change resumes from is on none of the \
                     nodes reached"
                )),
            };
        }
        let adoption = cluster::adopt(&ours, &seen, inner.config.cluster_identity);
        let adoption = if timeouts {
            self.judge_node_timeout(&self.seen_descriptors_per_server(), adoption)
        } else {
            adoption
        };
        match (&inner.config.cluster_pin, adoption) {
            (Some(pin), Adoption::Adopted(d)) if d.id != *pin && d.prev.as_ref() != Some(pin) => {
                Adoption::Refused(format!(
                    "these nodes form cluster {} ({}), but this client is pinned to cluster {pin}",
                    d.id,
                    d.describe()
                ))
            }
            (_, adoption) => adoption,
        }
    }

    /// Refuse an adopted cluster whose agreed node timeout is shorter than this client's:
    /// every repair waits the cluster's node timeout for writes in flight, so no client may
    /// count replies for longer (see [`cluster::agreed_node_timeout`]).
    fn judge_node_timeout(
        &self,
        seen: &[Result<cluster::Descriptor, String>],
        adoption: Adoption,
    ) -> Adoption {
        let Adoption::Adopted(d) = &adoption else {
            return adoption;
        };
        let ours = self.inner.config.node_timeout;
        let needed = self.inner.majority.needed();
        match cluster::agreed_node_timeout(seen, &d.id, needed) {
            Some(agreed) if ours > agreed => Adoption::Refused(format!(
                "this client's node timeout ({ours:?}) is longer than the node timeout of \
                 cluster {} ({agreed:?}), which every repair waits for writes in flight: use a \
                 node timeout of at most {agreed:?}, or raise the cluster's with `redquorum \
                 --node-timeout {ours:?} cluster init`",
                d.id,
            )),
            _ => adoption,
        }
    }

    /// The cluster descriptors this client's reachable nodes hold (unreadable ones as errors).
    /// As `seen_descriptors`, one per server: a server reached by two URLs (its run_id seen
    /// twice) counts once, as it votes once.
    fn seen_descriptors_per_server(&self) -> Vec<Result<cluster::Descriptor, String>> {
        let mut servers = std::collections::HashSet::new();
        self.inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0)
            .filter(|p| p.run_id.as_ref().is_none_or(|r| servers.insert(r.clone())))
            .filter_map(|p| p.cluster)
            .map(|raw| cluster::Descriptor::decode(&raw))
            .collect()
    }

    pub(crate) fn seen_descriptors(&self) -> Vec<Result<cluster::Descriptor, String>> {
        self.inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0.and_then(|p| p.cluster))
            .map(|raw| cluster::Descriptor::decode(&raw))
            .collect()
    }

    fn report_with(&self, i: usize, adoption: &Adoption) -> NodeReport {
        let inner = &self.inner;
        let snapshots: Vec<_> = inner.nodes.iter().map(|n| n.snapshot()).collect();
        let run_ids: Vec<Option<&str>> = snapshots
            .iter()
            .map(|(p, _)| p.as_ref().and_then(|p| p.run_id.as_deref()))
            .collect();
        let duplicates = duplicate_servers(&run_ids);
        let (probe, restarted_from) = snapshots.get(i).cloned().unwrap_or((None, None));
        let mut findings = match &probe {
            Some(p) => p.findings(inner.config.attest_fsync_always),
            None => vec![Finding::Unreachable(
                inner.nodes[i]
                    .last_error()
                    .unwrap_or_else(|| "not connected yet".into()),
            )],
        };
        if let Some(Some(first)) = duplicates.get(i) {
            findings.push(Finding::SameServerAs(*first));
        }
        if let (Some(p), true) = (&probe, inner.config.amnesia_protection) {
            if let Adoption::Refused(why) = adoption {
                findings.push(Finding::OtherCluster(why.clone()));
            } else {
                match cluster::standing(p.marker.as_deref(), p.run_id.as_deref(), adoption) {
                    Standing::Member => {}
                    Standing::Quarantined { reason, .. } => {
                        findings.push(Finding::Quarantined(reason))
                    }
                    Standing::Stranger(why) => findings.push(Finding::OtherCluster(why)),
                }
            }
        }
        if let (Some(prev), Some(cur)) = (
            restarted_from,
            probe.as_ref().and_then(|p| p.run_id.clone()),
        ) {
            findings.push(Finding::Restarted {
                previous: prev,
                current: cur,
            });
        }
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity()));
        let unsafe_found = findings.iter().any(|f| f.severity() == Severity::Unsafe);
        let votes =
            probe.is_some() && (inner.config.safety == SafetyMode::Permissive || !unsafe_found);
        NodeReport {
            node: NodeId(i),
            url: inner.urls[i].clone(),
            probe,
            findings,
            votes,
        }
    }

    /// The client's current verdicts: computed for all nodes at once and cached until any
    /// node records a new probe, so the per-request cost is one lock and an `Arc` clone.
    pub(crate) fn verdicts(&self) -> Arc<Verdicts> {
        let version: u64 = self.inner.nodes.iter().map(|n| n.probe_version()).sum();
        {
            let cache = self
                .inner
                .verdicts
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(v) = cache.as_ref().filter(|v| v.version == version) {
                return v.clone();
            }
        }
        let adoption = self.judge_adoption();
        let mut exclusions = Vec::with_capacity(self.inner.nodes.len());
        let mut quarantine = Vec::with_capacity(self.inner.nodes.len());
        for i in 0..self.inner.nodes.len() {
            let report = self.report_with(i, &adoption);
            let reasons: Vec<String> = report
                .findings
                .iter()
                .filter(|f| f.severity() == Severity::Unsafe)
                .map(ToString::to_string)
                .collect();
            exclusions.push((!report.votes).then(|| reasons.join("; ")));
            quarantine.push(report.findings.iter().find_map(|f| match f {
                Finding::Quarantined(why) => Some(why.clone()),
                _ => None,
            }));
        }
        let sealed = self.inner.nodes.iter().any(|n| {
            n.snapshot()
                .0
                .and_then(|p| p.marker)
                .is_some_and(|m| cluster::sealed_for(&m).is_some())
        });
        let verdicts = Arc::new(Verdicts {
            sealed,
            version,
            cluster_id: adoption.id().map(Arc::from),
            adoption,
            exclusions,
            quarantine,
        });
        let mut cache = self
            .inner
            .verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Verdicts from newer probes, stored meanwhile by another thread, stay.
        if cache.as_ref().is_some_and(|c| c.version > version) {
            return verdicts;
        }
        // Count each node whose verdict turns to quarantined, against the verdicts stored last
        // (under the lock: two threads judging at once count a change once).
        for (i, q) in verdicts.quarantine.iter().enumerate() {
            let before = cache
                .as_ref()
                .is_some_and(|c| c.quarantine.get(i).is_some_and(Option::is_some));
            if q.is_some() && !before {
                crate::metrics::node_quarantined(i);
            }
        }
        *cache = Some(verdicts.clone());
        verdicts
    }

    /// Why node `i` may not vote right now, if it may not.
    pub(crate) fn exclusion(&self, i: usize) -> Option<String> {
        self.verdicts().exclusions.get(i).cloned().flatten()
    }

    /// Why node `i` must be repaired before it votes, if it must (and may be).
    pub(crate) fn quarantine_reason(&self, i: usize) -> Option<String> {
        if !self.inner.config.amnesia_protection {
            return None;
        }
        self.verdicts().quarantine.get(i).cloned().flatten()
    }
}
