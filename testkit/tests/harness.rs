//! Self-test of the harness against real containers.
//!
//! Needs Docker and the image from `scripts/build-redis-image.sh`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use redquorum_testkit::{Cluster, FaultMode, NodeSpec, CONTAINER_LABEL};
use testcontainers::bollard::query_parameters::ListContainersOptions;

/// How long a request may take before we call it "no answer".
const SHORT: Duration = Duration::from_millis(300);

/// A fresh connection to `url` (explicit redis-rs timeouts, longer than ours).
async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Outcome of one request with a deadline.
#[derive(Debug, PartialEq)]
enum Outcome<T> {
    Answered(T),
    Failed(String),
    TimedOut,
}

/// `PING` on an existing connection, within `deadline`.
async fn ping_on(con: &mut MultiplexedConnection, deadline: Duration) -> Outcome<String> {
    match tokio::time::timeout(deadline, redis::cmd("PING").query_async::<String>(con)).await {
        Ok(Ok(pong)) => Outcome::Answered(pong),
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(_) => Outcome::TimedOut,
    }
}

/// Connect to `url` and `PING`, all within `deadline`.
async fn fresh_ping(url: &str, deadline: Duration) -> Outcome<String> {
    let attempt = async {
        let mut con = connect(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(pong)) => Outcome::Answered(pong),
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(_) => Outcome::TimedOut,
    }
}

async fn set(con: &mut MultiplexedConnection, key: &str, value: &str) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async::<()>(con)
        .await
        .unwrap_or_else(|e| panic!("SET {key} failed: {e}"));
}

async fn get(con: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(con)
        .await
        .unwrap_or_else(|e| panic!("GET {key} failed: {e}"))
}

async fn config_get(con: &mut MultiplexedConnection, name: &str) -> String {
    let map: HashMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(con)
        .await
        .unwrap_or_else(|e| panic!("CONFIG GET {name} failed: {e}"));
    map.get(name)
        .cloned()
        .unwrap_or_else(|| panic!("CONFIG GET {name} returned no value: {map:?}"))
}

#[tokio::test]
async fn killed_node_fails_then_restarts_with_its_aof_data() {
    let cluster = Cluster::start(3).await;
    assert_eq!(cluster.len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);

    // Every node works through its proxy.
    for (i, url) in urls.iter().enumerate() {
        let mut con = connect(url)
            .await
            .unwrap_or_else(|e| panic!("node {i}: connect through proxy {url} failed: {e}"));
        set(&mut con, "story", &format!("written on node {i}")).await;
        assert_eq!(
            get(&mut con, "story").await.as_deref(),
            Some(format!("written on node {i}").as_str()),
            "node {i}: GET through the proxy does not return what SET wrote"
        );
    }

    let node = cluster.node(0);
    let proxy_before = node.proxy_addr();
    let port_before = node.host_port();
    let mut old_con = connect(&node.url()).await.expect("node 0: connect");

    node.kill().await;
    let fresh = fresh_ping(&node.url(), Duration::from_secs(3)).await;
    assert!(
        matches!(fresh, Outcome::Failed(_)),
        "node 0 killed: a PING over a fresh proxied connection should fail fast, got {fresh:?}"
    );
    let old = ping_on(&mut old_con, Duration::from_secs(3)).await;
    assert!(
        matches!(old, Outcome::Failed(_)),
        "node 0 killed: a PING on a connection opened before the kill should fail, got {old:?}"
    );
    // A partition in front of a dead node still looks silent, not refused.
    node.cut_off();
    assert_eq!(
        fresh_ping(&node.url(), SHORT).await,
        Outcome::TimedOut,
        "node 0 killed and cut off: a fresh connection should hang, not fail"
    );
    node.heal();
    // The other nodes are untouched.
    assert_eq!(
        fresh_ping(&cluster.node(1).url(), Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "node 1 should not notice that node 0 was killed"
    );

    node.restart().await;
    assert_eq!(node.proxy_addr(), proxy_before, "proxy address changed");
    assert_eq!(node.host_port(), port_before, "host port changed");
    let mut con = connect(&node.url())
        .await
        .expect("node 0: connect through the proxy after restart");
    assert_eq!(
        get(&mut con, "story").await.as_deref(),
        Some("written on node 0"),
        "node 0: the key written before kill -9 is gone after restart (AOF not replayed?)"
    );
    let mut direct = node.direct_connection().await;
    assert_eq!(
        get(&mut direct, "story").await.as_deref(),
        Some("written on node 0")
    );

    node.kill_and_restart().await;
    assert_eq!(
        fresh_ping(&node.url(), Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "node 0: proxy URL does not work after kill_and_restart"
    );
}

#[tokio::test]
async fn frozen_node_hangs_until_thawed() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(0);
    let mut con = connect(&node.url()).await.expect("node 0: connect");
    assert_eq!(
        ping_on(&mut con, SHORT).await,
        Outcome::Answered("PONG".into())
    );

    node.freeze().await;
    assert!(node.is_frozen());
    assert_eq!(
        ping_on(&mut con, SHORT).await,
        Outcome::TimedOut,
        "frozen node 0 answered a PING"
    );
    assert_eq!(
        fresh_ping(&node.url(), SHORT).await,
        Outcome::TimedOut,
        "frozen node 0 answered a PING on a fresh connection"
    );

    node.thaw().await;
    assert!(!node.is_frozen());
    assert_eq!(
        fresh_ping(&node.url(), Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "thawed node 0 does not answer PING on a fresh connection"
    );
    assert_eq!(
        ping_on(&mut con, Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "thawed node 0 does not answer PING on the connection opened before the freeze"
    );
}

#[tokio::test]
async fn wiped_node_comes_back_empty() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(0);
    let mut con = connect(&node.url()).await.expect("node 0: connect");
    set(&mut con, "doomed", "1").await;
    assert!(
        node.data_dir().join("appendonlydir").is_dir(),
        "node 0: no appendonlydir in the data dir {:?}",
        node.data_dir()
    );

    node.wipe_and_restart().await;
    let mut con = connect(&node.url())
        .await
        .expect("node 0: connect after wipe");
    assert_eq!(
        get(&mut con, "doomed").await,
        None,
        "node 0: the key survived wipe_and_restart"
    );
    assert_eq!(
        ping_on(&mut con, Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into())
    );
    // The restarted node persists again (a new AOF in the emptied directory).
    set(&mut con, "reborn", "1").await;
    assert!(node.data_dir().join("appendonlydir").is_dir());
}

#[tokio::test]
async fn proxy_faults_cut_drop_refuse_and_delay() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(0);
    let url = node.url();

    // --- silent partition
    let mut clean = connect(&url).await.expect("connect (clean)");
    let mut used = connect(&url).await.expect("connect (used during cut)");
    node.cut_off();
    assert_eq!(node.fault_mode(), FaultMode::CutOff);
    assert_eq!(
        fresh_ping(&url, SHORT).await,
        Outcome::TimedOut,
        "cut_off: a PING over a fresh connection got through"
    );
    assert_eq!(
        ping_on(&mut used, SHORT).await,
        Outcome::TimedOut,
        "cut_off: a PING over an open connection got through"
    );
    node.heal();
    assert_eq!(
        fresh_ping(&url, Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "heal: a fresh connection does not work"
    );
    assert_eq!(
        ping_on(&mut clean, Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "heal: a connection that sent nothing during the cut should keep working"
    );
    let broken = ping_on(&mut used, Duration::from_secs(3)).await;
    assert!(
        matches!(broken, Outcome::Failed(_)),
        "heal: a connection that lost bytes during the cut should have been closed, got {broken:?}"
    );

    // --- lost replies
    let mut con = connect(&url).await.expect("connect before drop_replies");
    node.drop_replies();
    let write = tokio::time::timeout(
        SHORT,
        redis::cmd("SET")
            .arg("lost-reply")
            .arg("landed")
            .query_async::<()>(&mut con),
    )
    .await;
    assert!(
        write.is_err(),
        "drop_replies: the SET should have timed out, got {write:?}"
    );
    let mut direct = node.direct_connection().await;
    assert_eq!(
        get(&mut direct, "lost-reply").await.as_deref(),
        Some("landed"),
        "drop_replies: the request should have reached the node even though its reply was lost"
    );
    node.heal();

    // --- refused connections
    let mut open = connect(&url).await.expect("connect before refuse");
    node.refuse();
    let closed = ping_on(&mut open, Duration::from_secs(3)).await;
    assert!(
        matches!(closed, Outcome::Failed(_)),
        "refuse: an open connection should have been closed, got {closed:?}"
    );
    let refused = fresh_ping(&url, Duration::from_secs(3)).await;
    assert!(
        matches!(refused, Outcome::Failed(_)),
        "refuse: a fresh connection should fail fast, got {refused:?}"
    );
    node.heal();
    assert_eq!(
        fresh_ping(&url, Duration::from_secs(3)).await,
        Outcome::Answered("PONG".into()),
        "heal after refuse: a fresh connection does not work"
    );

    // --- latency (one way, each direction: a round trip gains twice the delay)
    let mut con = connect(&url).await.expect("connect before latency");
    node.set_latency(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(
        ping_on(&mut con, Duration::from_secs(5)).await,
        Outcome::Answered("PONG".into())
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "set_latency(200ms): a PING round trip took only {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "set_latency(200ms): a PING took {took:?}"
    );
    node.heal();
    assert_eq!(
        node.latency(),
        Duration::from_millis(200),
        "heal must not reset latency"
    );
    node.set_latency(Duration::ZERO);
    let started = Instant::now();
    assert_eq!(
        ping_on(&mut con, Duration::from_secs(5)).await,
        Outcome::Answered("PONG".into())
    );
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "set_latency(ZERO): a PING still took {:?}",
        started.elapsed()
    );
}

// Multi-threaded on purpose: testcontainers drops containers differently per runtime flavor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_cluster_removes_frozen_containers() {
    let cluster = Cluster::start(2).await;
    let ids: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.container_id().to_string())
        .collect();
    let dirs: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| n.data_dir().to_path_buf())
        .collect();
    cluster.node(0).freeze().await;
    cluster.node(1).freeze().await;
    drop(cluster);

    let docker = testcontainers::core::client::docker_client_instance()
        .await
        .expect("connect to Docker");
    let left: Vec<String> = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![CONTAINER_LABEL.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .expect("docker ps -a")
        .into_iter()
        .filter_map(|c| c.id)
        .filter(|id| ids.contains(id))
        .collect();
    assert!(
        left.is_empty(),
        "containers of a dropped cluster are still there (docker ps -a): {left:?}"
    );
    for dir in dirs {
        assert!(!dir.exists(), "data dir {dir:?} outlived its node");
    }
}

#[tokio::test]
async fn extra_args_override_the_safe_defaults() {
    let cluster = Cluster::start_with(vec![
        NodeSpec::safe(),
        NodeSpec::with_args(&["--appendfsync", "everysec"]),
    ])
    .await;
    let mut safe = cluster.node(0).direct_connection().await;
    assert_eq!(config_get(&mut safe, "appendfsync").await, "always");
    assert_eq!(config_get(&mut safe, "appendonly").await, "yes");
    assert_eq!(
        config_get(&mut safe, "maxmemory-policy").await,
        "noeviction"
    );
    assert_eq!(config_get(&mut safe, "save").await, "");

    let mut relaxed = cluster.node(1).direct_connection().await;
    assert_eq!(
        config_get(&mut relaxed, "appendfsync").await,
        "everysec",
        "node 1 was started with --appendfsync everysec"
    );
    assert_eq!(config_get(&mut relaxed, "appendonly").await, "yes");
}

#[tokio::test]
async fn a_panicking_test_leaves_no_containers_behind() {
    let (ids_tx, ids_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
    let outcome = tokio::spawn(async move {
        let cluster = Cluster::start(2).await;
        cluster.node(1).freeze().await;
        cluster.node(0).cut_off();
        let ids = cluster
            .nodes()
            .iter()
            .map(|n| n.container_id().to_string())
            .collect();
        ids_tx.send(ids).expect("send container ids");
        panic!("deliberate panic with a frozen node and a cut-off node");
    })
    .await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_panic()),
        "the inner test should have panicked, got {outcome:?}"
    );
    let ids = ids_rx.await.expect("the inner test sent its container ids");

    let docker = testcontainers::core::client::docker_client_instance()
        .await
        .expect("connect to Docker");
    let mut left = Vec::new();
    for id in &ids {
        if docker
            .inspect_container(
                id,
                None::<testcontainers::bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .is_ok()
        {
            left.push(id.clone());
        }
    }
    assert!(
        left.is_empty(),
        "containers of a panicked test are still there: {left:?}"
    );
}

/// A node's `TIME`, in milliseconds since the epoch; `who` names the node in the panic.
async fn node_time_ms(con: &mut MultiplexedConnection, who: &str) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(con)
        .await
        .unwrap_or_else(|e| panic!("TIME on {who} failed: {e}"));
    s * 1000 + us / 1000
}

/// How far `a`'s `TIME` is ahead of `b`'s, in ms (`b` is read between two reads of `a`, so
/// the time the requests take cancels out).
async fn skew_ms(
    a: &mut MultiplexedConnection,
    a_name: &str,
    b: &mut MultiplexedConnection,
    b_name: &str,
) -> i64 {
    let a1 = node_time_ms(a, a_name).await;
    let b = node_time_ms(b, b_name).await;
    let a2 = node_time_ms(a, a_name).await;
    (a1 + a2) / 2 - b
}

/// Slack for comparing two clocks that should differ by an exact step.
const CLOCK_SLACK_MS: i64 = 1_000;

fn assert_skew(skew: i64, want: i64, what: &str) {
    assert!(
        (skew - want).abs() <= CLOCK_SLACK_MS,
        "{what}: the stepped node's TIME should be {want} ms ahead of the other node's, \
         it is {skew} ms ahead (slack {CLOCK_SLACK_MS} ms)"
    );
}

/// `SET key v PX ttl_ms` on `con`.
async fn set_px(con: &mut MultiplexedConnection, key: &str, ttl_ms: u64, who: &str) {
    redis::cmd("SET")
        .arg(key)
        .arg("v")
        .arg("PX")
        .arg(ttl_ms)
        .query_async::<()>(con)
        .await
        .unwrap_or_else(|e| panic!("SET {key} v PX {ttl_ms} on {who} failed: {e}"));
}

/// Polls `GET key` until it answers nil; returns how long that took, or `None` if the key is
/// still there after `within`.
async fn gone_within(
    con: &mut MultiplexedConnection,
    key: &str,
    within: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if get(con, key).await.is_none() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_moves_one_nodes_time_forward_and_back() {
    let cluster = Cluster::start(2).await;
    let (stepped, other) = (cluster.node(0), cluster.node(1));
    assert_eq!(
        stepped.clock_offset_ms(),
        0,
        "a new node starts at offset 0"
    );
    let mut s = stepped.direct_connection().await;
    let mut o = other.direct_connection().await;
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        0,
        "before any step (shim loaded at offset 0)",
    );
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let unstepped = node_time_ms(&mut o, "node 1").await;
    assert!(
        (unstepped - real).abs() <= CLOCK_SLACK_MS,
        "an unstepped node's TIME must be real time: {unstepped} ms vs host {real} ms"
    );

    stepped.step_clock_ms(120_000);
    assert_eq!(stepped.clock_offset_ms(), 120_000, "offset after +120 s");
    assert_eq!(other.clock_offset_ms(), 0, "a step moves one node only");
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        120_000,
        "after step_clock_ms(120_000) on a running node",
    );

    stepped.step_clock_ms(-120_000);
    assert_eq!(
        stepped.clock_offset_ms(),
        0,
        "offset after +120 s then -120 s"
    );
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        0,
        "after stepping back by -120 s",
    );

    stepped.step_clock_ms(-45_000);
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        -45_000,
        "after a -45 s step (behind real time)",
    );
    stepped.set_clock_offset_ms(10_000);
    assert_eq!(stepped.clock_offset_ms(), 10_000, "set_clock_offset_ms");
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        10_000,
        "after set_clock_offset_ms(10_000)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_clock_step_expires_keys_on_that_node_only() {
    let cluster = Cluster::start(2).await;
    let (stepped, other) = (cluster.node(0), cluster.node(1));
    let mut s = stepped.direct_connection().await;
    let mut o = other.direct_connection().await;
    set_px(&mut s, "k", 60_000, "node 0").await;
    set_px(&mut o, "k", 60_000, "node 1").await;
    assert_eq!(
        get(&mut s, "k").await.as_deref(),
        Some("v"),
        "a 60 s key must exist before the step"
    );

    stepped.step_clock_ms(120_000);
    let gone = gone_within(&mut s, "k", Duration::from_millis(100)).await;
    assert!(
        gone.is_some(),
        "a key SET with PX 60000 must expire at once after a +120 s wall-clock step, but GET \
         still returned it 100 ms later"
    );
    assert_eq!(
        get(&mut o, "k").await.as_deref(),
        Some("v"),
        "the same key on the unstepped node must survive (only node 0's clock moved)"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg("k")
        .query_async(&mut o)
        .await
        .expect("PTTL on node 1");
    assert!(
        (50_000..=60_000).contains(&ttl),
        "the unstepped node's key must keep its remaining TTL, PTTL is {ttl} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_survives_restart_and_wipe() {
    let cluster = Cluster::start(2).await;
    let (stepped, other) = (cluster.node(0), cluster.node(1));
    let mut o = other.direct_connection().await;

    // The offset is the node's host clock: a restarted redis-server comes back on it.
    stepped.step_clock_ms(-30_000);
    stepped.kill_and_restart().await;
    assert_eq!(
        stepped.clock_offset_ms(),
        -30_000,
        "offset after kill_and_restart"
    );
    let mut s = stepped.direct_connection().await;
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        -30_000,
        "a -30 s step, then kill_and_restart",
    );
    stepped.step_clock_ms(90_000);
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        60_000,
        "a +90 s step on the restarted node",
    );

    // A wipe deletes the data directory, not the clock: the +60 s holds, and it still steps.
    stepped.wipe_and_restart().await;
    assert_eq!(
        stepped.clock_offset_ms(),
        60_000,
        "offset after wipe_and_restart"
    );
    let mut s = stepped.direct_connection().await;
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        60_000,
        "the +60 s offset after wipe_and_restart (is the shim still loaded?)",
    );
    stepped.step_clock_ms(-180_000);
    assert_skew(
        skew_ms(&mut s, "node 0", &mut o, "node 1").await,
        -120_000,
        "a -180 s step on the wiped node",
    );
}

/// Kills and reaps a child process when dropped (also when the test panics).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_redis_server_process_follows_its_clock_file() {
    let clock = redquorum_testkit::clock::ClockDir::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        l.local_addr().expect("its address").port()
    };
    let mut server = KillOnDrop(
        std::process::Command::new(redquorum_testkit::server_program())
            .args(["--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--bind", "127.0.0.1"])
            .envs(clock.envs())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("cannot spawn the server: Debian's redis-server (or REDQUORUM_TEST_SERVER) must be on PATH"),
    );
    let url = format!("redis://127.0.0.1:{port}");
    let mut con = None;
    for _ in 0..100 {
        if let Ok(c) = connect(&url).await {
            con = Some(c);
            break;
        }
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("the local redis-server under the clock shim exited at start-up: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut con = con.unwrap_or_else(|| {
        panic!("the local redis-server under the clock shim does not answer on {url} after 5 s")
    });
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let before = node_time_ms(&mut con, "the local redis-server").await;
    assert!(
        (before - real).abs() <= CLOCK_SLACK_MS,
        "at offset 0 the local redis-server's TIME must be real time: {before} ms vs host {real} ms"
    );
    set_px(&mut con, "k", 60_000, "the local redis-server").await;

    clock.step_ms(3_600_000);
    let after = node_time_ms(&mut con, "the local redis-server").await;
    assert!(
        (after - before - 3_600_000).abs() <= CLOCK_SLACK_MS,
        "a +1 h step must move the local redis-server's TIME by an hour, it moved {} ms",
        after - before
    );
    assert!(
        gone_within(&mut con, "k", Duration::from_millis(100))
            .await
            .is_some(),
        "a 60 s key on the local redis-server must expire at once after a +1 h step"
    );
    clock.step_ms(-3_600_000);
    let back = node_time_ms(&mut con, "the local redis-server").await;
    assert!(
        (back - before).abs() <= CLOCK_SLACK_MS + 1_000,
        "stepping back -1 h must bring the local redis-server's TIME back: {back} ms vs {before} ms"
    );
}
