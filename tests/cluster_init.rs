//! Explicit cluster set-up and the cluster's node timeout, on real nodes (issue 28, items 3
//! and 4): no client sets a cluster up on blank nodes; `cluster init` does, once; a cluster
//! whose every node lost its data is refused the same way, so its IDs never restart silently;
//! the node timeout recorded at init bounds every client's and is what a repair waits.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use common::{config_from_urls, init_tracing};
use redquorum::{Client, Config, ConfigError, Error, IdGenerator, Lock};
use redquorum_testkit::Cluster;

fn config(cluster: &Cluster) -> Config {
    config_from_urls(cluster.urls()).expect("test URLs are valid")
}

/// The test config with a node timeout of `ms` (and a connect timeout of at most 250 ms).
fn with_node_timeout(cluster: &Cluster, ms: u64) -> Config {
    config(cluster)
        .with_node_timeout(Duration::from_millis(ms))
        .with_connect_timeout(Duration::from_millis(ms.min(250)))
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
        cluster.key_counts().await,
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

/// Every node loses its data (FLUSHALL, no restart) under a running client that took lock
/// `res` three times. Returns the last token before the loss, and what the running client's
/// next acquisition gave. `implicit`: the TEST-ONLY switch by which a repair sets blank nodes
/// up, as every client did before issue 28.
async fn tokens_after_every_node_lost(
    cluster: &Cluster,
    implicit: bool,
) -> (u64, Result<u64, Error>) {
    Client::init_cluster(config(cluster))
        .await
        .expect("cluster init");
    let mut running_config = config(cluster);
    if implicit {
        running_config = running_config.with_implicit_set_up_for_tests();
    }
    let running = Client::connect(running_config).await.expect("connect");
    let lock = Lock::new(&running, "res", Duration::from_secs(5)).expect("valid");
    let mut last = 0;
    for _ in 0..3 {
        let guard = lock.try_acquire().await.expect("the lock is free");
        last = guard.token().get();
        guard.release().await.expect("release");
    }
    for node in cluster.nodes() {
        node.flushall().await;
    }
    if !implicit {
        // The running client is refused: no token at or below one it was granted.
        match lock.try_acquire().await {
            Err(e) => println!("the running client is refused: {e}"),
            Ok(g) => panic!(
                "after every node lost its data, a lease was granted with token {} (last {last})",
                g.token()
            ),
        }
    }
    // A new process's client (no memory of the tokens).
    let mut fresh_config = config(cluster);
    if implicit {
        fresh_config = fresh_config.with_implicit_set_up_for_tests();
    }
    let fresh = match Client::connect(fresh_config).await {
        Ok(c) => c,
        Err(e) => return (last, Err(e)),
    };
    let lock = Lock::new(&fresh, "res", Duration::from_secs(5)).expect("valid");
    let mut after = Err(Error::InvalidArgument("not tried".into()));
    for _ in 0..10 {
        after = lock.try_acquire().await.map(|g| g.token().get());
        if after.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (last, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_node_lost_its_data_tokens_never_restart_until_the_operator_runs_cluster_init()
{
    init_tracing();
    let cluster = Cluster::start(3).await;
    let (last, after) = tokens_after_every_node_lost(&cluster, false).await;
    // A new client is refused naming cluster init, and writes nothing.
    match after {
        Err(e) if names_cluster_init(&e) => println!("refused as it must be: {e}"),
        other => panic!(
            "blank nodes after a cluster (last token {last}) must be refused naming init: \
             {other:?}"
        ),
    }
    let written = cluster.key_counts().await;
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
    println!("after cluster init, the cluster works again (ID {id})");
}

/// Teeth: with the set-up implicit again (the rule before issue 28), a new client's repair
/// sets the blank nodes up and its lease token goes back to one granted before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_implicit_set_up_a_new_clients_tokens_restart_after_every_node_lost_its_data() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let (last, after) = tokens_after_every_node_lost(&cluster, true).await;
    match after {
        Ok(t) if t <= last => println!("token {t} after {last}: the hole the set-up rule closes"),
        other => panic!(
            "with implicit set-up, the running client should have been granted a restarted \
             token (at most {last}), got {other:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_timeout_is_the_clusters_raised_by_init_never_lowered_and_waited_by_repairs() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let with = |ms: u64| with_node_timeout(&cluster, ms);
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

/// Short timeouts, so that a claim left by a stopped init is taken over in about 5 s.
fn fast(c: Config) -> Config {
    c.with_operation_timeout(Duration::from_millis(500))
        .with_node_timeout(Duration::from_millis(250))
}

/// `config` whose `cluster init` stops once it decided to mark blank nodes (its claims taken):
/// the first notify fires then, the second lets it go on.
fn frozen_at_init_decision(config: Config) -> (Config, Arc<Notify>, Arc<Notify>) {
    let (decided, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let frozen = config.with_copy_hook_for_tests({
        let (decided, resume) = (decided.clone(), resume.clone());
        move |event| {
            let (decided, resume) = (decided.clone(), resume.clone());
            Box::pin(async move {
                if event == redquorum::CopyEvent::InitDecided {
                    decided.notify_one();
                    resume.notified().await;
                }
            })
        }
    });
    (frozen, decided, resume)
}

/// An operator's `cluster init` killed half-way (after its claims, before its marks): every
/// client is still refused naming cluster init, and running init again finishes the set-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_cluster_init_is_finished_by_running_it_again() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let (frozen, decided, _resume) = frozen_at_init_decision(fast(config(&cluster)));
    let killed = tokio::spawn(Client::init_cluster(frozen));
    decided.notified().await;
    killed.abort();
    let _ = killed.await;
    match Client::connect(fast(config(&cluster))).await {
        Err(e) if names_cluster_init(&e) => println!("refused as it must be: {e}"),
        other => {
            panic!("after an interrupted init, clients must be refused naming init: {other:?}")
        }
    }
    let start = Instant::now();
    let again = Client::init_cluster(fast(config(&cluster)))
        .await
        .expect("running cluster init again finishes the set-up");
    println!(
        "the second init set the cluster up in {:?}: {again:?}",
        start.elapsed()
    );
    assert!(again.created && again.marked == 3, "{again:?}");
    let client = Client::connect(fast(config(&cluster)))
        .await
        .expect("connect");
    IdGenerator::new(&client, "s")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID once the set-up is finished");
}

/// A `cluster init` that decided to mark the blank nodes and froze before marking node 2;
/// meanwhile another init set the cluster up, node 2 became a member and then lost its data
/// (FLUSHALL). Returns node 2's marker once the frozen init resumed. `unclaimed`: the
/// TEST-ONLY switch by which its mark needs no claim (as the set-up's unguarded mark did).
async fn a_late_init_mark(unclaimed: bool) -> Option<String> {
    let cluster = Cluster::start(3).await;
    let (mut frozen, decided, resume) = frozen_at_init_decision(fast(config(&cluster)));
    if unclaimed {
        frozen = frozen.with_unclaimed_copy_writes_for_tests();
    }
    let first = tokio::spawn(Client::init_cluster(frozen));
    decided.notified().await;
    // The frozen init holds claims on the three blank nodes: this one takes them over after
    // watching them unchanged for their lifetime, and sets the cluster up.
    let second = Client::init_cluster(fast(config(&cluster)))
        .await
        .expect("the second init sets the cluster up");
    assert!(second.created, "{second:?}");
    let client = Client::connect(fast(config(&cluster)))
        .await
        .expect("connect");
    IdGenerator::new(&client, "s")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");
    cluster.node(2).flushall().await;
    resume.notify_one();
    let late = first.await.expect("the first init's task");
    println!("the frozen init, resumed: {late:?}");
    let mut n2 = cluster.node(2).direct_connection().await;
    redis::cmd("GET")
        .arg("rq:marker")
        .query_async(&mut n2)
        .await
        .expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_inits_late_mark_never_lands_on_a_member_that_lost_its_data() {
    init_tracing();
    let marker = a_late_init_mark(false).await;
    assert_eq!(
        marker, None,
        "the flushed member must stay unmarked (quarantined until repaired), not be marked by \
         the frozen init"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_set_up_claims_a_frozen_inits_late_mark_lands_on_a_flushed_member() {
    init_tracing();
    let marker = a_late_init_mark(true).await;
    assert!(
        marker.is_some(),
        "with unclaimed marks the frozen init's late mark should land on the flushed node"
    );
}

/// A repair never lowers the cluster's node timeout, even by a client whose cached
/// descriptor predates a raise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_by_a_client_that_predates_a_raise_keeps_the_raised_node_timeout() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let with = |ms: u64| with_node_timeout(&cluster, ms);
    Client::init_cluster(with(250)).await.expect("cluster init");
    let quick = Client::connect(with(100))
        .await
        .expect("connect before the raise");
    cluster.node(2).cut_off();
    let raised = Client::init_cluster(with(1000)).await.expect("raise");
    assert_eq!(raised.raised, 2, "{raised:?}");
    cluster.node(2).heal();
    cluster.node(1).flushall().await;
    // IDs through `quick`: node 1 refuses its marker check, `quick` probes it again (only it:
    // its probes of nodes 0 and 2 still show 250 ms) and repairs it.
    let ids = IdGenerator::new(&quick, "s").expect("valid");
    let mut n1 = cluster.node(1).direct_connection().await;
    let start = Instant::now();
    loop {
        let _ = ids.next_id().await;
        let marker: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut n1)
            .await
            .expect("GET");
        if marker.is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "node 1 was not repaired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored: String = redis::cmd("GET")
        .arg("rq:cluster")
        .query_async(&mut n1)
        .await
        .expect("node 1's descriptor");
    assert!(
        stored.contains("\"node_timeout_ms\":1000"),
        "the repair lowered node 1's recorded node timeout: {stored}"
    );
    Client::connect(with(1000))
        .await
        .expect("the raised node timeout is still allowed after the repair");
}

/// An operator starts the nodes and runs `cluster init` at once (`docker compose up`, then
/// init): a node that does not accept connections yet (its proxy accepts and closes them, as
/// Docker's port forwarding does before the server listens) is waited for, within the
/// operation timeout, and the cluster is set up on every node. (Init used to refuse at the
/// first census: "needs every node to answer: 2 of 3 did".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_init_right_after_the_nodes_start_waits_for_one_not_accepting_connections_yet() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    cluster.node(2).refuse();
    let (init, ()) = tokio::join!(Client::init_cluster(config(&cluster)), async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        cluster.node(2).heal();
    });
    let init = init.expect("init waits for the node that comes up within its operation timeout");
    assert!(
        init.created && init.marked == 3,
        "every node marked: {init:?}"
    );
}

/// A node that does not come up within the operation timeout: init waits for it that long, then
/// refuses, naming the node and why, and marks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_init_refuses_naming_a_node_that_never_answers_and_marks_nothing() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    cluster.node(2).refuse();
    let started = Instant::now();
    let e = Client::init_cluster(fast(config(&cluster)))
        .await
        .expect_err("init needs every node");
    let took = started.elapsed();
    let text = e.to_string();
    println!("refused after {took:?}: {text}");
    assert!(
        names_cluster_init(&e) && text.contains("node 2") && text.contains("no node was marked"),
        "the refusal names the silent node and says no node was marked: {text}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "init waited for the node about its operation timeout (500 ms), no longer: {took:?}"
    );
    assert_eq!(
        cluster.key_counts().await,
        vec![0, 0, 0],
        "no node holds anything"
    );
}
