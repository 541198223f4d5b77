#!/usr/bin/env bash
# The fault campaign: local redis-server nodes (or the REDQUORUM_TEST_SERVER program, e.g.
# valkey-server), workload processes and redquorum CLI processes under a seeded schedule of
# faults, their histories checked. Prints a summary; the last line is exactly
# `campaign: seed=<s> operations=<n> faults=<n> violations=<n>`; exits non-zero when a
# violation was found.
#
# Usage: scripts/campaign.sh [--quick | --long] [--seed S] [--plant BUG] [--duration 90s] ...
#   --quick  the CI campaign (about a minute of faults, debug build)
#   --long   the README's campaign (twenty minutes of faults, release build)
# `--seed S` replays a campaign's schedule of faults and operations (timing aside).
set -euo pipefail
cd "$(dirname "$0")/.."

# The nodes run REDQUORUM_TEST_SERVER (a name on PATH or a path; default redis-server), e.g.
# valkey-server for the Valkey pass (scripts/valkey-tests.sh).
server="${REDQUORUM_TEST_SERVER:-redis-server}"
if ! command -v "$server" >/dev/null 2>&1; then
    case "$(basename "$server")" in
        *valkey*)
            echo "campaign: installing Valkey from bookworm-backports"
            scripts/install-valkey.sh
            ;;
        *)
            echo "campaign: installing Debian's redis-server"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends redis-server >/dev/null
            ;;
    esac
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "campaign: a C compiler (cc) is needed for the LD_PRELOAD shims" >&2
    exit 2
fi

profile=debug
build=()
for arg in "$@"; do
    if [ "$arg" = "--long" ]; then
        profile=release
        build=(--release)
    fi
done
cargo build "${build[@]}" -q -p redquorum-campaign -p redquorum-cli --features redquorum-cli/test-util
exec "target/$profile/rq-campaign" run --redquorum "target/$profile/redquorum" "$@"
