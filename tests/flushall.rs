//! FLUSHALL without a restart, as a fault of the copies: a node that loses every key but keeps
//! its run_id, in the middle of a node-list change or of a repair, and a repairer that lost its
//! claim while it was paused.
//!
//! Each story runs with the protection on and off (a test-only switch), where the same story
//! must show the violation, or the test has no teeth.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config_from_urls, init_tracing};
use redquorum::{Config, CopyEvent, Error, IdGenerator, Units};
use redquorum_testkit::Cluster;

/// FLUSHALL on the node at `url` (straight to the server).
async fn flushall(url: String) {
    let client = redis::Client::open(url).expect("a direct URL");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("a direct connection");
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut con)
        .await
        .expect("FLUSHALL");
}

/// The register `key` on node `i`, read directly (0 when absent).
async fn register(cluster: &Cluster, i: usize, key: &str) -> u64 {
    let mut con = cluster.node(i).direct_connection().await;
    let v: Option<u64> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut con)
        .await
        .expect("GET");
    v.unwrap_or(0)
}

/// The lowest value of the register `key` that some majority of `nodes` shows at its highest:
/// what a new process's first ID round could start from (this process's own high-water mark
/// would hide it).
async fn weakest_majority(cluster: &Cluster, nodes: &[usize], key: &str) -> u64 {
    let mut values = Vec::new();
    for &i in nodes {
        values.push(register(cluster, i, key).await);
    }
    values.sort_unstable();
    // The majority made of the lowest values: its highest is the (n/2+1)-th lowest.
    values[nodes.len() / 2]
}

/// A config whose copies FLUSHALL the node at `victim` once, when the first copy starts
/// (after its census: the sources are fixed).
fn flush_when_the_copy_starts(config: Config, victim: String) -> Config {
    let fired = Arc::new(AtomicBool::new(false));
    config.with_copy_hook_for_tests(move |event| {
        let (fired, victim) = (fired.clone(), victim.clone());
        Box::pin(async move {
            if event == CopyEvent::Started && !fired.swap(true, Ordering::SeqCst) {
                flushall(victim).await;
                println!("hook: the source was flushed as the copy started");
            }
        })
    })
}

/// The traced hole H1: old list {A, B, C} -> new {A, B, D}. An ID round is accepted on A and C
/// (B is cut off); C is cut off while the change seals, so the sources are {A, B}; A is
/// flushed as the copy starts. Returns the old cluster's last ID and the lowest ID register
/// some majority of the new list holds once a client of it has run (after the change is run
/// again once C is back, if the first run refused).
async fn change_with_a_source_flushed(blind: bool) -> (u64, u64) {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let all = cluster.urls();
    let (a, b, c, d) = (&all[0], &all[1], &all[2], &all[3]);
    let old_list = vec![a.clone(), b.clone(), c.clone()];
    let new_list = vec![a.clone(), b.clone(), d.clone()];
    let old = common::connect(config_from_urls(&old_list).unwrap())
        .await
        .expect("the old cluster is set up on A, B, C");
    let ids = IdGenerator::new(&old, "orders").unwrap();
    ids.next_id().await.expect("a first ID on every node");

    cluster.node(1).cut_off();
    // Past B's register (which a spare block may have raised ahead of the IDs returned).
    let stale_b = register(&cluster, 1, "rq:id:orders").await;
    let mut last_old = 0;
    while last_old <= stale_b {
        last_old = *ids
            .next_ids(1000)
            .await
            .expect("A and C accept the rounds")
            .end();
    }
    cluster.node(1).heal();
    println!("the old cluster returned up to {last_old}; B missed the rounds since {stale_b}");

    let mut changer = config_from_urls(&old_list).unwrap();
    changer = flush_when_the_copy_starts(changer, cluster.node(0).direct_url());
    if blind {
        changer = changer.with_blind_copy_reads_for_tests();
    }
    let changer = common::connect(changer)
        .await
        .expect("the operator's client");
    cluster.node(2).cut_off();
    let first = changer
        .change_cluster(config_from_urls(&new_list).unwrap())
        .await;
    println!("the change with C cut off and A flushed during the copy: {first:?}");
    cluster.node(2).heal();
    if !blind {
        assert!(
            matches!(first, Err(Error::Unfinished { .. })),
            "a source flushed during the copy must stop the change, got {first:?}"
        );
        let again = changer
            .change_cluster(config_from_urls(&new_list).unwrap())
            .await
            .expect("run again with C back, the change finishes from the sealed {B, C}");
        println!("run again: {again:?}");
    }
    let new = common::connect(config_from_urls(&new_list).unwrap())
        .await
        .expect("a client of the new list");
    // Let the new list's client repair whatever it finds quarantined.
    common::eventually(
        Duration::from_secs(20),
        "the new cluster answers",
        || async { new.ping().await.is_ok() },
    )
    .await;
    let floor = weakest_majority(&cluster, &[0, 1, 3], "rq:id:orders").await;
    (last_old, floor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_flushed_during_a_node_list_change_stops_it_and_no_id_is_handed_out_twice() {
    let (last_old, floor) = change_with_a_source_flushed(false).await;
    assert!(
        floor >= last_old,
        "every majority of the new list must hold the old cluster's last ID {last_old}; one \
         holds only {floor}, so a new process could hand it out again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_blind_copy_reads_a_source_flushed_during_a_change_makes_ids_go_back() {
    let (last_old, floor) = change_with_a_source_flushed(true).await;
    assert!(
        floor < last_old,
        "the blind copy read the flushed A as empty and the stale B, so some majority of the \
         new list must hold less than the old cluster's last ID {last_old} (got {floor}); if \
         not, this test has no teeth"
    );
}

/// The hole H1 in a repair at N = 5. Rounds reach nodes 0, 3 and 4 only (1 and 2 are cut off
/// from the producer); node 4 is wiped and a client repairs it; node 3 restarts while that
/// repair settles (its data intact, but not verified for its new incarnation, so it is no
/// source: the verified {0, 1, 2} are a majority); node 0, the one source with the newest IDs,
/// is flushed as the copy starts. Returns the producer's last ID and the lowest ID register
/// some majority of the five holds once the cluster answers again.
async fn repair_with_a_source_flushed(blind: bool) -> (u64, u64) {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let urls = cluster.urls();
    let producer = common::connect(config_from_urls(&urls).unwrap())
        .await
        .expect("the cluster is set up on five nodes");
    let ids = IdGenerator::new(&producer, "orders").unwrap();
    ids.next_id().await.expect("a first ID on every node");
    cluster.node(1).cut_off();
    cluster.node(2).cut_off();
    let stale = register(&cluster, 1, "rq:id:orders")
        .await
        .max(register(&cluster, 2, "rq:id:orders").await);
    let mut last = 0;
    while last <= stale {
        last = *ids
            .next_ids(1000)
            .await
            .expect("nodes 0, 3 and 4 accept the rounds")
            .end();
    }
    cluster.node(1).heal();
    cluster.node(2).heal();
    drop((ids, producer));
    println!("IDs up to {last} on nodes 0, 3, 4; nodes 1 and 2 hold {stale}");

    cluster.node(4).wipe_and_restart().await;
    // A settle long enough for node 3's restart to land inside it: the cluster's node
    // timeout, raised to 2 s (every repair waits it).
    let mut config = config_from_urls(&urls)
        .unwrap()
        .with_node_timeout(Duration::from_secs(2));
    redquorum::Client::init_cluster(config.clone())
        .await
        .expect("the node timeout raised to 2 s");
    config = flush_when_the_copy_starts(config, cluster.node(0).direct_url());
    if blind {
        config = config.with_blind_copy_reads_for_tests();
    }
    let (repairer, ()) = tokio::join!(common::connect(config), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cluster.node(3).kill_and_restart().await;
        println!("node 3 restarted while node 4's repair settles");
    });
    let repairer = repairer.expect("the repairing client");
    common::eventually(
        Duration::from_secs(30),
        "every node repaired (each votes again)",
        || async {
            let _ = repairer.ping().await;
            repairer.check().await.iter().all(|r| r.votes)
        },
    )
    .await;
    let floor = weakest_majority(&cluster, &[0, 1, 2, 3, 4], "rq:id:orders").await;
    (last, floor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_flushed_during_a_repair_at_five_nodes_stops_it_and_no_id_is_handed_out_twice() {
    let (last, floor) = repair_with_a_source_flushed(false).await;
    assert!(
        floor >= last,
        "every majority of the five must hold the last ID returned, {last}; one holds only \
         {floor}, so a new process could hand it out again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_blind_copy_reads_a_source_flushed_during_a_repair_at_five_nodes_makes_ids_go_back() {
    let (last, floor) = repair_with_a_source_flushed(true).await;
    assert!(
        floor < last,
        "the blind copy read the flushed node 0 as empty and the stale 1 and 2, so some \
         majority must hold less than the last ID {last} (got {floor}); if not, this test has \
         no teeth"
    );
}

/// The traced hole M1: a repairer pauses between reading a page and writing it; meanwhile its
/// claim is taken over by another client, which repairs the node; a unit is removed and
/// collected. Returns the units listed after the paused repairer resumed.
async fn a_late_page_write(unclaimed: bool) -> std::collections::BTreeSet<String> {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let quick = |c: Config| c.with_operation_timeout(Duration::from_millis(500));
    let producer = common::connect(quick(config_from_urls(&urls).unwrap()))
        .await
        .expect("the producer's client");
    let units = Units::new(&producer, "pool").unwrap();
    units
        .add(&["u".to_string(), "v".to_string()])
        .await
        .expect("two units");

    // Node 2 loses every key but keeps its run_id.
    cluster.node(2).flushall().await;

    // R1 starts repairing it and pauses after reading its first page (u and v).
    let (paused_tx, paused_rx) = tokio::sync::oneshot::channel::<()>();
    let paused_tx = Arc::new(std::sync::Mutex::new(Some(paused_tx)));
    let resume = Arc::new(tokio::sync::Notify::new());
    let mut r1 = quick(config_from_urls(&urls).unwrap());
    if unclaimed {
        r1 = r1.with_unclaimed_copy_writes_for_tests();
    }
    let r1 = r1.with_copy_hook_for_tests({
        let (paused_tx, resume) = (paused_tx.clone(), resume.clone());
        move |event| {
            let tx = (event == CopyEvent::PageRead)
                .then(|| paused_tx.lock().unwrap().take())
                .flatten();
            let resume = resume.clone();
            Box::pin(async move {
                if let Some(tx) = tx {
                    let _ = tx.send(());
                    resume.notified().await;
                }
            })
        }
    });
    let r1 = common::connect(r1).await.expect("R1");
    let _ = Units::new(&r1, "pool").unwrap().list().await;
    tokio::time::timeout(Duration::from_secs(20), paused_rx)
        .await
        .expect("R1's repair reads a page within 20 s")
        .expect("the hook reports the pause");
    println!("R1 paused between its page read and its page write");

    // R2 watches R1's claim unchanged for its lifetime, takes it over and repairs the node.
    let r2 = common::connect(quick(config_from_urls(&urls).unwrap()))
        .await
        .expect("R2");
    common::wait_repaired(cluster.node(2), &r2).await;
    println!("R2 repaired node 2");

    // u is removed and collected on every node (by a client that probed the repaired node:
    // one whose probe predates the repair is refused there once, as after any repair).
    let producer = common::connect(quick(config_from_urls(&urls).unwrap()))
        .await
        .expect("the producer's client, again");
    let units = Units::new(&producer, "pool").unwrap();
    units.remove(&["u".to_string()]).await.expect("remove u");
    common::eventually(Duration::from_secs(10), "u is collected", || async {
        units.collect_removed().await.unwrap_or(0) == 1
    })
    .await;
    assert_eq!(
        units.list().await.expect("list"),
        ["v".to_string()].into(),
        "u removed and collected"
    );

    // R1 resumes with its old page.
    resume.notify_one();
    tokio::time::sleep(Duration::from_secs(2)).await;
    units.list().await.expect("list")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repairer_that_lost_its_claim_writes_nothing_and_a_collected_unit_stays_gone() {
    let listed = a_late_page_write(false).await;
    assert_eq!(
        listed,
        ["v".to_string()].into(),
        "the paused repairer's late page brought a collected unit back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unclaimed_copy_writes_a_late_page_brings_a_collected_unit_back() {
    let listed = a_late_page_write(true).await;
    assert!(
        listed.contains("u"),
        "without the claim check the paused repairer's page must bring u back (listed \
         {listed:?}); if not, this test has no teeth"
    );
}

/// The trap of a dead repairer's claim and a node's clock stepping back: a repairer hangs for
/// good at its copy's start (its claim stays on the node, never refreshed), then the node's
/// wall clock steps back an hour. Returns how long another client took to repair the node, or
/// None when it still did not vote after 30 s.
async fn dead_repairer_then_clock_back(node_clock: bool) -> Option<Duration> {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let config = || {
        let c = config_from_urls(&urls)
            .unwrap()
            .with_operation_timeout(Duration::from_millis(600));
        if node_clock {
            c.with_server_clock_leases_for_tests()
        } else {
            c
        }
    };
    let first = common::connect(config()).await.expect("the cluster");
    IdGenerator::new(&first, "orders")
        .unwrap()
        .next_id()
        .await
        .expect("an ID");
    drop(first);
    cluster.node(2).wipe_and_restart().await;

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let hangs = config().with_copy_hook_for_tests(move |event| {
        if event == CopyEvent::Started {
            if let Some(tx) = tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            return Box::pin(futures::future::pending());
        }
        Box::pin(async {})
    });
    // Its repair runs in a task of its own and hangs there, holding the claim.
    let _dead = common::connect(hangs)
        .await
        .expect("the repairer that dies");
    tokio::time::timeout(Duration::from_secs(20), rx)
        .await
        .expect("the first repair reached its copy")
        .expect("hook");
    cluster.node(2).step_clock_ms(-3_600_000);
    println!("node 2's clock stepped back an hour; its claim is a dead repairer's");

    let started = std::time::Instant::now();
    let other = common::connect(config()).await.expect("another client");
    while started.elapsed() < Duration::from_secs(30) {
        let _ = other.ping().await;
        if other.check().await.get(2).is_some_and(|r| r.votes) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_repairers_claim_is_taken_over_whatever_the_nodes_clock_does() {
    let took = dead_repairer_then_clock_back(false).await;
    println!("repaired by another client after {took:?}");
    assert!(
        took.is_some(),
        "the dead repairer's claim must be taken over after its lifetime on the client's clock, \
         whatever the node's wall clock says; node 2 stayed quarantined for 30 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_claims_expiring_on_the_nodes_clock_a_step_back_keeps_the_node_quarantined() {
    let took = dead_repairer_then_clock_back(true).await;
    assert!(
        took.is_none(),
        "with the claim expiring on the node's clock, stepped back an hour, node 2 must stay \
         quarantined for 30 s (it was repaired after {took:?}): if not, this test has no teeth"
    );
}
