#!/usr/bin/env bash
# Runs a benchmark against local redis-server nodes (installs Debian's redis-server if
# missing; for the ID profile's fsync counts, Debian's linux-perf if it can).
# Usage: scripts/bench.sh ids|locks|membership|repair|memory|distribution|serve [--quick] [--nodes N]
#        scripts/bench.sh ids|locks [--no-valkey]   (the tables run on Redis, then on Valkey 8,
#                                  installed by scripts/install-valkey.sh; --no-valkey: Redis only)
#        scripts/bench.sh ids --connect   (only what a connect costs, TLS beside plain)
#        scripts/bench.sh serve [--etcd]   (IDs through `redquorum serve`; --etcd: beside etcd's JSON gateway)
#        scripts/bench.sh etcd [--quick]
# `etcd` compares with etcd 3.4 (three members on loopback) through the etcd-client crate:
# the crate etcd-bench/, outside the workspace; it installs Debian's etcd-server and protoc
# (protobuf-compiler, with libprotobuf-dev for the well-known .proto files) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${1:-ids}"; shift || true
export DEBIAN_FRONTEND=noninteractive
updated=
# Install Debian packages (as root, quietly) unless `probe` already succeeds.
install_missing() {
    local probe="$1"; shift
    if ! eval "$probe" >/dev/null 2>&1; then
        if [ -z "$updated" ]; then apt-get update -qq; updated=1; fi
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    fi
}
install_missing "command -v redis-server" redis-server
if [ "$bench" = ids ] && ! command -v perf >/dev/null 2>&1; then
    apt-get install -y -qq --no-install-recommends linux-perf >/dev/null 2>&1 \
        || echo "bench: perf not installed; the profile will not count fsyncs"
fi
# ids and locks run their tables on Valkey 8 nodes too, after Redis's.
if [ "$bench" = ids ] || [ "$bench" = locks ]; then
    valkey=1
    for arg in "$@"; do
        case "$arg" in --no-valkey | --connect | --soak | --held) valkey= ;; esac
    done
    if [ -n "$valkey" ] && ! scripts/install-valkey.sh; then
        echo "bench: Valkey could not be installed (scripts/install-valkey.sh failed above): Redis rows only"
        set -- "$@" --no-valkey
    fi
fi
if [ "$bench" = etcd ]; then
    install_missing "command -v etcd" etcd-server
    install_missing "command -v protoc && test -f /usr/include/google/protobuf/descriptor.proto" \
        protobuf-compiler libprotobuf-dev
    exec cargo run --release --manifest-path etcd-bench/Cargo.toml -- "$@"
fi
# `serve` (IDs through `redquorum serve`) is the CLI crate's; the others are the library's.
package=redquorum
if [ "$bench" = serve ]; then
    package=redquorum-cli
    # `serve --etcd` adds etcd's JSON gateway to the same run.
    for arg in "$@"; do
        if [ "$arg" = --etcd ]; then install_missing "command -v etcd" etcd-server; fi
    done
fi
cargo bench -p "$package" --bench "$bench" -- "$@"
