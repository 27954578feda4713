#!/usr/bin/env bash
# hack/bench-status-ab.sh -- the status writer's A/B of docs/benchmarks.md:
# operator_scale (200 Jobs x 16 ranks by default) once per variant, the
# variants interleaved and repeated, so load from elsewhere on the machine
# hits each alike. A variant is `MODE,WORKERS`: `--status-write=MODE`
# (apply | merge) and `--concurrency=WORKERS` (the writer's workers).
#   bash hack/bench-status-ab.sh                       # defaults below
#   REPS=3 JOBS=1 RANKS=2048 bash hack/bench-status-ab.sh merge,16
# Expects the local control plane up and the release binaries built
# (`cargo build --release --bin memprof-operator --example operator_scale`).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG
apiserver_pid="$(bash hack/local-cluster.sh pid kube-apiserver)"
reps="${REPS:-2}" jobs="${JOBS:-200}" ranks="${RANKS:-16}" rounds="${ROUNDS:-1}"
variants=("$@")
[ "${#variants[@]}" -gt 0 ] || variants=(apply,8 apply,16 merge,8 merge,16)
for rep in $(seq "$reps"); do
    for v in "${variants[@]}"; do
        mode="${v%,*}" workers="${v#*,}"
        echo "== rep $rep of $reps: --status-write=$mode --concurrency=$workers ($(date -u +%T))"
        target/release/examples/operator_scale --jobs "$jobs" --ranks "$ranks" --rounds "$rounds" \
            --apiserver-pid "$apiserver_pid" ${EXTRA:-} \
            --operator-arg=--status-write="$mode" --operator-arg=--concurrency="$workers"
    done
done
