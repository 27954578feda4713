#!/usr/bin/env bash
# GPU proof of the host-memory analysis: two runs of
# bench/gpu/host_leak.py under `memprof profile` (the standalone sidecar and
# the in-process agent, no code change), ~100 s each:
#   leak  a Python list keeps 30 MB/s of CPU tensors (GPU memory flat);
#   none  the same trainer without the list.
# Checks the final report (`--output`): allocator.host.leakSuspected true for
# leak with allocator.host.growthBytesPerSecond within 30 % of the RSS growth
# the trainer measured, false for none; the GPU never called a leak.
#
#   bench/gpu/host_leak.sh [OUTDIR]      # from the repository root; .gpu/ holds
#                                        # the release memprof and memprof-sidecar
# Exits 1 when a check fails. Env: MEMPROF (.gpu/memprof), PY (python3), DURATION (100).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/.gpu/host-leak}
MEMPROF=${MEMPROF:-$ROOT/.gpu/memprof}
PY=${PY:-python3}
DURATION=${DURATION:-100}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/agent/python/bootstrap:$ROOT/agent/python"
status=0
for run in leak:30 none:0; do
  name=${run%%:*}
  rate=${run##*:}
  echo "== $name (leak ${rate} MB/s, ${DURATION} s)"
  "$MEMPROF" profile --output "$OUT/$name.report.json" -- \
    "$PY" "$ROOT/bench/gpu/host_leak.py" --leak-mbps "$rate" --duration "$DURATION" \
    --summary "$OUT/$name.summary.json" >"$OUT/$name.log" 2>&1 || { echo "memprof profile failed: $(tail -5 "$OUT/$name.log")"; status=1; }
done
"$PY" - "$OUT" <<'PYEOF' || status=1
import json, sys
out = sys.argv[1]
ok = True
for name in ("leak", "none"):
    rep = json.load(open(f"{out}/{name}.report.json"))
    summ = json.load(open(f"{out}/{name}.summary.json"))
    a = rep.get("allocator") or {}
    h = a.get("host") or {}
    g = h.get("growthBytesPerSecond")
    print(f"{name}: host={json.dumps(h)[:400]}")
    print(f"{name}: trainer measured {summ['measuredBytesPerSecond'] / 1e6:.1f} MB/s of RSS growth; gpu growth={a.get('growth')}")
    if a.get("growth") == "leak":
        print(f"FAIL {name}: the GPU was called a leak"); ok = False
    if name == "leak":
        if not h.get("leakSuspected"):
            print("FAIL leak: host leak not flagged"); ok = False
        m = summ["measuredBytesPerSecond"]
        if g is None or abs(g - m) > 0.3 * m:
            print(f"FAIL leak: growth {g} vs measured {m}"); ok = False
    elif h.get("leakSuspected"):
        print("FAIL none: a host leak flagged without one"); ok = False
print("host_leak: OK" if ok else "host_leak: FAILED")
sys.exit(0 if ok else 1)
PYEOF
exit $status
