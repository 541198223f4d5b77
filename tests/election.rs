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

/// A leader with a 2 s lease crashes. A candidate with a 300 ms lease that campaigns for 1.5 s
/// (`election run --wait 1.5s`) is told the leader's lease looks abandoned and when it can be
/// taken, not that a live leader has it; one that campaigns for 4 s takes it over after the
/// leader's TTL, not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_campaign_against_a_crashed_leader_hears_its_lease_looks_abandoned() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(2);
    let short = Duration::from_millis(300);
    let a = Election::new(&client(cluster.urls()).await, "bounded", ttl, "a").unwrap();
    let lead_a = a.campaign().await.unwrap();
    lead_a.guard().suspend_extension_for_tests();
    let crashed_at = Instant::now();

    let b = Election::new(&client(cluster.urls()).await, "bounded", short, "b").unwrap();
    let said = b.campaign_for(Duration::from_millis(1500)).await;
    assert!(
        matches!(&said, Err(redquorum::Error::LockLooksAbandoned { ttl: t, .. }) if *t == ttl),
        "a campaign that ends before the takeover says the leader's lease looks abandoned: {said:?}"
    );
    let c = Election::new(&client(cluster.urls()).await, "bounded", short, "c").unwrap();
    let lead_c = c
        .campaign_for(Duration::from_secs(4))
        .await
        .expect("a long enough campaign takes the crashed leader's lease over");
    let took = crashed_at.elapsed();
    assert!(took >= ttl, "not before the leader's TTL: {}", ms(took));
    assert!(lead_c.term() > lead_a.term());
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
                    .run_period_infallible(
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
        job_a.run_period_infallible("P1", Duration::ZERO, |_, _| tokio::time::sleep(
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
        .run_period_infallible("P1", Duration::from_secs(3), |_, _| async { "done by B" })
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
        .run_period_infallible("P1", Duration::from_secs(3), |_, _| async { "again?" })
        .await
        .unwrap();
    assert!(matches!(third, JobOutcome::AlreadyDone { .. }), "{third:?}");
}

/// Work that can fail: `run_period`'s `Err` records nothing (the next instance runs the
/// period), its `Ok` records it. `begin_period` hands the lease to the caller: an abandoned run
/// records nothing, a completed one records its token, and while one instance holds the run
/// another is told it is not the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_period_is_not_recorded_and_the_next_instance_runs_it() {
    use redquorum::PeriodStart;
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(2);
    let a = PeriodicJob::new(&client(cluster.urls()).await, "import", ttl).unwrap();
    let b = PeriodicJob::new(&client(cluster.urls()).await, "import", ttl).unwrap();

    let failed = a
        .run_period("2026-11-26", Duration::ZERO, |_, _| async {
            Err::<(), _>("upstream down")
        })
        .await
        .unwrap();
    assert!(
        matches!(
            failed,
            JobOutcome::Ran {
                output: Err("upstream down"),
                ..
            }
        ),
        "the work's failure is its outcome, not an error of the call: {failed:?}"
    );
    let retried = b
        .run_period("2026-11-26", Duration::ZERO, |token, _| async move {
            Ok::<_, ()>(token)
        })
        .await
        .unwrap();
    let JobOutcome::Ran {
        output: Ok(token), ..
    } = retried
    else {
        panic!("nothing was recorded: instance B runs the period: {retried:?}");
    };
    let again = a
        .run_period_infallible("2026-11-26", Duration::ZERO, |_, _| async {})
        .await
        .unwrap();
    assert_eq!(
        again,
        JobOutcome::AlreadyDone { token },
        "B's success recorded the period with its token"
    );

    // The caller holds the lease: abandon records nothing, complete records the run's token.
    let PeriodStart::Due(run) = a.begin_period("2026-11-27", Duration::ZERO).await.unwrap() else {
        panic!("the 27th is due");
    };
    assert_eq!(run.period(), "2026-11-27");
    assert!(run.guard().is_held());
    let held = b.begin_period("2026-11-27", Duration::ZERO).await.unwrap();
    assert!(
        matches!(held, PeriodStart::NotLeader),
        "while A holds the run, B is not the leader: {held:?}"
    );
    run.abandon().await;
    let PeriodStart::Due(run) = b.begin_period("2026-11-27", Duration::ZERO).await.unwrap() else {
        panic!("an abandoned period is due again");
    };
    let recorded = run.complete().await.unwrap();
    let done = a.begin_period("2026-11-27", Duration::ZERO).await.unwrap();
    assert!(
        matches!(done, PeriodStart::AlreadyDone { token } if token == recorded),
        "a completed run is recorded with its token: {done:?}"
    );
}

/// A cron one-shot whose lease the nodes grant too late (80 ms each way to every node, for a
/// 200 ms lease whose requests may take up to 250 ms: half the TTL is gone before the
/// majority's answers arrive; with the default per-node deadline, a client frozen or starved
/// mid-round does the same) is told so, with an error to retry. It must not hear "another instance holds the job" (`NotLeader`): every
/// host's cron would believe another host runs the period, and none would run it. Nothing is
/// left held: once the nodes are fast again, the next one-shot runs the period at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_granted_too_late_is_an_error_to_retry_not_another_holder() {
    use redquorum::{Error, JobOptions, LockOptions, PeriodStart};
    init_tracing();
    let cluster = Cluster::start(3).await;
    let options = JobOptions::default()
        .with_lock(LockOptions::default().with_node_timeout(Duration::from_millis(250)));
    let job = PeriodicJob::with_options(
        &client(cluster.urls()).await,
        "nightly",
        Duration::from_millis(200),
        options,
    )
    .unwrap();
    let latency = |d| (0..3).for_each(|i| cluster.node(i).set_latency(d));
    // One run first, at full speed: the nodes load the scripts (a first call's NOSCRIPT
    // would cost a second round trip).
    let Ok(PeriodStart::Due(warm_up)) = job.begin_period("warm-up", Duration::ZERO).await else {
        panic!("the job is free and due");
    };
    warm_up.abandon().await;

    latency(Duration::from_millis(80));
    let slow = job.begin_period("2026-11-28", Duration::ZERO).await;
    assert!(
        matches!(&slow, Err(Error::TooSlow { .. })),
        "a grant that came too late is an error to retry, not another holder: {slow:?}"
    );
    let e = slow.err().unwrap();
    assert!(e.is_retryable() && !e.is_outcome_unknown(), "{e:?}");

    latency(Duration::ZERO);
    let started = Instant::now();
    let due = job.begin_period("2026-11-28", Duration::ZERO).await;
    assert!(
        matches!(due, Ok(PeriodStart::Due(_))),
        "the slow round was released, so the next one-shot runs the period: {due:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(180),
        "at once, not after waiting out a leftover lease: {:?}",
        started.elapsed()
    );
}

/// One term's work as a `lead` loop ran it.
#[derive(Clone, Debug)]
struct TermWork {
    who: &'static str,
    term: u64,
    start: Instant,
    end: Option<Instant>,
    /// Whether its token had fired when it ended.
    told: bool,
}

type WorkLog = Arc<std::sync::Mutex<Vec<TermWork>>>;

/// Marks a work's end when the work returns or is dropped.
struct Running {
    log: WorkLog,
    i: usize,
    token: tokio_util::sync::CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap();
        log[self.i].end = Some(Instant::now());
        log[self.i].told = self.token.is_cancelled();
    }
}

/// A leader's work that logs its interval and runs until its token fires.
fn logged_work(
    who: &'static str,
    log: WorkLog,
) -> impl FnMut(
    redquorum::FencingToken,
    tokio_util::sync::CancellationToken,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    move |term, token| {
        let log = log.clone();
        Box::pin(async move {
            let i = {
                let mut log = log.lock().unwrap();
                log.push(TermWork {
                    who,
                    term: term.get(),
                    start: Instant::now(),
                    end: None,
                    told: false,
                });
                log.len() - 1
            };
            let _running = Running {
                log,
                i,
                token: token.clone(),
            };
            token.cancelled().await;
        })
    }
}

/// The works `who` has started so far.
fn works_of(log: &WorkLog, who: &str) -> Vec<TermWork> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|w| w.who == who)
        .cloned()
        .collect()
}

/// The leader loop as users write it (`Election::lead`): two candidates run it; the leader's
/// work runs with its term; the leader is cut off from a majority, its work's token fires and
/// the other candidate leads in a higher term; when that one shuts down it resigns and the
/// first, which campaigned again meanwhile, leads at once in a higher term still. At no time
/// do two works run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_running_the_leader_loop_hand_over_on_loss_and_on_shutdown() {
    use tokio_util::sync::CancellationToken;
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(1);
    let log: WorkLog = Arc::default();
    // A reaches the nodes through the fault proxies, B directly: cutting the proxies cuts A
    // alone.
    let direct: Vec<String> = cluster.nodes().iter().map(|n| n.direct_url()).collect();
    let a = Election::new(&client(cluster.urls()).await, "loop", ttl, "a").unwrap();
    let b = Election::new(&client(direct).await, "loop", ttl, "b").unwrap();
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let lead_a = tokio::spawn({
        let (stop, work) = (stop_a.clone(), logged_work("a", log.clone()));
        async move { a.lead(stop, work).await }
    });
    common::eventually(Duration::from_secs(5), "A leads", || {
        let n = works_of(&log, "a").len();
        async move { n == 1 }
    })
    .await;
    let lead_b = tokio::spawn({
        let (stop, work) = (stop_b.clone(), logged_work("b", log.clone()));
        async move { b.lead(stop, work).await }
    });
    tokio::time::sleep(ttl / 2).await;
    assert!(works_of(&log, "b").is_empty(), "B waits while A leads");

    // A is cut off from two of three nodes: it cannot extend; its work is told and stopped
    // by the end of its validity, and B takes the lease over.
    let cut_at = Instant::now();
    cluster.nodes()[0].cut_off();
    cluster.nodes()[1].cut_off();
    common::eventually(ttl * 5, "B leads after A's loss", || {
        let n = works_of(&log, "b").len();
        async move { n == 1 }
    })
    .await;
    let a1 = works_of(&log, "a")[0].clone();
    let b1 = works_of(&log, "b")[0].clone();
    let a1_end = a1.end.expect("A's work ended at its loss");
    println!(
        "A's work stopped {} after the cut; B led {} after the cut",
        ms(a1_end - cut_at),
        ms(b1.start - cut_at)
    );
    assert!(a1.told, "A's work was told by its token: {a1:?}");
    assert!(
        a1_end - cut_at <= ttl,
        "within A's validity: {}",
        ms(a1_end - cut_at)
    );
    assert!(b1.term > a1.term, "a higher term: {a1:?} then {b1:?}");
    cluster.heal_all();
    tokio::time::sleep(ttl).await;
    assert_eq!(works_of(&log, "a").len(), 1, "A campaigns, B still leads");

    // B shuts down: its work is told, B resigns, and A (woken by the release) leads at once.
    let stopped_at = Instant::now();
    stop_b.cancel();
    let summary_b = lead_b.await.unwrap().unwrap();
    common::eventually(ttl * 2, "A leads again", || {
        let n = works_of(&log, "a").len();
        async move { n == 2 }
    })
    .await;
    let a2 = works_of(&log, "a")[1].clone();
    let handover = a2.start - stopped_at;
    println!("hand-over after B's shutdown: {}", ms(handover));
    assert!(
        handover < ttl / 2,
        "B resigned: A is woken, not left to wait out B's lease ({})",
        ms(handover)
    );
    assert!(a2.term > b1.term, "{b1:?} then {a2:?}");
    assert_eq!(
        (
            summary_b.terms,
            summary_b.lost,
            summary_b.last_term.map(|t| t.get())
        ),
        (1, 0, Some(b1.term))
    );

    stop_a.cancel();
    let summary_a = lead_a.await.unwrap().unwrap();
    assert_eq!((summary_a.terms, summary_a.lost), (2, 1), "{summary_a:?}");
    let mut works = log.lock().unwrap().clone();
    works.sort_by_key(|w| w.start);
    for w in &works {
        let end = w.end.map(|e| ms(e - works[0].start)).unwrap_or_default();
        let start = ms(w.start - works[0].start);
        println!("{} term {}: {start} .. {end}", w.who, w.term);
    }
    assert!(
        works.iter().all(|w| w.told && w.end.is_some()),
        "{works:#?}"
    );
    for pair in works.windows(2) {
        assert!(
            pair[0].end.unwrap() <= pair[1].start && pair[0].term < pair[1].term,
            "two works at once, or terms out of order: {pair:#?}"
        );
    }
}

/// `Election::leader` and `observe` say when the leader looks abandoned, from the reader's own
/// history: a leader that stops extending (crashed) is reported again, abandoned, once its
/// lease stayed unchanged for the TTL plus drift; a live leader never is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_reports_a_crashed_leader_as_abandoned_after_its_ttl() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(1);
    let a = Election::new(&client(cluster.urls()).await, "quiet", ttl, "a").unwrap();
    let observer = Election::new(&client(cluster.urls()).await, "quiet", ttl, "obs").unwrap();
    let lead_a = a.campaign().await.unwrap();
    let mut changes = Box::pin(observer.observe(Duration::from_millis(100)));
    let first = changes.next().await.unwrap().expect("a leader");
    assert!(!first.looks_abandoned(), "{first:?}");
    assert_eq!(first.unchanged_for, None, "a first read has no history");
    let live = tokio::time::timeout(ttl * 2, changes.next()).await;
    assert!(
        live.is_err(),
        "a live leader is not reported again: {live:?}"
    );
    let info = observer.leader().await.unwrap().unwrap();
    assert!(
        !info.looks_abandoned() && info.unchanged_for < Some(ttl),
        "{info:?}"
    );

    // A "crashes": it stops extending and never releases.
    lead_a.guard().suspend_extension_for_tests();
    let crashed_at = Instant::now();
    let abandoned = tokio::time::timeout(ttl * 3, changes.next())
        .await
        .expect("reported within the TTL plus drift and a poll")
        .unwrap()
        .expect("still the leader: nobody took the lease over");
    let after = crashed_at.elapsed();
    println!(
        "reported abandoned {} after the last extension could have been",
        ms(after)
    );
    assert!(abandoned.looks_abandoned(), "{abandoned:?}");
    assert_eq!(abandoned.term, lead_a.term());
    assert!(after >= ttl - ttl / 3, "not before its TTL: {}", ms(after));
    let watched = Election::new(&client(cluster.urls()).await, "quiet", ttl, "w").unwrap();
    let info = watched.leader_watching(ttl * 3).await.unwrap().unwrap();
    assert!(info.looks_abandoned(), "{info:?}");
    std::mem::drop(lead_a);
}
