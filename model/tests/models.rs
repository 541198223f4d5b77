//! Every model passes within its CI bounds, and every planted bug yields a counterexample,
//! printed as a readable trace.

use redquorum_model::{check_symmetric, find, find_symmetric, ids};

fn passes(model: ids::IdModel) {
    let r = check_symmetric(model, 2, None);
    println!("ids: {r}");
    assert!(r.complete, "the exploration stopped before its end");
    assert!(
        r.failed.is_empty(),
        "the ID register broke a property: {:#?}",
        r.failed
    );
}

#[test]
fn the_id_register_returns_unique_ids_in_real_time_order_under_lost_messages_and_a_crash() {
    passes(ids::IdModel::ci_network());
}

#[test]
fn the_id_register_returns_unique_ids_in_real_time_order_when_a_node_is_wiped_and_repaired() {
    passes(ids::IdModel::ci_amnesia());
}

fn counterexample(model: ids::IdModel, bug: ids::Bug, property: &'static str) {
    shows(bug, property, find(model.with_bug(bug), 2, property));
}

/// Assert that the search `r` found a counterexample to `property`, and print it.
fn shows(bug: ids::Bug, property: &'static str, r: redquorum_model::Report) {
    println!(
        "ids with {bug:?}: {}; {property}:\n{}",
        r.summary(),
        r.counterexample(property).unwrap_or("  (not found)\n")
    );
    let trace = r.counterexample(property).unwrap_or_else(|| {
        panic!(
            "{bug:?}: no counterexample to {property:?} found in {} states",
            r.unique
        )
    });
    assert!(
        trace.contains("calls next_ids"),
        "unreadable trace:\n{trace}"
    );
}

#[test]
fn a_quorum_of_half_the_nodes_yields_a_repeated_id() {
    counterexample(
        ids::IdModel::ci_network(),
        ids::Bug::QuorumHalf,
        "IDs unique",
    );
}

#[test]
fn a_wiped_node_without_quarantine_yields_a_repeated_id() {
    counterexample(
        ids::IdModel::ci_amnesia(),
        ids::Bug::NoQuarantine,
        "IDs unique",
    );
}

#[test]
fn a_repair_that_does_not_wait_for_proposals_in_flight_yields_a_repeated_id() {
    counterexample(
        ids::IdModel::ci_amnesia(),
        ids::Bug::RepairWithoutWait,
        "IDs unique",
    );
}

#[test]
fn the_id_register_returns_unique_ids_in_real_time_order_when_a_node_is_flushed_and_repaired() {
    passes(ids::IdModel::ci_flush());
}

#[test]
fn a_flushed_node_without_quarantine_yields_a_repeated_id() {
    counterexample(
        ids::IdModel::ci_flush(),
        ids::Bug::NoQuarantine,
        "IDs unique",
    );
}

// The exhaustive tier: one of the two largest passes (hundreds of millions of states; 315 s
// and 174 s alone on 2 cores on 2026-11-28). `scripts/model.sh` runs it; CI runs every other
// set, and one of this set's two planted bugs (the other is in this tier).
#[test]
#[ignore = "exhaustive tier: scripts/model.sh"]
fn ids_from_spare_blocks_validated_by_a_majority_read_stay_unique_and_in_real_time_order() {
    passes(ids::IdModel::ci_spare());
}

/// The spare-block fast path (`IdOptions::with_lookahead`): a planted bug is searched
/// depth-first with symmetry reduction (its counterexample lies past a second call).
fn spare_counterexample(bug: ids::Bug) {
    let mut model = ids::IdModel::ci_spare().with_bug(bug);
    model.losses = 0;
    let property = "IDs in real-time order";
    shows(bug, property, find_symmetric(model, 2, property));
}

// The exhaustive tier too: its depth-first search took 61 s on 2 cores (CI keeps the other
// spare-block bug, found in seconds, as this model's teeth).
#[test]
#[ignore = "exhaustive tier: scripts/model.sh"]
fn a_spare_block_handed_out_without_a_read_breaks_real_time_order() {
    spare_counterexample(ids::Bug::SpareWithoutRead);
}

#[test]
fn a_spare_block_validated_by_one_node_breaks_real_time_order() {
    spare_counterexample(ids::Bug::SpareReadFromOne);
}
