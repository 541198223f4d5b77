#!/usr/bin/env bash
# Runs each feature's integration tests again with every node serving TLS only (client
# certificates required, made by the test with rcgen) and the library logged in as a Redis
# user made from exactly the lines `redquorum acl --user rq --feature F` prints (see
# testkit/src/secure.rs). Called by scripts/test.sh, after the image is built.
#
# Usage: scripts/secure-tests.sh [extra nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# The same features as scripts/test.sh's run, so nothing is compiled again.
cargo build -q --workspace --features redquorum-cli/test-util --bins
acl_dir=$(mktemp -d)
trap 'rm -rf "$acl_dir"' EXIT

# Teeth tests whose weakened client calls PEXPIRE (the test-only server-clock leases): a
# command no production path sends, so no feature's ACL grants it.
teeth_needing_pexpire='test(=without_the_protection_a_wiped_node_after_a_missed_grant_admits_two_holders)
 | test(=without_the_protection_a_nodes_clock_step_admits_two_holders)
 | test(=restoring_the_newest_of_two_holders_copies_admits_two_holders)
 | test(=without_the_protection_a_lost_beat_copy_gives_a_task_two_owners)
 | test(=without_per_process_keys_two_processes_with_one_id_own_the_same_tasks)'
# And a teeth test whose violation needs the leader's rounds to fall right: about one run in
# two on plain TCP, rarely over TLS (five runs in a row once showed none); the plain pass shows
# its teeth.
teeth_needing_pexpire="$teeth_needing_pexpire
 | test(=with_repeatable_beats_a_node_flushed_after_a_beat_gives_a_task_two_owners)"

# run FEATURES TEST... [-- nextest arguments]
run() {
    local features=$1; shift
    local binaries=""
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        binaries="${binaries:+$binaries | }binary(=$1)"; shift
    done
    [ "${1:-}" = "--" ] && shift
    local file="$acl_dir/${features//,/-}.acl"
    target/debug/redquorum acl --user rq --feature "$features" > "$file"
    echo "secure-tests: feature $features over TLS as user rq:"
    sed 's/^/    /' "$file"
    if ! REDQUORUM_TEST_ACL_FILE="$file" cargo nextest run --workspace \
        --features redquorum-cli/test-util \
        -E "package(redquorum) & ($binaries) & not ($teeth_needing_pexpire)" "$@"; then
        failed+=("$features")
    fi
}

failed=()
run ids ids repair -- "$@"
run locks,ids locks lease_safety floor_repair -- "$@"
run election election -- "$@"
run indexing membership views -- "$@"
if [ ${#failed[@]} -gt 0 ]; then
    echo "secure-tests: FAILED for: ${failed[*]}" >&2
    exit 1
fi
echo "secure-tests: every feature's tests passed over TLS under its least-privilege user"
