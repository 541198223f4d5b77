#!/usr/bin/env bash
# Runs a benchmark against local redis-server nodes (installs Debian's redis-server if
# missing; for the ID profile's fsync counts, Debian's linux-perf if it can).
# Usage: scripts/bench.sh ids|locks|membership|repair|memory|distribution [--quick] [--nodes N]
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${1:-ids}"; shift || true
export DEBIAN_FRONTEND=noninteractive
if ! command -v redis-server >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
if [ "$bench" = ids ] && ! command -v perf >/dev/null 2>&1; then
    apt-get install -y -qq --no-install-recommends linux-perf >/dev/null 2>&1 \
        || echo "bench: perf not installed; the profile will not count fsyncs"
fi
cargo bench --bench "$bench" -- "$@"
