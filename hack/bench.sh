#!/usr/bin/env bash
# hack/bench.sh -- what `make bench` runs: every benchmark that needs no GPU,
# against the local control plane (started here if needed, stopped again if
# so). They print numbers; docs/benchmarks.md records what was seen.
# GPU scenarios live in bench/gpu/ (see docs/gpu-results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
started_cluster=0
cleanup() { [ "$started_cluster" = 1 ] && bash hack/local-cluster.sh down || true; }
trap cleanup EXIT
if ! bash hack/local-cluster.sh status >/dev/null 2>&1; then
    bash hack/local-cluster.sh up >/dev/null
    started_cluster=1
fi
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG
cargo build --release --workspace --bins --example operator_scale --example operator_memory --example remediation_latency --example api_write_loop
echo "== sidecar: writes per rank per 30 s, RSS and CPU (sim backend)"
bash bench/sidecar_budget.sh 8 120
echo "== roll-up: CPU per report event, incremental against from scratch (2,048 x 1 and 256 x 8)"
cargo bench -p memprof-analysis --bench rollup
echo "== operator: 256 ranks, report -> profile status latency, status size, RSS, CPU"
target/release/examples/operator_scale --ranks 256 --rounds 5
# The scale run of docs/benchmarks.md: each prints its goals beside the numbers
# (a missed goal says MISSED and does not stop the script); ~3 and ~5 minutes.
apiserver_pid="$(bash hack/local-cluster.sh pid kube-apiserver)"
echo "== API server on its own: writes/s and round trips per kind of write, no operator (~5 minutes)"
target/release/examples/api_write_loop --lanes 8,16 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: 256 ranks x 8 GPUs in one Job"
target/release/examples/operator_scale --jobs 1 --ranks 256 --gpus-per-rank 8 --rounds 2 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: 2,048 ranks in one Job"
target/release/examples/operator_scale --jobs 1 --ranks 2048 --rounds 2 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: one JobSet of 2,048 ranks (256 child Jobs x 8 pods) against one Job of 2,048 ranks, A/B"
target/release/examples/operator_scale --workload jobset --ranks 2048 --pods-per-job 8 --rounds 2 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: one JobSet of 2,048 child Jobs of one pod against one Job of 2,048 ranks, A/B"
target/release/examples/operator_scale --workload jobset --ranks 2048 --pods-per-job 1 --rounds 2 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: one PyTorchJob of 2,048 ranks against one Job of 2,048 ranks, A/B"
target/release/examples/operator_scale --workload pytorchjob --ranks 2048 --rounds 2 --apiserver-pid "$apiserver_pid"
echo "== operator at scale: 200 Jobs x 16 ranks at once"
target/release/examples/operator_scale --jobs 200 --ranks 16 --rounds 1 --apiserver-pid "$apiserver_pid"
echo "== operator memory: 1,000 Jobs and 1,000 pods, plain then with ~250 KiB of tenant metadata each"
target/release/examples/operator_memory --objects 1000
echo "== remediation: triggering report -> recreated Job"
target/release/examples/remediation_latency 10
echo "== admission webhook: mutate and HTTPS round trip"
cargo bench -p memprof --bench admission
echo "== admission webhook under a hostile client: server RSS, legitimate latency (limits on, then off)"
cargo build --release --example webhook_hostile
target/release/examples/webhook_hostile --limits default
target/release/examples/webhook_hostile --limits off
