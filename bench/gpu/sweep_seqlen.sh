#!/usr/bin/env bash
# GPU proof of the sweep's memory model: a sequence-length
# sweep of an eager-attention decoder (bench/gpu/sweep_attn_trainer.py:
# explicit softmax(QKᵀ)V, memory quadratic in SEQ_LEN) over the issue's grid
# 1024,2048,3072,4096. The sweep fits its model, runs its verification
# search (the model proposes, real runs decide) and names the largest value
# that RAN under the headroom limit. Then this script re-runs that value for
# more steps, and checks:
#   1. the recommended SEQ_LEN ran in the sweep, under the limit, and runs
#      again for RECHECK_STEPS steps without an OOM;
#   2. the next value on the search's step above it OOMs or runs over the
#      limit (the sweep's own run, or one made here when the model was sure
#      enough of it to stop the search);
#   3. the recommendation is not an extrapolation: a run backs it;
#   4. the model the sweep chose is not a line with a negative static part.
# It also prints what a least-squares line through the grid would have
# called safe (the issue's failure), for the record.
#
#   OUT=/some/dir bash bench/gpu/sweep_seqlen.sh
#
# Writes $OUT/sweep.{json,csv,html,txt}, $OUT/plots/*.{svg,png},
# $OUT/recheck.json, $OUT/next.json (when run here), $OUT/verdict.txt; run logs under $OUT/logs*.
# Needs target/release/memprof (BIN to change) and torch. About 10 runs of
# a few steps: under 6 minutes on an H100 80 GB.
# TRAINER=tests/fixtures/fake_trainer.py with FAKE_ATTN=1 (the fake trainer's
# quadratic law) tries the script without a GPU.
set -euo pipefail
: "${OUT:?set OUT to the output directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
PY=${PY:-python3}
TRAINER=${TRAINER:-$HERE/sweep_attn_trainer.py}
GRID=${GRID:-1024,2048,3072,4096}
BATCH=${BATCH:-2}
STEPS=${STEPS:-5}
RECHECK_STEPS=${RECHECK_STEPS:-15}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

sweep() {
  "$BIN/memprof" sweep --agent-path "$ROOT/agent/python" --timeout 120 --headroom 0.1 "$@" \
    -- "$PY" "$TRAINER"
}

GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo "unknown GPU")
log "sweep SEQ_LEN=$GRID at BATCH_SIZE=$BATCH, $STEPS steps each, verification on, on $GPU"
sweep --vary "SEQ_LEN=$GRID" --vary "BATCH_SIZE=$BATCH" --steps "$STEPS" \
  --note "bench/gpu/sweep_seqlen.sh on $GPU: eager-attention decoder (softmax(QK^T)V, no flash/SDPA), BATCH_SIZE=$BATCH, $STEPS steps per configuration" \
  --json "$OUT/sweep.json" --csv "$OUT/sweep.csv" --html "$OUT/sweep.html" \
  --plot-dir "$OUT/plots" --logs "$OUT/logs" \
  | tee "$OUT/sweep.txt"

# The value called safe, and the next value on the search's step above it:
# run by the sweep (the bound), or, when the model was sure it does not fit
# and the search stopped there, run here.
read -r SAFE NEXT NEXT_RAN < <("$PY" - "$OUT/sweep.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
m = [m for m in r["models"] if m["variable"] == "SEQ_LEN"]
m = m[0] if m else {}
safe, bound, step = m.get("largestSafe"), m.get("bound"), m.get("step")
# One step above what ran (at most the bound, a tested value on the step).
nxt = safe + step if safe is not None and step else (bound["x"] if bound else None)
ran = nxt is not None and any(float(x["values"]["SEQ_LEN"]) == nxt for x in r["runs"])
f = lambda x: "-" if x is None else str(int(x))
print(f(safe), f(nxt), "yes" if ran else "no")
PYEOF
)
log "largest safe SEQ_LEN=$SAFE; next value on the step $NEXT (run by the sweep: $NEXT_RAN)"
if [ "$SAFE" != "-" ]; then
  log "re-run SEQ_LEN=$SAFE for $RECHECK_STEPS steps (must not OOM)"
  sweep --vary "SEQ_LEN=$SAFE" --vary "BATCH_SIZE=$BATCH" --steps "$RECHECK_STEPS" --no-verify \
    --json "$OUT/recheck.json" --logs "$OUT/logs-recheck" >/dev/null
fi
if [ "$NEXT" != "-" ] && [ "$NEXT_RAN" = "no" ]; then
  log "run SEQ_LEN=$NEXT (the model said it does not fit; must OOM or go over the limit)"
  sweep --vary "SEQ_LEN=$NEXT" --vary "BATCH_SIZE=$BATCH" --steps "$STEPS" --no-verify \
    --json "$OUT/next.json" --logs "$OUT/logs-next" >/dev/null || true
fi

"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/verdict.txt"
import json, os, sys
out = sys.argv[1]
GiB = 2**30
sweep = json.load(open(os.path.join(out, "sweep.json")))
m = [m for m in sweep["models"] if m["variable"] == "SEQ_LEN"][0]
runs = sweep["runs"]
limit = m["limitBytes"]
def peak(r):
    return r.get("peakReservedBytes")
def at(x):
    return [r for r in runs if float(r["values"]["SEQ_LEN"]) == x]
for r in runs:
    p = peak(r)
    print("SEQ_LEN=%s%s: %s, peak reserved %s" % (
        r["values"]["SEQ_LEN"], " (verification)" if r.get("trial") else "", r["status"],
        "-" if p is None else "%.2f GiB" % (p / GiB)))
fit = m.get("fit")
if fit:
    c = fit["curve"]
    print("model: %s, static %.2f GiB, %.1f MiB/token, %.3f KiB/token^2; held-out rms %s; backed %s..%s"
          % (c["family"], c["staticBytes"] / GiB, c["perUnitBytes"] / 2**20, c["perUnitSquaredBytes"] / 1024,
             "-" if fit["heldOutRmsBytes"] is None else "%.2f GiB" % (fit["heldOutRmsBytes"] / GiB),
             fit["supportMin"], fit["supportMax"]))
else:
    print("model: none (%s)" % m.get("noModel"))
print("limit %.1f GiB (device %.1f GiB, %.0f%% headroom)" % (limit / GiB, m["deviceTotalBytes"] / GiB, 100 * m["headroom"]))

# What the line the issue saw would have said: least squares on the grid.
grid = [(float(r["values"]["SEQ_LEN"]), peak(r)) for r in runs if not r.get("trial") and r["status"] == "ok" and peak(r)]
if len(grid) >= 2:
    n = len(grid); sx = sum(x for x, _ in grid); sy = sum(y for _, y in grid)
    sxx = sum(x * x for x, _ in grid); sxy = sum(x * y for x, y in grid)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx); icpt = (sy - slope * sx) / n
    print("for the record, a line through the grid: %.2f GiB + %.2f MiB x SEQ_LEN, at the limit at SEQ_LEN %.0f"
          % (icpt / GiB, slope / 2**20, (limit - icpt) / slope))

checks = []
safe = m.get("largestSafe")
bound = m.get("bound")
checks.append(("a value is called safe", safe is not None, "largestSafe %s" % safe))
if safe is not None:
    ran = [r for r in at(safe) if r["status"] == "ok" and peak(r) is not None and peak(r) <= limit]
    checks.append(("the recommended value ran in the sweep under the limit", bool(ran),
                   "SEQ_LEN=%d: %s" % (safe, ", ".join("%s %.2f GiB" % (r["status"], (peak(r) or 0) / GiB) for r in at(safe)))))
    path = os.path.join(out, "recheck.json")
    rc = json.load(open(path))["runs"][0] if os.path.exists(path) else None
    good = rc is not None and rc["status"] == "ok"
    checks.append(("the recommended value runs again for more steps", good,
                   "not run" if rc is None else "%s after %s steps, peak reserved %s" % (
                       rc["status"], rc["steps"], "-" if peak(rc) is None else "%.2f GiB" % (peak(rc) / GiB))))
step = m.get("step")
nxt = safe + step if safe is not None and step else (bound["x"] if bound else None)
tried = at(nxt) if nxt is not None else []
path = os.path.join(out, "next.json")
if not tried and os.path.exists(path):
    tried = json.load(open(path))["runs"]
over = [r for r in tried if r["status"] == "oom" or (peak(r) is not None and peak(r) > limit)]
checks.append(("the next value on the step OOMs or runs over the limit", bool(over) and (safe is None or nxt > safe),
               "SEQ_LEN=%s: %s" % (nxt, ", ".join("%s %s" % (r["status"], "-" if peak(r) is None else "%.2f GiB" % (peak(r) / GiB))
                                                  for r in tried) or "not run")))
pred = m.get("predicted")
if pred is not None and safe is not None:
    checks.append(("no recommendation beyond what ran", safe >= pred["x"] or not m["verified"],
                   "predicted %s (%s), verified %s" % (pred["x"], pred["support"]["kind"], m["verified"])))
if fit:
    c = fit["curve"]
    sane = not (c["family"] == "linear" and c["staticBytes"] < -fit["marginBytes"])
    checks.append(("the model is not a line with a negative static part", sane, c["family"]))
ok = True
for name, good, detail in checks:
    ok = ok and good
    print("%s: %s (%s)" % ("PASS" if good else "FAIL", name, detail))
print("verdict: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PYEOF
log "done"
