//! [`Client`]: the configured set of nodes, their safety verdicts, and the way every quorum
//! operation reaches them.
//!
//! Architecture invariant: every request to a node goes through [`Client::fan_out`] (which
//! uses the one fan-out primitive in [`crate::quorum`]) or, for the safety check, straight
//! through that primitive. Nothing else sends to nodes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::cluster::{self, Adoption, Standing};
use crate::config::{Config, ConfigError, SafetyMode};
use crate::error::{Error, NoQuorum};
use crate::node::Node;
use crate::quorum::fanout::{self, NodeCall, Wait};
use crate::quorum::{Majority, NodeId, NodeOutcome, Tally, UnknownCause};
use crate::safety::{duplicate_servers, Finding, NodeReport, Severity};

/// Which nodes a raw fan-out asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Targets {
    All,
    Only(usize),
    /// The nodes whose bits are set (node `i` is bit `i`; at most 63 nodes).
    Set(u64),
}

impl Targets {
    fn includes(self, i: usize) -> bool {
        match self {
            Targets::All => true,
            Targets::Only(j) => i == j,
            Targets::Set(mask) => i < 64 && mask & (1u64 << i) != 0,
        }
    }

    /// The set of these nodes.
    pub(crate) fn of(nodes: &[usize]) -> Targets {
        Targets::Set(
            nodes
                .iter()
                .filter(|i| **i < 64)
                .fold(0, |m, i| m | (1u64 << i)),
        )
    }
}

/// Which servers (by run_id) nodes of one fan-out already reached, and through which node.
type Claims = Arc<std::sync::Mutex<Vec<(Arc<str>, usize)>>>;

/// What every per-node call of one fan-out shares.
struct NodeCallSetup {
    node_timeout: Duration,
    voting_only: bool,
    cluster_id: Option<Arc<str>>,
    claims: Claims,
}

/// One node's connection, handed to a quorum operation's per-node step.
pub(crate) struct NodeConn {
    /// The node's position in the configuration.
    pub(crate) node: usize,
    pub(crate) conn: MultiplexedConnection,
    /// The marker value this node must hold for its vote to count (`<run_id>/<cluster id>`,
    /// see [`crate::cluster`]), or `*` when amnesia protection is off. It also names the
    /// node's incarnation (it changes when the server restarts).
    pub(crate) marker: Arc<str>,
    /// The server's run_id when this connection was opened.
    pub(crate) run_id: Arc<str>,
}

impl NodeConn {
    /// A pipeline that first reads the node's marker: a read that decides something runs
    /// behind it, and [`marker_holds`](Self::marker_holds) tells whether its answer counts
    /// (a node emptied by FLUSHALL, or swapped behind a proxy, is caught at once rather than
    /// at its next probe).
    pub(crate) fn checked_pipe(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(crate::keys::fixed_key(crate::keys::KeyKind::Marker));
        pipe
    }

    /// Whether the marker read by [`checked_pipe`](Self::checked_pipe) is the expected one.
    pub(crate) fn marker_holds(&self, marker: Option<&str>) -> bool {
        &*self.marker == "*" || marker == Some(&*self.marker)
    }

    /// The outcome of a read whose marker check failed.
    pub(crate) fn stale<T>(&self) -> NodeOutcome<T> {
        NodeOutcome::Unknown(UnknownCause::Excluded(
            "its marker changed (data lost, or another server): it votes again once repaired"
                .into(),
        ))
    }
}

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
}

/// A handle on N independent Redis nodes. Cheap to clone; clones share connections.
///
/// Build it with [`Client::connect`]. It never fails because nodes are down: connections are
/// opened lazily, re-opened after failures, and a minority of absent nodes is expected.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) urls: Vec<String>,
    pub(crate) majority: Majority,
    /// Cached verdicts (cluster adoption, voting, quarantine).
    verdicts: std::sync::Mutex<Option<Arc<Verdicts>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.inner.urls)
            .field("majority", &self.inner.majority.needed())
            .field("safety", &self.inner.config.safety)
            .finish()
    }
}

impl Client {
    /// Validate `config`, log its warnings, and open connections to every node concurrently
    /// (waiting at most one node timeout). Unreachable nodes are not an error here: they are
    /// retried on every operation. Quarantined nodes are repaired; on a brand-new cluster
    /// (every node reachable, none marked, no data) the nodes are marked as one cluster, whose
    /// descriptor (the node list) every node then holds (see [`crate::cluster`]).
    ///
    /// # Errors
    /// [`Error::Config`] if the configuration is invalid, or
    /// [`ConfigError::ClusterMismatch`] if the nodes belong to a cluster with another node list
    /// (or to different clusters): the error names both lists.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the half-built client.
    pub async fn connect(config: Config) -> Result<Client, Error> {
        let client = Self::open(config, true).await?;
        // A client whose node list is not the cluster's is refused before it does anything.
        if let Adoption::Refused(why) = &client.verdicts().adoption {
            return Err(Error::Config(ConfigError::ClusterMismatch(why.clone())));
        }
        Ok(client)
    }

    /// The cluster this client works in (the descriptor its nodes hold), once known.
    pub fn cluster(&self) -> Option<cluster::Descriptor> {
        match &self.verdicts().adoption {
            Adoption::Adopted(d) => Some(d.clone()),
            _ => None,
        }
    }

    /// Build the client and reach its nodes; `repair` also repairs quarantined nodes at once.
    pub(crate) async fn open(config: Config, repair: bool) -> Result<Client, Error> {
        config.validate()?;
        for w in config.warnings() {
            tracing::warn!("{w}");
        }
        let mut nodes = Vec::with_capacity(config.nodes.len());
        for (i, url) in config.nodes.iter().enumerate() {
            let node = Node::new(
                NodeId(i),
                url.clone(),
                config.connect_timeout,
                // Connecting and probing run in the background, shared by every request
                // waiting for the node; give them more room than one request so that a loaded
                // node can still rejoin.
                (config.node_timeout * 4)
                    .max(Duration::from_secs(1))
                    .min(config.operation_timeout.max(config.node_timeout)),
            )
            .map_err(|reason| {
                Error::Config(crate::ConfigError::MalformedUrl {
                    index: i,
                    url: url.to_string(),
                    reason,
                })
            })?;
            nodes.push(Arc::new(node));
        }
        let client = Client {
            inner: Arc::new(Inner {
                majority: match config.quorum_override {
                    Some(needed) => Majority::unsafe_quorum_for_tests(nodes.len(), needed),
                    None => Majority::of(nodes.len()),
                },
                urls: config.nodes.iter().map(ToString::to_string).collect(),
                config,
                nodes,
                verdicts: std::sync::Mutex::new(None),
            }),
        };
        let warmup = client
            .fan_out_raw("connect", Wait::All, Targets::All, None, |_| async {
                Ok(NodeOutcome::Applied(()))
            })
            .await;
        tracing::debug!(reachable = warmup.applied(), "client connected");
        // Nodes without a valid marker (a new cluster, a wiped or restarted node) are
        // repaired now, so the first operation does not find them quarantined.
        let quarantined: Vec<usize> = (0..client.inner.nodes.len())
            .filter(|i| client.quarantine_reason(*i).is_some())
            .collect();
        if repair && !quarantined.is_empty() {
            // In tasks of their own: a repair of a large keyspace outlives this wait and goes
            // on in the background (the node votes once it is marked).
            let deadline = client.inner.config.operation_timeout;
            let repairs: Vec<_> = quarantined
                .into_iter()
                .filter_map(|i| client.spawn_repair(i))
                .collect();
            let _ = tokio::time::timeout(deadline, futures::future::join_all(repairs)).await;
        }
        Ok(client)
    }

    /// Driver clients of the voting-eligible nodes, for pub/sub wake-up hints (never used to
    /// decide anything).
    pub(crate) fn pubsub_clients(&self) -> Vec<redis::Client> {
        self.inner.nodes.iter().map(|n| n.driver_client()).collect()
    }

    /// The majority of the configured nodes.
    pub fn majority(&self) -> Majority {
        self.inner.majority
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Redacted URLs of the nodes, in node order.
    pub fn node_urls(&self) -> &[String] {
        &self.inner.urls
    }

    /// PING every node; succeeds when a majority of the configured nodes that are allowed to
    /// vote answered.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] naming each node's problem.
    ///
    /// # Cancel safety
    /// Cancel-safe (a PING has no effect).
    pub async fn ping(&self) -> Result<Tally<()>, Error> {
        let tally = self
            .fan_out("ping", Wait::Decided, |mut nc: NodeConn| async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut nc.conn)
                    .await?;
                Ok(NodeOutcome::Applied(()))
            })
            .await;
        self.require_majority("ping", tally, |_| String::new())
    }

    /// Probe every node now (PING, INFO, CONFIG GET) and report its findings, in node order.
    ///
    /// Strict mode excludes a node from every majority while it has an [`Severity::Unsafe`]
    /// finding; the `votes` field of each report says whether it currently counts.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn check(&self) -> Vec<NodeReport> {
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
            self.inner.config.node_timeout,
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
        let inner = &self.inner;
        let ours = inner.config.node_names();
        let seen: Vec<Result<cluster::Descriptor, String>> = inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0.and_then(|p| p.cluster))
            .map(|raw| cluster::Descriptor::decode(&raw))
            .collect();
        let adoption = cluster::adopt(&ours, &seen, inner.config.cluster_identity);
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
        let verdicts = Arc::new(Verdicts {
            version,
            cluster_id: adoption.id().map(Arc::from),
            adoption,
            exclusions,
            quarantine,
        });
        *self
            .inner
            .verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(verdicts.clone());
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

    /// Turn a tally into `Ok` when a majority applied, or a [`NoQuorum`] error.
    pub(crate) fn require_majority<T>(
        &self,
        op: &'static str,
        tally: Tally<T>,
        rejected: impl Fn(&T) -> String,
    ) -> Result<Tally<T>, Error> {
        if tally.reached() {
            Ok(tally)
        } else {
            Err(NoQuorum::from_tally(op, &tally, &self.inner.urls, rejected).into())
        }
    }

    /// Send `op` to every voting node concurrently through the fan-out primitive.
    ///
    /// Per node: get (or open and probe) its connection, skip it if it may not vote, run
    /// `op`, all within the per-node deadline. A timed-out or broken connection is discarded.
    /// `op` decides from the reply whether the node applied or rejected the operation.
    pub(crate) async fn fan_out<T, F, Fut>(&self, name: &'static str, wait: Wait, op: F) -> Tally<T>
    where
        T: Send + 'static,
        F: Fn(NodeConn) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        self.fan_out_with(name, wait, None, true, Targets::All, None, op)
            .await
    }

    /// To every node (voting or not), awaiting all of them, but reporting the number of nodes
    /// that applied it on `decided` as soon as the outcome is decided. Run it in a task of its
    /// own to return at the decision while slow nodes are still being reached.
    pub(crate) async fn fan_out_all_reporting<T, F, Fut>(
        &self,
        name: &'static str,
        deadline: Duration,
        decided: tokio::sync::oneshot::Sender<usize>,
        op: F,
    ) -> Tally<T>
    where
        T: Send + 'static,
        F: Fn(NodeConn) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        self.fan_out_with(
            name,
            Wait::All,
            Some(deadline),
            false,
            Targets::All,
            Some(decided),
            op,
        )
        .await
    }

    /// Like [`fan_out`](Self::fan_out) with a per-node deadline of its own (leases use a
    /// small fraction of their TTL).
    pub(crate) async fn fan_out_within<T, F, Fut>(
        &self,
        name: &'static str,
        wait: Wait,
        deadline: Duration,
        op: F,
    ) -> Tally<T>
    where
        T: Send + 'static,
        F: Fn(NodeConn) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        self.fan_out_with(name, wait, Some(deadline), true, Targets::All, None, op)
            .await
    }

    /// Like [`fan_out`](Self::fan_out) but also to nodes that may not vote (for reads that
    /// repair and check nodes), optionally skipping one node and with a longer deadline.
    pub(crate) async fn fan_out_raw<T, F, Fut>(
        &self,
        name: &'static str,
        wait: Wait,
        targets: Targets,
        deadline: Option<Duration>,
        op: F,
    ) -> Tally<T>
    where
        T: Send + 'static,
        F: Fn(NodeConn) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        self.fan_out_with(name, wait, deadline, false, targets, None, op)
            .await
    }

    // Private plumbing behind the four public shapes above; each argument is one of their knobs.
    #[allow(clippy::too_many_arguments)]
    async fn fan_out_with<T, F, Fut>(
        &self,
        name: &'static str,
        wait: Wait,
        deadline: Option<Duration>,
        voting_only: bool,
        targets: Targets,
        decided: Option<tokio::sync::oneshot::Sender<usize>>,
        op: F,
    ) -> Tally<T>
    where
        T: Send + 'static,
        F: Fn(NodeConn) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>> + Send + 'static,
    {
        let node_timeout = deadline.unwrap_or(self.inner.config.node_timeout);
        // One cluster id for the whole fan-out, and one vote per server: the first node of
        // this fan-out to reach a server claims it, so a second URL to the same server is
        // excluded from the very first fan-out (before any probe comparison could notice).
        let cluster_id = self.verdicts().cluster_id.clone();
        let claims: Claims = Arc::default();
        let calls: Vec<(NodeId, NodeCall<T>)> = self
            .inner
            .nodes
            .iter()
            .map(|node| {
                let call: NodeCall<T> = if !targets.includes(node.id.0) {
                    Box::pin(futures::future::ready(NodeOutcome::Unknown(
                        UnknownCause::Excluded("not asked by this operation".into()),
                    )))
                } else {
                    Box::pin(self.clone().call_node(
                        node.clone(),
                        NodeCallSetup {
                            node_timeout,
                            voting_only,
                            cluster_id: cluster_id.clone(),
                            claims: claims.clone(),
                        },
                        op.clone(),
                    ))
                };
                (node.id, call)
            })
            .collect();
        // The backstop is slightly longer than the node's own deadline, so the node's own
        // (which also discards the connection) fires first.
        fanout::fan_out(
            name,
            self.inner.majority,
            node_timeout + Duration::from_millis(5),
            wait,
            calls,
            decided,
        )
        .await
    }

    async fn call_node<T, F, Fut>(
        self,
        node: Arc<Node>,
        setup: NodeCallSetup,
        op: F,
    ) -> NodeOutcome<T>
    where
        F: Fn(NodeConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<NodeOutcome<T>>>,
    {
        let NodeCallSetup {
            node_timeout,
            voting_only,
            cluster_id,
            claims,
        } = setup;
        let mut generation = None;
        let outcome = tokio::time::timeout(node_timeout, async {
            let lease = match node.connection().await {
                Ok(l) => l,
                Err(cause) => return NodeOutcome::Unknown(cause),
            };
            generation = Some(lease.generation);
            if voting_only {
                if let Some(why) = self.exclusion(node.id.0) {
                    if self.quarantine_reason(node.id.0).is_some() {
                        self.spawn_repair(node.id.0);
                    }
                    return NodeOutcome::Unknown(UnknownCause::Excluded(why));
                }
            }
            // (Raw fan-outs, for repair and checks, see every URL and count servers
            // themselves.)
            if voting_only && self.inner.config.cluster_identity && !lease.run_id.is_empty() {
                let mut claims = claims.lock().unwrap_or_else(|p| p.into_inner());
                match claims.iter().find(|(r, _)| *r == lease.run_id) {
                    Some((_, first)) if *first != node.id.0 => {
                        return NodeOutcome::Unknown(UnknownCause::Excluded(format!(
                            "the same server as node {first} (run_id), counted once"
                        )));
                    }
                    Some(_) => {}
                    None => claims.push((lease.run_id.clone(), node.id.0)),
                }
            }
            self.maybe_reprobe(&node);
            let marker: Arc<str> = if self.inner.config.amnesia_protection {
                cluster::marker_value(&lease.run_id, cluster_id.as_deref().unwrap_or("")).into()
            } else {
                "*".into()
            };
            let conn = NodeConn {
                node: node.id.0,
                conn: lease.conn,
                marker,
                run_id: lease.run_id.clone(),
            };
            match op(conn).await {
                Ok(outcome) => outcome,
                Err(e) => NodeOutcome::Unknown(node.failed(lease.generation, &e)),
            }
        })
        .await;
        match outcome {
            Ok(o) => o,
            Err(_elapsed) => {
                if let Some(g) = generation {
                    node.discard(g);
                }
                NodeOutcome::Unknown(UnknownCause::Timeout)
            }
        }
    }

    fn maybe_reprobe(&self, node: &Arc<Node>) {
        if node.probe_is_stale(self.inner.config.recheck_interval) && node.begin_reprobe() {
            let node = node.clone();
            let timeout = self.inner.config.node_timeout;
            tokio::spawn(async move {
                let _ = tokio::time::timeout(timeout, node.reprobe()).await;
                node.end_reprobe();
            });
        }
    }
}
