#!/usr/bin/env bash
# The Valkey pass (CI, after scripts/test.sh): a representative subset of the real-node tests
# and the quick fault campaign against Valkey 8.0 (bookworm-backports) instead of Redis 7.0.
# Installs Valkey (scripts/install-valkey.sh) and builds its node image
# (scripts/build-redis-image.sh, redquorum-valkey:8.0) when missing.
#
# Usage: scripts/valkey-tests.sh [--no-campaign] [extra nextest arguments]
#
# One variable switches the testkit: REDQUORUM_TEST_SERVER=valkey-server makes local nodes
# (LocalNodes, the campaign, TLS nodes) run valkey-server and container nodes default to the
# image redquorum-valkey:8.0 (REDQUORUM_REDIS_IMAGE is unset here so that it cannot point them
# back at Redis). The same features and profile as scripts/test.sh, so after it nothing is
# compiled again.
set -euo pipefail
cd "$(dirname "$0")/.."

campaign=1
case "${1:-}" in
    -h | --help)
        sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --no-campaign)
        campaign=0
        shift
        ;;
esac

export REDQUORUM_TEST_SERVER="${REDQUORUM_TEST_SERVER:-valkey-server}"
case "$(basename "$REDQUORUM_TEST_SERVER")" in
    *valkey*) ;;
    *)
        echo "valkey-tests: REDQUORUM_TEST_SERVER=$REDQUORUM_TEST_SERVER is not a Valkey server" >&2
        exit 2
        ;;
esac
unset REDQUORUM_REDIS_IMAGE

scripts/install-valkey.sh
scripts/build-redis-image.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "valkey-tests: installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# binary:test, a few of each kind; about 1.5 minutes on 2 cores. Containers unless noted.
tests=(
    # IDs: faults on a minority, a wipe mid-run, a lost reply never counted.
    ids:ids_stay_unique_and_ordered_while_faults_hit_a_minority
    ids:a_node_wiped_mid_run_causes_no_duplicate_and_no_inversion
    ids:a_lost_reply_is_never_counted_as_an_acceptance
    # Leases: fencing, a restart with the AOF, a partitioned holder, racing clients.
    locks:a_paused_holder_is_fenced_off_by_its_token
    locks:a_node_restarted_with_its_aof_while_the_lock_is_held_gives_no_second_holder
    locks:a_holder_cut_off_from_a_majority_signals_loss_by_its_deadline
    locks:thirty_two_racing_clients_never_hold_at_once_and_make_progress
    # Clock steps (the LD_PRELOAD shim under valkey-server), with a teeth test showing the
    # step moves Valkey's expiry, and a wipe after a missed grant.
    lease_safety:a_nodes_clock_stepping_forward_admits_no_second_holder
    lease_safety:without_the_protection_a_nodes_clock_step_admits_two_holders
    lease_safety:a_wiped_node_after_a_missed_grant_admits_no_second_holder
    harness:a_local_redis_server_process_follows_its_clock_file
    # Repair: a wiped node under load; FLUSHALL (the run_id stays) mid-repair; a claim
    # taken over whatever the node's clock does.
    repair:a_wiped_node_with_many_keys_is_repaired_under_load_and_ids_stay_ordered
    flushall:a_source_flushed_during_a_repair_at_five_nodes_stops_it_and_no_id_is_handed_out_twice
    flushall:a_dead_repairers_claim_is_taken_over_whatever_the_nodes_clock_does
    # The node list changed; group membership (peer indexing) and work distribution.
    cluster:changing_the_node_list_keeps_order_and_an_old_list_client_follows_it
    cluster_init:blank_nodes_are_refused_naming_cluster_init_until_it_sets_the_cluster_up_once
    membership:joins_leaves_and_crashes_never_give_a_task_two_owners
    membership:a_node_flushed_right_after_a_beat_gives_no_task_two_owners
    distribution:joins_leaves_crashes_and_unit_changes_never_give_a_unit_two_owners
    units:a_wiped_node_never_brings_a_removed_unit_back
    # Local processes (LocalNodes), TLS nodes and the ACL permission check.
    units:the_leaders_cursors_are_per_node_even_when_markers_are_alike
    tls:mutual_tls_with_a_ca_file_and_a_client_certificate_serves_every_operation
    tls:the_permission_check_names_what_the_user_lacks_and_which_feature_needs_it
    # The CLI's check names the server: `valkey 8.0.1`.
    cli:check_names_the_server_and_its_own_version
)
filter=""
for t in "${tests[@]}"; do
    filter="${filter:+$filter | }(binary(=${t%%:*}) & test(=${t#*:}))"
done

echo "valkey-tests: ${#tests[@]} tests against $($REDQUORUM_TEST_SERVER --version)"
cargo nextest run --workspace --features redquorum-cli/test-util --profile ci -E "$filter" "$@"

if [ "$campaign" -eq 1 ]; then
    echo "valkey-tests: the quick fault campaign against valkey-server nodes"
    scripts/campaign.sh --quick
fi
