#!/usr/bin/env bash
# hack/image.sh -- what `make image` runs: builds the one memprof image
# (memprof-operator, memprof-sidecar, memprof and the Python agent tree) as an
# OCI archive, from parts this machine has: the release binaries cargo builds
# here (or binaries already built, --binaries), the shared libraries they link (found with ldd, copied from this
# machine's Debian packages), and Debian's buildah. No base image is pulled
# and no registry is named; see the Dockerfile for what the image holds.
#
#   bash hack/image.sh                  target/image/memprof-<version>.oci.tar
#   bash hack/image.sh --output FILE    the archive at FILE
#   bash hack/image.sh --stage DIR      only the build context (rootfs/ and
#                                       the Dockerfile), for `docker build`
#   bash hack/image.sh --no-build       the release binaries already built
#   bash hack/image.sh --binaries DIR   the binaries already built in DIR
#                                       (make test: target/debug, the
#                                       binaries its tests ran; see there)
#
# buildah runs with the vfs storage driver under a private storage root in a
# temporary directory, removed at exit: nothing is left in the host's image
# store. Run as root (or where rootless buildah works); as root, a missing
# buildah is installed with apt-get.
set -euo pipefail
# Paths given on the command line are the caller's.
CALLER_PWD=$PWD
cd "$(dirname "$0")/.."

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

BINARIES=(memprof-operator memprof-sidecar memprof)
TARGET_DIR=${CARGO_TARGET_DIR:-target}
# Where `memprof install-agent` copies from by default (memprof_api::DEFAULT_AGENT_SOURCE
# in crates/api/src/lib.rs; the chart's agent.path).
AGENT_DIR=/opt/memprof/agent
UID_GID=65532

output="" stage_only="" build=1 bin_dir=""
from_caller() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$CALLER_PWD/$1" ;; esac; }
parse_args() {
    while [ $# -gt 0 ]; do
        case $1 in
            --output) output=$(from_caller "${2:?--output needs a file}"); shift 2 ;;
            --stage) stage_only=$(from_caller "${2:?--stage needs a directory}"); shift 2 ;;
            --no-build) build=0; shift ;;
            --binaries) bin_dir=$(from_caller "${2:?--binaries needs a directory}"); build=0; shift 2 ;;
            -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
            *) die "unknown argument $1 (see --help)" ;;
        esac
    done
}

# The workspace version, as the binaries' --version prints it.
version() {
    local id
    id=$(cargo pkgid -p memprof)
    printf '%s\n' "${id##*[#@]}"
}

revision() {
    local rev
    rev=$(git rev-parse --short=12 HEAD 2>/dev/null) || { echo unknown; return; }
    git diff --quiet HEAD -- . 2>/dev/null || rev="$rev-dirty"
    printf '%s\n' "$rev"
}

# Image timestamps: SOURCE_DATE_EPOCH if set, else the commit's time, so that
# rebuilding a commit gives the same dates.
epoch() {
    printf '%s\n' "${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
}

ensure_buildah() {
    command -v buildah >/dev/null && return
    [ "$(id -u)" = 0 ] || die "buildah is not installed: install it (Debian/Ubuntu: apt-get install buildah) and run again"
    log "installing buildah (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
}

build_binaries() {
    log "cargo build --release (${BINARIES[*]})"
    cargo build --release --locked --workspace --bins
}

# Copies host path $2 into root filesystem $1 at the same path, recreating
# every symbolic link met on the way (merged /usr: /lib -> usr/lib,
# /lib64/ld-linux-x86-64.so.2 -> ../lib/...), so the path the binaries name
# resolves in the image as it does here.
stage_path() {
    local rootfs=$1 path=$2 prefix="" part target rest
    local -a parts
    IFS=/ read -ra parts <<<"${path#/}"
    for part in "${parts[@]}"; do
        prefix="$prefix/$part"
        if [ -L "$prefix" ]; then
            target=$(readlink "$prefix")
            if [ ! -L "$rootfs$prefix" ]; then
                mkdir -p "$(dirname "$rootfs$prefix")"
                ln -s "$target" "$rootfs$prefix"
            fi
            case $target in /*) ;; *) target="$(dirname "$prefix")/$target" ;; esac
            rest=${path#"$prefix"}
            stage_path "$rootfs" "$(realpath -ms "$target")$rest"
            return
        elif [ -d "$prefix" ]; then
            mkdir -p "$rootfs$prefix"
        else
            cp --preserve=mode "$prefix" "$rootfs$prefix"
        fi
    done
}

# The absolute paths ldd names for a binary: its libraries and the dynamic
# loader. A library ldd cannot find stops the build.
shared_libraries() {
    local out
    out=$(ldd "$1") || die "ldd $1 failed"
    if grep -q 'not found' <<<"$out"; then
        die "$1 links a library this machine lacks: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
    fi
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$out"
}

stage_binaries() {
    local rootfs=$1 bin
    mkdir -p "$rootfs/usr/local/bin"
    for bin in "${BINARIES[@]}"; do
        [ -x "$bin_dir/$bin" ] || die "$bin_dir/$bin is missing: build it (make image builds release binaries)"
        install -m 0755 "$bin_dir/$bin" "$rootfs/usr/local/bin/$bin"
    done
}

# The libraries all binaries link, and the Debian copyright file of each
# package they come from (the LGPL and GPL-with-exception notices travel with
# the libraries).
stage_libraries() {
    local rootfs=$1 bin lib pkg
    local -a libs
    mapfile -t libs < <(for bin in "${BINARIES[@]}"; do shared_libraries "$bin_dir/$bin"; done | sort -u)
    for lib in "${libs[@]}"; do
        stage_path "$rootfs" "$lib"
        pkg=$(dpkg-query -S "$lib" 2>/dev/null | head -n1 | cut -d: -f1) || true
        if [ -n "$pkg" ] && [ -f "/usr/share/doc/$pkg/copyright" ]; then
            install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$rootfs/usr/share/doc/$pkg/copyright"
        fi
    done
    log "libraries: ${libs[*]}"
}

# The CA bundle: kube's TLS falls back to the system roots (rustls platform
# verifier) when a kubeconfig names no CA; in a pod, the service account's
# ca.crt is used instead.
stage_ca_bundle() {
    local rootfs=$1 bundle=/etc/ssl/certs/ca-certificates.crt
    if [ ! -f "$bundle" ]; then
        [ "$(id -u)" = 0 ] || die "$bundle is missing: install ca-certificates (apt-get install ca-certificates)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates >/dev/null
    fi
    install -D -m 0644 "$bundle" "$rootfs$bundle"
}

stage_etc() {
    local rootfs=$1
    mkdir -p "$rootfs/etc"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/:/sbin/nologin\n' \
        "$UID_GID" "$UID_GID" >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:%s:\n' "$UID_GID" >"$rootfs/etc/group"
    # Without it glibc asks DNS before /etc/hosts.
    printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
    chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
    install -d -m 1777 "$rootfs/tmp"
}

# The agent tree as install-agent expects it: bootstrap/ (the startup hook)
# and lib/memprof_agent/, whole; no bytecode; readable by any uid.
stage_agent() {
    local rootfs=$1 src=agent/python dst=$1$AGENT_DIR
    install -d -m 0755 "$dst/lib"
    cp -R "$src/bootstrap" "$dst/bootstrap"
    cp -R "$src/memprof_agent" "$dst/lib/memprof_agent"
    find "$dst" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +
    find "$dst" -type d -exec chmod 0755 {} +
    find "$dst" -type f -exec chmod 0644 {} +
}

stage_context() {
    local context=$1 rootfs=$1/rootfs
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    stage_binaries "$rootfs"
    stage_libraries "$rootfs"
    stage_ca_bundle "$rootfs"
    stage_etc "$rootfs"
    stage_agent "$rootfs"
    cp Dockerfile "$context/Dockerfile"
    log "build context: $context ($(du -sh "$rootfs" | cut -f1) in rootfs/)"
}

# buildah with a private vfs store under $STORE (removed at exit).
bh() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs "$@"; }

build_archive() {
    local context=$1 archive=$2 ver=$3 ts
    ts=$(epoch)
    log "buildah bud -> $archive"
    bh bud --quiet --isolation chroot --format oci --timestamp "$ts" \
        --build-arg "VERSION=$ver" --build-arg "REVISION=$(revision)" \
        --build-arg "CREATED=$(date -u -d "@$ts" +%Y-%m-%dT%H:%M:%SZ)" \
        --build-arg "SOURCE=$(sed -n 's/^home: *//p' charts/memprof/Chart.yaml)" \
        -f "$context/Dockerfile" -t "memprof:$ver" "$context" >/dev/null
    mkdir -p "$(dirname "$archive")"
    rm -f "$archive"
    bh push --quiet "memprof:$ver" "oci-archive:$archive:memprof:$ver"
}

main() {
    parse_args "$@"
    local ver
    ver=$(version)
    bin_dir=${bin_dir:-$TARGET_DIR/release}
    [ "$build" = 0 ] || build_binaries
    if [ -n "$stage_only" ]; then
        mkdir -p "$stage_only"
        stage_context "$stage_only"
        return
    fi
    ensure_buildah
    STORE=$(mktemp -d "${TMPDIR:-/tmp}/memprof-image.XXXXXX")
    trap 'bh rm --all >/dev/null 2>&1 || true; bh rmi --all --force >/dev/null 2>&1 || true; rm -rf "$STORE"' EXIT
    stage_context "$STORE/context"
    output=${output:-$TARGET_DIR/image/memprof-$ver.oci.tar}
    build_archive "$STORE/context" "$output" "$ver"
    log "built $output ($(du -h "$output" | cut -f1), sha256 $(sha256sum "$output" | cut -c1-16)...), image memprof:$ver"
}

main "$@"
