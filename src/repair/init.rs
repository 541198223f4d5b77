//! `cluster init`: setting a cluster up, explicitly, and raising its node timeout.

use std::sync::Arc;
use std::time::Duration;

use super::decide::{self, SetUp};
use super::{Census, Mark, RepairClaim};
use crate::client::{decode, script_call, Client, Guard, Request, Steps, Targets};
use crate::cluster::{self, Descriptor};
use crate::config::{Config, ConfigError};
use crate::error::Error;
use crate::keys::{fixed_key, KeyKind};
use crate::scripts::CLUSTER_INIT;

/// How often `cluster init` reads the nodes again while one does not answer.
const CENSUS_RETRY: Duration = Duration::from_millis(200);

/// What [`Client::init_cluster`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterInit {
    /// The cluster as its nodes hold it now.
    pub cluster: Descriptor,
    /// Whether this call set the cluster up (false: a majority was marked for it already).
    pub created: bool,
    /// Nodes this call marked.
    pub marked: usize,
    /// Nodes whose descriptor this call gave a longer node timeout.
    pub raised: usize,
    /// The cluster's node timeout now: the longest that a majority of its nodes record (see
    /// [`Client::init_cluster`]).
    pub node_timeout: Option<Duration>,
}

impl Client {
    /// Set up a cluster on the nodes of `config`, explicitly and once (`redquorum cluster
    /// init`): every other way in ([`Client::connect`], every command) refuses blank nodes.
    /// Idempotent: on a cluster already set up it changes nothing but the node timeout.
    ///
    /// - **Blank nodes** (every configured node answers, none holds a marker of another
    ///   cluster or any redquorum data, fewer than a majority are marked): each node is marked
    ///   for the cluster of this node list, whose descriptor records `config`'s node timeout.
    ///   A set-up cut short (some nodes marked) is finished the same way.
    /// - **A cluster set up already** (a majority of the nodes marked for the cluster these
    ///   nodes' descriptors name): nothing is marked. If `config`'s node timeout is longer
    ///   than the cluster's, the descriptors are raised to it (never lowered); clients may
    ///   use it once a majority of the nodes record it.
    ///
    /// The node timeout is the cluster's: every repair waits it for writes in flight, so a
    /// client with a longer one is refused ([`ConfigError::ClusterMismatch`]).
    ///
    /// # Errors
    /// [`ConfigError::ClusterSetUp`] when nothing can be set up: a node did not answer within
    /// the operation timeout (init reads the nodes again every 200 ms until then), a node
    /// holds data or another cluster's marker while fewer than a majority are marked (a
    /// majority lost its data: empty every node first to start over, losing what they hold),
    /// or the pin names another cluster; [`ConfigError::ClusterMismatch`] when the nodes form
    /// a cluster with another node list; [`Error::Config`] for an invalid configuration;
    /// [`Error::NoQuorum`] when fewer than a majority could be marked.
    ///
    /// # Cancel safety
    /// Cancel-safe: an interrupted set-up leaves some nodes marked, and running it again
    /// finishes it; clients refuse the nodes until a majority is marked.
    pub async fn init_cluster(config: Config) -> Result<ClusterInit, Error> {
        // Bound to its list: a set-up never follows a change.
        let client = Client::open(config, false).await?.current();
        client.set_up().await
    }

    /// `cluster init` through this client (see [`Client::init_cluster`]).
    pub(super) async fn set_up(&self) -> Result<ClusterInit, Error> {
        let inner = &self.inner;
        let needed = inner.majority.needed();
        let census = self.census_of_every_node().await;
        let (d, created) = self.plan_set_up(&census)?;
        let marked = if created {
            self.mark_blank(&d, &census).await?
        } else {
            0
        };
        // The descriptors as they are now (the marks wrote some): read again only if it marked.
        let census = if created { self.census().await } else { census };
        let stored: Vec<(usize, String)> = census
            .iter()
            .filter_map(|c| Some((c.node, c.descriptor.clone()?)))
            .collect();
        let raised = self.raise(&d, stored).await;
        for n in &inner.nodes {
            let _ = tokio::time::timeout(inner.config.node_timeout, n.reprobe()).await;
        }
        let seen = self.seen_descriptors();
        let ready = seen.iter().flatten().filter(|s| s.id == d.id).count();
        if ready < needed {
            return Err(Error::Config(ConfigError::ClusterSetUp(format!(
                "cluster init: only {ready} of {} nodes hold cluster {} now, {needed} must: run \
                 it again once every node answers",
                inner.nodes.len(),
                d.id
            ))));
        }
        let node_timeout = cluster::agreed_node_timeout(&seen, &d.id, needed);
        tracing::info!(cluster = %d.id, created, marked, raised, "cluster init");
        Ok(ClusterInit {
            cluster: d,
            created,
            marked,
            raised,
            node_timeout,
        })
    }

    /// The census, read again every [`CENSUS_RETRY`] while some node does not answer and the
    /// answers so far do not decide (a node just started may not accept connections yet: an
    /// operator's `docker compose up` then `cluster init`), until the operation timeout. It
    /// only reads; each census gets only the time left.
    async fn census_of_every_node(&self) -> Vec<Census> {
        let give_up = tokio::time::Instant::now() + self.inner.config.operation_timeout;
        loop {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            let census = self
                .census_within(left.max(self.inner.config.node_timeout))
                .await;
            let waiting = matches!(self.set_up_plan(&census), Ok(SetUp::Incomplete { .. }));
            if !waiting || tokio::time::Instant::now() + CENSUS_RETRY >= give_up {
                return census;
            }
            tokio::time::sleep(CENSUS_RETRY).await;
        }
    }

    /// The refusal when some node did not answer the census: each silent node and why, and
    /// that no node was marked.
    fn silent_nodes(&self, census: &[Census], answered: usize, nodes: usize) -> Error {
        let silent: Vec<String> = self
            .inner
            .nodes
            .iter()
            .filter(|n| !census.iter().any(|c| c.node == n.id.0))
            .map(|n| {
                let why = n.last_error().unwrap_or_else(|| "no answer in time".into());
                format!("node {} ({}): {why}", n.id.0, n.url.redacted())
            })
            .collect();
        Error::Config(ConfigError::ClusterSetUp(format!(
            "cluster init needs every node to answer: {answered} of {nodes} did within {:?} ({}); \
             no node was marked: run it again once every node answers",
            self.inner.config.operation_timeout,
            silent.join("; ")
        )))
    }

    /// What `cluster init` decides from `census` (see [`decide::set_up`]), or a refusal of
    /// another cluster's node list.
    fn set_up_plan(&self, census: &[Census]) -> Result<SetUp, Error> {
        let inner = &self.inner;
        let adoption = self.judge_adoption_with(false);
        if let cluster::Adoption::Refused(why) = &adoption {
            return Err(Error::Config(ConfigError::ClusterMismatch(why.clone())));
        }
        Ok(decide::set_up(
            &adoption,
            census,
            inner.majority.needed(),
            inner.nodes.len(),
            &inner.config.node_names(),
            inner.config.cluster_pin.as_deref(),
        ))
    }

    /// What `cluster init` does after `census`: the cluster (with this client's node timeout
    /// at least) and whether its nodes are to be marked, or why nothing can be set up.
    fn plan_set_up(&self, census: &[Census]) -> Result<(Descriptor, bool), Error> {
        let ours = self.inner.config.node_timeout;
        match self.set_up_plan(census)? {
            SetUp::Refuse(why) => Err(Error::Config(ConfigError::ClusterSetUp(format!(
                "cluster init: {why}"
            )))),
            SetUp::Incomplete { answered, nodes } => {
                Err(self.silent_nodes(census, answered, nodes))
            }
            SetUp::Mark(d) => Ok((d.with_node_timeout_at_least(ours), true)),
            SetUp::Exists(d) => Ok((d.with_node_timeout_at_least(ours), false)),
        }
    }

    /// Mark the unmarked nodes of `census` for cluster `d`, each under a repair claim taken
    /// before the decision is checked again: the mark (`mark.lua`) lands only while the node
    /// still carries this claim, so a mark that arrives late (this process was frozen, the
    /// request was delayed) on a node that became a member since and lost its data finds no
    /// claim (a FLUSHALL removed it, or another set-up took it over) and writes nothing.
    /// Returns how many nodes were marked.
    async fn mark_blank(&self, d: &Descriptor, census: &[Census]) -> Result<usize, Error> {
        let claims: Vec<(usize, RepairClaim)> = census
            .iter()
            .filter(|c| c.marker.is_none())
            .map(|c| (c.node, RepairClaim::new(self.clone(), c.node, None)))
            .collect();
        let taken = futures::future::join_all(claims.iter().map(|(_, c)| c.take())).await;
        let held: Vec<&(usize, RepairClaim)> = claims
            .iter()
            .zip(taken)
            .filter_map(|(c, t)| t.then_some(c))
            .collect();
        // The decision again, under the claims (nothing else writes a claimed blank node).
        let census = self.census().await;
        let decided = self.plan_set_up(&census);
        if !matches!(&decided, Ok((again, true)) if again.id == d.id) {
            for (_, claim) in &held {
                claim.release().await;
            }
            return decided.map(|_| 0);
        }
        self.copy_event(crate::config::CopyEvent::InitDecided).await;
        let mut marked = 0;
        for (node, claim) in held {
            let blank = census
                .iter()
                .find(|c| c.node == *node && c.marker.is_none());
            let done = match blank {
                Some(c) => {
                    let mark = Arc::new(Mark {
                        run_id: c.run_id.clone(),
                        descriptor: d.encode(),
                        marker: cluster::marker_value(
                            &c.run_id,
                            self.epoch(claim).as_deref(),
                            &d.id,
                        ),
                        claim: self.copy_target(&c.run_id, claim).claim,
                    });
                    self.mark(Targets::Only(*node), mark).await.contains(node)
                }
                None => false,
            };
            if done {
                marked += 1;
            } else {
                claim.release().await;
            }
        }
        Ok(marked)
    }

    /// Give every marked node whose descriptor is `d`'s with a shorter node timeout `d`'s
    /// (a compare-and-set on the stored descriptor, `stored`, as the census read it; a node
    /// without a marker is never touched). Returns how many were raised.
    async fn raise(&self, d: &Descriptor, stored: Vec<(usize, String)>) -> usize {
        let raised = d.encode();
        let stale: Arc<Vec<(usize, String)>> = Arc::new(
            stored
                .into_iter()
                .filter(|(_, raw)| {
                    Descriptor::decode(raw)
                        .is_ok_and(|s| s.id == d.id && s.node_timeout_ms < d.node_timeout_ms)
                })
                .collect(),
        );
        if stale.is_empty() {
            return 0;
        }
        let steps = Steps::per_node(move |ctx| {
            let (_, old) = stale.iter().find(|(n, _)| *n == ctx.node)?;
            let call = script_call(
                &CLUSTER_INIT,
                Guard::None("raises a marked node's descriptor, compare-and-set"),
            )
            .marker_key()
            .key(fixed_key(KeyKind::Cluster))
            .arg(&raised)
            .arg(old);
            Some(call.decode(|_, v| decode::one_applied(v)))
        });
        let request = Request::any_node("cluster.raise", Targets::All)
            .within(self.inner.config.operation_timeout);
        self.send(request, steps).await.applied()
    }
}
