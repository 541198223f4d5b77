//! Monotonic IDs against real nodes: uniqueness and real-time order under concurrency,
//! under faults on a minority, and across node amnesia; and the same checker failing when
//! the protection is switched off.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::workload;
use common::{evalsha_calls, eventually, init_tracing, script};
use redquorum::{Error, IdGenerator};
use redquorum_testkit::checker::{check_ids, IdCall};
use redquorum_testkit::Cluster;

async fn generators(urls: &[String], count: usize, sequence: &str) -> Vec<IdGenerator> {
    let mut gens = Vec::new();
    for _ in 0..count {
        // A separate client per generator: separate connections, separate rounds.
        let client = common::connect(common::config_from_urls(urls).expect("valid"))
            .await
            .expect("valid");
        gens.push(IdGenerator::new(&client, sequence).expect("valid name"));
    }
    gens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_from_eight_clients_are_unique_and_in_real_time_order() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let gens = generators(&cluster.urls(), 8, "orders").await;
    let seen = workload::run(&gens, 16, 20_000, Duration::from_secs(60)).await;
    println!(
        "{} IDs in {} calls, {} errors",
        seen.ids,
        seen.calls.len(),
        seen.errors
    );
    assert!(
        seen.ids >= 20_000,
        "the workload must produce 20,000 IDs (got {}; first error: {:?})",
        seen.ids,
        seen.first_error
    );
    assert_eq!(
        seen.errors, 0,
        "a healthy cluster fails no call: {:?}",
        seen.first_error
    );
    if let Err(v) = check_ids(&seen.calls) {
        panic!("checker: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_stay_unique_and_ordered_while_faults_hit_a_minority() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let config = |urls: &[String]| {
        common::config_from_urls(urls)
            .expect("valid")
            .with_node_timeout(Duration::from_millis(100))
            .with_connect_timeout(Duration::from_millis(100))
    };
    let mut gens = Vec::new();
    for _ in 0..8 {
        let client = common::connect(config(&cluster.urls()))
            .await
            .expect("valid");
        gens.push(IdGenerator::new(&client, "faulty").expect("valid"));
    }
    let faults = async {
        // Each phase hits at most two of five nodes.
        for round in 0..2 {
            tracing::warn!(round, "fault: kill -9 node0, freeze node1");
            cluster.node(0).kill().await;
            cluster.node(1).freeze().await;
            tokio::time::sleep(Duration::from_millis(700)).await;
            cluster.node(0).restart().await;
            cluster.node(1).thaw().await;
            // A restarted node stays faulty (quarantined) until it is repaired, which first
            // waits one node timeout for writes in flight: give it that before two more nodes
            // fail, so that at most a minority is faulty at any time.
            tokio::time::sleep(Duration::from_millis(1000)).await;
            tracing::warn!(round, "fault: cut off node2, drop replies of node3");
            cluster.node(2).cut_off();
            cluster.node(3).drop_replies();
            tokio::time::sleep(Duration::from_millis(700)).await;
            cluster.node(2).heal();
            cluster.node(3).heal();
            tracing::warn!(round, "fault: 20 ms latency on node4, kill -9 node1");
            cluster.node(4).set_latency(Duration::from_millis(20));
            cluster.node(1).kill().await;
            tokio::time::sleep(Duration::from_millis(700)).await;
            cluster.node(1).restart().await;
            cluster.node(4).set_latency(Duration::ZERO);
        }
    };
    let (seen, ()) = tokio::join!(
        workload::run(&gens, 8, 20_000, Duration::from_secs(8)),
        faults
    );
    println!(
        "under faults: {} IDs in {} calls, {} failed calls (first: {:?})",
        seen.ids,
        seen.calls.len(),
        seen.errors,
        seen.first_error
    );
    // Every reconnect after a kill, cut-off or lost reply is a TLS handshake in secure mode
    // (`scripts/secure-tests.sh`): about a quarter of the plain progress there (1,072 against
    // 4,644 IDs in one run each, alone on 2 cores), so its bar is a quarter.
    let bar = if redquorum_testkit::secure::secure().is_some() {
        250
    } else {
        1_000
    };
    assert!(
        seen.ids > bar,
        "progress must continue while only a minority is faulty (got {} IDs, need {bar})",
        seen.ids
    );
    if let Err(v) = check_ids(&seen.calls) {
        panic!("checker: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_wiped_mid_run_causes_no_duplicate_and_no_inversion() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let gens = generators(&cluster.urls(), 4, "wiped").await;
    let wipe = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.node(1).wipe_and_restart().await;
    };
    let (seen, ()) = tokio::join!(
        workload::run(&gens, 8, 1_000_000, Duration::from_secs(3)),
        wipe
    );
    println!(
        "across a wipe: {} IDs, {} failed calls",
        seen.ids, seen.errors
    );
    if let Err(v) = check_ids(&seen.calls) {
        panic!("checker: {v}");
    }
    let client = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    eventually(
        Duration::from_secs(10),
        "the wiped node is repaired and votes again",
        || async { client.check().await[1].votes },
    )
    .await;
}

/// One scripted amnesia scenario on three nodes A, B, C:
/// 1. with C cut off, a first client takes IDs from {A, B};
/// 2. B is wiped and restarted empty;
/// 3. C is healed and A cut off: {B, C} is a majority that never saw those IDs;
/// 4. a second client (another process, in effect: its own URL list, so its own
///    high-water mark) asks for IDs.
///
/// Returns the history of both clients.
async fn amnesia_scenario(protect: bool) -> (Vec<IdCall>, Option<Error>) {
    let cluster = Cluster::start(3).await;
    let config = |urls: Vec<String>| {
        let c = common::config_from_urls(urls).expect("valid");
        if protect {
            c
        } else {
            c.with_amnesia_protection_disabled_for_tests()
        }
    };
    let mut calls = Vec::new();
    let mut record = |who: &str, start: std::time::Instant, ids: Vec<u64>| {
        calls.push(IdCall {
            who: who.into(),
            start,
            end: std::time::Instant::now(),
            ids,
        });
    };

    // The cluster is set up (every node marked) while all nodes are up.
    let first = common::connect(config(cluster.urls()))
        .await
        .expect("valid");
    cluster.node(2).cut_off();
    let gen1 = IdGenerator::new(&first, "amnesia").expect("valid");
    for _ in 0..20 {
        let start = std::time::Instant::now();
        let ids = gen1.next_ids(5).await.expect("{A, B} is a majority");
        record("first client", start, ids.collect());
    }

    cluster.node(1).wipe_and_restart().await;
    cluster.node(2).heal();
    cluster.node(0).cut_off();

    let second_urls = vec![
        cluster.node(0).url(),
        cluster.node(1).direct_url(),
        cluster.node(2).url(),
    ];
    let second =
        common::connect(config(second_urls).with_operation_timeout(Duration::from_secs(1)))
            .await
            .expect("valid");
    let gen2 = IdGenerator::new(&second, "amnesia").expect("valid");
    let mut last_error = None;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        match gen2.next_ids(5).await {
            Ok(ids) => record("second client", start, ids.collect()),
            Err(e) => last_error = Some(e),
        }
    }
    if protect {
        // Once A is back, B is repaired from {A, C} and the second client goes on above.
        cluster.node(0).heal();
        let mut ok = false;
        for _ in 0..50 {
            let start = std::time::Instant::now();
            if let Ok(ids) = gen2.next_ids(5).await {
                record("second client after heal", start, ids.collect());
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            ok,
            "after A is healed the wiped node must be repaired and IDs flow again"
        );
    }
    (calls, last_error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_keeps_a_wiped_node_from_repeating_ids() {
    init_tracing();
    let (calls, error) = amnesia_scenario(true).await;
    let err = error.expect("with B quarantined and A cut off there is no majority");
    assert!(
        err.to_string().contains("quarantined"),
        "the error must say the wiped node is quarantined: {err}"
    );
    if let Err(v) = check_ids(&calls) {
        panic!("checker: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_the_checker_catches_repeated_ids() {
    init_tracing();
    let (calls, _) = amnesia_scenario(false).await;
    let verdict = check_ids(&calls);
    println!("checker with quarantine off: {verdict:?}");
    assert!(verdict.is_err(), "with amnesia protection off the wiped node must let IDs repeat, and the checker must see it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_quorum_of_half_the_checker_catches_repeated_ids() {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let half = |urls: Vec<String>| {
        common::config_from_urls(urls)
            .expect("valid")
            .with_unsafe_quorum_for_tests(2)
    };
    let mut calls = Vec::new();

    // {A, B} and {C, D} are both "quorums" of two: they need not intersect.
    let first = common::connect(half(cluster.urls())).await.expect("valid");
    cluster.node(2).cut_off();
    cluster.node(3).cut_off();
    let gen1 = IdGenerator::new(&first, "split").expect("valid");
    for _ in 0..10 {
        let start = std::time::Instant::now();
        let ids = gen1
            .next_ids(5)
            .await
            .expect("two of four is a quorum here");
        calls.push(IdCall {
            who: "first".into(),
            start,
            end: std::time::Instant::now(),
            ids: ids.collect(),
        });
    }
    cluster.node(2).heal();
    cluster.node(3).heal();
    cluster.node(0).cut_off();
    cluster.node(1).cut_off();
    let second_urls = vec![
        cluster.node(0).url(),
        cluster.node(1).url(),
        cluster.node(2).direct_url(),
        cluster.node(3).direct_url(),
    ];
    let second = common::connect(half(second_urls)).await.expect("valid");
    let gen2 = IdGenerator::new(&second, "split").expect("valid");
    for _ in 0..10 {
        let start = std::time::Instant::now();
        let ids = gen2.next_ids(5).await.expect("{C, D} is a quorum of two");
        calls.push(IdCall {
            who: "second".into(),
            start,
            end: std::time::Instant::now(),
            ids: ids.collect(),
        });
    }
    let verdict = check_ids(&calls);
    println!("checker with a quorum of N/2: {verdict:?}");
    assert!(
        verdict.is_err(),
        "two disjoint 'quorums' must repeat IDs, and the checker must see it"
    );

    // The real majority (three of four) refuses the first phase outright.
    let majority = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    let err = IdGenerator::new(&majority, "split")
        .expect("valid")
        .next_id()
        .await
        .expect_err("two of four is no majority");
    assert!(matches!(err, Error::NoQuorum(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_never_counted_as_an_acceptance() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let client = common::connect(
        common::config_from_urls(cluster.urls())
            .expect("valid")
            .with_operation_timeout(Duration::from_secs(1)),
    )
    .await
    .expect("valid");
    let gen = IdGenerator::new(&client, "lost").expect("valid");
    gen.next_id().await.expect("healthy");
    // Let every reply of that round arrive (the round returned at a majority; a straggler's
    // reply still in flight when replies start being dropped would poison its connection
    // before our write is even sent).
    client.check().await;
    // Replies from two of three nodes are lost: they apply the write, but we must not count it.
    cluster.node(0).drop_replies();
    cluster.node(1).drop_replies();
    let err = gen
        .next_id()
        .await
        .expect_err("only one reply can arrive: no majority");
    assert!(
        err.is_outcome_unknown(),
        "lost replies make the outcome unknown: {err}"
    );
    let mut direct = cluster.node(0).direct_connection().await;
    let stored: u64 = redis::cmd("GET")
        .arg("rq:id:lost")
        .query_async(&mut direct)
        .await
        .expect("read");
    assert!(
        stored >= 2,
        "the node did apply the write whose reply was lost (holds {stored})"
    );
    cluster.heal_all();
    let next = gen.next_id().await.expect("healed");
    assert!(
        next > stored,
        "the next ID ({next}) is above whatever the lost write stored ({stored})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error() {
    let cluster = Cluster::start(1).await;
    let client = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    assert!(matches!(IdGenerator::new(&client, ""), Err(Error::Name(_))));
    assert!(matches!(
        IdGenerator::new(&client, "a\nb"),
        Err(Error::Name(_))
    ));
    let gen = IdGenerator::new(&client, "ok").expect("valid");
    let e = gen.next_ids(0).await.expect_err("zero IDs");
    assert!(e.to_string().contains("count must be between 1 and"), "{e}");
    assert!(gen.next_ids(u64::MAX).await.is_err());
    // Near the 2^53 ceiling the sequence says it is exhausted instead of wrapping or lying.
    let mut direct = cluster.node(0).direct_connection().await;
    let _: () = redis::cmd("SET")
        .arg("rq:id:ok")
        .arg((1u64 << 53) - 2)
        .query_async(&mut direct)
        .await
        .expect("set");
    let e = gen.next_ids(5).await.expect_err("past 2^53");
    assert!(matches!(e, Error::Exhausted { .. }), "{e}");
}

/// The fast path's story. Client A's first call is a write round that also reserves spare
/// IDs. Another process's call then returns an ID above that spare (its proposal, sent as its
/// client sends it, is accepted by nodes 0 and 1: a majority). A's next call starts after that
/// one returned, so its ID must be larger. `validated`: A reads a majority before using its
/// spare, sees the higher block, and writes above it; without the read (test-only switch) A
/// returns a spare ID below the other process's. Returns the three calls.
async fn spare_story(validated: bool) -> Vec<IdCall> {
    let cluster = Cluster::start(3).await;
    let config = common::config_from_urls(cluster.urls()).expect("valid");
    let config = if validated {
        config
    } else {
        config.with_unvalidated_spares_for_tests()
    };
    let a = common::connect(config).await.expect("valid");
    let orders = IdGenerator::new(&a, "spare").expect("valid name");
    let call = |who: &str, start: std::time::Instant, ids: Vec<u64>| IdCall {
        who: who.into(),
        start,
        end: std::time::Instant::now(),
        ids,
    };
    let mut calls = Vec::new();

    let start = std::time::Instant::now();
    let first = orders.next_id().await.expect("a healthy cluster");
    calls.push(call("A", start, vec![first]));

    let start = std::time::Instant::now();
    let other = first + redquorum::DEFAULT_LOOKAHEAD + 100;
    for node in &cluster.nodes()[..2] {
        let mut con = node.direct_connection().await;
        let marker: String = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut con)
            .await
            .expect("the node is marked");
        let (status, _): (i64, u64) = script(include_str!("../src/scripts/id_propose.lua"))
            .key("rq:marker")
            .key("rq:id:spare")
            .arg(&marker)
            .arg(other)
            .arg(other)
            .invoke_async(&mut con)
            .await
            .expect("id_propose.lua runs");
        assert_eq!(status, 1, "the other process's block is above A's spare");
    }
    calls.push(call("another process", start, vec![other]));

    let start = std::time::Instant::now();
    let next = orders.next_id().await.expect("a healthy cluster");
    calls.push(call("A again", start, vec![next]));
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_from_the_spare_block_follows_every_id_returned_before_the_call() {
    init_tracing();
    let calls = spare_story(true).await;
    if let Err(v) = check_ids(&calls) {
        panic!("the validating read must keep real-time order: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_validating_read_the_checker_catches_an_older_spare_id() {
    init_tracing();
    let calls = spare_story(false).await;
    let v = check_ids(&calls).expect_err("an unvalidated spare ID must break real-time order");
    println!("caught, as expected: {v}");
}

/// One client, 64 sequences, two callers each, every call a write round (no spare IDs): the
/// proposals of different sequences due together share node calls (node 0 runs far fewer
/// script calls than there were rounds), and each sequence's IDs are still unique and in
/// real-time order, as if each had its own calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_of_many_sequences_share_node_calls_and_each_keeps_its_order() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let client = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    let options = redquorum::IdOptions::default()
        .with_lookahead(0)
        .expect("valid");
    let gens: Vec<IdGenerator> = (0..64)
        .map(|i| IdGenerator::with_options(&client, &format!("many-{i}"), options.clone()))
        .collect::<Result<_, _>>()
        .expect("valid names");
    let before = evalsha_calls(cluster.node(0)).await;
    let seen = workload::run(&gens, 2, 6_000, Duration::from_secs(60)).await;
    let calls_on_node = evalsha_calls(cluster.node(0)).await - before;
    assert_eq!(seen.errors, 0, "a healthy cluster: {:?}", seen.first_error);
    println!(
        "{} calls of 64 sequences, {calls_on_node} script calls on node 0",
        seen.calls.len()
    );
    assert!(
        calls_on_node * 2 < seen.calls.len() as u64,
        "proposals due together must share calls: {calls_on_node} script calls for {} rounds",
        seen.calls.len()
    );
    for g in 0..64 {
        let prefix = format!("gen{g}/");
        let mine: Vec<IdCall> = seen
            .calls
            .iter()
            .filter(|c| c.who.starts_with(&prefix))
            .cloned()
            .collect();
        assert!(!mine.is_empty(), "sequence many-{g} made progress");
        if let Err(v) = check_ids(&mine) {
            panic!("sequence many-{g}: {v}");
        }
    }
}

/// Generators made one after another in one process (a generator per request) each start
/// above the blocks the earlier ones reserved with their spare IDs: no lost round, no random
/// jump, each first ID just above the previous generator's block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_generators_in_one_process_start_above_the_reserved_spares() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let client = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    let mut firsts = Vec::new();
    for _ in 0..4 {
        let gen = IdGenerator::new(&client, "per-request").expect("valid name");
        firsts.push(gen.next_id().await.expect("a healthy cluster"));
    }
    let step = redquorum::DEFAULT_LOOKAHEAD + 1;
    assert_eq!(
        firsts,
        vec![1, 1 + step, 1 + 2 * step, 1 + 3 * step],
        "each fresh generator's first round starts just above the last reserved block"
    );
}

/// Near the end of the sequence (2^53 - 1) the spare shrinks and a lost round's jump stays
/// below the end: IDs keep coming, increasing, up to 2^53 - 1 itself, and only then does the
/// generator report exhaustion. (The first round, proposed from 1, loses and jumps a random
/// distance above the nodes' value; how many IDs remain after it varies.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_ids_below_two_to_the_53_are_handed_out_before_exhaustion() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let client = common::connect(common::config_from_urls(cluster.urls()).expect("valid"))
        .await
        .expect("valid");
    let limit: u64 = 1 << 53;
    for node in cluster.nodes() {
        let mut con = node.direct_connection().await;
        let _: () = redis::cmd("SET")
            .arg("rq:id:near-the-end")
            .arg(limit - 10)
            .query_async(&mut con)
            .await
            .expect("SET");
    }
    let gen = IdGenerator::new(&client, "near-the-end").expect("valid name");
    let mut got = Vec::new();
    let end = loop {
        match gen.next_id().await {
            Ok(id) => got.push(id),
            Err(e) => break e,
        }
        assert!(got.len() <= 9, "at most 9 IDs remain: {got:?}");
    };
    assert!(
        matches!(end, Error::Exhausted { .. }),
        "the sequence ends exhausted: {end:?}"
    );
    assert!(!got.is_empty(), "IDs remained below 2^53");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "increasing: {got:?}");
    assert!(got[0] > limit - 10, "above the nodes' value: {got:?}");
    assert_eq!(got.last(), Some(&(limit - 1)), "the last ID is 2^53 - 1");
}
