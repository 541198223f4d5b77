//! One Redis node: its connection, its last safety probe, and how driver errors map to
//! per-node outcomes.
//!
//! A node owns at most one multiplexed connection. It is opened lazily (on first use and
//! after any failure), probed for safety before its first request, and discarded as soon as
//! a request on it times out or breaks: a connection that lost a reply could hand the next
//! reply to the wrong request, so it is never reused.
//!
//! Architecture invariant: a node's connection is probed (INFO + CONFIG GET) before it carries
//! any quorum request, so a restarted or reconfigured server is noticed before it votes.

use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use tokio::time::Instant;

use crate::config::{NodeUrl, TlsConnector};
use crate::keys::{fixed_key, KeyKind};
use crate::quorum::{NodeId, UnknownCause};
use crate::safety::Probe;
use crate::transport::{driver_client, FixedAddr};

/// What the node keeps between requests.
#[derive(Default)]
struct State {
    conn: Option<Lease>,
    next_generation: u64,
    probe: Option<Probe>,
    probed_at: Option<Instant>,
    /// The run_id seen before the latest one, when a restart was observed.
    restarted_from: Option<String>,
    last_error: Option<String>,
    /// The connect-and-probe in progress, shared by everyone waiting for it.
    connecting: Option<Connecting>,
}

type Connecting = Shared<BoxFuture<'static, Result<Lease, UnknownCause>>>;

pub(crate) struct Node {
    pub(crate) id: NodeId,
    pub(crate) url: NodeUrl,
    /// The driver's client: plain connections, and pub/sub hints.
    client: redis::Client,
    /// The client's TLS configuration, shared by its nodes, for a `rediss://` node's connects.
    #[cfg(feature = "tls")]
    tls_connector: Option<Arc<TlsConnector>>,
    /// Where to connect when the TLS server name replaced the URL's host.
    resolver: Option<FixedAddr>,
    /// Whether this node is reached over TLS (for error hints).
    tls: bool,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// Deadline for connect plus safety probe, run in the background.
    probe_timeout: Duration,
    /// Set while a background re-probe runs, so a burst of requests starts only one.
    reprobing: std::sync::atomic::AtomicBool,
    /// Counts recorded probes.
    probe_version: std::sync::atomic::AtomicU64,
    /// Set while a repair of this node runs (single flight).
    pub(crate) repairing: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("url", &self.url)
            .finish()
    }
}

/// A node's connection: the driver's multiplexed connection and, when this crate spawned its
/// driver task (a TLS connection), the handle that stops the task once the last clone is
/// dropped, as redis-rs does for the connections it opens itself.
#[derive(Clone)]
pub(crate) struct Conn {
    inner: MultiplexedConnection,
    _driver: Option<Arc<Driver>>,
}

/// Aborts a connection's driver task when dropped.
struct Driver(tokio::task::AbortHandle);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Conn {
    fn new(inner: MultiplexedConnection) -> Conn {
        Conn {
            inner,
            _driver: None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A connection handed out for one request, with its generation (to discard exactly it).
#[derive(Clone)]
pub(crate) struct Lease {
    pub(crate) generation: u64,
    pub(crate) conn: Conn,
    /// The server's run_id when this connection was opened (a restart breaks the connection,
    /// so it holds for the connection's whole life).
    pub(crate) run_id: Arc<str>,
}

impl Node {
    pub(crate) fn new(
        id: NodeId,
        url: NodeUrl,
        tls: &Arc<TlsConnector>,
        connect_timeout: Duration,
        probe_timeout: Duration,
    ) -> Result<Node, String> {
        let (client, resolver) =
            driver_client(&url, &tls.settings).map_err(|e| url.scrub(&e.to_string()))?;
        Ok(Node {
            id,
            tls: url.is_tls(),
            #[cfg(feature = "tls")]
            tls_connector: url.is_tls().then(|| tls.clone()),
            url,
            client,
            resolver,
            connect_timeout,
            state: Mutex::new(State::default()),
            probe_timeout,
            reprobing: std::sync::atomic::AtomicBool::new(false),
            repairing: std::sync::atomic::AtomicBool::new(false),
            probe_version: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked while holding it; the state is
        // plain data that is always left consistent, so keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection, opening and probing a new one if there is none.
    ///
    /// The connect-and-probe runs in its own task, shared by every caller waiting for it, so
    /// a request that is abandoned (its fan-out already had a majority) does not cancel the
    /// reconnect: a node that is slower to reconnect than the others answer still rejoins.
    ///
    /// Cancel safety: cancel-safe; the connect attempt goes on and its result is kept.
    pub(crate) async fn connection(self: &Arc<Self>) -> Result<Lease, UnknownCause> {
        let pending = {
            let mut st = self.state();
            if let Some(lease) = st.conn.clone() {
                return Ok(lease);
            }
            match &st.connecting {
                Some(shared) => shared.clone(),
                None => {
                    let node = self.clone();
                    let task = tokio::spawn(async move {
                        let result =
                            match tokio::time::timeout(node.probe_timeout, node.open()).await {
                                Ok(r) => r,
                                Err(_) => Err(UnknownCause::Unreachable(
                                    "connect and safety probe timed out".into(),
                                )),
                            };
                        node.state().connecting = None;
                        result
                    });
                    let shared: Connecting = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(UnknownCause::Unreachable(format!(
                                "connect task failed: {e}"
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    st.connecting = Some(shared.clone());
                    shared
                }
            }
        };
        pending.await
    }

    /// A new connection, not probed and not stored: for [`open`](Self::open), and for
    /// `Client::check_permissions`, which must ask a node whose user cannot even run the
    /// probe (it decides nothing).
    pub(crate) async fn connect(&self) -> Result<Conn, UnknownCause> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Deadlines are enforced per request by the caller; the driver's own 500 ms
            // default must not cut a longer per-node deadline short.
            .set_response_timeout(None);
        match self.open_connection(config).await {
            Ok(c) => Ok(c),
            Err(e) => {
                let mut msg = not_redis_hint(self.url.scrub(&e.to_string()));
                if self.tls {
                    if let Some(hint) = crate::config::tls_hint(&msg) {
                        msg = format!("TLS handshake failed: {msg}: {hint}");
                    }
                }
                self.state().last_error = Some(msg.clone());
                Err(UnknownCause::Unreachable(msg))
            }
        }
    }

    /// A new connection: over TLS with the client's rustls configuration, else the driver's.
    async fn open_connection(
        &self,
        config: redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<Conn> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls_connector {
            // The driver's connection timeout, over the same steps and with its error.
            let connect = crate::transport::tls_connect(&self.url, tls, config);
            let (conn, driver) = tokio::time::timeout(self.connect_timeout, connect)
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into())
                })?;
            return Ok(Conn {
                inner: conn,
                _driver: Some(Arc::new(Driver(driver))),
            });
        }
        let config = match &self.resolver {
            Some(r) => config.set_dns_resolver(r.clone()),
            None => config,
        };
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Conn::new(conn))
    }

    /// Open a connection, probe it, and store it as the current one.
    async fn open(&self) -> Result<Lease, UnknownCause> {
        let mut conn = self.connect().await?;
        let probe = match probe(&mut conn).await {
            Ok(p) => p,
            Err(e) => {
                let mut msg = not_redis_hint(self.url.scrub(&e.to_string()));
                if msg.to_ascii_lowercase().contains("noperm") {
                    // The node answered: say it is the user's permissions, not the network.
                    msg = format!(
                        "{msg}: permission denied: the node answered, but its Redis user lacks \
                         a permission every client needs (`redquorum acl --user NAME` prints \
                         them)"
                    );
                }
                self.state().last_error = Some(msg.clone());
                return Err(UnknownCause::Unreachable(format!(
                    "safety probe failed: {msg}"
                )));
            }
        };
        let mut st = self.state();
        st.next_generation += 1;
        let lease = Lease {
            generation: st.next_generation,
            conn,
            run_id: probe.run_id.clone().unwrap_or_default().into(),
        };
        self.record_probe(&mut st, probe);
        st.conn = Some(lease.clone());
        st.last_error = None;
        Ok(lease)
    }

    fn record_probe(&self, st: &mut State, probe: Probe) {
        let previous = st.probe.as_ref().and_then(|p| p.run_id.clone());
        if let (Some(prev), Some(cur)) = (previous, probe.run_id.clone()) {
            if prev != cur {
                tracing::warn!(node = %self.id, url = %self.url, previous = %prev, current = %cur, "node restarted (run_id changed)");
                st.restarted_from = Some(prev);
            }
        }
        st.probe = Some(probe);
        st.probed_at = Some(Instant::now());
        self.probe_version
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Bumped on every recorded probe; lets the client cache voting verdicts.
    pub(crate) fn probe_version(&self) -> u64 {
        self.probe_version
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the latest probe is older than `max_age` (or there is none). Cheap.
    pub(crate) fn probe_is_stale(&self, max_age: Duration) -> bool {
        self.state().probed_at.is_none_or(|t| t.elapsed() > max_age)
    }

    /// Probe again over the current (or a new) connection and record the result.
    pub(crate) async fn reprobe(self: &Arc<Self>) -> Result<Probe, UnknownCause> {
        let lease = self.connection().await?;
        let mut conn = lease.conn;
        match probe(&mut conn).await {
            Ok(p) => {
                let mut st = self.state();
                self.record_probe(&mut st, p.clone());
                Ok(p)
            }
            Err(e) => Err(self.failed(lease.generation, &e)),
        }
    }

    /// Drop connection `generation` if it is still the current one.
    pub(crate) fn discard(&self, generation: u64) {
        let mut st = self.state();
        if st.conn.as_ref().is_some_and(|l| l.generation == generation) {
            st.conn = None;
        }
    }

    /// Classify a driver error from a request on connection `generation`; discard the
    /// connection when the error leaves its reply stream in doubt.
    pub(crate) fn failed(&self, generation: u64, e: &redis::RedisError) -> UnknownCause {
        let msg = self.url.scrub(&e.to_string());
        if e.is_timeout()
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
        {
            self.discard(generation);
            self.state().last_error = Some(msg.clone());
            if e.is_timeout() {
                UnknownCause::Timeout
            } else {
                UnknownCause::ConnectionLost(msg)
            }
        } else {
            UnknownCause::ServerError(msg)
        }
    }

    /// The latest probe, and the run_id seen before it when the node was restarted.
    /// (Staleness is [`probe_is_stale`](Self::probe_is_stale).)
    pub(crate) fn snapshot(&self) -> (Option<Probe>, Option<String>) {
        let st = self.state();
        (st.probe.clone(), st.restarted_from.clone())
    }

    /// Claim the right to run a background re-probe; false if one is already running.
    pub(crate) fn begin_reprobe(&self) -> bool {
        !self
            .reprobing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    pub(crate) fn end_reprobe(&self) {
        self.reprobing
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// The driver client (for pub/sub subscriptions), unless the node is reached through a
    /// TLS server name: redis-rs opens pub/sub connections with its own resolver, which would
    /// look the server name up as a host. Such nodes send no wake-up hints (waiters poll).
    pub(crate) fn driver_client(&self) -> Option<redis::Client> {
        self.resolver.is_none().then(|| self.client.clone())
    }

    /// The marker the latest probe read.
    pub(crate) fn probed_marker(&self) -> Option<String> {
        self.state().probe.as_ref().and_then(|p| p.marker.clone())
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.state().last_error.clone()
    }
}

/// Read what the safety check needs in ONE round trip (a pipeline): PING (latency), INFO
/// server/persistence/memory, CONFIG GET appendfsync (which an ACL may forbid: then the
/// policy is unverified), the node marker and the cluster descriptor.
async fn probe(conn: &mut Conn) -> redis::RedisResult<Probe> {
    let t0 = Instant::now();
    let wall0 = std::time::SystemTime::now();
    let mut pipe = redis::pipe();
    pipe.ignore_errors()
        .cmd("PING")
        .cmd("INFO")
        .arg("server")
        .arg("persistence")
        .arg("memory")
        .cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .arg("no-appendfsync-on-rewrite")
        .cmd("GET")
        .arg(fixed_key(KeyKind::Marker))
        .cmd("GET")
        .arg(fixed_key(KeyKind::Cluster));
    let mut replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(conn).await?;
    let latency = t0.elapsed();
    if replies.len() != 5 {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "safety probe",
            format!("expected 5 replies, got {}", replies.len()),
        )));
    }
    let cluster = replies.pop().unwrap_or(Ok(redis::Value::Nil));
    let marker = replies.pop().unwrap_or(Ok(redis::Value::Nil));
    let config = replies.pop().unwrap_or(Ok(redis::Value::Nil));
    let info = replies.pop().unwrap_or(Ok(redis::Value::Nil));
    let ping = replies.pop().unwrap_or(Ok(redis::Value::Nil));
    ping?;
    let info: String = redis::from_redis_value(info?)?;
    let mut probe = Probe::from_info(&info);
    probe.latency = latency;
    // The node's wall clock against ours, for `check` (information only).
    let server_us: Option<i64> = info
        .lines()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix("server_time_usec:"))
        .and_then(|v| v.parse().ok());
    let mid = wall0 + latency / 2;
    if let (Some(server_us), Ok(local)) = (server_us, mid.duration_since(std::time::UNIX_EPOCH)) {
        let local_us = i64::try_from(local.as_micros()).unwrap_or(i64::MAX);
        probe.clock_offset_ms = Some((server_us - local_us) / 1000);
    }
    match config.and_then(|v| Ok(redis::from_redis_value::<Vec<String>>(v)?)) {
        Ok(pairs) => {
            let get = |k: &str| {
                pairs
                    .chunks(2)
                    .find(|c| c.first().map(String::as_str) == Some(k))
                    .and_then(|c| c.get(1))
                    .cloned()
            };
            probe.appendfsync =
                get("appendfsync").ok_or_else(|| "CONFIG GET returned no appendfsync".to_string());
            probe.no_appendfsync_on_rewrite = get("no-appendfsync-on-rewrite").map(|v| v == "yes");
        }
        Err(e) => {
            probe.appendfsync = Err(format!(
                "CONFIG GET not allowed: {}",
                e.code().unwrap_or("error")
            ))
        }
    }
    probe.marker = redis::from_redis_value(marker?)?;
    probe.cluster = redis::from_redis_value(cluster?)?;
    Ok(probe)
}

/// A driver error that shows the peer does not speak Redis (a reply that does not parse as
/// RESP: an HTTP server, another protocol) said so, on one line (the driver's message spans
/// several).
fn not_redis_hint(msg: String) -> String {
    if !msg.to_ascii_lowercase().contains("parse error") {
        return msg;
    }
    let one_line: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!(
        "not a Redis reply (is a Redis server listening on this port?): {}",
        one_line.join("; ")
    )
}
