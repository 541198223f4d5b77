//! The view register cannot fork: one version names one view, and of the views derived from
//! one base at most one is ever adopted. Each story runs on real nodes with the protection on
//! and with the forkable register (the test-only switch), where it must show the fork.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::init_tracing;
use redquorum::{Client, Error};
use redquorum::{Ownership, View, ViewRegisterForTests, ViewState};
use redquorum_testkit::Cluster;

const TASKS: u64 = 64;

async fn client(urls: &[String]) -> Client {
    common::connect(common::config_from_urls(urls).expect("valid"))
        .await
        .expect("connects")
}

fn members(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// An active view for `ids`, derived from `base` (as a leader without the barrier seals).
fn active_from(base: &View, ids: &[&str], term: u64) -> View {
    let mut v = base.next(&members(ids), term);
    v.state = ViewState::Active;
    v.draining.clear();
    v.previous.clear();
    v
}

/// Tasks that two adopted views give to different members at one version (the fenced guard
/// accepts equal tokens, so it cannot separate them).
fn same_token_two_owners(a: &View, b: &View) -> Vec<u64> {
    if a.version != b.version {
        return Vec::new();
    }
    (0..TASKS)
        .filter(|t| {
            let key = t.to_le_bytes();
            a.owner(&key, *t, Ownership::Modulo) != b.owner(&key, *t, Ownership::Modulo)
        })
        .collect()
}

/// The leader seals V1; its next seal X reaches node 0 only; it reads V1 again and reseals Y
/// (other members) while node 2 is cut off; then reader A (who reaches nodes 0 and 2) and
/// reader B (nodes 1 and 2) read at once and each adopts what it read. Returns both
/// adoptions.
async fn partial_seal_then_reseal(
    forkable: bool,
) -> (View, View, Result<View, Error>, Result<View, Error>) {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let all = cluster.urls();
    let dead = "redis://127.0.0.1:1".to_string();
    let leader_client = client(&all).await;
    let reader_a = client(&[all[0].clone(), dead.clone(), all[2].clone()]).await;
    let reader_b = client(&[dead, all[1].clone(), all[2].clone()]).await;
    let leader = ViewRegisterForTests::new(&leader_client, "g", forkable).expect("valid");
    let reg_a = ViewRegisterForTests::new(&reader_a, "g", forkable).expect("valid");
    let reg_b = ViewRegisterForTests::new(&reader_b, "g", forkable).expect("valid");
    let term = 1;

    let v1 = leader
        .seal(active_from(&View::empty(), &["a", "b"], term))
        .await
        .expect("V1 is sealed on every node");
    cluster.node(1).cut_off();
    cluster.node(2).cut_off();
    let x = leader
        .seal(active_from(&v1, &["a", "b", "c"], term))
        .await
        .expect_err("X reaches node 0 only");
    println!("the seal of X failed: {x}");
    cluster.node(1).heal();
    cluster.node(2).cut_off();
    let x = active_from(&v1, &["a", "b", "c"], term);
    let y = leader.seal(active_from(&v1, &["a", "b", "d"], term)).await;
    println!("the reseal (Y) gave {y:?}");
    cluster.node(2).heal();

    let (ra, rb) = tokio::join!(reg_a.read(), reg_b.read());
    let (ra, rb) = (ra.expect("A reads 0 and 2"), rb.expect("B reads 1 and 2"));
    let (va, vb) = tokio::join!(reg_a.adopt(&ra), reg_b.adopt(&rb));
    (v1, x, va, vb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_seal_and_a_reseal_never_give_one_version_two_views() {
    let (v1, x, va, vb) = partial_seal_then_reseal(false).await;
    println!("A adopted {va:?}\nB adopted {vb:?}");
    match (&va, &vb) {
        (Ok(a), Ok(b)) => {
            let clash = same_token_two_owners(a, b);
            assert!(
                clash.is_empty(),
                "tasks {clash:?} have two owners at version {:?}",
                a.version
            );
            assert!(
                a == b || a.base == b.version || b.base == a.version,
                "two adopted views must be one chain: {a:?} / {b:?}"
            );
        }
        _ => {
            // At most one reader adopted; whatever was adopted derives from V1.
            for v in [&va, &vb].into_iter().flatten() {
                assert_eq!(v.base, v1.version, "an adopted view derives from V1");
            }
        }
    }
    // X and Y both derive from V1: whichever write-back lands first on node 2 wins it, and
    // the other reader, refused there, adopts nothing.
    assert_eq!(
        usize::from(va.is_ok()) + usize::from(vb.is_ok()),
        1,
        "exactly one of two views derived from one base may be adopted: {va:?} / {vb:?}"
    );
    if let Ok(a) = &va {
        assert_eq!(a.members, x.members, "A read X");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_forkable_register_a_reseal_gives_one_token_two_owners() {
    let (_, _, va, vb) = partial_seal_then_reseal(true).await;
    let (a, b) = (va.expect("A adopts"), vb.expect("B adopts"));
    println!(
        "A adopted {:?} {:?}\nB adopted {:?} {:?}",
        a.version, a.members, b.version, b.members
    );
    let clash = same_token_two_owners(&a, &b);
    assert!(
        !clash.is_empty(),
        "the forkable register must let A and B adopt two views at one version"
    );
}

/// A deposed leader's late seal X reaches one node after the new leader read V1; a reader
/// spreads X by its write-back and adopts it; then the new leader seals W derived from V1.
/// Returns what the reader adopted and the new leader's seal.
async fn deposed_leaders_late_write(forkable: bool) -> (View, View, Result<View, Error>) {
    init_tracing();
    let cluster = Cluster::start(3).await;
    let all = cluster.urls();
    let dead = "redis://127.0.0.1:1".to_string();
    let old_leader = client(&all).await;
    let new_leader = client(&all).await;
    let reader = client(&[all[0].clone(), all[1].clone(), dead]).await;
    let l1 = ViewRegisterForTests::new(&old_leader, "g", forkable).expect("valid");
    let l2 = ViewRegisterForTests::new(&new_leader, "g", forkable).expect("valid");
    let r = ViewRegisterForTests::new(&reader, "g", forkable).expect("valid");

    let v1 = l1
        .seal(active_from(&View::empty(), &["a", "b"], 1))
        .await
        .expect("V1 sealed in term 1");
    // The new leader (term 2) has read V1; the old one's late seal X lands on node 0 only.
    cluster.node(1).cut_off();
    cluster.node(2).cut_off();
    let _ = l1.seal(active_from(&v1, &["a", "b", "c"], 1)).await;
    cluster.node(1).heal();
    cluster.node(2).heal();
    // A reader that reaches nodes 0 and 1 spreads X and adopts it (c now owns tasks).
    let reading = r.read().await.expect("reads");
    let adopted = r.adopt(&reading).await.expect("adopts");
    // The new leader seals W from what it read: V1.
    let w = l2.seal(v1.next(&members(&["a", "b", "d"]), 2)).await;
    (v1, adopted, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_spread_late_view_is_never_skipped_by_the_next_seal() {
    let (v1, adopted, w) = deposed_leaders_late_write(false).await;
    assert!(
        adopted.members.contains_key("c"),
        "the reader adopted the late view X: {adopted:?}"
    );
    assert!(
        w.is_err(),
        "W, derived from V1, must be refused where X is held (X was adopted after V1): {w:?}"
    );
    println!(
        "the new leader's seal from the stale base V1 {:?} was refused: {w:?}",
        v1.version
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_forkable_register_the_next_seal_skips_an_adopted_view() {
    let (_, adopted, w) = deposed_leaders_late_write(true).await;
    let w = w.expect("the forkable register takes W over X (a higher version)");
    assert!(
        adopted.members.contains_key("c"),
        "the reader adopted X: {adopted:?}"
    );
    assert!(
        !w.draining.contains("c"),
        "W's draining set misses c, who worked under the adopted X: the skip this test shows"
    );
    assert_ne!(
        w.base, adopted.version,
        "W does not derive from the adopted X"
    );
}
