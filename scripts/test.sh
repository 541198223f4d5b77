#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of this kind: installs Debian's redis-server
# (needed to build the node image) if missing, builds the local Redis image, then runs every
# test of the workspace (unit, integration against real Redis containers, doc tests).
#
# Usage: scripts/test.sh [extra nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "test: installing Debian's redis-server and redis-tools (node image source; redis-cli for CLI tests)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
fi
scripts/build-redis-image.sh

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# The CLI's test-only options (e.g. `dist watch --no-barrier-for-tests`) let its process tests
# show that their checkers catch what a protection prevents.
cargo nextest run --workspace --features redquorum-cli/test-util --profile ci "$@"
cargo test --workspace --doc

# Each feature's tests again over mutual TLS, as the least-privilege user `redquorum acl`
# prints (two tests at a time, one fewer than the plain pass: a TLS connect costs more CPU than
# a plain one, even with the roots parsed once per client).
scripts/secure-tests.sh --profile ci --test-threads 2
