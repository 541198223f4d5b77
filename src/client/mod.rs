//! [`Client`]: the configured set of nodes, their safety verdicts, and the way every quorum
//! operation reaches them.
//!
//! Architecture invariant: every request to a node is a [`Request`] with its [`Step`]s, sent
//! by [`Client::send`] (which uses the one fan-out primitive in [`crate::quorum`]) or, for the
//! safety check, straight through that primitive. Nothing else sends to nodes.
//!
//! # A running client follows a change of its node list
//!
//! ## How it works
//! 1. Every clone of a [`Client`] shares one cell holding the node list in use: an `Inner`
//!    with the nodes, their connections, probes and verdicts, the configuration and the
//!    majority. A request reads the cell once, when it starts (`Client::current`: a *pinned*
//!    handle), and runs on that list to its end: its per-node calls, the verdicts that say who
//!    votes, the marker each node must hold and the majority its tally counts with all come
//!    from the same `Inner`. A repair, a set-up and a change of the node list each run on one
//!    pinned handle from start to end, and a pinned handle never follows.
//! 2. A request of a user's handle that finds no majority while some node was excluded from
//!    it (sealed and re-marked nodes fail the marker check at once, and a refused ID proposal
//!    or lock read re-probes its node; a timeout or a refusal alone says nothing of a change),
//!    or any request while a probe shows a sealed node (also one that succeeds: a bare
//!    majority of the old list), starts a look for a successor in the background (`follow.rs`: one look at a time
//!    per client, at most once per four node timeouts or a second, since a contended lock's
//!    waiters see refusals all the time). The request
//!    itself returns as before: a request without a majority costs its deadline, no more.
//! 3. The look re-probes the list's nodes ([`Client::check`]) and judges them with
//!    `Client::successor`, the code [`Client::connect`] runs: the successor is the newest
//!    descriptor that descends from a cluster of exactly this list, every seal must name it or
//!    one of its predecessors (`cluster::follow`), and a client built from its node list (this
//!    configuration's password and TLS settings) must adopt it, i.e. its nodes hold its
//!    descriptor (not necessarily marked yet: a change interrupted before its marks is
//!    followed, and the old majority is sealed either way). Only then is the cell's list replaced, whole, and the
//!    next request of every clone runs on the new one; its unmarked nodes are repaired in the
//!    background as at connect. A refused look is logged at warn and changes nothing.
//!
//! ## Guarantees
//! - A request runs entirely on one list: no tally mixes the votes of two lists or counts one
//!   list's votes against the other's majority. The switch is one pointer store.
//! - Following adds nothing a node decides: every vote on the new list is cast by a node marked
//!   for the successor, under its marker check, as for a client configured with the new list.
//!   The change's own argument (`src/repair/mod.rs`: seal a majority of the old nodes, wait
//!   one node timeout, copy from the sealed majority, mark) therefore covers a following
//!   client unchanged, and no old node accepts anything once sealed: nothing is held silently
//!   on the old list.
//! - A lease granted on the old list and extended on the new one: the copy moves lease keys
//!   (holder value, version, token), fences and floors from a sealed majority before any new
//!   node votes, so the holder's copy is on a majority of the new list; `lock_extend.lua` there
//!   compares its value and token like on any node. Between the seal and the follow its
//!   extensions fail as at any loss of majority: the guard's validity runs down, and `lost()`
//!   fires only if the switch takes longer than the validity left (the TTL minus drift since
//!   its last extension), never later. A group's views, beats and leader lease, and a pool's
//!   lists, are copied likewise (views by their compare-and-set, beats at their highest
//!   sequence), so a member keeps its index and assignment under the same bound.
//! - Majorities: a tally counts with its own list's majority ([`Tally::majority`]);
//!   [`Client::majority`] and [`Client::node_urls`] give the list in use now.
//! - Per-node state: probes, verdicts, quarantine and repairs belong to a list; the new one
//!   starts with its own probes, and a repair in flight on the old one finishes there (its
//!   writes are refused by the seals). Node numbers (the `node` label of metrics, `NoQuorum`'s
//!   problems) are positions in the list in use: after a follow, a position may name another
//!   server.
//!
//! ## Not guaranteed
//! - A successor no reachable old node shows (a change to nodes disjoint from the old ones:
//!   only the seals name it) is not followed, at connect or while running.
//! - The requests that meet the sealed list before the look ends fail (they ran on the old
//!   list); calls that retry (an acquisition that waits, ID rounds, extensions, beats) go on
//!   on the new list, a single attempt (`try_acquire`) returns its error.
//! - A lock's watch of an abandoned lease grows with a longer list but is never shortened:
//!   after a shrink its entries beyond the new list stay, which can make a waiter try a round
//!   early (each node's script decides, so it costs a refused round, never a grant).

mod follow;
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
///
/// **A running client follows a node-list change.** When its operations meet a sealed
/// cluster (`redquorum cluster change`), the client checks for the successor exactly as
/// [`Client::connect`] does and, once the successor is verified, every later request of every
/// clone goes to the new list; a request runs on one list from start to end (see the module
/// docs of `src/client/mod.rs`).
#[derive(Clone)]
pub struct Client {
    /// The node list this handle works on: for a user's handle, the list it was built with
    /// (every request takes the current one from `cell`); for a `pinned` handle, the one list
    /// a request, a repair or a change runs on from start to end.
    pub(crate) inner: Arc<Inner>,
    /// What every clone shares: the current node list, the shared instances, the follow.
    cell: Arc<Cell>,
    /// Whether this handle is bound to `inner` ([`Client::current`]): its requests never
    /// switch lists and never start a follow.
    pub(crate) pinned: bool,
}

/// What every clone of a client shares, whatever node list it works on.
pub(crate) struct Cell {
    /// The node list every new request runs on; replaced whole by a follow.
    current: std::sync::RwLock<Arc<Inner>>,
    /// One shared instance per type, for the layers above (the lock's extension batcher).
    shared: std::sync::Mutex<SharedMap>,
    /// Whether a running client follows a change of its node list (see `follow.rs`).
    follows: bool,
    /// One follow at a time, and when the last one looked.
    follow: tokio::sync::Mutex<follow::FollowState>,
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
}

type SharedMap = std::collections::HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.current().inner;
        f.debug_struct("Client")
            .field("nodes", &inner.urls)
            .field("majority", &inner.majority.needed())
            .field("safety", &inner.config.safety)
            .finish()
    }
}

impl Client {
    /// This client's one instance of `T`, made on first use: state that every handle on this
    /// client shares (the lock's extension batcher), without this layer knowing the type.
    pub(crate) fn shared<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.cell.shared.lock().unwrap_or_else(|p| p.into_inner());
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
    /// counted (`redquorum_cluster_follows_total`). A client connected before the change
    /// follows it the same way while it runs (see [`Client`]); the operations that meet the
    /// sealed list before the successor is verified fail as any operation without a majority.
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
        let client = Self::open(config, false).await?;
        let client = match client.successor().await? {
            Some(next) => {
                next.followed_from(&client);
                next
            }
            None => client,
        };
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

    /// A client of the successor, when a change of the node list replaced this client's
    /// cluster ([`cluster::follow`]): built from the successor's node list (the URLs the
    /// descriptor names, with this configuration's password and TLS settings), and returned
    /// only if the new nodes hold the successor's descriptor. None when there is nothing to
    /// follow. Judged from the nodes' latest probes.
    pub(crate) async fn successor(&self) -> Result<Option<Client>, Error> {
        let config = &self.inner.config;
        let ours = config.node_names();
        if config.adopt_as.is_some() || !config.cluster_identity {
            return Ok(None);
        }
        let seals: Vec<String> = self
            .inner
            .nodes
            .iter()
            .filter_map(|n| n.snapshot().0.and_then(|p| p.marker))
            .filter_map(|m| cluster::sealed_for(&m).map(String::from))
            .collect();
        let successor = match cluster::follow(&ours, &self.seen_descriptors(), &seals) {
            cluster::Follow::Stay => return Ok(None),
            cluster::Follow::Refuse(why) => {
                return Err(Error::Config(ConfigError::ClusterMismatch(why)))
            }
            cluster::Follow::To(d) => d,
        };
        let next =
            Self::open_with(config.following(&successor.nodes)?, self.inner.read_only).await?;
        match &next.verdicts().adoption {
            Adoption::Adopted(d) if d.id == successor.id => Ok(Some(next)),
            other => Err(Error::Config(ConfigError::ClusterMismatch(format!(
                "the node list was changed to cluster {} ({}), but its nodes do not hold \
                 it ({other:?})",
                successor.id,
                successor.describe()
            )))),
        }
    }

    /// Log and count that this client (of the successor) replaced `old`'s node list.
    pub(crate) fn followed_from(&self, old: &Client) {
        tracing::warn!(
            from = %old.inner.config.node_names().join(","),
            to = %self.inner.config.node_names().join(","),
            cluster = ?self.cluster().map(|d| d.id),
            "the configured node list was replaced by a change of the node list: this client \
             follows the new cluster; update its configuration"
        );
        crate::metrics::cluster_followed();
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
        if !self.pinned {
            return self.current().set_up_problem();
        }
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
        match &self.current_or_pinned().verdicts().adoption {
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
        let follows = !read_only
            && config.adopt_as.is_none()
            && config.cluster_identity
            && config.live_follow;
        let inner = Arc::new(Inner {
            majority: config.majority(),
            urls: config.nodes.iter().map(ToString::to_string).collect(),
            config,
            nodes,
            verdicts: std::sync::Mutex::new(None),
            read_only,
        });
        let client = Client {
            cell: Arc::new(Cell {
                current: std::sync::RwLock::new(inner.clone()),
                shared: std::sync::Mutex::new(SharedMap::new()),
                follows,
                follow: tokio::sync::Mutex::new(follow::FollowState::default()),
            }),
            inner,
            pinned: false,
        };
        let warmup = client
            .current()
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
        if !self.pinned {
            return Box::pin(self.current().repair_quarantined()).await;
        }
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
        self.current_or_pinned()
            .inner
            .nodes
            .iter()
            .filter_map(|n| n.driver_client())
            .collect()
    }

    /// The majority of the nodes in use (the configured ones, or the successor's after a
    /// followed change of the node list). A request counts with the majority of the list it
    /// ran on ([`Tally::majority`]); prefer that one when judging a tally.
    pub fn majority(&self) -> Majority {
        self.current_or_pinned().inner.majority
    }

    /// The configuration this client was built from (at [`Client::connect`], after the follow
    /// of a change made before it; the timeouts and settings of every list it follows later).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Redacted URLs of the nodes in use, in node order: the configured ones, or the
    /// successor's after a followed change of the node list.
    pub fn node_urls(&self) -> Vec<String> {
        self.current_or_pinned().inner.urls.clone()
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
