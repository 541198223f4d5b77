#!/usr/bin/env bash
# Builds a local Docker image that runs the host's Debian redis-server (or valkey-server),
# without any image registry: the binary and the shared libraries `ldd` lists are copied into
# a minimal root filesystem which is then `docker import`ed.
#
# Usage: scripts/build-redis-image.sh [--force]
#
#   REDQUORUM_TEST_SERVER  the server to put in the image (a name on PATH or a path), default
#                          redis-server; valkey-server builds the Valkey image (installed by
#                          scripts/install-valkey.sh when missing)
#   REDQUORUM_REDIS_IMAGE  image to build or use ("name:tag"), default redquorum-redis:7.0, or
#                          redquorum-valkey:8.0 when the server is Valkey (the testkit's defaults)
#   --force                rebuild even if the image exists (only images this script made)
#
# Idempotent: an existing image is kept (and only checked with `--version`). An image under
# an overridden name that this script did not build (e.g. an official redis image) is never
# touched, not even with --force.
set -euo pipefail

PROGRAM="${REDQUORUM_TEST_SERVER:-redis-server}"
# The name the server runs under inside the image (its entrypoint): redis-server or
# valkey-server. Both pick their mode from argv[0] and take the same flags.
NAME="$(basename "$PROGRAM")"
case "$NAME" in
    *valkey*) VALKEY=1 DEFAULT_IMAGE=redquorum-valkey:8.0 ;;
    *) VALKEY=0 DEFAULT_IMAGE=redquorum-redis:7.0 ;;
esac
IMAGE="${REDQUORUM_REDIS_IMAGE:-$DEFAULT_IMAGE}"
OLD_ID=""
LABEL_KEY="org.redquorum.testkit-image"
FORCE=0

for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h | --help)
            sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "build-redis-image: unknown argument: $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

log() { echo "build-redis-image: $*"; }

command -v docker >/dev/null 2>&1 || {
    echo "build-redis-image: docker is not installed" >&2
    exit 1
}

verify() {
    log "checking that $IMAGE runs: docker run --rm --network none $IMAGE --version"
    local out
    if ! out="$(docker run --rm --network none "$IMAGE" --version 2>&1)"; then
        echo "build-redis-image: image $IMAGE does not run $NAME --version:" >&2
        echo "$out" >&2
        exit 1
    fi
    log "ok: $out"
}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    ours="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL_KEY\" }}" "$IMAGE" 2>/dev/null || true)"
    if [[ "$FORCE" -eq 0 ]]; then
        log "image $IMAGE already exists; not rebuilding (use --force to rebuild)"
        verify
        exit 0
    fi
    if [[ "$ours" != "1" ]]; then
        log "image $IMAGE exists and was not built by this script; leaving it alone despite --force"
        verify
        exit 0
    fi
    log "--force: rebuilding $IMAGE"
    OLD_ID="$(docker image inspect --format '{{.Id}}' "$IMAGE")"
fi

if ! command -v "$PROGRAM" >/dev/null 2>&1; then
    if [[ "$VALKEY" -eq 1 ]]; then
        log "$PROGRAM not found; installing Valkey from bookworm-backports"
        "$(dirname "$0")/install-valkey.sh"
    else
        log "$PROGRAM not found; installing Debian's redis-server"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update
        apt-get install -y --no-install-recommends redis-server
    fi
fi

# Debian's /usr/bin/redis-server is a symlink to redis-check-rdb (valkey-server to
# valkey-check-rdb); we copy the real file under the server's name (it picks its mode from
# argv[0]).
SERVER="$(command -v "$PROGRAM")"
log "using $SERVER ($("$SERVER" --version))"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"
mkdir -p "$ROOT/usr/bin" "$ROOT/data" "$ROOT/tmp" "$ROOT/etc"
chmod 1777 "$ROOT/tmp"

cp -L "$SERVER" "$ROOT/usr/bin/$NAME"
chmod 0755 "$ROOT/usr/bin/$NAME"

# Every library ldd resolves, at the same path, dereferenced; plus the dynamic loader
# (the line without "=>", e.g. /lib64/ld-linux-x86-64.so.2). linux-vdso has no file.
libs="$(ldd "$SERVER" | awk '
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }
')"
if [[ -z "$libs" ]]; then
    echo "build-redis-image: ldd listed no libraries for $SERVER" >&2
    exit 1
fi
while IFS= read -r lib; do
    [[ -n "$lib" ]] || continue
    mkdir -p "$ROOT$(dirname "$lib")"
    cp -L "$lib" "$ROOT$lib"
done <<<"$libs"
log "copied $NAME and $(wc -l <<<"$libs") libraries"

# Minimal identity files, so that getpwuid(0) and friends answer.
printf 'root:x:0:0:root:/root:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ROOT/etc/group"
printf 'hosts: files\n' >"$ROOT/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n' >"$ROOT/etc/hosts"

log "importing rootfs as $IMAGE"
tar -C "$ROOT" --numeric-owner --owner=0 --group=0 -cf "$WORK/rootfs.tar" .
docker import \
    --change 'WORKDIR /data' \
    --change "ENTRYPOINT [\"/usr/bin/$NAME\"]" \
    --change 'EXPOSE 6379' \
    --change "LABEL $LABEL_KEY=1" \
    --message "$NAME from the host ($("$SERVER" --version | awk '{print $3}'))" \
    "$WORK/rootfs.tar" "$IMAGE" >/dev/null
log "built $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE") bytes)"
if [[ -n "$OLD_ID" && "$OLD_ID" != "$(docker image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
    # The replaced image is now untagged; remove it unless a container still uses it.
    if docker image rm "$OLD_ID" >/dev/null 2>&1; then
        log "removed the replaced image ${OLD_ID#sha256:}"
    else
        log "kept the replaced image ${OLD_ID#sha256:} (still in use)"
    fi
fi
verify
