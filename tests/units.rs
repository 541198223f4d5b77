//! The units of a pool on real nodes: add, remove, list; concurrent producers; a node down and
//! a node wiped in between.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::{client, init_tracing};
use redquorum::{Error, Units};
use redquorum_testkit::Cluster;

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_units_are_listed_and_removed_ones_never_are_whatever_node_fails() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let sites = Units::new(&c, "parsers").unwrap();
    sites.add(&names("site", 30)).await.expect("added");
    cluster.node(0).kill().await;
    sites
        .remove(&names("site", 10))
        .await
        .expect("removed with node 0 down");
    cluster.node(0).restart().await;
    cluster.node(1).wipe_and_restart().await;
    sites
        .add(&["site-3".to_string()])
        .await
        .expect("added again");
    let listed = sites.list().await.expect("listed");
    let mut want: BTreeSet<String> = names("site", 30)[10..].iter().cloned().collect();
    want.insert("site-3".into());
    assert_eq!(
        listed, want,
        "a unit removed is never listed; one added again is"
    );
    let other = client(&cluster.urls()).await;
    assert_eq!(
        Units::new(&other, "parsers").unwrap().list().await.unwrap(),
        want,
        "any client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_producers_at_once_lose_nothing() {
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let mut tasks = Vec::new();
    for p in 0..8 {
        let units = Units::new(&c, "mailboxes").unwrap();
        tasks.push(tokio::spawn(async move {
            for batch in names(&format!("p{p}"), 200).chunks(25) {
                units.add(batch).await.expect("added");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let listed = Units::new(&c, "mailboxes").unwrap().list().await.unwrap();
    assert_eq!(listed.len(), 8 * 200, "every producer's units");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_hostile_unit_is_refused_before_anything_is_sent() {
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let units = Units::new(&c, "pool").unwrap();
    for bad in ["", "a\nb", &"x".repeat(600)] {
        assert!(
            matches!(
                units.add(&["ok".into(), bad.to_string()]).await,
                Err(Error::Name(_))
            ),
            "{bad:?} must be refused"
        );
    }
    assert!(
        units.list().await.unwrap().is_empty(),
        "nothing was sent, not even `ok`"
    );
    assert!(matches!(Units::new(&c, ""), Err(Error::Name(_))));
}

/// The removals reached only nodes 1 and 2 (node 0 was down); node 1 is then wiped and node 2
/// goes down, so the only majority left is node 0 (which never saw the removals) and the wiped
/// node 1. Run with the amnesia protection (`protected`), node 1 must be repaired from a
/// majority of the others first, which is impossible: the list fails instead of answering.
/// Returns the removed units the first answer showed, or None when no list answered.
async fn removed_units_listed_after_a_wipe(protected: bool) -> Option<usize> {
    let cluster = Cluster::start(3).await;
    let mut config = redquorum::Config::from_urls(cluster.urls()).expect("valid");
    if !protected {
        config = config.with_amnesia_protection_disabled_for_tests();
    }
    let c = common::connect(config).await.expect("connect");
    let sites = Units::new(&c, "parsers").unwrap();
    sites.add(&names("site", 20)).await.expect("added");
    cluster.node(0).kill().await;
    sites
        .remove(&names("site", 10))
        .await
        .expect("removed on nodes 1 and 2");
    cluster.node(0).restart().await;
    cluster.node(1).wipe_and_restart().await;
    cluster.node(2).kill().await;
    let removed: BTreeSet<String> = names("site", 10).into_iter().collect();
    // The restarted nodes are reconnected lazily: ask for up to 5 s, take the first answer.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if let Ok(listed) = sites.list().await {
            return Some(listed.intersection(&removed).count());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_never_brings_a_removed_unit_back() {
    let shown = removed_units_listed_after_a_wipe(true).await;
    assert!(
        shown.is_none_or(|n| n == 0),
        "a removed unit was listed again ({shown:?} of 10)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_amnesia_protection_a_wiped_node_brings_removed_units_back() {
    let shown = removed_units_listed_after_a_wipe(false).await;
    assert_eq!(
        shown,
        Some(10),
        "the wiped node's empty answer must let node 0's stale adds through"
    );
}

/// Collect removals, then replay an old add of a collected unit on one node, as a write
/// delayed in the network would land. Returns (collected, whether the unit came back).
async fn replayed_add_after_collection(floor: bool) -> (usize, bool) {
    let cluster = Cluster::start(3).await;
    let units = Units::new(&client(&cluster.urls()).await, "gc").expect("pool");
    let names: Vec<String> = (0..20).map(|i| format!("u{i:02}")).collect();
    units.add(&names).await.expect("added");
    units.remove(&names[..10]).await.expect("removed");
    let collected = if floor {
        units.collect_removed().await
    } else {
        units.collect_removed_without_floor_for_tests().await
    }
    .expect("collected");
    let listed = units.list().await.expect("listed");
    let kept: BTreeSet<String> = names[10..].iter().cloned().collect();
    assert_eq!(listed, kept, "collection changed what is listed");
    // The add of u00 at the pool's first version, delayed until after its removal was
    // collected, lands on node 0.
    let applied = units
        .replay_add_for_tests("u00", 1, 0)
        .await
        .expect("replayed");
    let back = units.list().await.expect("listed").contains("u00");
    assert_eq!(applied, back, "the replay's effect and the listing agree");
    (collected, back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collected_removals_stay_removed_when_an_old_write_lands_late() {
    init_tracing();
    let (collected, back) = replayed_add_after_collection(true).await;
    assert_eq!(
        collected, 10,
        "every removal held on all nodes is collected"
    );
    assert!(
        !back,
        "a delayed add below the collection floor brought a removed unit back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_floor_a_late_old_write_brings_a_collected_unit_back() {
    init_tracing();
    let (collected, back) = replayed_add_after_collection(false).await;
    assert_eq!(collected, 10);
    assert!(
        back,
        "without the floor the delayed add must resurrect the unit (the checker has teeth)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_with_a_node_down_collects_nothing_and_changes_nothing() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let units = Units::new(&client(&cluster.urls()).await, "gc").expect("pool");
    let names: Vec<String> = (0..4).map(|i| format!("u{i}")).collect();
    units.add(&names).await.expect("added");
    units.remove(&names[..2]).await.expect("removed");
    cluster.node(2).kill().await;
    assert_eq!(units.collect_removed().await.expect("read"), 0);
    cluster.node(2).restart().await;
    let want: BTreeSet<String> = names[2..].iter().cloned().collect();
    assert_eq!(units.list().await.expect("listed"), want);
}

/// One collection of two removed units while node 1's replies take 600 ms (300 ms each way)
/// on a client with the default node timeout (250 ms): the count collected, and how long it
/// took.
/// Every node must apply the collection's floor before anything is deleted, so node 1's late
/// reply decides it.
async fn collection_with_a_slow_node(bounded: bool) -> (usize, std::time::Duration) {
    use std::time::{Duration, Instant};

    let cluster = Cluster::start(3).await;
    let mut config = common::config_from_urls(cluster.urls()).unwrap();
    if !bounded {
        config = config.with_unbounded_vote_deadlines_for_tests();
    }
    let c = common::connect(config).await.expect("client");
    let units = Units::new(&c, "slow").expect("pool");
    let names: Vec<String> = (0..4).map(|i| format!("u{i}")).collect();
    units.add(&names).await.expect("added");
    units.remove(&names[..2]).await.expect("removed");
    // Node 1 answers, but later than the node timeout: a repair of another node would have
    // stopped waiting for this write in flight before it lands.
    cluster.node(1).set_latency(Duration::from_millis(300));
    let started = Instant::now();
    let collected = units.collect_removed().await.expect("the read answers");
    let took = started.elapsed();
    cluster.node(1).set_latency(Duration::ZERO);
    (collected, took)
}

/// Every vote that may change a node counts a reply only within the cluster's node timeout,
/// the time a repair waits for writes in flight before it reads the other nodes: a
/// collection's floor, applied by a node whose reply comes after that, is not counted (the
/// collection collects nothing and leaves the removals for later). Unit writes and the pool's
/// list writes once waited the 5 s operation timeout for such a reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_never_counted_from_a_reply_later_than_the_node_timeout() {
    init_tracing();
    let (collected, took) = collection_with_a_slow_node(true).await;
    assert_eq!(
        collected, 0,
        "the collection counted node 1's floor from a reply later than the 250 ms node timeout \
         (it took {took:?}): a repair waiting the node timeout could miss that write"
    );
}

/// The teeth: with the bound switched off, the same collection waits for node 1's late reply
/// (the 5 s operation timeout allows it) and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_bound_a_write_is_counted_from_a_late_reply() {
    init_tracing();
    let (collected, took) = collection_with_a_slow_node(false).await;
    assert_eq!(
        collected, 2,
        "without the bound, node 1's late floor (took {took:?}) is counted and the two removals \
         collected"
    );
    assert!(
        took >= std::time::Duration::from_millis(550),
        "the count waited for node 1's 600 ms reply, took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_all_leaves_exactly_the_new_units() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let units = Units::new(&client(&cluster.urls()).await, "rp").expect("pool");
    let set = |names: &[&str]| -> Vec<String> { names.iter().map(|s| s.to_string()).collect() };
    units.add(&set(&["a", "b", "c"])).await.expect("added");
    units
        .replace_all(&set(&["b", "c", "d", "e"]))
        .await
        .expect("replaced");
    let want: BTreeSet<String> = set(&["b", "c", "d", "e"]).into_iter().collect();
    assert_eq!(units.list().await.expect("listed"), want);
    units.replace_all(&[]).await.expect("emptied");
    assert!(
        units.list().await.expect("listed").is_empty(),
        "replace by nothing empties the pool"
    );
}

/// What the pool leader's reader returned: the units, and per node that answered whether it
/// sent its whole register and how many fields.
async fn leader_read(
    reader: &redquorum::LeaderUnitsForTests,
) -> (BTreeSet<String>, Vec<(bool, usize)>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match reader.read().await {
            Ok(r) => return r,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the leader's read of the units never succeeded: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// A raw write on one node, as a client that does not keep the change log would make it: the
/// entry raised and the stamp moved, nothing logged.
async fn unlogged_add(url: &str, pool: &str, unit: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::pipe()
        .cmd("HSET")
        .arg(format!("rq:units:{pool}"))
        .arg(unit)
        .arg(2_000_000_001u64)
        .ignore()
        .cmd("INCR")
        .arg(format!("rq:ustamp:{pool}"))
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let logged: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("rq:ulog:{pool}"))
        .arg(unit)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        logged, None,
        "the raw write is not in the node's change log: a reader trusting the log alone would \
         miss {unit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_leader_reads_only_what_changed_and_nothing_a_node_did_not_log() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let c = client(&urls).await;
    let units = Units::new(&c, "logged").unwrap();
    units.add(&names("u", 50)).await.expect("added");
    // The add returns once a majority applied it, and the third node's request may have been
    // dropped unsent (or the node not yet voting): add again until every node holds the 50, so
    // the first read below sees the same register on every node.
    let mut every_node_holds_them = false;
    for _ in 0..20 {
        let mut held = Vec::new();
        for i in 0..3 {
            let mut con = cluster.node(i).direct_connection().await;
            let n: usize = redis::cmd("HLEN")
                .arg("rq:units:logged")
                .query_async(&mut con)
                .await
                .unwrap();
            held.push(n);
        }
        if held.iter().all(|n| *n == 50) {
            every_node_holds_them = true;
            break;
        }
        units.add(&names("u", 50)).await.expect("added again");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        every_node_holds_them,
        "every node holds the 50 units after twenty adds"
    );
    let reader = redquorum::LeaderUnitsForTests::new(&c, "logged").unwrap();

    // A node's first reply is its whole register; once every node has answered once, nothing
    // changed means nothing sent.
    let (seen, per_node) = leader_read(&reader).await;
    assert_eq!(seen.len(), 50);
    assert!(
        per_node.iter().all(|(whole, n)| *whole && *n == 50),
        "a first read takes each node's whole register: {per_node:?}"
    );
    let mut quiet = false;
    for _ in 0..10 {
        let (seen, per_node) = leader_read(&reader).await;
        assert_eq!(seen.len(), 50);
        assert!(
            per_node
                .iter()
                .all(|(whole, n)| (*whole && *n == 50) || (!*whole && *n == 0)),
            "a node with a cursor sends nothing when nothing changed: {per_node:?}"
        );
        if per_node.iter().all(|(whole, _)| !*whole) {
            quiet = true;
            break;
        }
    }
    assert!(
        quiet,
        "the nodes answering a read sent empty deltas within ten reads"
    );

    // One unit added and one removed: each node sends those two fields, not the pool.
    units.add(&["x".to_string()]).await.expect("added");
    units.remove(&["u-0".to_string()]).await.expect("removed");
    let (seen, per_node) = leader_read(&reader).await;
    assert!(seen.contains("x") && !seen.contains("u-0"), "{seen:?}");
    assert!(
        per_node
            .iter()
            .filter(|(whole, n)| !*whole && *n <= 2)
            .count()
            >= 2,
        "a change costs O(change) on every node read before (a node whose replies always came \
         after the majority's has no cursor yet and sends its register): {per_node:?}"
    );

    // A write that did not log (an older client), on a majority: those nodes send their whole
    // register again and the unit is seen.
    for url in &urls[..2] {
        unlogged_add(url, "logged", "y").await;
    }
    let (seen, per_node) = leader_read(&reader).await;
    assert!(
        seen.contains("y"),
        "a unit written without the log on a majority must be seen: {per_node:?}"
    );
    assert!(
        per_node.iter().any(|(whole, _)| *whole),
        "a node whose stamp moved without its log sends its whole register: {per_node:?}"
    );

    // Node 2 misses an add, restarts with its data and is repaired (the unit copied onto it,
    // unlogged); node 0 then dies, so the read's majority is nodes 1 and 2.
    cluster.node(2).kill().await;
    units
        .add(&["z".to_string()])
        .await
        .expect("added with node 2 down");
    cluster.node(2).restart().await;
    common::wait_repaired(cluster.node(2), &c).await;
    cluster.node(0).kill().await;
    let (seen, per_node) = leader_read(&reader).await;
    assert!(
        seen.contains("z") && seen.contains("y") && seen.contains("x") && !seen.contains("u-0"),
        "after node 2's restart and repair, with node 0 down: {per_node:?}, {} units",
        seen.len()
    );
    assert_eq!(seen.len(), 52, "u-1..u-49, x, y, z");
}

/// The leader read the units, then a unit is removed and its removal collected on every node
/// before the leader's next read. `logged`: the collection as `units_gc.lua` makes it (logged
/// like a change); otherwise as a collection that does not log (raw HDEL and ZREM on each node,
/// as this crate's first collection did). Returns whether the leader's next read shows the
/// removed unit.
async fn removal_collected_between_leader_reads(logged: bool) -> bool {
    let nodes = redquorum_testkit::LocalNodes::start(3);
    let urls = nodes.urls();
    let c = client(&urls).await;
    let units = Units::new(&c, "p").unwrap();
    units.add(&names("u", 5)).await.expect("added");
    let reader = redquorum::LeaderUnitsForTests::new(&c, "p").unwrap();
    for _ in 0..3 {
        leader_read(&reader).await;
    }
    units.remove(&["u-0".to_string()]).await.expect("removed");
    if logged {
        let other = Units::new(&client(&urls).await, "p").unwrap();
        assert_eq!(other.collect_removed().await.expect("collected"), 1);
    } else {
        for url in &urls {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let () = redis::pipe()
                .cmd("HDEL")
                .arg("rq:units:p")
                .arg("u-0")
                .ignore()
                .cmd("ZREM")
                .arg("rq:ulog:p")
                .arg("u-0")
                .ignore()
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    assert!(
        !units.list().await.expect("listed").contains("u-0"),
        "a fresh read does not list u-0"
    );
    let (seen, per_node) = leader_read(&reader).await;
    println!("leader read after the removal and its collection: {per_node:?}");
    seen.contains("u-0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_collected_before_the_leader_read_it_stays_removed_for_the_leader() {
    assert!(
        !removal_collected_between_leader_reads(true).await,
        "u-0 was removed (Ok) before the read began: the leader must not see it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_that_does_not_log_hides_the_removal_from_the_leader() {
    assert!(
        removal_collected_between_leader_reads(false).await,
        "with an unlogged collection the leader's copies keep the add: the test above has teeth"
    );
}

/// Without the amnesia protection every node answers under the marker "*": the leader's
/// cursors must still be per node (one shared cursor made a read of nodes 0 and 2 miss a unit
/// on nodes 1 and 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_cursors_are_per_node_even_when_markers_are_alike() {
    let nodes = redquorum_testkit::LocalNodes::start(3);
    let urls = nodes.urls();
    let cfg = redquorum::Config::from_urls(&urls)
        .unwrap()
        .with_amnesia_protection_disabled_for_tests();
    let c = common::connect(cfg).await.unwrap();
    let units = Units::new(&c, "q").unwrap();
    units.add(&["x".to_string()]).await.unwrap();
    let reader = redquorum::LeaderUnitsForTests::new(&c, "q").unwrap();
    leader_read(&reader).await;
    let mut v = 1_000_000u64;
    for i in 0..5 {
        for n in [0, 1] {
            v += 1;
            assert!(units
                .replay_add_for_tests(&format!("a{i}"), v, n)
                .await
                .unwrap());
        }
    }
    nodes.freeze(2);
    leader_read(&reader).await;
    nodes.thaw(2);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    v += 1;
    for n in [1, 2] {
        assert!(units.replay_add_for_tests("b", v, n).await.unwrap());
    }
    for i in 0..5 {
        v += 1;
        assert!(units
            .replay_add_for_tests(&format!("c{i}"), v, 2)
            .await
            .unwrap());
    }
    nodes.freeze(1);
    let (seen, _) = leader_read(&reader).await;
    nodes.thaw(1);
    assert!(
        seen.contains("b"),
        "b is on nodes 1 and 2 (a majority) but the read of nodes 0 and 2 missed it"
    );
}
