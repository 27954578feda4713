#!/usr/bin/env bash
# bench/sidecar_budget.sh -- measures, against the local control plane:
#   * MemoryReport writes per rank per 30 s in steady state (from each
#     sidecar's own write counter, memprof_sidecar_report_writes_total);
#   * sidecar RSS and CPU with the sim backend, at 1 Hz and 10 Hz;
#   * the agent's push round trip over the sidecar's Unix socket (POST
#     /v1/agent answered with the verdict, contract B), as the Python agent
#     sends it (http.client over AF_UNIX, one connection per push), and the
#     answer's size; then the sidecar's CPU and RSS at 10 pushes/s.
# Prints numbers; asserts nothing. Usage:
#   bash bench/sidecar_budget.sh [RANKS] [SECONDS] [PUSHES]
# Needs release binaries (`make release`) and the local control plane
# (`hack/local-cluster.sh up`). Stops every process it starts, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-8}
SECONDS_RUN=${2:-180}
PUSHES=${3:-2000}
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
        --interval "$interval" --listen 127.0.0.1:0 --agent-socket "$work/s$i.sock" >"$work/s$i.log" 2>&1 &
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

# The push round trip, on rank 0's socket (its writes above are done), with
# pushes the size of a one-GPU periodic push; then 10 pushes/s for 30 s.
python3 - "$work/s0.sock" "$PUSHES" "${pids[0]}" "$hz" <<'PY'
import http.client, json, socket, sys, time
sock, n, pid, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=2)
        self.path_ = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path_)

def push(i):
    return json.dumps({"version": 1, "time": time.time(), "pid": 4242, "rank": 0, "step": i,
        "devices": [{"index": 0, "uuid": "GPU-bench", "allocatedBytes": 30_000_000_000, "reservedBytes": 32_000_000_000,
                     "activeBytes": 30_000_000_000, "inactiveSplitBytes": 500_000_000, "peakAllocatedBytes": 31_000_000_000,
                     "peakReservedBytes": 32_000_000_000, "freeBytes": 40_000_000_000, "totalBytes": 80_000_000_000}]}).encode()

def once(i):
    c = Unix(sock)
    try:
        c.request("POST", "/v1/agent", body=push(i), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body)
        return body
    finally:
        c.close()

def cpu():
    return sum(int(x) for x in open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[11:13])

def rss():
    return next(int(l.split()[1]) for l in open("/proc/%d/status" % pid) if l.startswith("VmRSS"))

for i in range(50):
    once(i)
ms = []
for i in range(n):
    t = time.perf_counter()
    body = once(i)
    ms.append((time.perf_counter() - t) * 1e3)
ms.sort()
q = lambda p: ms[min(len(ms) - 1, int(p * (len(ms) - 1) + 0.5))]
print("push round trip over the socket, %d pushes of %d B: p50 %.3f ms, p99 %.3f ms, max %.3f ms; answer %d B: %s"
      % (n, len(push(0)), q(0.5), q(0.99), ms[-1], len(body), body.decode()[:160]))
c0, r0, t0 = cpu(), rss(), time.time()
i = 0
while time.time() - t0 < 30:
    once(i)
    i += 1
    time.sleep(max(0.0, t0 + i / 10 - time.time()))
secs = time.time() - t0
print("at 10 pushes/s for %.0f s: sidecar CPU %.3f %% of a core, RSS %.1f -> %.1f MiB"
      % (secs, 100 * (cpu() - c0) / hz / secs, r0 / 1024, rss() / 1024))
PY
