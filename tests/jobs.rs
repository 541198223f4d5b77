//! Once-per-period jobs against real nodes: a record counts only while the job's lease holds.
//!
//! The story of issue 43: the holder of token 5 completes period P and pauses between its
//! loss check and its record; its lease lapses; token 6 takes the job over, begins P and
//! fails; then 5's record goes out. With the protection, 5 is told its lease was lost and the
//! next run runs P. Each story also runs with the protection switched off (a test-only
//! switch), where the same story must show the period skipped, or the test has no teeth.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config_from_urls, init_tracing};
use redquorum::{Config, Error, FencingToken, JobOutcome, PeriodStart, PeriodicJob};
use redquorum_testkit::Cluster;
use tokio::sync::Notify;

const PERIOD: &str = "2026-12-03";
const TTL: Duration = Duration::from_secs(2);

/// Which protection a story runs without.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Weakened {
    Nothing,
    /// `with_unfenced_records_for_tests`: no lease check on the nodes or the client, no begin
    /// marks.
    Fence,
    /// `without_begun_marks_for_tests`: the lease check stays, no begin marks.
    BeginMarks,
}

impl Weakened {
    fn apply(self, config: Config) -> Config {
        match self {
            Weakened::Nothing => config,
            Weakened::Fence => config.with_unfenced_records_for_tests(),
            Weakened::BeginMarks => config.without_begun_marks_for_tests(),
        }
    }
}

/// How the story ended: what the deposed holder was told, its token and its successor's, and
/// what the next run found.
struct StoryEnd {
    late: Result<FencingToken, Error>,
    deposed: FencingToken,
    successor: FencingToken,
    next: JobOutcome<Result<(), ()>>,
}

async fn job(
    cluster: &Cluster,
    weakened: Weakened,
    hook: Option<(Arc<Notify>, Arc<Notify>)>,
) -> PeriodicJob {
    let mut config = weakened.apply(config_from_urls(cluster.urls()).unwrap());
    if let Some((paused, resume)) = hook {
        config = config.with_record_hook_for_tests(move || {
            let (paused, resume) = (paused.clone(), resume.clone());
            Box::pin(async move {
                paused.notify_one();
                resume.notified().await;
            })
        });
    }
    let client = common::connect(config).await.expect("connects");
    PeriodicJob::new(&client, "nightly", TTL).unwrap()
}

/// The story, on three nodes. With `outside`, node 2 is cut off while the successor takes the
/// job over, begins P and fails, so the deposed holder's record can land there (on a node
/// outside the successor's majority, which still holds the deposed holder's copy and fence).
async fn deposed_holder_records_late(weakened: Weakened, outside: bool) -> StoryEnd {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let (paused, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let deposed = job(&cluster, weakened, Some((paused.clone(), resume.clone()))).await;
    let successor = job(&cluster, weakened, None).await;
    let next = job(&cluster, weakened, None).await;

    // The holder of the first token completes P, and pauses after its loss check, before its
    // record: its lease is not extended any more (a paused process extends nothing).
    let PeriodStart::Due(run) = deposed.begin_period(PERIOD, Duration::ZERO).await.unwrap() else {
        panic!("P is due at first");
    };
    let deposed_token = run.token();
    run.guard().suspend_extension_for_tests();
    let late = tokio::spawn(run.complete());
    paused.notified().await;

    // Its lease lapses; the successor takes the job over, begins P, and its work fails.
    if outside {
        cluster.node(2).cut_off();
    }
    let PeriodStart::Due(taken) = successor
        .begin_period(PERIOD, TTL * 5)
        .await
        .expect("the successor takes the lapsed lease over")
    else {
        panic!("P is not recorded: the successor must find it due");
    };
    let successor_token = taken.token();
    assert!(successor_token > deposed_token, "tokens increase");
    taken.abandon().await;
    if outside {
        cluster.node(2).heal();
        // The heal closes the connections that discarded bytes: let the clients reconnect.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The deposed holder wakes up and sends its record.
    resume.notify_one();
    let late = late.await.unwrap();
    println!("the deposed holder's complete: {late:?}");

    // The next run, on any instance: P must run, its successor having failed.
    let next = next
        .run_period(PERIOD, TTL * 5, |_, _| async { Ok::<(), ()>(()) })
        .await
        .expect("the next run answers");
    println!("the next run: {next:?}");
    StoryEnd {
        late,
        deposed: deposed_token,
        successor: successor_token,
        next,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_holders_late_record_is_refused_and_the_next_run_runs_the_period() {
    let end = deposed_holder_records_late(Weakened::Nothing, false).await;
    assert!(
        matches!(end.late, Err(Error::LeaseLost { .. })),
        "the holder of token {} recorded after token {} took the job over: it must be told its \
         lease was lost, got {:?}",
        end.deposed,
        end.successor,
        end.late
    );
    assert!(
        matches!(end.next, JobOutcome::Ran { output: Ok(()), .. }),
        "token {} began P and failed, so the next run must run P, got {:?}",
        end.successor,
        end.next
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unfenced_records_a_late_record_lands_and_the_period_is_skipped() {
    let end = deposed_holder_records_late(Weakened::Fence, false).await;
    assert!(
        end.late.is_ok() && end.next == JobOutcome::AlreadyDone { token: end.deposed },
        "without the lease check, the late record of token {} must land on every node and make \
         P look done after token {} began it and failed (got {:?}, then {:?}); if not, this \
         test has no teeth",
        end.deposed,
        end.successor,
        end.late,
        end.next
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_record_on_a_node_outside_the_successors_majority_does_not_count() {
    let end = deposed_holder_records_late(Weakened::Nothing, true).await;
    assert!(
        matches!(end.late, Err(Error::LeaseLost { .. })),
        "two nodes refuse the late record of token {}: its holder must be told its lease was \
         lost, got {:?}",
        end.deposed,
        end.late
    );
    assert!(
        matches!(end.next, JobOutcome::Ran { output: Ok(()), .. }),
        "the late record of token {} landed on the cut-off node only, below token {}'s begin \
         mark: the next run must ignore it and run P, got {:?}",
        end.deposed,
        end.successor,
        end.next
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_begin_marks_a_late_record_on_one_node_skips_the_period() {
    let end = deposed_holder_records_late(Weakened::BeginMarks, true).await;
    assert!(
        matches!(end.late, Err(Error::LeaseLost { .. })),
        "the lease check alone still tells the holder of token {} it lost: {:?}",
        end.deposed,
        end.late
    );
    assert_eq!(
        end.next,
        JobOutcome::AlreadyDone { token: end.deposed },
        "without begin marks, the late record on the one node outside token {}'s majority must \
         make P look done to a reader counting every node; if not, this test has no teeth",
        end.successor
    );
}

/// Item 2 of issue 43: the obvious call takes fallible work; its `Err` records nothing and the
/// next call runs the period and records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_work_leaves_the_period_to_the_next_call_which_records_it() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let job = job(&cluster, Weakened::Nothing, None).await;
    let failed = job
        .run_period(PERIOD, Duration::ZERO, |_, _| async {
            Err::<&str, _>("upstream down")
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
        "the work's failure is its outcome: {failed:?}"
    );
    let retried = job
        .run_period(PERIOD, Duration::ZERO, |_, _| async {
            Ok::<_, ()>("written")
        })
        .await
        .unwrap();
    let JobOutcome::Ran {
        output: Ok("written"),
        token,
    } = retried
    else {
        panic!("the failed run recorded nothing: the next call must run P, got {retried:?}");
    };
    let again = job
        .run_period(PERIOD, Duration::ZERO, |_, _| async {
            Ok::<_, ()>("twice?")
        })
        .await
        .unwrap();
    assert_eq!(
        again,
        JobOutcome::AlreadyDone { token },
        "the successful run recorded P with its token"
    );
}

/// Other locks share the job lock's fence floor bucket (1,024 buckets for every lock name):
/// their releases may raise it above a live holder's token. The lease check reads the floors
/// only where a node holds no copy of the holder's lease, so a holder that keeps its copies
/// still records. (A check of the floors everywhere would refuse this record on every node:
/// the period would never be recorded while another lock of its bucket is busy.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floors_raised_by_other_locks_do_not_refuse_a_live_holders_record() {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let job = job(&cluster, Weakened::Nothing, None).await;
    let PeriodStart::Due(run) = job.begin_period(PERIOD, Duration::ZERO).await.unwrap() else {
        panic!("P is due at first");
    };
    let token = run.token();
    // Every bucket and the single floor far above the token, on every node, as releases of
    // busy locks in the job lock's bucket would leave them.
    let above = token.get() + 1000;
    for i in 0..3 {
        let mut con = cluster.node(i).direct_connection().await;
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg("rq:floor").arg(above).ignore();
        for bucket in 0..1024 {
            pipe.cmd("SET")
                .arg(format!("rq:floor:{bucket}"))
                .arg(above)
                .ignore();
        }
        let () = pipe.query_async(&mut con).await.expect("floors raised");
    }
    let recorded = run.complete().await;
    assert_eq!(
        recorded.as_ref().ok(),
        Some(&token),
        "the holder kept its copies: floors raised by other locks must not refuse its record: \
         {recorded:?}"
    );
}
