#!/usr/bin/env bash
# Builds the kubectl plugin's release archive for linux/amd64:
#   dist/memprof-vVERSION-linux-amd64.tar.gz   memprof, kubectl-memprof (a copy:
#                                              krew links only `bin`), the
#                                              kubectl_complete-memprof helper,
#                                              README.md, LICENSE when there is one
#   dist/memprof-vVERSION-linux-amd64.tar.gz.sha256
#   dist/memprof.yaml                          krew/memprof.yaml with version,
#                                              uri and sha256 filled in
# The archive is reproducible (sorted, owner 0, mtime SOURCE_DATE_EPOCH or 0,
# gzip without a timestamp): the same binary gives the same sha256.
#
# Env: VERSION (default: Cargo.toml's), DIST (default: dist),
#      RELEASE_BASE_URL (where the archive will be downloaded from; the
#      manifest's uri is RELEASE_BASE_URL/ARCHIVE; unset, it is the archive's
#      file name, for `kubectl krew install --manifest=... --archive=...`).
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)}
dist=${DIST:-dist}
name="memprof-v${version}-linux-amd64"
archive="${name}.tar.gz"

# Steps: build -> stage -> archive -> checksum -> manifest.
build() {
    if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
        echo "release.sh builds linux/amd64 on a linux/amd64 machine; this is $(uname -s)/$(uname -m)" >&2
        exit 1
    fi
    cargo build --release --locked --bin memprof
}

stage() {
    rm -rf "${dist:?}/${name}"
    mkdir -p "${dist}/${name}"
    install -m 0755 target/release/memprof "${dist}/${name}/memprof"
    install -m 0755 target/release/memprof "${dist}/${name}/kubectl-memprof"
    install -m 0755 hack/kubectl_complete-memprof "${dist}/${name}/kubectl_complete-memprof"
    install -m 0644 README.md "${dist}/${name}/README.md"
    if [ -f LICENSE ]; then install -m 0644 LICENSE "${dist}/${name}/LICENSE"; fi
}

pack() {
    tar --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime="@${SOURCE_DATE_EPOCH:-0}" -C "${dist}" -cf - "${name}" \
        | gzip -n -9 > "${dist}/${archive}"
    rm -rf "${dist:?}/${name}"
}

checksum() {
    (cd "${dist}" && sha256sum "${archive}" > "${archive}.sha256")
    cut -d' ' -f1 "${dist}/${archive}.sha256"
}

manifest() {
    local sha=$1 uri
    uri=${RELEASE_BASE_URL:+${RELEASE_BASE_URL%/}/}${archive}
    sed -e '/^#/d' -e "s|\${VERSION}|${version}|g" -e "s|\${URI}|${uri}|g" \
        -e "s|\${SHA256}|${sha}|g" krew/memprof.yaml > "${dist}/memprof.yaml"
}

build
stage
pack
sha=$(checksum)
manifest "$sha"
echo "${dist}/${archive}"
echo "sha256 ${sha}"
echo "${dist}/memprof.yaml (krew manifest)"
