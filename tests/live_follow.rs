//! A running client follows a change of its node list (issue 43, item 8): a lock holder, a
//! group and an idle client, all connected before `cluster change` swapped node 2 for node 3,
//! go on through the new list without a restart; a successor the seals do not name is not
//! followed.
//!
//! After the swap node 1 is frozen, so only the new list ({0, 3}) still gives a majority: the
//! same story with the test-only switch `without_live_follow_for_tests` loses the lease, the
//! group's assignments and the idle client's IDs, or the test has no teeth.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{init_tracing, ms};
use redquorum::{Assignment, Client, Config, GroupOptions, IdGenerator, Lock, Member};
use redquorum_testkit::Cluster;
use tokio::time::Instant;

/// The holder's TTL: far longer than the change (seal, one node timeout, copy, mark) and the
/// look for the successor, on a loaded machine.
const TTL: Duration = Duration::from_secs(8);
/// The group's beat interval (membership leases last 1.25 intervals).
const INTERVAL: Duration = Duration::from_secs(4);

fn config(urls: &[String], live_follow: bool) -> Config {
    let config = common::config_from_urls(urls).expect("test URLs are valid");
    if live_follow {
        config
    } else {
        config.without_live_follow_for_tests()
    }
}

fn sorted(mut urls: Vec<String>) -> Vec<String> {
    urls.sort();
    urls
}

/// The URLs a client of `urls` shows ([`Client::node_urls`]), sorted.
fn urls_of(urls: &[String]) -> Vec<String> {
    sorted(
        config(urls, true)
            .nodes()
            .iter()
            .map(ToString::to_string)
            .collect(),
    )
}

/// What the running clients kept through the swap.
struct Kept {
    /// When the holder's lease was lost, if it was.
    lost: Option<String>,
    /// The holder's lease is held at the end.
    held: bool,
    /// The least validity the holder's lease had left, sampled every 20 ms from the change on.
    least_left: Duration,
    /// The holder's nodes at the end, and the new list's.
    holder_nodes: Vec<String>,
    new_nodes: Vec<String>,
    /// Each member's assignments (index, replicas) before the swap and at the end.
    indices_before: Vec<(u32, u32)>,
    indices_after: Vec<Option<(u32, u32)>>,
    /// Each member's longest stretch without an assignment after it first settled.
    longest_gap: Duration,
    /// The idle client's ID after the swap, or its error.
    idle_id: Result<u64, String>,
    /// The idle client's last ID before the swap.
    idle_last: u64,
}

async fn join(urls: &[String], live_follow: bool, id: &str) -> Member {
    let client = common::connect(config(urls, live_follow))
        .await
        .expect("a client of the old list");
    let opts = GroupOptions::default()
        .with_interval(INTERVAL)
        .record_history_for_tests();
    Member::join(&client, "swap-workers", id, opts)
        .await
        .expect("join")
}

/// The least validity `guard` has left while sampled every 20 ms for `d`.
async fn left_during(guard: &redquorum::LockGuard, d: Duration) -> Duration {
    let end = Instant::now() + d;
    let mut least = TTL;
    while Instant::now() < end {
        least = least.min(
            guard
                .valid_until()
                .saturating_duration_since(Instant::now()),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    least
}

/// Wait until both members hold active assignments of one view with two replicas.
async fn settled(members: &[&Member]) -> Vec<(u32, u32)> {
    let limit = Instant::now() + INTERVAL * 6;
    loop {
        let a: Vec<Option<Assignment>> = members.iter().map(|m| m.assignment()).collect();
        let same_view = a.windows(2).all(|w| match (&w[0], &w[1]) {
            (Some(x), Some(y)) => x.version == y.version,
            _ => false,
        });
        if same_view && a.iter().flatten().all(|x| x.replicas == 2) {
            return a
                .into_iter()
                .flatten()
                .map(|x| (x.index, x.replicas))
                .collect();
        }
        assert!(Instant::now() < limit, "the group never settled: {a:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The longest stretch, after `from`, during which the member published no assignment (or
/// its published assignment had run out).
fn longest_gap(history: &[(Instant, Option<Assignment>)], from: Instant, end: Instant) -> Duration {
    let mut covered_until = from;
    let mut longest = Duration::ZERO;
    for (i, (at, a)) in history.iter().enumerate() {
        let next = history.get(i + 1).map_or(end, |(t, _)| *t);
        if next <= from {
            continue;
        }
        if let Some(a) = a {
            let start = (*at).max(from);
            longest = longest.max(start.saturating_duration_since(covered_until));
            covered_until = covered_until.max(next.min(a.valid_until()));
        }
    }
    longest.max(end.saturating_duration_since(covered_until))
}

/// Nodes 0, 1, 2 form the cluster. A holder of an auto-extended lease, a group of two members
/// and an idle client run, each with its own client of that list. An operator swaps node 2 for
/// node 3 (`cluster change`); then node 1 freezes, so only the new list has a majority.
async fn swap_a_node_under_running_clients(live_follow: bool) -> Kept {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let all = cluster.urls();
    let old = all[..3].to_vec();
    let new = vec![all[0].clone(), all[1].clone(), all[3].clone()];

    let holder = common::connect(config(&old, live_follow))
        .await
        .expect("the holder's client");
    let guard = Lock::new(&holder, "swap-lease", TTL)
        .expect("valid")
        .try_acquire()
        .await
        .expect("the lease is free");
    let (a, b) = (
        join(&old, live_follow, "a").await,
        join(&old, live_follow, "b").await,
    );
    let indices_before = settled(&[&a, &b]).await;
    let idle = common::connect(config(&old, live_follow))
        .await
        .expect("the idle client");
    let ids = IdGenerator::new(&idle, "swap-ids").expect("valid");
    let idle_last = ids.next_id().await.expect("an ID before the swap");

    let operator = Client::connect(config(&old, true))
        .await
        .expect("the operator's client");
    let started = Instant::now();
    let change = operator
        .change_cluster(config(&new, true))
        .await
        .expect("node 2 is swapped for node 3");
    println!(
        "swapped {} -> {} in {} (sealed {}, marked {}, {} keys)",
        change.from.describe(),
        change.to.describe(),
        ms(started.elapsed()),
        change.sealed,
        change.marked,
        change.keys
    );
    // Let the running clients meet the sealed list (the holder extends every TTL / 3, the
    // members beat every interval), then take node 1 away from the old list's majority.
    let mut least_left = TTL;
    least_left = least_left.min(left_during(&guard, INTERVAL + Duration::from_secs(1)).await);
    cluster.node(1).freeze().await;
    let idle_id = ids.next_id().await.map_err(|e| e.to_string());
    least_left = least_left.min(left_during(&guard, TTL + Duration::from_secs(2)).await);
    let end = Instant::now();
    let kept = Kept {
        lost: guard.lost_at().map(|at| format!("lost at {at:?}")),
        held: guard.is_held(),
        least_left,
        holder_nodes: sorted(holder.node_urls()),
        new_nodes: urls_of(&new),
        indices_before,
        indices_after: [&a, &b]
            .iter()
            .map(|m| m.assignment().map(|x| (x.index, x.replicas)))
            .collect(),
        longest_gap: [&a, &b]
            .iter()
            .map(|m| longest_gap(&m.history_for_tests(), started, end))
            .max()
            .unwrap_or_default(),
        idle_id,
        idle_last,
    };
    cluster.node(1).thaw().await;
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_holder_group_and_idle_client_follow_a_swapped_node() {
    let kept = swap_a_node_under_running_clients(true).await;
    println!(
        "lost {:?}, held {} (least validity left {}), holder's nodes {:?}, members {:?} -> {:?}, \
         longest gap {}, idle client's ID {:?} after {}",
        kept.lost,
        kept.held,
        ms(kept.least_left),
        kept.holder_nodes,
        kept.indices_before,
        kept.indices_after,
        ms(kept.longest_gap),
        kept.idle_id,
        kept.idle_last
    );
    assert_eq!(
        kept.lost, None,
        "the holder's lease must survive the swap (its extensions follow the new list)"
    );
    assert!(kept.held, "the holder must still hold its lease");
    assert_eq!(
        kept.holder_nodes, kept.new_nodes,
        "the holder works through the new list"
    );
    let before: Vec<Option<(u32, u32)>> = kept.indices_before.iter().copied().map(Some).collect();
    assert_eq!(
        kept.indices_after, before,
        "each member keeps its index through the swap"
    );
    assert_eq!(
        kept.longest_gap,
        Duration::ZERO,
        "no member may be left without an assignment during the swap"
    );
    match kept.idle_id {
        Ok(id) => assert!(
            id > kept.idle_last,
            "the idle client's ID {id} must follow its last {}",
            kept.idle_last
        ),
        Err(e) => panic!("an operation started after the swap must work on the new list: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_live_follow_a_swapped_node_costs_the_lease_the_group_and_the_ids() {
    let kept = swap_a_node_under_running_clients(false).await;
    println!(
        "lost {:?}, held {}, members {:?} -> {:?}, longest gap {}, idle client's ID {:?}",
        kept.lost,
        kept.held,
        kept.indices_before,
        kept.indices_after,
        ms(kept.longest_gap),
        kept.idle_id
    );
    assert!(
        kept.lost.is_some() && !kept.held,
        "without the follow the old list's holder must lose its lease"
    );
    assert!(
        kept.longest_gap > Duration::ZERO,
        "without the follow the members must lose their assignments"
    );
    assert!(
        kept.idle_id.is_err(),
        "without the follow the idle client must get no ID"
    );
}

/// A running client whose old nodes' seals name a successor other than the one the new nodes
/// hold (a bogus seal on node 2 after the swap) does not follow: it stays on its list, and with
/// node 1 frozen its operations fail rather than run on an unverified list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_client_never_follows_a_successor_the_seals_do_not_name() {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let all = cluster.urls();
    let old = all[..3].to_vec();
    let new = vec![all[0].clone(), all[1].clone(), all[3].clone()];
    let client = common::connect(config(&old, true))
        .await
        .expect("a client of the old list");
    let ids = IdGenerator::new(&client, "bogus-ids").expect("valid");
    ids.next_id().await.expect("an ID before the swap");
    Client::connect(config(&old, true))
        .await
        .expect("the operator's client")
        .change_cluster(config(&new, true))
        .await
        .expect("node 2 is swapped for node 3");

    let mut n2 = cluster.node(2).direct_connection().await;
    let marker: String = redis::cmd("GET")
        .arg("rq:marker")
        .query_async(&mut n2)
        .await
        .expect("node 2's marker");
    let (head, _) = marker
        .split_once("#sealed:")
        .expect("node 2 was sealed by the change");
    let () = redis::cmd("SET")
        .arg("rq:marker")
        .arg(format!("{head}#sealed:0123456789abcdef"))
        .query_async(&mut n2)
        .await
        .expect("SET");
    cluster.node(1).freeze().await;
    let got = ids.next_id().await;
    let nodes = sorted(client.node_urls());
    cluster.node(1).thaw().await;
    println!("after the bogus seal: {got:?} through {nodes:?}");
    assert_eq!(
        nodes,
        urls_of(&old),
        "a successor the seals do not name must not be followed"
    );
    assert!(
        got.is_err(),
        "with node 1 frozen the old list has no majority, and no other list may be used: {got:?}"
    );
}

/// A change to another node count (3 -> 5) under a running holder and a running ID generator:
/// the batched calls (extensions, ID rounds) count with the new list's majority (3 of 5),
/// never stopping at the old one's (2), so the lease is kept and IDs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_holder_and_id_generator_follow_a_grown_cluster() {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let old = all[..3].to_vec();
    let holder = common::connect(config(&old, true))
        .await
        .expect("the holder's client");
    let guard = Lock::new(&holder, "grow-lease", TTL)
        .expect("valid")
        .try_acquire()
        .await
        .expect("the lease is free");
    let ids = IdGenerator::new(&holder, "grow-ids").expect("valid");
    let last = ids.next_id().await.expect("an ID before the change");

    let started = Instant::now();
    Client::connect(config(&old, true))
        .await
        .expect("the operator's client")
        .change_cluster(config(&all, true))
        .await
        .expect("the cluster grows to five nodes");
    println!("grown in {}", ms(started.elapsed()));
    // Several extensions (every TTL / 3) and ID rounds on the new list.
    let mut least_left = left_during(&guard, TTL / 2).await;
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(ids.next_id().await.map_err(|e| e.to_string()));
        least_left = least_left.min(left_during(&guard, TTL / 4).await);
    }
    let nodes = sorted(holder.node_urls());
    println!(
        "lost {:?}, held {}, least validity left {}, nodes {nodes:?}, IDs {got:?} after {last}",
        guard.lost_at(),
        guard.is_held(),
        ms(least_left)
    );
    assert_eq!(nodes, urls_of(&all), "the client follows the grown list");
    assert_eq!(
        guard.lost_at(),
        None,
        "the holder's extensions must count with the new list's majority"
    );
    assert!(guard.is_held(), "the holder must still hold its lease");
    let mut prev = last;
    for id in got {
        let id = id.expect("ID rounds on the grown list must reach its majority");
        assert!(id > prev, "IDs must go on increasing: {id} after {prev}");
        prev = id;
    }
}
