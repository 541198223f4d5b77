#!/usr/bin/env bash
# The TLS demo: the five docker-compose nodes with the TLS option (docker-compose.tls.yml):
# TLS only, client certificates required, and redquorum logged in as the least-privilege
# user `rq` that `redquorum acl --user rq` describes. Makes a throw-away CA, server and client
# certificates with openssl in ./.demo-tls, runs `check`, `id next` and `lock run` over
# TLS, shows that a wrong CA is refused with a clear error, and tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
# The compose file defaults to the official redis image; this machine's kind cannot pull images,
# so the scripts use the one scripts/build-redis-image.sh builds from Debian's redis-server.
export REDQUORUM_REDIS_IMAGE="${REDQUORUM_REDIS_IMAGE:-redquorum-redis:7.0}"

compose() {
    if command -v docker-compose >/dev/null 2>&1; then docker-compose -p redquorum-demo-tls -f docker-compose.yml -f docker-compose.tls.yml "$@"
    else docker compose -p redquorum-demo-tls -f docker-compose.yml -f docker-compose.tls.yml "$@"; fi
}

command -v openssl >/dev/null 2>&1 || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends openssl >/dev/null
}
scripts/build-redis-image.sh >/dev/null
# REDQUORUM_DEMO_FEATURES: as in scripts/demo.sh.
features=(${REDQUORUM_DEMO_FEATURES:+--features "$REDQUORUM_DEMO_FEATURES"})
cargo build -q --workspace --bins "${features[@]}"
bin=./target/debug/redquorum

dir=.demo-tls
rm -rf "$dir" && mkdir -p "$dir"
export REDQUORUM_TLS_DIR="$PWD/$dir"
trap '[ -n "${KEEP:-}" ] || { echo "demo-tls: tearing the nodes down"; compose down -v >/dev/null 2>&1 || true; rm -rf "$dir"; }' EXIT

echo "demo-tls: a throw-away CA, a server certificate (localhost, 127.0.0.1) and a client certificate"
cert() { # NAME SUBJECT [SAN]
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$2" \
        -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 2 -out "$dir/$1.crt" ${3:+-extfile <(printf 'subjectAltName=%s' "$3")} 2>/dev/null
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=redquorum demo CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
cert server localhost "DNS:localhost,IP:127.0.0.1"
cert client redquorum-demo-client "DNS:redquorum-demo-client"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=some other CA" -keyout "$dir/other-ca.key" -out "$dir/other-ca.crt" 2>/dev/null
# The node reads its key as whatever user the image runs; demo files only.
chmod 644 "$dir"/*

# The ACL file: the admin user, and `rq` with exactly what `redquorum acl` prints (its lines
# joined: an ACL file names each user once) and a password.
password=demo-password
{
    # The admin user gets a password too: a client certificate alone must not make anyone admin.
    echo "user default on >demo-admin-password ~* &* +@all"
    echo "user rq $($bin acl --user rq | sed 's/^ACL SETUSER rq //' | tr '\n' ' ')>$password"
} > "$dir/users.acl"
echo "demo-tls: the ACL user rq, from 'redquorum acl --user rq' (no CONFIG GET: clients attest fsync):"
$bin acl --user rq | sed 's/^/  /'

echo "demo-tls: starting five TLS-only nodes on 127.0.0.1:7001-7005"
compose up -d >/dev/null 2>&1 || compose up -d
export REDQUORUM_NODES="rediss://rq:$password@localhost:7001,rediss://rq:$password@localhost:7002,rediss://rq:$password@localhost:7003,rediss://rq:$password@localhost:7004,rediss://rq:$password@localhost:7005"
export REDQUORUM_CACERT="$dir/ca.crt" REDQUORUM_CERT="$dir/client.crt" REDQUORUM_KEY="$dir/client.key"
# The user has no CONFIG GET (it would read the admin password): the operator attests fsync.
export REDQUORUM_ATTEST_FSYNC_ALWAYS=true
# The operator's one `cluster init` (it needs every node up: retried while they start).
for _ in $(seq 1 100); do
    if $bin cluster init >/dev/null 2>&1; then break; fi
    sleep 0.2
done
echo
echo "== redquorum cluster init (again: the cluster is set up already) =="
$bin cluster init

echo
echo "== redquorum check (TLS, user rq): safety and permissions =="
$bin check
echo
echo "== redquorum id next orders -n 3 =="
$bin id next orders -n 3
echo
echo "== redquorum lock run nightly -- sh -c 'echo token \$REDQUORUM_FENCING_TOKEN' =="
$bin lock run nightly -- sh -c 'echo "holding nightly with token $REDQUORUM_FENCING_TOKEN"'
echo
echo "== a wrong CA is refused, and the error says which setting to check =="
if out=$($bin --cacert "$dir/other-ca.crt" check 2>&1); then
    echo "demo-tls: a wrong CA was accepted" >&2; exit 1
fi
echo "$out" | grep -m1 -o "not signed by a trusted CA[^;]*" | sed 's/^/  /'
echo
echo "demo-tls: done"
