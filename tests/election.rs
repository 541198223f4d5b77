//! Leader election and once-per-period jobs against real nodes.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{init_tracing, ms};
use futures::StreamExt;
use redquorum::{Client, Election, JobOutcome, PeriodicJob};
use redquorum_testkit::Cluster;
use tokio::time::Instant;

async fn client(urls: Vec<String>) -> Client {
    common::connect(common::config_from_urls(urls).expect("valid"))
        .await
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_resigning_leaders_successor_takes_over_at_once() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(3);
    let a = Election::new(&client(cluster.urls()).await, "scheduler", ttl, "host-a").unwrap();
    let b = Election::new(&client(cluster.urls()).await, "scheduler", ttl, "host-b").unwrap();
    let observer =
        Election::new(&client(cluster.urls()).await, "scheduler", ttl, "observer").unwrap();
    let mut changes = Box::pin(observer.observe(Duration::from_millis(200)));
    assert_eq!(changes.next().await, Some(None), "no leader at first");

    let lead_a = a.campaign().await.unwrap();
    let info = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (info.candidate.as_str(), info.term),
        ("host-a", lead_a.term())
    );
    assert_eq!(changes.next().await.unwrap().unwrap().candidate, "host-a");
    assert!(b.try_campaign().await.is_err(), "only one leader at a time");

    // B campaigns (waits); A resigns: B must take over without waiting out a retry delay.
    let b_campaign = tokio::spawn(async move { (b.campaign().await.unwrap(), Instant::now()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resigned_at = Instant::now();
    let term_a = lead_a.term();
    lead_a.resign().await.unwrap();
    let (lead_b, became_at) = b_campaign.await.unwrap();
    let handover = became_at - resigned_at;
    println!("hand-over after resign: {}", ms(handover));
    assert!(
        handover < Duration::from_millis(250),
        "the successor must be woken, not wait a retry delay ({})",
        ms(handover)
    );
    assert!(lead_b.term() > term_a, "terms increase");
    let mut seen = changes.next().await.unwrap();
    if seen.is_none() {
        seen = changes.next().await.unwrap(); // the observer may see the gap between leaders
    }
    assert_eq!(seen.unwrap().candidate, "host-b");
    lead_b.resign().await.unwrap();
    assert_eq!(
        changes.next().await,
        Some(None),
        "the observer reports 'no leader'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leaders_successor_takes_over_within_the_ttl_plus_one_retry_delay() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(1);
    let a = Election::new(&client(cluster.urls()).await, "failover", ttl, "a").unwrap();
    let b = Election::new(&client(cluster.urls()).await, "failover", ttl, "b").unwrap();
    let lead_a = a.campaign().await.unwrap();
    // A "crashes": it stops extending and never releases.
    lead_a.guard().suspend_extension_for_tests();
    let crashed_at = Instant::now();
    let lead_b = b.campaign().await.unwrap();
    let took = crashed_at.elapsed();
    println!(
        "fail-over after the leader stopped: {} (TTL {})",
        ms(took),
        ms(ttl)
    );
    assert!(
        took <= ttl + ttl / 10 * 2 + Duration::from_millis(100),
        "took {}",
        ms(took)
    );
    assert!(lead_b.term() > lead_a.term());
    assert!(!lead_a.is_leader(), "the old leader knows it lost");
    std::mem::drop(lead_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_job_runs_once_per_period_across_instances_and_failovers() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let job = PeriodicJob::new(
            &client(cluster.urls()).await,
            "daily-report",
            Duration::from_secs(2),
        )
        .unwrap();
        let runs = runs.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for _ in 0..5 {
                let runs = runs.clone();
                let o = job
                    .run_period(
                        "2026-11-22",
                        Duration::from_millis(300),
                        |_token, _cancel| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        },
                    )
                    .await
                    .unwrap();
                outcomes.push(format!("{i}:{o:?}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            outcomes
        }));
    }
    for t in tasks {
        println!("{:?}", t.await.unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the period's work runs exactly once across four instances"
    );

    // A failover DURING the work: the first runner loses its lease mid-work (cut off); the
    // period is not recorded, and the next leader runs it.
    let job_a = PeriodicJob::new(
        &client(cluster.urls()).await,
        "failover-report",
        Duration::from_millis(600),
    )
    .unwrap();
    let nodes = cluster.nodes();
    let cut = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        nodes[0].cut_off();
        nodes[1].cut_off();
    };
    let (first, ()) = tokio::join!(
        job_a.run_period("P1", Duration::ZERO, |_, _| tokio::time::sleep(
            Duration::from_secs(3)
        )),
        cut
    );
    assert!(
        first.is_err(),
        "the first runner lost its lease mid-work: {first:?}"
    );
    cluster.heal_all();
    let direct = cluster.nodes().iter().map(|n| n.direct_url()).collect();
    let job_b = PeriodicJob::new(
        &client(direct).await,
        "failover-report",
        Duration::from_millis(600),
    )
    .unwrap();
    let second = job_b
        .run_period("P1", Duration::from_secs(3), |_, _| async { "done by B" })
        .await
        .unwrap();
    assert!(
        matches!(
            second,
            JobOutcome::Ran {
                output: "done by B",
                ..
            }
        ),
        "{second:?}"
    );
    // A failover AFTER completion does not run it again.
    let third = job_a
        .run_period("P1", Duration::from_secs(3), |_, _| async { "again?" })
        .await
        .unwrap();
    assert!(matches!(third, JobOutcome::AlreadyDone { .. }), "{third:?}");
}
