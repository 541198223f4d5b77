//! Cluster identity: every client counts majorities over the same servers.
//!
//! Each story runs with the protection on (the misconfigured client is refused, a server votes
//! once) and off (the test-only switch), where the same story must show the violation, or the
//! test has no teeth.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use common::init_tracing;
use std::time::Duration;

use redquorum::{Client, Config, ConfigError, Error, IdGenerator, Lock, LockOptions};
use redquorum_testkit::Cluster;

fn config(urls: &[String], protected: bool) -> Config {
    let config = Config::from_urls(urls).expect("test URLs are valid");
    if protected {
        config
    } else {
        config.without_cluster_identity_for_tests()
    }
}

/// A cluster set up as nodes [0, 1, 2]; a second client lists [0, 1, 2, 3, 4] (an expansion
/// rolled out to one service first). Returns the error B's connect gave or, when B was let
/// in, what happened when A and B each used a majority of their own list: A's ID and lease
/// through {0, 1} (node 2 frozen), then B's through {2, 3, 4} (nodes 0 and 1 frozen).
async fn another_node_list(protected: bool) -> Result<String, Error> {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let first_three = all[..3].to_vec();
    let a = common::connect(config(&first_three, true))
        .await
        .expect("A sets the cluster up on nodes 0, 1, 2");
    let ids_a = IdGenerator::new(&a, "order").expect("valid");
    ids_a.next_id().await.expect("A issues an ID");
    let b = common::connect(config(&all, protected)).await?;
    let ids_b = IdGenerator::new(&b, "order").expect("valid");
    ids_b
        .next_id()
        .await
        .expect("B issues an ID with every node up");

    cluster.node(2).freeze().await;
    let x = ids_a.next_id().await.expect("A's majority {0, 1}");
    let manual = LockOptions::default().with_auto_extend(false);
    let guard_a = Lock::with_options(&a, "exclusive", Duration::from_secs(10), manual)
        .expect("valid")
        .try_acquire()
        .await
        .expect("A holds the lease through {0, 1}");
    cluster.node(2).thaw().await;

    cluster.node(0).freeze().await;
    cluster.node(1).freeze().await;
    let y = ids_b.next_id().await;
    let b_lease = Lock::new(&b, "exclusive", Duration::from_secs(10))
        .expect("valid")
        .try_acquire()
        .await;
    cluster.node(0).thaw().await;
    cluster.node(1).thaw().await;
    let mut seen = Vec::new();
    if let Ok(guard_b) = &b_lease {
        if guard_a.is_held() && guard_b.is_held() {
            seen.push(format!(
                "two holders: A (token {}) and B (token {})",
                guard_a.token(),
                guard_b.token()
            ));
        }
    }
    match y {
        Ok(y) if y <= x => seen.push(format!("order broken: B's ID {y} came after A's {x}")),
        Ok(y) => seen.push(format!("ID order kept ({y} > {x}, by a random skip)")),
        Err(e) => seen.push(format!("B got no ID: {e}")),
    }
    Ok(seen.join("; "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_another_node_list_is_refused_naming_both_lists() {
    match another_node_list(true).await {
        Err(Error::Config(ConfigError::ClusterMismatch(why))) => {
            println!("refused: {why}");
            assert!(
                why.contains("5 nodes") && why.contains("3 nodes"),
                "the error must name both lists: {why}"
            );
        }
        other => panic!("a client listing five nodes of a three-node cluster must be refused at connect, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_identity_another_node_list_admits_two_lease_holders() {
    let verdict = another_node_list(false)
        .await
        .expect("without the check B is let in");
    println!("{verdict}");
    assert!(
        verdict.contains("two holders"),
        "with the check off, disjoint majorities {{0, 1}} and {{2, 3, 4}} must admit two \
         lease holders: {verdict}"
    );
}

/// Two URLs reach node 0 (through its proxy and directly) and node 1 is unreachable. The
/// proxy URL is refused while the client connects, so only the direct URL is probed; then it
/// heals and the first ping connects it. Returns how many nodes the ping counted.
async fn one_server_two_urls(protected: bool) -> Result<usize, Error> {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let _setup = common::connect(config(&cluster.urls(), true))
        .await
        .expect("the cluster is set up on its three nodes");
    let urls = vec![
        cluster.node(0).url(),
        cluster.node(0).direct_url(),
        cluster.node(1).url(),
    ];
    cluster.node(0).refuse();
    cluster.node(1).refuse();
    let c = common::connect(config(&urls, protected)).await?;
    cluster.node(0).heal();
    let tally = c.ping().await?;
    Ok(tally.applied())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reached_by_two_urls_votes_once_from_the_first_fan_out() {
    match one_server_two_urls(true).await {
        Err(Error::NoQuorum(e)) => println!("refused as it must be: {e}"),
        other => panic!(
            "one server behind two URLs is not a majority of three, but the first ping gave \
             {other:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_per_fan_out_claims_one_server_votes_twice() {
    let counted = one_server_two_urls(false)
        .await
        .expect("with the claims off, the one server's two URLs make a 'majority'");
    assert_eq!(counted, 2, "the one server was counted twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_node_list_keeps_order_and_an_old_list_client_follows_it() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let first_three = all[..3].to_vec();
    let a = common::connect(config(&first_three, true))
        .await
        .expect("A sets the cluster up on nodes 0, 1, 2");
    let ids_a = IdGenerator::new(&a, "order").expect("valid");
    let mut last_a = 0;
    for _ in 0..5 {
        last_a = ids_a.next_id().await.expect("A issues IDs");
    }
    let change = a
        .change_cluster(config(&all, true))
        .await
        .expect("the node list changes from three nodes to five");
    println!(
        "changed {} -> {}: sealed {}, marked {}",
        change.from.describe(),
        change.to.describe(),
        change.sealed,
        change.marked
    );
    assert_eq!(change.marked, 5, "every new node is raised and marked");
    // A, running through the change, follows it (issue 43): its next ID, asked while its old
    // list is sealed, is issued through the five nodes and follows its last.
    let next_a = ids_a
        .next_id()
        .await
        .expect("a running client of the old list follows the change");
    assert!(
        next_a > last_a,
        "A's ID {next_a} after the change must follow its last {last_a}"
    );
    assert_eq!(
        sorted(&a.node_urls()),
        sorted(&all),
        "A works through the new cluster's five nodes"
    );
    last_a = next_a;
    // A new client still configured with the old list follows the change.
    let follower = common::connect(config(&first_three, true))
        .await
        .expect("a new client with the old list follows the new cluster");
    assert_eq!(
        sorted(&follower.node_urls()),
        sorted(&all),
        "the follower works through the new cluster's five nodes"
    );
    let f = IdGenerator::new(&follower, "order")
        .expect("valid")
        .next_id()
        .await
        .expect("the follower issues IDs in the new cluster");
    assert!(
        f > last_a,
        "the follower's ID {f} must follow A's last {last_a}"
    );
    let b = common::connect(config(&all, true))
        .await
        .expect("a client of the new list connects");
    let ids_b = IdGenerator::new(&b, "order").expect("valid");
    // Nodes 0 and 1 (two of the three old ones) freeze: {2, 3, 4} must know A's IDs.
    cluster.node(0).freeze().await;
    cluster.node(1).freeze().await;
    let y = ids_b.next_id().await.expect("a majority of the new list");
    cluster.node(0).thaw().await;
    cluster.node(1).thaw().await;
    assert!(y > last_a, "B's ID {y} must follow A's last {last_a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_cluster_cannot_be_changed_again_to_another_list() {
    init_tracing();
    let cluster = Cluster::start(6).await;
    let all = cluster.urls();
    let (old, new, other) = (all[0..3].to_vec(), all[3..6].to_vec(), all[3..5].to_vec());
    let a = common::connect(config(&old, true))
        .await
        .expect("the old cluster");
    let ids_a = IdGenerator::new(&a, "s").expect("valid");
    let last = ids_a.next_id().await.expect("an ID");
    a.change_cluster(config(&new, true))
        .await
        .expect("old -> new (every node replaced)");
    // A client that still has the old list tries to move the old cluster elsewhere.
    let stale = common::connect(config(&old, true))
        .await
        .expect("the old nodes still hold the old descriptor");
    let second = stale.change_cluster(config(&other, true)).await;
    println!("second change: {second:?}");
    assert!(
        second.is_err(),
        "nodes sealed for one successor cannot be sealed for another: {second:?}"
    );
    let b = common::connect(config(&new, true))
        .await
        .expect("the new cluster");
    let y = IdGenerator::new(&b, "s")
        .expect("valid")
        .next_id()
        .await
        .expect("the new cluster works");
    assert!(y > last, "{y} must follow {last}");
}

/// The old cluster on nodes 0-2 issued IDs; a service is given the replacement list (blank
/// nodes 3-5) before `cluster change` ran. Returns the first ID it got, if any.
async fn replacement_list_before_the_change(pinned: bool) -> (u64, Option<u64>) {
    init_tracing();
    let cluster = Cluster::start(6).await;
    let all = cluster.urls();
    let (old, new) = (all[0..3].to_vec(), all[3..6].to_vec());
    let a = common::connect(config(&old, true))
        .await
        .expect("the old cluster");
    let ids = IdGenerator::new(&a, "s").expect("valid");
    let mut last = 0;
    for _ in 0..5 {
        last = ids.next_id().await.expect("IDs");
    }
    let id = a.cluster().expect("a cluster").id;
    let mut cfg = config(&new, true);
    if pinned {
        cfg = cfg.with_cluster_id(&id).expect("a valid id");
    }
    let got = match common::connect(cfg).await {
        Ok(b) => IdGenerator::new(&b, "s")
            .expect("valid")
            .next_id()
            .await
            .ok(),
        Err(_) => None,
    };
    (last, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_client_never_sets_up_a_fresh_cluster_on_blank_nodes() {
    let (last, got) = replacement_list_before_the_change(true).await;
    assert_eq!(
        got, None,
        "a pinned client must not issue IDs from blank nodes (last was {last})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpinned_a_replacement_list_starts_a_fresh_cluster() {
    let (last, got) = replacement_list_before_the_change(false).await;
    println!("old cluster's last ID {last}; the fresh cluster's first {got:?}");
    assert!(
        got.is_some_and(|g| g <= last),
        "without a pin the blank nodes become a fresh cluster whose IDs start over (the hazard the \
         pin closes)"
    );
}

/// A shrink from five nodes to three, and the two removed nodes gone: a client still
/// configured with the five follows the three (the successor records its predecessor's list);
/// a seal naming another successor than the one the new nodes hold is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_list_client_follows_a_shrink_after_the_removed_nodes_are_gone() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let three = all[..3].to_vec();
    let a = common::connect(config(&all, true))
        .await
        .expect("five nodes");
    let ids = IdGenerator::new(&a, "s").expect("valid");
    let mut last = 0;
    for _ in 0..5 {
        last = ids.next_id().await.expect("an ID");
    }
    let change = a
        .change_cluster(config(&three, true))
        .await
        .expect("five nodes -> three");
    drop((ids, a));

    // A seal naming a bogus successor on node 4 (still up): the old list is refused.
    let mut n4 = cluster.node(4).direct_connection().await;
    let marker: String = redis::cmd("GET")
        .arg("rq:marker")
        .query_async(&mut n4)
        .await
        .expect("node 4's marker");
    let (head, _) = marker
        .split_once("#sealed:")
        .expect("node 4 was sealed by the change");
    let bogus = format!("{head}#sealed:0123456789abcdef");
    let () = redis::cmd("SET")
        .arg("rq:marker")
        .arg(&bogus)
        .query_async(&mut n4)
        .await
        .expect("SET");
    match Client::connect(config(&all, true)).await {
        Err(Error::Config(ConfigError::ClusterMismatch(why)))
            if why.contains("0123456789abcdef") =>
        {
            println!("refused as it must be: {why}")
        }
        other => panic!("a seal naming another successor must be refused: {other:?}"),
    }
    let () = redis::cmd("SET")
        .arg("rq:marker")
        .arg(&marker)
        .query_async(&mut n4)
        .await
        .expect("SET");

    // The removed nodes are gone.
    cluster.node(3).kill().await;
    cluster.node(4).kill().await;
    let follower = Client::connect(config(&all, true))
        .await
        .expect("the five-node list follows the three");
    assert_eq!(sorted(&follower.node_urls()), sorted(&three));
    assert_eq!(follower.cluster().map(|d| d.id), Some(change.to.id));
    let y = IdGenerator::new(&follower, "s")
        .expect("valid")
        .next_id()
        .await
        .expect("the follower issues IDs");
    assert!(y > last, "{y} must follow {last}");
}

fn sorted(urls: &[String]) -> Vec<String> {
    let mut v = urls.to_vec();
    v.sort();
    v
}
