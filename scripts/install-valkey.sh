#!/usr/bin/env bash
# Installs Valkey 8.0 (valkey-server, valkey-cli) from Debian's bookworm-backports, for the
# Valkey test pass (scripts/valkey-tests.sh). Idempotent; prints nothing but progress.
#
# Usage: scripts/install-valkey.sh
#
#   REDQUORUM_VALKEY_DIR  where the packages are unpacked, default /opt/redquorum-valkey
#
# How: the packages are fetched with `apt-get download` and unpacked with `dpkg -x` into
# $REDQUORUM_VALKEY_DIR (their runtime libraries come from bookworm itself, with apt-get
# install), and `valkey-server` / `valkey-cli` are linked into /usr/local/bin. Nothing is
# configured: no service is installed or started (a packaged valkey-server would start one on
# port 6379 beside the tests' nodes), no user is made, /etc is not touched. The backports suite
# is read from a one-off source list (`-o Dir::Etc::SourceList=FILE`, the same mirror as the
# machine's own Debian source), so the machine's apt sources are left as they were.
#
# Already installed (a `valkey-server` 8.0.x on PATH, from here or from a package): nothing
# is done.
set -euo pipefail

DIR="${REDQUORUM_VALKEY_DIR:-/opt/redquorum-valkey}"
BIN=/usr/local/bin
WANT_MAJOR_MINOR="8.0"
PACKAGES=(valkey-server valkey-tools)

log() { echo "install-valkey: $*"; }
die() {
    echo "install-valkey: $*" >&2
    exit 1
}

case "${1:-}" in
    "") ;;
    -h | --help)
        sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument: $1 (try --help)" ;;
esac

# "8.0.1" from "Valkey server v=8.0.1 sha=...".
server_version() {
    "$1" --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p'
}

if command -v valkey-server >/dev/null 2>&1; then
    have="$(server_version valkey-server)"
    if [[ "$have" == "$WANT_MAJOR_MINOR".* ]]; then
        log "valkey-server $have already installed ($(command -v valkey-server))"
        exit 0
    fi
    log "valkey-server ${have:-of unknown version} on PATH is not $WANT_MAJOR_MINOR.x; installing $WANT_MAJOR_MINOR"
fi

[[ "$(id -u)" -eq 0 ]] || die "must run as root (apt-get, $DIR, $BIN)"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script needs Debian bookworm"

# shellcheck disable=SC1091
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
[[ "$codename" == "bookworm" ]] || die "Debian bookworm is needed (this machine: ${codename:-unknown}); Valkey 8.0 comes from bookworm-backports"

# The machine's own Debian mirror and its key: the first source (deb822 or one-line) that
# carries the suite bookworm itself.
debian_source() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk -v suite="$codename" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uri = ""; key = ""; ok = 0; deb = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^[ \t]*#/) continue
                    split($i, kv, ":[ \t]*")
                    name = tolower(kv[1]); value = substr($i, index($i, ":") + 1)
                    gsub(/^[ \t]+|[ \t]+$/, "", value)
                    if (name == "types" && value ~ /(^| )deb( |$)/) deb = 1
                    if (name == "uris") { split(value, u, " "); uri = u[1] }
                    if (name == "suites" && (" " value " ") ~ (" " suite " ")) ok = 1
                    if (name == "signed-by") key = value
                }
                if (deb && ok && uri != "") { print uri " " key; exit }
            }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk -v suite="$codename" '
            $1 == "deb" {
                key = ""; i = 2
                if ($2 ~ /^\[/) {
                    for (; i <= NF; i++) {
                        if ($i ~ /signed-by=/) { key = $i; sub(/.*signed-by=/, "", key); sub(/\]$/, "", key) }
                        if ($i ~ /\]$/) { i++; break }
                    }
                }
                if ($(i + 1) == suite) { print $i " " key; exit }
            }' "$f"
    done
}

read -r uri key < <(debian_source | head -n 1) || true
[[ -n "${uri:-}" ]] || die "no Debian source for $codename in /etc/apt (sources.list or sources.list.d)"
key="${key:-/usr/share/keyrings/debian-archive-keyring.gpg}"
log "backports from $uri ($codename-backports, key $key)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LIST="$WORK/backports.list"
# The one-off list stands in for /etc/apt/sources.list (sources.list.d still counts): it
# carries that file's lines too, so that `apt-get update` refreshes the machine's own suites
# rather than dropping their package lists.
{
    echo "deb [signed-by=$key] $uri $codename-backports main"
    if [[ -f /etc/apt/sources.list ]]; then cat /etc/apt/sources.list; fi
} >"$LIST"
APT=(-o "Dir::Etc::SourceList=$LIST")

export DEBIAN_FRONTEND=noninteractive
apt-get "${APT[@]}" update -qq
# Downloaded as root into a private directory (apt's _apt user could not write there).
(cd "$WORK" && apt-get "${APT[@]}" -o APT::Sandbox::User=root download -qq "${PACKAGES[@]}")

# Runtime libraries: every dependency of the packages except themselves, from bookworm.
deps="$(for deb in "$WORK"/*.deb; do dpkg-deb -f "$deb" Depends; done |
    tr ',' '\n' | sed 's/[(|].*//; s/[[:space:]]//g' | grep -v -e '^$' -e '^valkey-' -e '^adduser$' |
    sort -u)"
if [[ -n "$deps" ]]; then
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $deps >/dev/null
fi

rm -rf "$DIR"
mkdir -p "$DIR"
for deb in "$WORK"/*.deb; do
    dpkg -x "$deb" "$DIR"
done
for prog in valkey-server valkey-cli; do
    [[ -e "$DIR/usr/bin/$prog" ]] || die "$prog missing from the packages"
    ln -sfn "$DIR/usr/bin/$prog" "$BIN/$prog"
done
have="$(server_version "$BIN/valkey-server")"
[[ "$have" == "$WANT_MAJOR_MINOR".* ]] ||
    die "installed valkey-server reports ${have:-no version}, not $WANT_MAJOR_MINOR.x"
log "installed valkey-server $have in $DIR (linked from $BIN); no service runs"
