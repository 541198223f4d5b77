//! [`Client`]: the configured set of nodes, their safety verdicts, and the way every quorum
//! operation reaches them.
//!
//! Architecture invariant: every request to a node is a [`Request`] with its [`Step`]s, sent
//! by [`Client::send`] (which uses the one fan-out primitive in [`crate::quorum`]) or, for the
//! safety check, straight through that primitive. Nothing else sends to nodes.

mod request;
mod send;
mod verdicts;

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{self, Adoption};
use crate::config::{Config, ConfigError};
use crate::error::Error;
use crate::node::Node;
use crate::quorum::{Majority, NodeId, NodeOutcome, Tally};

pub(crate) use request::{
    decode, script_call, stale, Guard, NodeConn, NodeCtx, Request, ScriptCall, Step, Steps, Targets,
};
use verdicts::Verdicts;

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
    /// A client that only reads ([`Client::connect_read_only`]): it repairs no node.
    pub(crate) read_only: bool,
    /// One shared instance per type, for the layers above (the lock's extension batcher).
    shared: std::sync::Mutex<SharedMap>,
}

type SharedMap = std::collections::HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>;

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
    /// This client's one instance of `T`, made on first use: state that every handle on this
    /// client shares (the lock's extension batcher), without this layer knowing the type.
    pub(crate) fn shared<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.inner.shared.lock().unwrap_or_else(|p| p.into_inner());
        let any = map
            .entry(std::any::TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()))
            .clone();
        // The entry for T's id holds a T.
        any.downcast::<T>()
            .unwrap_or_else(|_| Arc::new(T::default()))
    }

    /// Validate `config`, log its warnings, and open connections to every node concurrently
    /// (waiting at most one node timeout). Unreachable nodes are not an error here: they are
    /// retried on every operation. Quarantined nodes are repaired. A client never sets up a
    /// cluster: on nodes where none is set up, [`Client::init_cluster`] (`redquorum cluster
    /// init`) does, once.
    ///
    /// **A changed node list is followed.** When a node-list change (`cluster change`)
    /// replaced the cluster of `config`'s list, the client works in the new cluster: its nodes
    /// are the ones the new cluster's descriptor lists (reached with `config`'s password, when
    /// all its URLs share one, and TLS settings), used only if they hold that descriptor, and
    /// only if every sealed old node names it (or a cluster it replaced). This holds when the
    /// number of nodes changed and when the removed nodes are gone; it is logged at warn and
    /// counted (`redquorum_cluster_follows_total`). Not guaranteed: a client connected before
    /// the change keeps its list; its operations fail once the old nodes are sealed, and a new
    /// `connect` (a restart) follows.
    ///
    /// # Errors
    /// [`Error::Config`] if the configuration is invalid;
    /// [`ConfigError::ClusterSetUp`] if a majority of the nodes answered and none of them is
    /// marked for a cluster (blank nodes, or nodes that all lost their data): the error names
    /// `cluster init`, and nothing was written;
    /// [`ConfigError::ClusterMismatch`] if the nodes belong to a cluster with another node list
    /// (or to different clusters), or the cluster's node timeout is shorter than this
    /// client's: the error names both; also if a successor is to be followed but the seals
    /// name another one, or its nodes do not hold it.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the half-built client (a repair it started
    /// goes on in the background).
    pub async fn connect(config: Config) -> Result<Client, Error> {
        let client = Self::open(config, false).await?.follow_successor().await?;
        // A client whose node list is not the cluster's is refused before it does anything.
        if let Adoption::Refused(why) = &client.verdicts().adoption {
            return Err(Error::Config(ConfigError::ClusterMismatch(why.clone())));
        }
        if let Some(why) = client.set_up_problem() {
            return Err(Error::Config(ConfigError::ClusterSetUp(why)));
        }
        client.repair_quarantined().await;
        Ok(client)
    }

    /// This client, or, when a change of the node list replaced its cluster, a client of the
    /// successor ([`cluster::follow`]): built from the successor's node list (the URLs the
    /// descriptor names, with this configuration's password and TLS settings), and used only
    /// if the new nodes hold the successor's descriptor. Logged and counted
    /// (`redquorum_cluster_follows_total`).
    async fn follow_successor(self) -> Result<Client, Error> {
        let config = &self.inner.config;
        let ours = config.node_names();
        if config.adopt_as.is_some() || !config.cluster_identity {
            return Ok(self);
        }
        let seals: Vec<String> = self
            .inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0.and_then(|p| p.marker))
            .filter_map(|m| cluster::sealed_for(&m).map(String::from))
            .collect();
        let successor = match cluster::follow(&ours, &self.seen_descriptors(), &seals) {
            cluster::Follow::Stay => return Ok(self),
            cluster::Follow::Refuse(why) => {
                return Err(Error::Config(ConfigError::ClusterMismatch(why)))
            }
            cluster::Follow::To(d) => d,
        };
        let next = Self::open(config.following(&successor.nodes)?, false).await?;
        match &next.verdicts().adoption {
            Adoption::Adopted(d) if d.id == successor.id => {}
            other => {
                return Err(Error::Config(ConfigError::ClusterMismatch(format!(
                    "the node list was changed to cluster {} ({}), but its nodes do not hold \
                     it ({other:?})",
                    successor.id,
                    successor.describe()
                ))))
            }
        }
        tracing::warn!(
            from = %ours.join(","),
            to = %successor.nodes.join(","),
            cluster = %successor.id,
            "the configured node list was replaced by a change of the node list: this client \
             follows the new cluster; update its configuration"
        );
        crate::metrics::cluster_followed();
        Ok(next)
    }

    /// A client that only reads, for inspection (`redquorum check`): it repairs no node and
    /// sets nothing up, and it is not refused by blank nodes or another cluster:
    /// [`Client::check`] reports them. Operations through it work as through
    /// [`Client::connect`]'s client, except that quarantined nodes stay unrepaired.
    ///
    /// # Errors
    /// [`Error::Config`] if the configuration is invalid.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the half-built client.
    pub async fn connect_read_only(config: Config) -> Result<Client, Error> {
        Self::open_with(config, true).await
    }

    /// Whether a cluster is set up on these nodes, as far as the nodes reached tell: None when
    /// it is (or too few nodes answered to tell), else why not, naming `cluster init`: a
    /// majority answered and none holds a marker (blank nodes, or nodes that all lost their
    /// data). Fewer than a majority marked (a set-up cut short, a majority lost) is left to
    /// the repair, whose deferral says why.
    pub fn set_up_problem(&self) -> Option<String> {
        if !self.inner.config.amnesia_protection || self.inner.config.implicit_set_up {
            return None;
        }
        let probes: Vec<_> = self
            .inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0)
            .collect();
        let needed = self.inner.majority.needed();
        let marked = probes.iter().filter(|p| p.marker.is_some()).count();
        (probes.len() >= needed && marked == 0).then(|| {
            format!(
                "no cluster is set up on these nodes ({} of {} answered, none of them marked \
                 for a cluster): {}",
                probes.len(),
                self.inner.nodes.len(),
                cluster::INIT_HINT
            )
        })
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
        let client = Self::open_with(config, false).await?;
        if repair {
            client.repair_quarantined().await;
        }
        Ok(client)
    }

    /// Build the client and reach its nodes (a `read_only` one never repairs).
    async fn open_with(config: Config, read_only: bool) -> Result<Client, Error> {
        config.validate()?;
        for w in config.warnings() {
            tracing::warn!("{w}");
        }
        let mut nodes = Vec::with_capacity(config.nodes.len());
        // One TLS configuration for every connect of every node of this client.
        let tls = Arc::new(crate::config::TlsConnector::new(config.tls.clone()));
        for (i, url) in config.nodes.iter().enumerate() {
            let node = Node::new(
                NodeId(i),
                url.clone(),
                &tls,
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
                majority: config.majority(),
                urls: config.nodes.iter().map(ToString::to_string).collect(),
                config,
                nodes,
                verdicts: std::sync::Mutex::new(None),
                read_only,
                shared: std::sync::Mutex::new(SharedMap::new()),
            }),
        };
        let warmup = client
            .send(
                Request::any_node("connect", Targets::All),
                Step::session(|_| async { Ok(NodeOutcome::Applied(())) }),
            )
            .await;
        tracing::debug!(reachable = warmup.applied(), "client connected");
        Ok(client)
    }

    /// Repair the nodes without a valid marker (a wiped or restarted node) now, so the first
    /// operation does not find them quarantined; waits at most one operation timeout.
    async fn repair_quarantined(&self) {
        let quarantined: Vec<usize> = (0..self.inner.nodes.len())
            .filter(|i| self.quarantine_reason(*i).is_some())
            .collect();
        // In tasks of their own: a repair of a large keyspace outlives this wait and goes
        // on in the background (the node votes once it is marked).
        let repairs: Vec<_> = quarantined
            .into_iter()
            .filter_map(|i| self.spawn_repair(i))
            .collect();
        if !repairs.is_empty() {
            let deadline = self.inner.config.operation_timeout;
            let _ = tokio::time::timeout(deadline, futures::future::join_all(repairs)).await;
        }
    }

    /// Driver clients of the voting-eligible nodes, for pub/sub wake-up hints (never used to
    /// decide anything).
    pub(crate) fn pubsub_clients(&self) -> Vec<redis::Client> {
        self.inner
            .nodes
            .iter()
            .filter_map(|n| n.driver_client())
            .collect()
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
        let ping = Step::unchecked(vec![redis::cmd("PING")], |_, reply| {
            decode::value::<String>(reply).map(|o| o.map(|_| ()))
        });
        self.decide(Request::vote("ping"), ping).await
    }
}
