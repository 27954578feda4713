#!/usr/bin/env bash
# tests/image.sh -- `make test-image`: builds the memprof image with
# hack/image.sh, opens the OCI archive with buildah, and runs the binaries
# INSIDE it (chroot isolation: only the image's own files and libraries):
# every binary's --version, and `memprof install-agent` as the webhook's init
# container runs it, which must find the agent tree at its default source and
# write as the image's non-root user. Everything buildah makes lives under a
# private storage root in a temporary directory, removed at exit.
# Arguments go to hack/image.sh (--no-build: the release binaries built).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test-image] %s\n' "$*" >&2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/memprof-test-image.XXXXXX")
bh() { buildah --root "$TMP/root" --runroot "$TMP/run" --storage-driver vfs "$@"; }
cleanup() {
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

# In the container, as the image's user, with nothing from this machine.
inside() { bh run --isolation chroot "$CTR" -- "$@" 2>&1 || true; }

VERSION=$(cargo pkgid -p memprof)
VERSION=${VERSION##*[#@]}

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
    check "$bin --version (inside: $out)" "$("${CARGO_TARGET_DIR:-target}/release/$bin" --version)" "$out"
    check "$bin --version names $VERSION" "$VERSION" "${out##* }"
done

log "agent install, as the webhook's init container runs it (default --from)"
agent_files=$(find agent/python/bootstrap agent/python/memprof_agent -maxdepth 1 -name '*.py' | wc -l)
check "memprof install-agent copies the agent tree" \
    "installed the memprof agent ($agent_files files) into /tmp/agent" "$(inside /usr/local/bin/memprof install-agent /tmp/agent)"
check "the hook is in the copy" "yes" "$([ -f "$MNT/tmp/agent/bootstrap/sitecustomize.py" ] && echo yes || echo no)"
check "the copy is owned by uid 65532 (it ran as the non-root user)" "65532:65532" \
    "$(stat -c %u:%g "$MNT/tmp/agent/bootstrap/sitecustomize.py" 2>&1)"

log "contents"
check "no shell" "absent" "$([ -e "$MNT/bin/sh" ] || [ -L "$MNT/bin/sh" ] && echo present || echo absent)"
check "no NVML bundled (the NVIDIA container toolkit mounts the host's)" "" \
    "$(find "$MNT" -name 'libnvidia-ml*' | sed "s|^$MNT||")"
check "binaries in /usr/local/bin" "memprof memprof-operator memprof-sidecar" "$(ls "$MNT/usr/local/bin" | tr '\n' ' ' | sed 's/ $//')"

printf 'image: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]
