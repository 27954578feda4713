#!/usr/bin/env bash
# hack/test.sh -- what `make test` runs: unit tests, then the integration
# tests against a real local control plane (started here if it is not up,
# and stopped again by PID at exit if this script started it).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test] %s\n' "$*" >&2; }

started_cluster=0
cleanup() {
    if [ "$started_cluster" = 1 ]; then
        log "stopping the local control plane this run started"
        bash hack/local-cluster.sh down || true
    fi
}
trap cleanup EXIT

log "unit tests"
cargo test --workspace --lib --bins

log "agent tests (pytest; a real memprof-sidecar, a fake torch: no GPU needed)"
# The binaries with the tests' features (and the integration tests, run
# below): a plain `cargo build --bins` would build every crate above tokio
# a second time, without its test-util feature (tests/cli_seed_gaps.rs).
cargo build --workspace --bins --tests
log "reference pages (docs/reference/) match the binaries just built"
make --no-print-directory check-docs
python3 -m pip install --quiet --disable-pip-version-check pytest jsonschema
MEMPROF_SIDECAR_BIN="$PWD/target/debug/memprof-sidecar" MEMPROF_BIN="$PWD/target/debug/memprof" \
    python3 -m pytest -q -p no:cacheprovider agent/python/tests

if ! bash hack/local-cluster.sh status >/dev/null 2>&1; then
    log "starting the local control plane (the first run builds kube-apiserver: ~10 min)"
    bash hack/local-cluster.sh up >/dev/null
    started_cluster=1
fi
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG
# Integration tests must fail, not skip, when the cluster is missing.
export MEMPROF_REQUIRE_CLUSTER=1

log "integration tests against $(kubectl version -o json 2>/dev/null | python3 -c 'import json,sys; v=json.load(sys.stdin)["serverVersion"]; print("kube-apiserver", v["gitVersion"])' 2>/dev/null || echo 'the local control plane')"
# One test binary at a time, a few tests in parallel: each test has its own
# namespace, and a test that must not overlap any other takes the cluster
# alone (tests/common/alone.rs). memprof's integration tests are the one
# binary `integration` (tests/main.rs).
cargo test --workspace --test "*" -- --test-threads=4
# Fault tests that freeze (SIGSTOP) or restart an API server: each starts a
# control plane of its own, so nothing else sees it hang; one at a time, after
# the rest, because their timing assertions want an idle machine.
log "fault tests: frozen and restarted API servers"
cargo test -p memprof --test integration -- --ignored --test-threads=1 faults::

# promtool for tests/alert_rules.py (`promtool test rules`): Debian's
# prometheus package, unpacked under target/ rather than installed, so that
# no Prometheus server is set up as a service on this machine.
if [ -z "${PROMTOOL:-}" ] && ! command -v promtool >/dev/null; then
    PROMTOOL=$PWD/target/promtool/usr/bin/promtool
    if [ ! -x "$PROMTOOL" ]; then
        log "fetching promtool (Debian package prometheus) into target/promtool"
        deb=$(mktemp -d)
        (cd "$deb" && { apt-get download prometheus >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get download prometheus >/dev/null; }; })
        dpkg -x "$deb"/prometheus_*.deb target/promtool && rm -rf "$deb"
    fi
    export PROMTOOL
fi

if ls tests/*.py >/dev/null 2>&1; then
    log "chart tests (rendered by Helm's own code) and alert tests (promtool test rules)"
    python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
    for t in tests/*.py; do python3 "$t"; done
fi
# The release build this needs is ~760 CPU-seconds from cold (2 cores: ~7-10 min);
# MEMPROF_TEST_IMAGE=0 skips it locally (CI runs it).
if [ "${MEMPROF_TEST_IMAGE:-1}" = 0 ]; then
    log "image test SKIPPED (MEMPROF_TEST_IMAGE=0)"
else
    log "image test: make image (release build, buildah; installs buildah and skopeo if missing), binaries run inside it, push/pull through a loopback registry"
    bash tests/image.sh
fi
log "all tests passed"
