#!/usr/bin/env bash
# Runs a benchmark against local redis-server nodes (installs Debian's redis-server if
# missing). Usage: scripts/bench.sh ids [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${1:-ids}"; shift || true
if ! command -v redis-server >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
cargo bench --bench "$bench" -- "$@"
