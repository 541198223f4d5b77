#!/usr/bin/env bash
# The demo: shows what redquorum can do so far against real nodes.
#
# With REDQUORUM_NODES set, it uses those nodes. Without it, it builds the local Redis image
# if needed, brings up the five docker-compose nodes on 127.0.0.1:7001-7005, runs the demo,
# and tears the nodes down again (volumes included).
set -euo pipefail
cd "$(dirname "$0")/.."
# The compose file defaults to the official redis image; this machine's kind cannot pull images,
# so the scripts use the one scripts/build-redis-image.sh builds from Debian's redis-server.
export REDQUORUM_REDIS_IMAGE="${REDQUORUM_REDIS_IMAGE:-redquorum-redis:7.0}"

compose() {
    if command -v docker-compose >/dev/null 2>&1; then docker-compose -p redquorum-demo "$@"
    else docker compose -p redquorum-demo "$@"; fi
}

if [[ -z "${REDQUORUM_NODES:-}" ]]; then
    if ! command -v redis-server >/dev/null 2>&1 && ! docker image inspect "${REDQUORUM_REDIS_IMAGE:-redquorum-redis:7.0}" >/dev/null 2>&1; then
        echo "demo: installing Debian's redis-server (source of the node image)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    fi
    scripts/build-redis-image.sh >/dev/null
    trap 'echo "demo: tearing the nodes down"; compose down -v >/dev/null 2>&1 || true' EXIT
    echo "demo: starting five Redis nodes on 127.0.0.1:7001-7005"
    compose up -d >/dev/null 2>&1 || compose up -d
    export REDQUORUM_NODES="redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005"
    for port in 7001 7002 7003 7004 7005; do
        for _ in $(seq 1 100); do
            if (exec 3<>/dev/tcp/127.0.0.1/$port && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null; then break; fi
            sleep 0.1
        done
    done
fi

# REDQUORUM_DEMO_FEATURES (CI: redquorum-cli/test-util) builds with the test run's features, so
# nothing is compiled again; the test-only switches are compiled in and stay off.
features=(${REDQUORUM_DEMO_FEATURES:+--features "$REDQUORUM_DEMO_FEATURES"})
cargo build -q --workspace --examples --bins "${features[@]}"
echo
echo "== redquorum cluster init: set the cluster up on the blank nodes, once =="
./target/debug/redquorum cluster init
echo
echo "== redquorum check: every node's safety findings =="
./target/debug/redquorum check
echo
for example in examples/*.rs; do
    name="$(basename "$example" .rs)"
    echo "== example: $name =="
    case "$name" in
        quickstart_leader | quickstart_pool)
            # These run until Ctrl-C, as a service would: interrupted after a few seconds,
            # each must have printed what the README says it prints.
            out=$(timeout -s INT 10 "./target/debug/examples/$name" || true)
            echo "$out"
            want="leading in term"; [ "$name" = quickstart_pool ] && want="I parse"
            grep -q "$want" <<<"$out" || { echo "demo: $name did not print \"$want\"" >&2; exit 1; }
            ;;
        *) "./target/debug/examples/$name" ;;
    esac
    echo
done

echo "== redquorum index watch: two instances join a group, one leaves =="
./target/debug/redquorum index watch demo-workers --interval 500ms --id alpha > /tmp/redquorum-demo-alpha.txt &
alpha=$!
sleep 1
timeout -s TERM 2 ./target/debug/redquorum index watch demo-workers --interval 500ms --id beta || true
sleep 1.5
kill -TERM "$alpha" 2>/dev/null || true
wait "$alpha" 2>/dev/null || true
echo "alpha saw:"
sed 's/^/  /' /tmp/redquorum-demo-alpha.txt
