#!/usr/bin/env bash
# Every model check, the exhaustive tier included: the two largest passes (the ID fast path's
# 401 million states, the lease repair's 155 million), which CI leaves out to stay within its
# time (315 s and 174 s alone on 2 cores on 2026-11-28; 9 minutes with the build). Run it
# after changing a model, a Lua script a model mirrors, or the decisions the models check;
# record the figures in
# docs/evidence.md ("Model checking").
#
# Usage: scripts/model.sh [extra nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
# The conformance tests start local redis-server processes.
if ! command -v redis-server >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
cargo nextest run -p redquorum-model --run-ignored all --profile ci "$@"
