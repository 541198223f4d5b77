//! State that can no longer matter is collected: acknowledgements of members long gone, and
//! completion records beyond the retained ones. Without it a node's memory grows with every
//! process that ever joined a group and every period a job ever ran.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{client, eventually, init_tracing, keys_matching};
use redquorum::{GroupOptions, Member};
use redquorum::{JobOptions, JobOutcome, PeriodicJob};
use redquorum_testkit::Cluster;

async fn hlen(cluster: &Cluster, key: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        out.push(
            redis::cmd("HLEN")
                .arg(key)
                .query_async(&mut con)
                .await
                .expect("HLEN"),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_of_members_that_left_are_collected() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let opts = || GroupOptions::default().with_interval(Duration::from_millis(300));
    let stay = Member::join(&c, "gc", "stay", opts()).await.expect("joins");
    // Eight processes come and go (each a new member key, each acknowledging views).
    for round in 0..8 {
        let m = Member::join(&c, "gc", &format!("temp{round}"), opts())
            .await
            .expect("joins");
        eventually(
            Duration::from_secs(5),
            "the temporary member gets an index",
            || {
                let m = &m;
                async move { m.assignment().is_some_and(|a| a.replicas == 2) }
            },
        )
        .await;
        m.leave().await;
    }
    eventually(
        Duration::from_secs(5),
        "the group settles on one member",
        || {
            let stay = &stay;
            async move { stay.assignment().is_some_and(|a| a.replicas == 1) }
        },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "old acknowledgements are collected",
        || {
            let cluster = &cluster;
            async move { hlen(cluster, "rq:ack:gc").await.iter().all(|n| *n <= 2) }
        },
    )
    .await;
    println!(
        "acknowledgement fields per node: {:?}",
        hlen(&cluster, "rq:ack:gc").await
    );
    stay.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_records_beyond_the_retained_ones_are_collected() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let keep_five = JobOptions::default().with_retained_records(5);
    let job =
        PeriodicJob::with_options(&c, "nightly", Duration::from_secs(2), keep_five).expect("valid");
    for day in 1..=12 {
        let out = job
            .run_period_infallible(
                &format!("2026-11-{day:02}"),
                Duration::from_secs(2),
                |_, _| async {},
            )
            .await
            .expect("runs");
        assert!(matches!(out, JobOutcome::Ran { .. }), "day {day}: {out:?}");
    }
    // Each period keeps two fields: its record and its begin mark.
    eventually(
        Duration::from_secs(5),
        "records beyond five periods are collected",
        || {
            let cluster = &cluster;
            async move {
                hlen(cluster, "rq:done:nightly")
                    .await
                    .iter()
                    .all(|n| *n <= 10)
            }
        },
    )
    .await;
    // The newest periods are still remembered.
    let again = job
        .run_period_infallible("2026-11-12", Duration::from_secs(2), |_, _| async {})
        .await
        .expect("answers");
    assert!(matches!(again, JobOutcome::AlreadyDone { .. }), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_of_released_locks_are_collected_and_tokens_still_increase() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let mut first_token = 0;
    for i in 0..40 {
        let lock =
            redquorum::Lock::new(&c, &format!("order-{i}"), Duration::from_secs(5)).expect("valid");
        let guard = lock.try_acquire().await.expect("free");
        if i == 0 {
            first_token = guard.token().get();
        }
        guard.release().await.expect("released");
    }
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        let fences = keys_matching(&mut con, "rq:fence:*").await;
        assert!(
            fences.is_empty(),
            "node {i} keeps fence keys of released locks: {fences:?}"
        );
    }
    // The first lock again: its fence key is gone, yet its next token is above its last one.
    let again = redquorum::Lock::new(&c, "order-0", Duration::from_secs(5))
        .expect("valid")
        .try_acquire()
        .await
        .expect("free");
    assert!(
        again.token().get() > first_token,
        "token {} must follow the lock's earlier token {first_token}",
        again.token()
    );
    again.release().await.expect("released");
}

/// Whether each node holds `key`, and the highest fence floor bucket on each node.
async fn fence_and_floors(cluster: &Cluster, key: &str) -> Vec<(bool, u64)> {
    let mut out = Vec::new();
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        let fence: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut con)
            .await
            .expect("EXISTS");
        let floors = keys_matching(&mut con, "rq:floor:*").await;
        let mut highest = 0;
        for f in floors {
            let v: Option<u64> = redis::cmd("GET")
                .arg(&f)
                .query_async(&mut con)
                .await
                .expect("GET");
            highest = highest.max(v.unwrap_or(0));
        }
        out.push((fence, highest));
    }
    out
}

/// A lock acquired again and again keeps its fence key between cycles (the next grant rewrites
/// it anyway: two writes fewer per cycle), and once its handle has released nothing for a
/// second every node folds the fence into its floor. Tokens rise throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cycled_again_and_again_keeps_its_fence_between_cycles_and_folds_it_once_idle() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster.urls()).await;
    let lock = redquorum::Lock::new(&c, "hot", Duration::from_secs(5)).expect("valid");
    let mut last = 0;
    for cycle in 0..10 {
        let guard = lock.try_acquire().await.expect("free");
        assert!(
            guard.token().get() > last,
            "cycle {cycle}: token {} must follow {last}",
            guard.token()
        );
        last = guard.token().get();
        guard.release().await.expect("released");
    }
    let between = fence_and_floors(&cluster, "rq:fence:hot").await;
    assert!(
        between.iter().filter(|(fence, _)| *fence).count() >= 2,
        "right after quick cycles the last release kept the fence key (fence key, floor per node): {between:?}"
    );
    eventually(
        Duration::from_secs(4),
        "once the handle is idle, every node folds the fence into its floor",
        || {
            let cluster = &cluster;
            async move {
                fence_and_floors(cluster, "rq:fence:hot")
                    .await
                    .iter()
                    .all(|(fence, floor)| !fence && *floor >= last)
            }
        },
    )
    .await;
    let again = lock.try_acquire().await.expect("free");
    assert!(
        again.token().get() > last,
        "after the fold, token {} must follow {last}",
        again.token()
    );
    again.release().await.expect("released");
}
