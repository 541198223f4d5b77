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

# The teeth tests (a protection switched off, the checker shown to catch what it prevents) run
# in the plain pass: their weakened clients send commands no production path sends (PEXPIRE for
# server-clock leases, ...), which no feature's ACL grants, and they show nothing about TLS or
# the ACL. This pass runs the protected stories only.
teeth='test(/^without_/) | test(/^with_/) | test(/checker_finds/)'

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
        -E "package(redquorum) & ($binaries) & not ($teeth)" "$@"; then
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
