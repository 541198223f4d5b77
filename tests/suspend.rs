//! A host suspend, staged on real nodes: this process's boot clock is moved ahead of its
//! monotonic clock (`set_boot_clock_ahead_for_tests`), as a suspend of that length just now
//! would (a real suspend cannot be done here). A lease and an assignment held across it must
//! read as over at once, and the lease's loss be signalled within a watchdog slice; with
//! validity judged on the monotonic clock alone (the old computation, switched back on by
//! `judge_validity_on_monotonic_clock_only_for_tests`) they read as still valid.
//!
//! The switches are process-global: nextest runs each test in a process of its own, and the
//! tests here also take [`SERIAL`] so that `cargo test` cannot run two at once.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use redquorum::{Assignment, GroupOptions, Lock, LockGuard, LossReason, Member};
use redquorum_testkit::Cluster;
use tokio::time::Instant;

/// One test at a time in this binary (the clock switches are process-global).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Far beyond every validity below (the lease's 30 s TTL, the group's 1.25 s lease).
const SUSPEND: Duration = Duration::from_secs(60);

/// What the holder reports right after the staged suspend, and how its loss came.
struct AfterResume {
    lease_valid_for: Duration,
    lease_held: bool,
    assignment_valid_for: Duration,
    owns_a_task: bool,
    /// The loss signal's reason, if it fired within 3 s of the resume.
    lost: Option<LossReason>,
}

/// A lease (TTL 30 s) and a group assignment held on real nodes, then a suspend of
/// [`SUSPEND`] staged; `monotonic_only`: validity judged as before the boot clock was read.
async fn suspended_holder(monotonic_only: bool) -> AfterResume {
    common::init_tracing();
    redquorum::set_boot_clock_ahead_for_tests(Duration::ZERO);
    redquorum::judge_validity_on_monotonic_clock_only_for_tests(monotonic_only);
    let cluster = Cluster::start(3).await;
    let client = common::client(&cluster.urls()).await;

    // Phase 1: a lease and an assignment, both valid.
    let guard: LockGuard = Lock::new(&client, "report", Duration::from_secs(30))
        .unwrap()
        .acquire(Duration::from_secs(5))
        .await
        .expect("the lease is acquired");
    let opts = GroupOptions::default().with_interval(Duration::from_secs(1));
    let member = Member::join(&client, "mailers", "host-a", opts)
        .await
        .expect("join");
    let deadline = Instant::now() + Duration::from_secs(15);
    let assignment: Assignment = loop {
        if let Some(a) = member.assignment().filter(|a| a.owns(0)) {
            break a;
        }
        assert!(Instant::now() < deadline, "the member never owned task 0");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(guard.is_held(), "the lease is held before the suspend");

    // Phase 2: the host "sleeps" for a minute; its monotonic clock did not count it.
    redquorum::set_boot_clock_ahead_for_tests(SUSPEND);
    let now = Instant::now();
    let after = AfterResume {
        lease_valid_for: guard.valid_until().saturating_duration_since(now),
        lease_held: guard.is_held(),
        assignment_valid_for: assignment.valid_until().saturating_duration_since(now),
        owns_a_task: assignment.owns(0),
        lost: tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .ok(),
    };
    member.leave().await;
    drop(guard);
    redquorum::set_boot_clock_ahead_for_tests(Duration::ZERO);
    redquorum::judge_validity_on_monotonic_clock_only_for_tests(false);
    after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_suspended_past_its_validity_no_longer_believes_it_holds() {
    let _one = SERIAL.lock().await;
    let after = suspended_holder(false).await;
    assert_eq!(
        after.lease_valid_for,
        Duration::ZERO,
        "after a suspend past the lease's validity, valid_until must be in the past"
    );
    assert!(
        !after.lease_held,
        "after a suspend past its validity, is_held() must be false"
    );
    assert_eq!(
        after.assignment_valid_for,
        Duration::ZERO,
        "after a suspend past the assignment's validity, its valid_until must be in the past"
    );
    assert!(
        !after.owns_a_task,
        "after a suspend past the assignment's validity, it must own nothing"
    );
    assert_eq!(
        after.lost,
        Some(LossReason::Expired),
        "the loss must be signalled (as expired) within a watchdog slice of the resume"
    );
}

/// The teeth: with validity judged on the monotonic clock alone (the computation before this
/// fix), the same holder still believes it holds its lease and its tasks after the suspend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_boot_clock_a_suspended_host_believes_it_still_holds() {
    let _one = SERIAL.lock().await;
    let after = suspended_holder(true).await;
    assert!(
        after.lease_valid_for > Duration::from_secs(20),
        "the monotonic clock alone still shows most of the 30 s validity: {:?}",
        after.lease_valid_for
    );
    assert!(after.lease_held, "the monotonic clock alone says held");
    assert!(
        after.assignment_valid_for > Duration::ZERO && after.owns_a_task,
        "the monotonic clock alone still shows the assignment valid"
    );
    assert_eq!(
        after.lost, None,
        "no loss is signalled on the monotonic clock alone"
    );
}
