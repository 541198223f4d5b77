//! Repair at scale: a wiped node holding many keys is repaired page by page while IDs keep
//! flowing, and afterwards it carries the majority's values (IDs through it stay ordered).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{client, init_tracing, workload};
use redquorum::IdGenerator;
use redquorum_testkit::checker::check_ids;
use redquorum_testkit::Cluster;
use tokio::time::Instant;

const BULK: u64 = 40_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_with_many_keys_is_repaired_under_load_and_ids_stay_ordered() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let gens: Vec<IdGenerator> = (0..2)
        .map(|_| IdGenerator::new(&c, "live").expect("valid"))
        .collect();
    gens[0].next_id().await.expect("IDs flow");
    // Many sequences, as a majority accepted them, on every node.
    let bulk = redis::Script::new(
        "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('SET', 'rq:id:bulk-' .. i, tostring(i + 1)) end return 1",
    );
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        let mut from = 0;
        while from < BULK {
            let _: i64 = bulk
                .arg(from)
                .arg(from + 9_999)
                .invoke_async(&mut con)
                .await
                .expect("bulk keys");
            from += 10_000;
        }
    }

    let load = {
        let gens = gens.clone();
        tokio::spawn(async move { workload::run(&gens, 3, u64::MAX, Duration::from_secs(6)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.node(2).wipe_and_restart().await;
    let wiped_at = Instant::now();
    let mut con = cluster.node(2).direct_connection().await;
    loop {
        let marker: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut con)
            .await
            .unwrap_or(None);
        if marker.is_some() {
            break;
        }
        assert!(
            wiped_at.elapsed() < Duration::from_secs(30),
            "the wiped node was not repaired within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("repaired {} after the wipe", common::ms(wiped_at.elapsed()));
    let observed = load.await.expect("the workload ran");
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut con)
        .await
        .expect("DBSIZE");
    assert!(
        keys >= BULK,
        "the repaired node holds {keys} keys, fewer than the {BULK} bulk keys"
    );
    let sample: Option<String> = redis::cmd("GET")
        .arg("rq:id:bulk-12345")
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(
        sample.as_deref(),
        Some("12346"),
        "a bulk register carries its value"
    );

    // Node 0 freezes: IDs through {1, 2} must follow every ID issued so far.
    cluster.node(0).freeze().await;
    let mut calls = observed.calls;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        let id = gens[1].next_id().await.expect("the repaired node votes");
        calls.push(redquorum_testkit::checker::IdCall {
            who: "after".into(),
            start,
            end: std::time::Instant::now(),
            ids: vec![id],
        });
    }
    cluster.node(0).thaw().await;
    println!(
        "{} IDs, {} errors during the repair",
        observed.ids, observed.errors
    );
    check_ids(&calls).unwrap_or_else(|v| panic!("checker: {v}"));
}
