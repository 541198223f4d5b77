//! The copy of a node-list change passes within its CI bounds (FLUSHALL of any node at any
//! moment), and each planted bug yields a counterexample, printed as a readable trace.

use redquorum_model::copy::{Bug, CopyModel, COMPLETES, FOLLOWS};
use redquorum_model::{check, find};

fn passes(what: &str, model: CopyModel) {
    let r = check(model, 2);
    println!("{what}: {r}");
    assert!(r.complete, "{what}: the exploration stopped before its end");
    assert!(
        r.failed.is_empty(),
        "{what}: the change broke a property (or {COMPLETES:?} was never reached): {:#?}",
        r.failed
    );
}

#[test]
fn the_new_cluster_follows_the_old_when_a_node_is_flushed_during_the_change() {
    passes("copy", CopyModel::ci());
}

#[test]
fn the_new_cluster_follows_the_old_when_two_nodes_are_flushed_during_the_change() {
    passes("copy, two flushes", CopyModel::ci_two_flushes());
}

/// Breadth-first: the shortest counterexample, which must read as the story of a change.
fn counterexample(model: CopyModel, bug: Bug) {
    let r = find(model.with_bug(bug), 2, FOLLOWS);
    println!(
        "copy with {bug:?}: {}; {FOLLOWS}:\n{}",
        r.summary(),
        r.counterexample(FOLLOWS).unwrap_or("  (not found)\n")
    );
    let trace = r.counterexample(FOLLOWS).unwrap_or_else(|| {
        panic!(
            "{bug:?}: no counterexample to {FOLLOWS:?} found in {} states",
            r.unique
        )
    });
    for words in ["starts an ID round", "seals node", "FLUSHALL", "marks node"] {
        assert!(
            trace.contains(words),
            "unreadable trace (no {words:?}):\n{trace}"
        );
    }
}

#[test]
fn a_copy_that_reads_its_sources_blind_lets_the_new_cluster_hand_out_an_old_id_again() {
    counterexample(CopyModel::ci(), Bug::BlindCopyReads);
}

#[test]
fn a_copy_whose_writes_ignore_the_claim_marks_flushed_targets_and_loses_an_old_id() {
    counterexample(CopyModel::ci_two_flushes(), Bug::UnclaimedCopyWrites);
}

#[test]
fn a_copy_that_goes_on_with_fewer_than_a_majority_of_unchanged_sources_loses_an_old_id() {
    counterexample(CopyModel::ci(), Bug::CopyWithoutMajority);
}
