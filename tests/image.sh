#!/usr/bin/env bash
# tests/image.sh -- `make test-image`: builds the memprof image with
# hack/image.sh, opens the OCI archive with buildah, and runs the binaries
# INSIDE it (chroot isolation: only the image's own files and libraries):
# every binary's --version, and `memprof install-agent` as the webhook's init
# container runs it, which must find the agent tree at its default source and
# write as the image's non-root user; `memprof top` inside it against the
# local control plane when it is up. Then the push docs/install.md shows:
# skopeo copies the archive to a real registry on loopback (Debian's
# docker-registry, unpacked into the temporary directory), buildah pulls it
# back and runs it. Everything buildah, skopeo and the registry make lives
# under a temporary directory, removed at exit; the registry is stopped by PID.
# Arguments go to hack/image.sh (--no-build: the release binaries built;
# --binaries DIR: those in DIR, as make test passes its debug build's).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test-image] %s\n' "$*" >&2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/memprof-test-image.XXXXXX")
# skopeo and buildah unpack archives and layers under TMPDIR; the local
# control plane's state dir is found from the caller's.
cluster() { TMPDIR=$CALLER_TMPDIR bash hack/local-cluster.sh "$@"; }
CALLER_TMPDIR=${TMPDIR:-/tmp}
export TMPDIR=$TMP
bh() { buildah --root "$TMP/root" --runroot "$TMP/run" --storage-driver vfs "$@"; }
REGISTRY_PID=""
cleanup() {
    if [ -n "$REGISTRY_PID" ]; then
        kill "$REGISTRY_PID" 2>/dev/null || true
        wait "$REGISTRY_PID" 2>/dev/null || true
    fi
    bh umount --all >/dev/null 2>&1 || true
    bh rm --all >/dev/null 2>&1 || true
    bh rmi --all --force >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT

passed=0 failed=0
check() { # NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        passed=$((passed + 1))
        log "ok   $1"
    else
        failed=$((failed + 1))
        log "FAIL $1: expected [$2], got [$3]"
    fi
}

# In container CTR, as the image's user, with nothing from this machine.
# buildah starts a command by copying itself into a sealed memfd; on a busy
# machine the sealing can fail (EBUSY: "sealing memfd copy: Device or
# resource busy") before the command runs at all. That is the tool failing
# to start, not the binary's answer, so it is tried once more; any other
# output, failures included, is the answer.
run_in() { # CTR COMMAND...
    local ctr=$1 out
    shift
    out=$(bh run --isolation chroot "$ctr" -- "$@" 2>&1) || true
    if [[ $out == *"sealing memfd copy"* ]]; then
        log "buildah could not start the command ($out); once more"
        out=$(bh run --isolation chroot "$ctr" -- "$@" 2>&1) || true
    fi
    printf '%s\n' "$out"
}
inside() { run_in "$CTR" "$@"; }

die() { log "error: $*"; exit 1; }

# apt-get install PACKAGE when its COMMAND is missing (root only).
need() {
    command -v "$1" >/dev/null && return
    [ "$(id -u)" = 0 ] || die "$1 is not installed: apt-get install $2"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null 2>&1 || {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    }
}

# The distribution registry, from Debian's docker-registry package: the one
# installed, or the package unpacked under $TMP (nothing installed, no service).
registry_binary() {
    if command -v docker-registry >/dev/null; then command -v docker-registry; return; fi
    (cd "$TMP" && { apt-get download docker-registry >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get download docker-registry >/dev/null; }; }) ||
        die "cannot download Debian's docker-registry package"
    dpkg -x "$TMP"/docker-registry_*.deb "$TMP/registry-pkg"
    printf '%s\n' "$TMP/registry-pkg/usr/bin/docker-registry"
}

# Starts a registry on a free loopback port (storage under $TMP), pushes the
# archive to it as docs/install.md does; sets REF.
push_and_pull() {
    local reg port i
    need skopeo skopeo
    reg=$(registry_binary)
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
        "$TMP/registry" "$port" >"$TMP/registry.yml"
    "$reg" serve "$TMP/registry.yml" >"$TMP/registry.log" 2>&1 &
    REGISTRY_PID=$!
    for i in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
        [ "$i" = 100 ] && die "the registry did not listen: $(cat "$TMP/registry.log")"
        sleep 0.1
    done
    REF=127.0.0.1:$port/memprof/memprof:$VERSION
    skopeo copy --quiet --dest-tls-verify=false "oci-archive:$TMP/memprof.oci.tar" "docker://$REF"
}

# The manifest digest the archive's index names.
archive_digest() {
    tar -xOf "$TMP/memprof.oci.tar" index.json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["digest"])'
}

VERSION=$(cargo pkgid -p memprof)
VERSION=${VERSION##*[#@]}

# The binaries the image holds, as built here: --binaries DIR's, else the
# release ones hack/image.sh builds (or finds, --no-build).
BIN_DIR=${CARGO_TARGET_DIR:-target}/release
args=("$@")
for i in "${!args[@]}"; do
    [ "${args[$i]}" != --binaries ] || BIN_DIR=${args[$((i + 1))]:-}
done

start=$(date +%s)
bash hack/image.sh --output "$TMP/memprof.oci.tar" "$@"
log "image built in $(($(date +%s) - start)) s: $(du -h "$TMP/memprof.oci.tar" | cut -f1)"

CTR=$(bh from --quiet --pull-never "oci-archive:$TMP/memprof.oci.tar")
MNT=$(bh mount "$CTR")

log "config"
check "user is numeric and non-root" "65532:65532" "$(bh inspect --format '{{.OCIv1.Config.User}}' "$CTR")"
check "entrypoint is the operator (the chart passes args only)" \
    "[/usr/local/bin/memprof-operator]" "$(bh inspect --format '{{.OCIv1.Config.Entrypoint}}' "$CTR")"
check "label org.opencontainers.image.version" "$VERSION" \
    "$(bh inspect --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}}' "$CTR")"

log "binaries, run inside the image"
# Each prints what the same binary prints on this machine, ending in the
# workspace version.
for bin in memprof-operator memprof-sidecar memprof; do
    out=$(inside "/usr/local/bin/$bin" --version)
    check "$bin --version (inside: $out)" "$("$BIN_DIR/$bin" --version)" "$out"
    check "$bin --version names $VERSION" "$VERSION" "${out##* }"
done

log "agent install, as the webhook's init container runs it (default --from)"
agent_files=$(find agent/python/bootstrap agent/python/memprof_agent -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | wc -l)
check "memprof install-agent copies the agent tree" \
    "installed the memprof agent ($agent_files files) into /tmp/agent" "$(inside /usr/local/bin/memprof install-agent /tmp/agent)"
check "the hook is in the copy" "yes" "$([ -f "$MNT/tmp/agent/bootstrap/sitecustomize.py" ] && echo yes || echo no)"
check "the copy is owned by uid 65532 (it ran as the non-root user)" "65532:65532" \
    "$(stat -c %u:%g "$MNT/tmp/agent/bootstrap/sitecustomize.py" 2>&1)"

log "contents"
check "no shell" "absent" "$([ -e "$MNT/bin/sh" ] || [ -L "$MNT/bin/sh" ] && echo present || echo absent)"
check "no NVML bundled (the NVIDIA container toolkit mounts the host's)" "" \
    "$(find "$MNT" -name 'libnvidia-ml*' | sed "s|^$MNT||")"
check "binaries in /usr/local/bin" "memprof memprof-operator memprof-sidecar" "$(find "$MNT/usr/local/bin" -mindepth 1 -printf '%f\n' | sort | tr '\n' ' ' | sed 's/ $//')"

log "the CLI in the image against the real local API server (TLS, the image's libraries)"
if cluster status >/dev/null 2>&1; then
    eval "$(cluster env)"
    # Readable by the image's uid 65532; $TMP itself is 0700.
    install -m 0644 "$KUBECONFIG" "$TMP/kubeconfig"
    out=$(bh run --isolation chroot -v "$TMP/kubeconfig:/etc/kubeconfig:ro" -e KUBECONFIG=/etc/kubeconfig \
        "$CTR" -- /usr/local/bin/memprof top -A -o json 2>&1 || true)
    # As kubectl prints a list: {"apiVersion": "v1", "kind": "List", "items": [...]}.
    check "memprof top -A -o json answers a kubectl List" "List list" \
        "$(python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d["kind"], type(d["items"]).__name__)' <<<"$out" 2>/dev/null || echo "$out")"
elif [ "${MEMPROF_REQUIRE_CLUSTER:-0}" = 1 ]; then
    check "the local control plane is up (MEMPROF_REQUIRE_CLUSTER=1)" "up" "down"
else
    log "skipped: no local control plane (make cluster-up)"
fi

bh umount "$CTR" >/dev/null

log "push to a registry with skopeo, pull back with buildah"
push_and_pull
PULLED=$(bh from --quiet --tls-verify=false "docker://$REF")
check "the registry serves the archive's manifest" "$(archive_digest)" \
    "$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REF")"
check "pulled image: memprof-sidecar --version" "memprof-sidecar $VERSION" \
    "$(run_in "$PULLED" /usr/local/bin/memprof-sidecar --version)"

printf 'image: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]
