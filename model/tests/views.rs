//! The view register and the prepare/active barrier of peer indexing pass within their CI
//! bounds, and every planted bug yields a counterexample, printed as a readable trace.

use redquorum_model::views::{Bug, ViewModel, ORDER, OWNERS};
use redquorum_model::{check, find};

fn passes(what: &str, model: ViewModel) {
    let r = check(model, 2);
    println!("{what}: {r}");
    assert!(r.complete, "{what}: the exploration stopped before its end");
    assert!(
        r.failed.is_empty(),
        "{what}: the view register or its barrier broke a property: {:#?}",
        r.failed
    );
}

#[test]
fn a_moved_task_keeps_one_owner_and_views_one_order_under_lost_seals_and_a_new_leader_term() {
    passes("views", ViewModel::ci());
}

#[test]
fn a_moved_task_keeps_one_owner_and_views_one_order_when_a_node_crashes_and_restarts() {
    passes("views with a crash", ViewModel::ci_crash());
}

#[test]
fn a_moved_task_keeps_one_owner_and_views_one_order_when_a_node_is_wiped_and_repaired() {
    passes("views with amnesia", ViewModel::ci_amnesia());
}

#[test]
fn a_moved_task_keeps_one_owner_and_views_one_order_when_a_node_is_flushed_and_repaired() {
    passes("views with a flush", ViewModel::ci_flush());
}

/// Check `bug` planted in the planted-bug bounds: the counterexample to `property` must be
/// found (the search stops there), and read as a story (members, the leader, the nodes). The
/// passing bound sets show that a task does move in the honest model (`MOVED`).
fn counterexample(bug: Bug, property: &'static str) {
    let r = find(ViewModel::planted().with_bug(bug), 2, property);
    println!("views with {bug:?}: {r}");
    let trace = r.counterexample(property).unwrap_or_else(|| {
        panic!(
            "{bug:?}: no counterexample to {property:?} found in {} states",
            r.unique
        )
    });
    for words in ["member", "the term-1 leader", "seals view"] {
        assert!(
            trace.contains(words),
            "unreadable trace (no {words:?}):\n{trace}"
        );
    }
}

#[test]
fn without_the_barrier_a_moved_task_has_two_owners() {
    counterexample(Bug::BarrierOff, OWNERS);
}

#[test]
fn a_validity_longer_than_the_leaders_watch_window_gives_a_moved_task_two_owners() {
    counterexample(Bug::ValidityBeyondWindow, OWNERS);
}

#[test]
fn a_forkable_register_lets_one_version_name_two_adopted_views() {
    counterexample(Bug::ForkableRegister, ORDER);
}

#[test]
fn a_reader_that_does_not_write_back_adopts_an_older_view_after_a_newer_one() {
    counterexample(Bug::NoWriteBack, ORDER);
}
