//! One Redis node: a container with a host data directory, a fixed host port and a
//! fault proxy in front.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, IntoConnectionInfo};
use testcontainers::bollard::query_parameters::{InspectContainerOptions, KillContainerOptions};
use testcontainers::bollard::Docker;
use testcontainers::{ContainerAsync, GenericImage};

use crate::clock::ClockDir;
use crate::container::{docker, start_container};
use crate::proxy::{FaultMode, FaultProxy};
use crate::NodeSpec;

/// How long a node may take to answer PING after a (re)start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(20);
/// Timeouts of the connections `direct_connection` hands out.
const DIRECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One Redis node of a [`Cluster`](crate::Cluster): a container with its data directory on
/// the host (bind-mounted at `/data`), published on a fixed 127.0.0.1 port, reached by
/// tests through a fault proxy on another fixed port. Its redis-server runs under the
/// wall-clock shim (see [`clock`](crate::clock)), at offset 0 until a test steps it.
///
/// Dropping it stops the proxy (closing its connections), removes the container (thawing
/// it first if it is frozen) and then deletes the data directory.
pub struct TestNode {
    index: usize,
    spec: NodeSpec,
    host_port: u16,
    frozen: AtomicBool,
    // Field order is drop order: proxy, then container, then the data directory
    // (which must outlive the container).
    proxy: FaultProxy,
    container: ContainerAsync<GenericImage>,
    data_dir: tempfile::TempDir,
    /// The node's host clock: the shim and its offset file, mounted at `/clock`. Not inside
    /// the data directory, so a wipe keeps it.
    clock: ClockDir,
}

impl fmt::Debug for TestNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestNode")
            .field("index", &self.index)
            .field("container", &self.container.id())
            .field("proxy", &self.proxy.addr())
            .field("host_port", &self.host_port)
            .field("mode", &self.proxy.mode())
            .field("latency", &self.proxy.latency())
            .field("frozen", &self.frozen.load(Ordering::SeqCst))
            .field("data_dir", &self.data_dir.path())
            .field("clock_dir", &self.clock.path())
            .field("clock_offset_ms", &self.clock.offset_ms())
            .field("spec", &self.spec)
            .finish()
    }
}

impl TestNode {
    /// Starts node `index` from `spec` and waits until it answers PING directly.
    pub async fn start(index: usize, spec: NodeSpec) -> TestNode {
        let data_dir = tempfile::Builder::new()
            .prefix(&format!("redquorum-node{index}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("node {index}: cannot create a data directory: {e}"));
        let clock = ClockDir::new();
        let (container, host_port) =
            start_container(index, &spec, data_dir.path(), clock.path()).await;
        let proxy = FaultProxy::start(
            SocketAddr::from(([127, 0, 0, 1], host_port)),
            &format!("node {index}"),
        )
        .await;
        let node = TestNode {
            index,
            spec,
            host_port,
            frozen: AtomicBool::new(false),
            proxy,
            container,
            data_dir,
            clock,
        };
        node.wait_ready("start").await;
        node
    }

    /// Position of this node in its cluster.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The spec this node was started with.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// "127.0.0.1:PORT" of the proxy (stable for the node's whole life, across restarts).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// redis://127.0.0.1:PROXYPORT; in secure mode ([`crate::secure`])
    /// rediss://USER:PASSWORD@127.0.0.1:PROXYPORT, the library's least-privilege user.
    pub fn url(&self) -> String {
        match crate::secure::secure() {
            Some(s) => format!(
                "rediss://{}:{}@{}",
                s.user,
                crate::secure::PASSWORD,
                self.proxy.addr()
            ),
            None => format!("redis://{}", self.proxy.addr()),
        }
    }

    /// The fixed 127.0.0.1 port Docker publishes the node's 6379 on.
    pub fn host_port(&self) -> u16 {
        self.host_port
    }

    /// "127.0.0.1:HOSTPORT": the node itself, bypassing the proxy.
    pub fn direct_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.host_port))
    }

    /// redis://127.0.0.1:HOSTPORT straight to the container's published port, bypassing the proxy.
    /// In secure mode rediss:// (the default user, with the test client certificate).
    pub fn direct_url(&self) -> String {
        match crate::secure::secure() {
            Some(_) => format!("rediss://{}", self.direct_addr()),
            None => format!("redis://{}", self.direct_addr()),
        }
    }

    /// Docker id of the node's container.
    pub fn container_id(&self) -> &str {
        self.container.id()
    }

    /// Host directory mounted at `/data` in the container (AOF directory inside).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// A fresh redis-rs multiplexed connection straight to the node (bypassing the
    /// proxy), for test assertions and setup. Connect and response timeouts: 5 s.
    pub async fn direct_connection(&self) -> MultiplexedConnection {
        self.direct_connection_auth(None, None).await
    }

    /// Like [`direct_connection`](Self::direct_connection), authenticated as `username`
    /// (`None`: the default user) with `password` (`None`: no AUTH).
    pub async fn direct_connection_auth(
        &self,
        username: Option<&str>,
        password: Option<&str>,
    ) -> MultiplexedConnection {
        let index = self.index;
        match self
            .try_direct_connection(username, password, DIRECT_TIMEOUT)
            .await
        {
            Ok(con) => con,
            Err(e) => panic!(
                "node {index}: direct connection to {} failed: {e}",
                self.direct_addr()
            ),
        }
    }

    async fn try_direct_connection(
        &self,
        username: Option<&str>,
        password: Option<&str>,
        timeout: Duration,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let mut info = self.direct_url().into_connection_info()?;
        let mut settings = info.redis_settings().clone();
        if let Some(username) = username {
            settings = settings.set_username(username);
        }
        if let Some(password) = password {
            settings = settings.set_password(password);
        }
        info = info.set_redis_settings(settings);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let client = match crate::secure::secure() {
            Some(s) => redis::Client::build_with_tls(info, s.pki.certificates())?,
            None => redis::Client::open(info)?,
        };
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Secure mode: make the library's user (the ACL lines, then its password) as the
    /// default user. Users live in memory only, so after every start.
    async fn apply_acl(&self) -> Result<(), String> {
        let Some(secure) = crate::secure::secure() else {
            return Ok(());
        };
        let mut con = self
            .try_direct_connection(None, None, DIRECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        for words in &secure.acl {
            let mut cmd = redis::cmd(&words[0]);
            for w in &words[1..] {
                cmd.arg(w);
            }
            let () = cmd
                .query_async(&mut con)
                .await
                .map_err(|e| format!("{}: {e}", words.join(" ")))?;
        }
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&secure.user)
            .arg(format!(">{}", crate::secure::PASSWORD))
            .query_async(&mut con)
            .await
            .map_err(|e| format!("ACL SETUSER password: {e}"))?;
        Ok(())
    }

    /// Everything the node's redis-server wrote to stdout so far, across restarts
    /// (useful in failure messages).
    pub async fn logs(&self) -> String {
        match self.container.stdout_to_vec().await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("<node {}: could not read logs: {e}>", self.index),
        }
    }

    // ---------------------------------------------------------------- node faults

    /// kill -9 the redis-server (Docker kill with SIGKILL); data dir kept. Returns once
    /// Docker reports the container stopped. Killing a node that is already down is a no-op.
    pub async fn kill(&self) {
        let index = self.index;
        let docker = docker().await;
        let options = KillContainerOptions {
            signal: "SIGKILL".to_string(),
        };
        match docker
            .kill_container(self.container.id(), Some(options))
            .await
        {
            Ok(()) => {}
            // 409: "is not running": already dead.
            Err(testcontainers::bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                ..
            }) => {}
            Err(e) => panic!("node {index}: docker kill (SIGKILL) failed: {e}"),
        }
        // A killed container is no longer paused.
        self.frozen.store(false, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.is_running().await {
            if tokio::time::Instant::now() > deadline {
                panic!("node {index}: container still running 10s after SIGKILL");
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Start the killed node again (same data, same host port) and wait until it answers
    /// PING with PONG (not LOADING) directly.
    pub async fn restart(&self) {
        let index = self.index;
        self.container.start().await.unwrap_or_else(|e| {
            panic!(
                "node {index}: docker start failed (is host port {} still free?): {e}",
                self.host_port
            )
        });
        self.wait_ready("restart").await;
    }

    /// [`kill`](Self::kill) then [`restart`](Self::restart).
    pub async fn kill_and_restart(&self) {
        self.kill().await;
        self.restart().await;
    }

    /// SIGSTOP-like freeze (docker pause): the node keeps its connections but answers nothing.
    pub async fn freeze(&self) {
        let index = self.index;
        self.container
            .pause()
            .await
            .unwrap_or_else(|e| panic!("node {index}: docker pause failed: {e}"));
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Thaw a frozen node (docker unpause).
    pub async fn thaw(&self) {
        let index = self.index;
        self.container
            .unpause()
            .await
            .unwrap_or_else(|e| panic!("node {index}: docker unpause failed: {e}"));
        self.frozen.store(false, Ordering::SeqCst);
    }

    /// True between [`freeze`](Self::freeze) and [`thaw`](Self::thaw) (or a kill).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// FLUSHALL without a restart: the node loses every key (marker included) but keeps its
    /// run_id, the one data loss a restart-based wipe never shows. Sent straight to the node
    /// (not through the fault proxy), so it works while the node is cut off for clients.
    pub async fn flushall(&self) {
        let index = self.index;
        let mut con = self.direct_connection().await;
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| panic!("node {index}: FLUSHALL failed: {e}"));
    }

    /// kill -9, delete everything in its data directory (AOF dir included), start again
    /// empty, wait ready.
    pub async fn wipe_and_restart(&self) {
        let index = self.index;
        self.kill().await;
        let entries = std::fs::read_dir(self.data_dir.path())
            .unwrap_or_else(|e| panic!("node {index}: cannot list its data directory: {e}"));
        for entry in entries {
            let entry =
                entry.unwrap_or_else(|e| panic!("node {index}: cannot list its data dir: {e}"));
            let path = entry.path();
            let removed = if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.unwrap_or_else(|e| panic!("node {index}: cannot delete {path:?}: {e}"));
        }
        self.container.start().await.unwrap_or_else(|e| {
            panic!(
                "node {index}: docker start after wipe failed (is host port {} still free?): {e}",
                self.host_port
            )
        });
        self.wait_ready("wipe_and_restart").await;
    }

    // ---------------------------------------------------------------- clock faults

    /// Step the node's WALL clock by `delta_ms` milliseconds (positive: forward, negative:
    /// back), adding to its current offset, at once, as an NTP step would: `gettimeofday`,
    /// `time` and `clock_gettime(CLOCK_REALTIME*, CLOCK_TAI)` of its redis-server jump; its
    /// monotonic and boot clocks do not. Redis's `TIME` and its key expiry follow at its next
    /// clock read. The offset is the node's host clock: it survives kill, restart and wipe.
    /// Works on a frozen or killed node too (it applies when the node runs again).
    pub fn step_clock_ms(&self, delta_ms: i64) {
        self.clock.step_ms(delta_ms);
        tracing::debug!(
            node = self.index,
            delta_ms,
            offset_ms = self.clock.offset_ms(),
            "clock step"
        );
    }

    /// Set the node's WALL-clock offset from real time to `offset_ms` milliseconds (a step to
    /// real time + `offset_ms`; 0 puts it back on real time). Same clocks and persistence as
    /// [`step_clock_ms`](Self::step_clock_ms); monotonic clocks untouched.
    pub fn set_clock_offset_ms(&self, offset_ms: i64) {
        tracing::debug!(node = self.index, offset_ms, "clock set");
        self.clock.set_offset_ms(offset_ms);
    }

    /// The node's current WALL-clock offset from real time, in milliseconds (0 at start).
    pub fn clock_offset_ms(&self) -> i64 {
        self.clock.offset_ms()
    }

    /// Host directory mounted at `/clock` in the container: the shim (`clockstep.so`) and the
    /// node's offset file (`offset`). Outside the data directory, so a wipe keeps it.
    pub fn clock_dir(&self) -> &Path {
        self.clock.path()
    }

    // ---------------------------------------------------------------- network faults

    /// Silent partition: the proxy keeps accepting and keeps connections open but forwards
    /// nothing in either direction (bytes are read and discarded).
    pub fn cut_off(&self) {
        tracing::debug!(node = self.index, "fault proxy: cut off");
        self.proxy.set_mode(FaultMode::CutOff);
    }

    /// Connections refused/closed: existing proxied connections are closed and new ones are
    /// accepted then immediately closed.
    pub fn refuse(&self) {
        tracing::debug!(node = self.index, "fault proxy: refuse");
        self.proxy.set_mode(FaultMode::Refuse);
    }

    /// Requests reach the node, replies are discarded (lost reply).
    pub fn drop_replies(&self) {
        tracing::debug!(node = self.index, "fault proxy: drop replies");
        self.proxy.set_mode(FaultMode::DropReplies);
    }

    /// Add this one-way delay to every forwarded chunk in each direction (`Duration::ZERO`
    /// = none), so a request/reply round trip gains `2 * d`. Independent of the fault
    /// mode: [`heal`](Self::heal) does not reset it.
    pub fn set_latency(&self, d: Duration) {
        tracing::debug!(node = self.index, ?d, "fault proxy: latency");
        self.proxy.set_latency(d);
    }

    /// Back to normal forwarding; every proxied connection that discarded any byte while
    /// faulty is closed at heal (its RESP stream is broken), clean connections keep working.
    pub fn heal(&self) {
        tracing::debug!(node = self.index, "fault proxy: heal");
        self.proxy.set_mode(FaultMode::Normal);
    }

    /// The proxy's current fault mode.
    pub fn fault_mode(&self) -> FaultMode {
        self.proxy.mode()
    }

    /// The proxy's current one-way latency.
    pub fn latency(&self) -> Duration {
        self.proxy.latency()
    }

    // ---------------------------------------------------------------- internals

    async fn is_running(&self) -> bool {
        let index = self.index;
        let docker = docker().await;
        let inspect = docker
            .inspect_container(self.container.id(), None::<InspectContainerOptions>)
            .await
            .unwrap_or_else(|e| panic!("node {index}: docker inspect failed: {e}"));
        inspect.state.and_then(|s| s.running).unwrap_or(false)
    }

    /// Polls PING directly every 20 ms until it answers PONG; panics after 30 s.
    async fn wait_ready(&self, what: &str) {
        let index = self.index;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let last_error = match self.ping_once().await {
                Ok(()) => match self.apply_acl().await {
                    Ok(()) => return,
                    Err(e) => panic!("node {index}: {what}: the test ACL failed: {e}"),
                },
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= deadline {
                let logs = self.logs().await;
                let tail: Vec<&str> = logs.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "node {index}: {what} did not become ready within {}s (last PING on {}: {last_error}); \
                     last log lines:\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.direct_addr(),
                    tail.join("\n")
                );
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    async fn ping_once(&self) -> Result<(), String> {
        // A node started with --requirepass answers NOAUTH to an unauthenticated PING.
        let password = self
            .spec
            .extra_args
            .windows(2)
            .rev()
            .find(|w| w[0] == "--requirepass")
            .map(|w| w[1].clone());
        let attempt = async {
            let mut con = self
                .try_direct_connection(None, password.as_deref(), Duration::from_secs(1))
                .await
                .map_err(|e| e.to_string())?;
            let pong: String = redis::cmd("PING")
                .query_async(&mut con)
                .await
                .map_err(|e| e.to_string())?;
            if pong == "PONG" {
                Ok(())
            } else {
                Err(format!("PING answered {pong:?}"))
            }
        };
        tokio::time::timeout(Duration::from_secs(2), attempt)
            .await
            .unwrap_or_else(|_| Err("PING took more than 2s".to_string()))
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        // Docker can force-remove a paused container, but do not rely on it: thaw first,
        // best effort, on a thread of its own (we may be inside a runtime, maybe a
        // current-thread one, where blocking on async work is not allowed).
        if self.frozen.load(Ordering::SeqCst) {
            let id = self.container.id().to_string();
            let thawed = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                runtime.block_on(async {
                    let docker = Docker::connect_with_local_defaults().ok()?;
                    docker.unpause_container(&id).await.ok()
                })
            })
            .join();
            if !matches!(thawed, Ok(Some(()))) {
                tracing::warn!(
                    node = self.index,
                    "could not thaw the frozen container before removing it"
                );
            }
        }
        // Then the fields drop: proxy (closing its connections), container (removed
        // by testcontainers), data directory.
    }
}
