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
