//! An operator's `cluster change` interrupted part-way is finished by running it again.
//!
//! The trap: a change stopped after marking one node of the new list (but fewer than a
//! majority) left a cluster that never voted again. The old list's client then adopts the
//! successor (same node count) and a re-run seals for a bogus second successor, or it is
//! refused outright (another count). Each story interrupts a change at a point of its
//! procedure, runs it again with the same two lists, and checks the new cluster works and
//! follows the old one's IDs. With resumption switched off (a test-only switch) the story
//! interrupted after the first mark must end with a cluster that answers nobody.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config_from_urls, init_tracing};
use redquorum::{Client, Config, CopyEvent, Error, IdGenerator};
use redquorum_testkit::Cluster;

/// Short deadlines: a claim left by the interrupted run is taken over after its lifetime
/// (8 operation timeouts plus 4 node timeouts), watched on this client's clock.
fn config(urls: &[String], resumes: bool) -> Config {
    let config = config_from_urls(urls)
        .expect("test URLs are valid")
        .with_operation_timeout(Duration::from_millis(600));
    if resumes {
        config
    } else {
        config.with_unresumable_changes_for_tests()
    }
}

/// Run `from.change_cluster(to)` until the change reaches `phase` for the `nth` time, then
/// drop it there (as a killed operator's process would stop: no claim released, nothing
/// cleaned up).
async fn interrupt_at(from: &[String], to: &[String], phase: CopyEvent, nth: usize) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let seen = Arc::new(AtomicUsize::new(0));
    let hooked = config(from, true).with_copy_hook_for_tests(move |event| {
        if event == phase && seen.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            if let Some(tx) = tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            // Never resumes: the change is dropped here.
            return Box::pin(futures::future::pending());
        }
        Box::pin(async {})
    });
    let client = common::connect(hooked)
        .await
        .expect("the old list connects");
    tokio::select! {
        done = client.change_cluster(config(to, true)) => {
            panic!("the change was to be interrupted at {phase:?}, but it ended: {done:?}")
        }
        _ = rx => println!("change interrupted at {phase:?}"),
    }
}

/// The old cluster on nodes 0-2 issues IDs; a change to `new` is interrupted at `phase`, then
/// run again (resumed or not). Returns the re-run's outcome and the first ID a client of the
/// new list got (after the old cluster's last), or why it got none.
async fn interrupted_then_rerun(
    new: &[usize],
    phase: CopyEvent,
    resumes: bool,
) -> (Result<String, Error>, Result<(u64, u64), String>) {
    interrupted_then_rerun_with(new, (phase, 1), None, resumes).await
}

/// As [`interrupted_then_rerun`], interrupted at the `nth` time the change reaches `phase`,
/// and with node `flushed` FLUSHALLed between the interruption and the re-run.
async fn interrupted_then_rerun_with(
    new: &[usize],
    (phase, nth): (CopyEvent, usize),
    flushed: Option<usize>,
    resumes: bool,
) -> (Result<String, Error>, Result<(u64, u64), String>) {
    init_tracing();
    let cluster = Cluster::start(5).await;
    let all = cluster.urls();
    let old: Vec<String> = all[..3].to_vec();
    let new: Vec<String> = new.iter().map(|&i| all[i].clone()).collect();
    let a = common::connect(config(&old, true))
        .await
        .expect("the old cluster");
    let ids = IdGenerator::new(&a, "orders").expect("valid");
    let mut last = 0;
    for _ in 0..20 {
        last = ids.next_id().await.expect("the old cluster issues IDs");
    }
    drop(a);

    interrupt_at(&old, &new, phase, nth).await;
    if let Some(i) = flushed {
        cluster.node(i).flushall().await;
        println!("node {i} flushed after the interruption");
    }
    let rerun = Client::change_node_list(config(&old, resumes), config(&new, true))
        .await
        .map(|c| {
            format!(
                "{} -> {}: sealed {}, marked {}, done before {}",
                c.from.id, c.to.id, c.sealed, c.marked, c.done_before
            )
        });
    println!("re-run: {rerun:?}");
    let first = match common::connect(config(&new, true)).await {
        Err(e) => Err(format!("the new list's client is refused: {e}")),
        Ok(b) => match IdGenerator::new(&b, "orders")
            .expect("valid")
            .next_id()
            .await
        {
            Ok(id) => Ok((last, id)),
            Err(e) => Err(format!("the new list's client gets no ID: {e}")),
        },
    };
    println!("new list: {first:?}");
    (rerun, first)
}

fn assert_finished(
    story: &str,
    (rerun, first): (Result<String, Error>, Result<(u64, u64), String>),
) {
    let rerun = rerun.unwrap_or_else(|e| panic!("{story}: running the change again failed: {e}"));
    let (last, id) = first.unwrap_or_else(|e| panic!("{story}: after the re-run ({rerun}): {e}"));
    assert!(
        id > last,
        "{story}: the new cluster's ID {id} must follow the old one's last {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_interrupted_after_one_mark_is_finished_by_running_it_again() {
    let outcome = interrupted_then_rerun(&[0, 1, 3], CopyEvent::Marked, true).await;
    assert_finished("swap node 2 for node 3, stopped after one mark", outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_interrupted_after_one_mark_is_finished_by_running_it_again() {
    let outcome = interrupted_then_rerun(&[0, 1, 2, 3, 4], CopyEvent::Marked, true).await;
    assert_finished(
        "grow from three nodes to five, stopped after one mark",
        outcome,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_interrupted_after_two_old_nodes_were_marked_is_finished_by_running_it_again() {
    // Nodes 0 and 1 (old and new) are marked; only node 2 is still sealed: the re-run copies
    // from the old nodes it marked already too.
    let outcome =
        interrupted_then_rerun_with(&[0, 1, 2, 3, 4], (CopyEvent::Marked, 2), None, true).await;
    assert_finished(
        "grow from three nodes to five, stopped after two marks",
        outcome,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_interrupted_after_one_mark_then_a_sealed_node_flushed_is_finished_by_running_it_again(
) {
    let outcome =
        interrupted_then_rerun_with(&[0, 1, 3], (CopyEvent::Marked, 1), Some(2), true).await;
    assert_finished(
        "swap node 2 for node 3, stopped after one mark, node 2 then flushed",
        outcome,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_interrupted_during_its_copy_is_finished_by_running_it_again() {
    let outcome = interrupted_then_rerun(&[0, 1, 3], CopyEvent::PageRead, true).await;
    assert_finished("swap, stopped between a page's read and its write", outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resumption_a_swap_stopped_after_one_mark_never_votes_again() {
    let (rerun, first) = interrupted_then_rerun(&[0, 1, 3], CopyEvent::Marked, false).await;
    assert!(
        first.is_err(),
        "without resumption the new cluster must be stuck (the trap), but it issued {first:?} \
         after the re-run {rerun:?}: the test has no teeth"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resumption_a_growth_stopped_after_one_mark_is_refused() {
    let (rerun, first) = interrupted_then_rerun(&[0, 1, 2, 3, 4], CopyEvent::Marked, false).await;
    assert!(
        rerun.is_err() && first.is_err(),
        "without resumption the re-run must be refused and the new cluster stuck, got \
         {rerun:?} and {first:?}: the test has no teeth"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_change_run_again_does_nothing() {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let all = cluster.urls();
    let (old, new) = (
        all[..3].to_vec(),
        vec![all[0].clone(), all[1].clone(), all[3].clone()],
    );
    let a = common::connect(config(&old, true)).await.expect("old");
    let last = IdGenerator::new(&a, "orders")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");
    let first = a
        .change_cluster(config(&new, true))
        .await
        .expect("the change");
    assert!(!first.done_before);
    let again = Client::change_node_list(config(&old, true), config(&new, true))
        .await
        .expect("running a finished change again succeeds");
    assert!(
        again.done_before && again.to.id == first.to.id,
        "the second run finds the same change done: {again:?}"
    );
    let b = common::connect(config(&new, true)).await.expect("new");
    let id = IdGenerator::new(&b, "orders")
        .expect("valid")
        .next_id()
        .await
        .expect("the new cluster still works: no bogus successor was sealed");
    assert!(id > last, "{id} must follow {last}");
}

/// A change from nodes 0-2 to nodes 3-5 completes; later nodes 3-5 are wiped (reused after
/// the cluster moved on). Deploy automation runs the same change again. Returns the re-run's
/// outcome and how many of nodes 3-5 it marked.
async fn stale_rerun(protected: bool) -> (Result<String, Error>, usize) {
    init_tracing();
    let cluster = Cluster::start(6).await;
    let all = cluster.urls();
    let (old, new) = (all[..3].to_vec(), all[3..].to_vec());
    let a = common::connect(config(&old, protected)).await.expect("old");
    IdGenerator::new(&a, "orders")
        .expect("valid")
        .next_id()
        .await
        .expect("an ID");
    a.change_cluster(config(&new, true))
        .await
        .expect("the change");
    drop(a);
    for i in 3..6 {
        cluster.node(i).wipe_and_restart().await;
    }
    let rerun = Client::change_node_list(config(&old, protected), config(&new, true))
        .await
        .map(|c| format!("done before: {}, marked {}", c.done_before, c.marked));
    let mut marked = 0;
    for i in 3..6 {
        let mut con = cluster.node(i).direct_connection().await;
        let m: Option<String> = redis::cmd("GET")
            .arg("rq:marker")
            .query_async(&mut con)
            .await
            .expect("GET");
        marked += usize::from(m.is_some());
    }
    println!("stale re-run: {rerun:?}; {marked} of the wiped nodes marked");
    (rerun, marked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_rerun_of_a_completed_change_copies_nothing() {
    let (rerun, marked) = stale_rerun(true).await;
    assert!(
        matches!(&rerun, Ok(r) if r.starts_with("done before: true")),
        "the old nodes' stamp says the change is done: {rerun:?}"
    );
    assert_eq!(
        marked, 0,
        "no wiped node of the new list may get the old cluster's frozen state again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_completion_stamp_a_stale_rerun_brings_the_old_state_back() {
    let (_, marked) = stale_rerun(false).await;
    assert!(
        marked >= 2,
        "without the stamp the re-run copies the frozen old state onto the wiped nodes and \
         marks a majority ({marked} marked): if not, this test has no teeth"
    );
}

/// A resumed change's old-list client adopts the old cluster exactly, past the usual
/// adoption: the operator's pin must still be checked against the change's two clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_change_pinned_to_neither_of_its_clusters_is_refused() {
    init_tracing();
    let cluster = Cluster::start(4).await;
    let all = cluster.urls();
    let (old, new) = (
        all[..3].to_vec(),
        vec![all[0].clone(), all[1].clone(), all[3].clone()],
    );
    common::connect(config(&old, true)).await.expect("old");
    interrupt_at(&old, &new, CopyEvent::Marked, 1).await;
    let pinned = config(&old, true)
        .with_cluster_id("00000000000000ff")
        .expect("an id");
    let refused = Client::change_node_list(pinned, config(&new, true)).await;
    assert!(
        matches!(refused, Err(Error::Config(_))),
        "a pin naming neither cluster refuses the resumed change: {refused:?}"
    );
    let change = Client::change_node_list(config(&old, true), config(&new, true))
        .await
        .expect("the unpinned re-run finishes the change");
    assert!(!change.done_before);
}
