#!/usr/bin/env bash
# bench/sidecar_budget.sh -- measures, against the local control plane:
#   * MemoryReport writes per rank per 30 s in steady state (from each
#     sidecar's own write counter, memprof_sidecar_report_writes_total);
#   * sidecar RSS and CPU with the sim backend, at 1 Hz and 10 Hz.
# Prints numbers; asserts nothing. Usage:
#   bash bench/sidecar_budget.sh [RANKS] [SECONDS]
# Needs release binaries (`make release`) and the local control plane
# (`hack/local-cluster.sh up`). Stops every process it starts, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-8}
SECONDS_RUN=${2:-180}
BIN=${BIN:-target/release}
NS=memprof-bench-sidecar-$$
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG
work=$(mktemp -d "${TMPDIR:-/tmp}/memprof-bench.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

kubectl apply --server-side -f crds/ >/dev/null
kubectl create namespace "$NS" >/dev/null
cat >"$work/steady.yaml" <<'YAML'
# Steady training: a saw-tooth between 30 and 40 GiB every 2 s, no leak.
seed: 1
default: { baseGiB: 30, amplitudeGiB: 10, periodSeconds: 2, noiseGiB: 0.2 }
YAML

port_of() { # the sidecar logs the address it bound
    for _ in $(seq 50); do
        a=$(grep -o 'addr=127.0.0.1:[0-9]*' "$1" 2>/dev/null | head -1 | cut -d: -f2 || true)
        [ -n "$a" ] && { echo "$a"; return; }
        sleep 0.2
    done
    echo "no port in $1" >&2; return 1
}
writes_of() {
    curl -fsS "http://127.0.0.1:$1/metrics" | awk '/^memprof_sidecar_report_writes_total/ {s+=$2} END {print s+0}'
}
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

declare -A port
for i in $(seq 0 $((RANKS - 1))); do
    interval=1s; [ "$i" = 0 ] && interval=100ms   # rank 0 samples at 10 Hz
    RUST_LOG=info POD_NAME=bench-$i POD_NAMESPACE=$NS MEMPROF_JOB_NAME=bench \
        "$BIN/memprof-sidecar" --backend sim --scenario "$work/steady.yaml" --rank "$i" \
        --interval "$interval" --listen 127.0.0.1:0 >"$work/s$i.log" 2>&1 &
    pids+=($!)
done
for i in $(seq 0 $((RANKS - 1))); do port[$i]=$(port_of "$work/s$i.log"); done

# Discard the first 20 s (first write, warm-up of the envelope), then measure.
sleep 20
hz=$(getconf CLK_TCK)
declare -A w0 c0
for i in $(seq 0 $((RANKS - 1))); do w0[$i]=$(writes_of "${port[$i]}"); c0[$i]=$(cpu_ticks "${pids[$i]}"); done
sleep "$SECONDS_RUN"
echo "steady state over ${SECONDS_RUN}s, $RANKS sim sidecars (rank 0 at 10 Hz, others at 1 Hz), $(date -u +%F), $(nproc) cores"
printf '%-6s %-8s %-10s %-16s %-10s %-8s\n' rank rate writes writes/30s cpu% rss_MiB
for i in $(seq 0 $((RANKS - 1))); do
    w=$(( $(writes_of "${port[$i]}") - w0[$i] ))
    c=$(( $(cpu_ticks "${pids[$i]}") - c0[$i] ))
    rate=1Hz; [ "$i" = 0 ] && rate=10Hz
    python3 - "$i" "$rate" "$w" "$SECONDS_RUN" "$c" "$hz" "$(rss_kib "${pids[$i]}")" <<'PY'
import sys
i, rate, w, secs, c, hz, rss = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
print(f"{i:<6} {rate:<8} {w:<10} {w * 30 / secs:<16.2f} {100 * c / hz / secs:<10.3f} {rss / 1024:<8.1f}")
PY
done
echo "reports in the namespace: $(kubectl -n "$NS" get memoryreports --no-headers | wc -l)"
