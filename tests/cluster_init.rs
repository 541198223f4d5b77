//! Explicit cluster set-up and the cluster's node timeout, on real nodes (issue 28, items 3
//! and 4): no client sets a cluster up on blank nodes; `cluster init` does, once; a cluster
//! whose every node lost its data is refused the same way, so its IDs never restart silently;
//! the node timeout recorded at init bounds every client's and is what a repair waits.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{config_from_urls, init_tracing};
use redquorum::{Client, Config, ConfigError, Error, IdGenerator};
use redquorum_testkit::Cluster;

/// How many keys each node holds, read straight from the servers.
async fn keys_per_node(cluster: &Cluster) -> Vec<u64> {
    let mut out = Vec::new();
    for node in cluster.nodes() {
        let mut c = node.direct_connection().await;
        out.push(
            redis::cmd("DBSIZE")
                .query_async(&mut c)
                .await
                .expect("DBSIZE"),
        );
    }
    out
}

fn config(cluster: &Cluster) -> Config {
    config_from_urls(cluster.urls()).expect("test URLs are valid")
}

fn names_cluster_init(e: &Error) -> bool {
    matches!(e, Error::Config(ConfigError::ClusterSetUp(why)) if why.contains("cluster init"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_nodes_are_refused_naming_cluster_init_until_it_sets_the_cluster_up_once() {
    init_tracing();
    let cluster = Cluster::start(3).await;

    // A client on blank nodes is refused, and writes nothing.
    match Client::connect(config(&cluster)).await {
        Err(e) if names_cluster_init(&e) => println!("refused as it must be: {e}"),
        other => panic!("a client on blank nodes must be refused naming cluster init: {other:?}"),
    }
    // Inspection only reads: a read-only client's check reports the nodes, writes nothing.
    let inspector = Client::connect_read_only(config(&cluster))
        .await
        .expect("a read-only client never refuses");
    let reports = inspector.check().await;
    assert_eq!(reports.len(), 3);
    assert!(
        inspector
            .set_up_problem()
            .is_some_and(|why| why.contains("cluster init")),
        "check must say no cluster is set up"
    );
    assert_eq!(
        keys_per_node(&cluster).await,
        vec![0, 0, 0],
        "connect and check on blank nodes wrote something"
    );

    // cluster init sets it up, once: a second run changes nothing.
    let first = Client::init_cluster(config(&cluster))
        .await
        .expect("cluster init on three blank nodes");
    assert!(first.created && first.marked == 3, "{first:?}");
    assert_eq!(first.node_timeout, Some(Duration::from_millis(250)));
    let again = Client::init_cluster(config(&cluster))
        .await
        .expect("cluster init again");
    assert!(
        !again.created && again.marked == 0 && again.raised == 0,
        "a second init must change nothing: {again:?}"
    );
    assert_eq!(again.cluster.id, first.cluster.id);

    let client = Client::connect(config(&cluster))
        .await
        .expect("the cluster is set up");
    let ids = IdGenerator::new(&client, "orders").expect("valid");
    assert_eq!(ids.next_id().await.expect("an ID"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_node_lost_its_data_ids_never_restart_until_the_operator_runs_cluster_init() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    Client::init_cluster(config(&cluster))
        .await
        .expect("cluster init");
    let running = Client::connect(config(&cluster)).await.expect("connect");
    let ids = IdGenerator::new(&running, "orders").expect("valid");
    let mut last = 0;
    for _ in 0..10 {
        last = ids.next_id().await.expect("an ID");
    }
    assert!(last >= 10);

    // Every node loses its data, without a restart.
    for node in cluster.nodes() {
        node.flushall().await;
    }
    // The running client is refused: no ID at or below one it issued.
    let fresh = IdGenerator::new(&running, "orders").expect("valid");
    match fresh.next_id().await {
        Err(e) => println!("the running client is refused: {e}"),
        Ok(id) => panic!("after every node lost its data, an ID was issued: {id} (last {last})"),
    }
    // A new client is refused naming cluster init, and writes nothing.
    match Client::connect(config(&cluster)).await {
        Err(e) if names_cluster_init(&e) => println!("refused as it must be: {e}"),
        other => panic!("blank nodes after a cluster must be refused naming init: {other:?}"),
    }
    let written = keys_per_node(&cluster).await;
    assert!(
        written.iter().all(|k| *k == 0),
        "the refused clients wrote on the wiped nodes: {written:?}"
    );

    // The operator decides: the cluster is set up anew.
    Client::init_cluster(config(&cluster))
        .await
        .expect("cluster init after the loss");
    let client = Client::connect(config(&cluster)).await.expect("connect");
    let id = IdGenerator::new(&client, "orders")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");
    // The registers started again (this process's own high-water mark may keep its IDs above
    // the ones it issued).
    println!("after cluster init, the first ID is {id} (before the loss: {last})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_timeout_is_the_clusters_raised_by_init_never_lowered_and_waited_by_repairs() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let with = |ms: u64| {
        config(&cluster)
            .with_node_timeout(Duration::from_millis(ms))
            .with_connect_timeout(Duration::from_millis(ms.min(250)))
    };
    Client::init_cluster(with(250)).await.expect("cluster init");

    // A client asking for more than the cluster's is refused, naming both.
    match Client::connect(with(1000)).await {
        Err(Error::Config(ConfigError::ClusterMismatch(why)))
            if why.contains("1s") && why.contains("250ms") =>
        {
            println!("refused as it must be: {why}")
        }
        other => panic!("a 1 s client on a 250 ms cluster must be refused: {other:?}"),
    }
    Client::connect(with(100))
        .await
        .expect("a shorter node timeout is fine");

    // init raises it; a later, shorter init never lowers it.
    let raised = Client::init_cluster(with(1000)).await.expect("raise");
    assert_eq!(raised.raised, 3, "{raised:?}");
    assert_eq!(raised.node_timeout, Some(Duration::from_secs(1)));
    let lower = Client::init_cluster(with(100)).await.expect("init");
    assert_eq!(
        lower.node_timeout,
        Some(Duration::from_secs(1)),
        "init never lowers the node timeout"
    );
    let slow = Client::connect(with(1000))
        .await
        .expect("the raised node timeout is allowed");
    IdGenerator::new(&slow, "s")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");

    // A repair by a 100 ms client still waits the cluster's 1 s for writes in flight.
    cluster.node(2).flushall().await;
    let start = Instant::now();
    let quick = Client::connect(with(100)).await.expect("connect");
    common::wait_repaired(cluster.node(2), &quick).await;
    let took = start.elapsed();
    println!("node 2 repaired in {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "the repair waited {took:?}, less than the cluster's 1 s node timeout"
    );
}
