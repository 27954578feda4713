#!/usr/bin/env bash
# hack/test.sh -- what `make test` runs: unit tests, then the integration
# tests against a real local control plane (started here if it is not up,
# and stopped again by PID at exit if this script started it).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test] %s\n' "$*" >&2; }

# Each step's wall time, printed as it ends and as a table at exit (also on
# failure), so a slow run says where its time went.
steps=() step_name="" step_start=$SECONDS
step() { # NAME: ends the running step, starts NAME
    end_step
    step_name=$1 step_start=$SECONDS
    log "$1"
}
end_step() {
    [ -n "$step_name" ] || return 0
    local took=$((SECONDS - step_start))
    steps+=("$(printf '%5d s  %s' "$took" "$step_name")")
    log "($took s) $step_name"
    step_name=""
}

started_cluster=0
cleanup() {
    end_step
    if [ "$started_cluster" = 1 ]; then
        log "stopping the local control plane this run started"
        bash hack/local-cluster.sh down || true
    fi
    if [ "${#steps[@]}" -gt 0 ]; then
        printf '[test] wall time per step (%d s in all):\n' "$SECONDS" >&2
        printf '[test]   %s\n' "${steps[@]}" >&2
    fi
}
trap cleanup EXIT

# MEMPROF_TEST_IMAGE=0 skips the image test locally (CI runs it).
test_image=${MEMPROF_TEST_IMAGE:-1}

step "debug build: binaries, unit and integration tests (once, with the tests' features)"
# The binaries with the tests' features (and every test target, run below): a
# plain `cargo build --bins` would build every crate above tokio a second
# time, without its test-util feature (tests/cli_seed_gaps.rs). After
# `make check-crds` (CI) there is nothing left to build.
cargo build --workspace --bins --tests

step "unit tests"
cargo test --workspace --lib --bins

step "reference pages (docs/reference/) match the binaries just built"
make --no-print-directory check-docs
step "agent tests (pytest; a real memprof-sidecar, a fake torch: no GPU needed)"
python3 -m pip install --quiet --disable-pip-version-check pytest jsonschema
MEMPROF_SIDECAR_BIN="$PWD/target/debug/memprof-sidecar" MEMPROF_BIN="$PWD/target/debug/memprof" \
    python3 -m pytest -q -p no:cacheprovider agent/python/tests

if ! bash hack/local-cluster.sh status >/dev/null 2>&1; then
    step "starting the local control plane (the first run builds kube-apiserver: ~10 min)"
    bash hack/local-cluster.sh up >/dev/null
    started_cluster=1
fi
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG
# Integration tests must fail, not skip, when the cluster is missing.
export MEMPROF_REQUIRE_CLUSTER=1

step "integration tests against $(kubectl version -o json 2>/dev/null | python3 -c 'import json,sys; v=json.load(sys.stdin)["serverVersion"]; print("kube-apiserver", v["gitVersion"])' 2>/dev/null || echo 'the local control plane')"
# One test binary at a time, a few tests in parallel: each test has its own
# namespace, and a test that must not overlap any other takes the cluster
# alone (tests/common/alone.rs). memprof's integration tests are the one
# binary `integration` (tests/main.rs). Ten at a time on two cores: the
# tests mostly wait (on the API server, on sidecars' sampling clocks), so
# more of them in flight shorten the run (on an idle 2-core machine: 376 s
# at four, 309 s at six, 260 s at ten with 58 % of the CPU still idle).
cargo test --workspace --test "*" -- --test-threads=10

# promtool for tests/alert_rules.py (`promtool test rules`): Debian's
# prometheus package, unpacked under target/ rather than installed, so that
# no Prometheus server is set up as a service on this machine.
if [ -z "${PROMTOOL:-}" ] && ! command -v promtool >/dev/null; then
    PROMTOOL=$PWD/target/promtool/usr/bin/promtool
    if [ ! -x "$PROMTOOL" ]; then
        step "fetching promtool (Debian package prometheus) into target/promtool"
        deb=$(mktemp -d)
        (cd "$deb" && { apt-get download prometheus >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get download prometheus >/dev/null; }; })
        dpkg -x "$deb"/prometheus_*.deb target/promtool && rm -rf "$deb"
    fi
    export PROMTOOL
fi

if ls tests/*.py >/dev/null 2>&1; then
    step "chart tests (rendered by Helm's own code) and alert tests (promtool test rules)"
    python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
    for t in tests/*.py; do python3 "$t"; done
fi

# Fault tests that freeze (SIGSTOP) or restart an API server: each starts a
# control plane of its own (a state dir of its own too), so nothing else sees
# it hang; after the rest. The restarts assert what happens exactly once, not
# how fast, and mostly wait: they run side by side. The others (the frozen
# API server's step-down is timed to 0.5 s, and any new fault test until it
# is known not to be timed) run one at a time on an otherwise idle machine.
# --workspace as above: `-p memprof` resolves features for that
# package alone and would rebuild the CLI and the test binary (~25 s).
step "fault tests: restarted API servers, side by side"
cargo test --workspace --test integration -- --ignored --test-threads=3 api_server_restart
step "fault tests: the rest (a frozen API server), one at a time"
cargo test --workspace --test integration -- --ignored --test-threads=1 faults:: --skip api_server_restart

if [ "$test_image" = 0 ]; then
    log "image test SKIPPED (MEMPROF_TEST_IMAGE=0)"
else
    # The image of the binaries these tests ran (hack/image.sh --binaries),
    # not of a release build: the same source built again with other
    # optimisation flags (~860 CPU-s, longer than all the tests' waits leave
    # on a 2-core machine) would prove what the packaging does no better.
    # `make test-image` packages and runs the release binaries `make image`
    # ships.
    step "image test: the image of the binaries built above (buildah; installs buildah and skopeo if missing), binaries run inside it, push/pull through a loopback registry"
    bash tests/image.sh --binaries target/debug
fi
end_step
log "all tests passed"
