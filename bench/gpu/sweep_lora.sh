#!/usr/bin/env bash
# GPU proof of `memprof sweep`: a batch sweep of a LoRA fine-tune
# (bench/gpu/sweep_trainer.py: Llama-shaped decoder, ~0.95B parameters in
# bf16, peft LoRA r=16 on every projection, sequence 2048) over batch sizes
# that straddle the GPU's memory, each in its own process with the agent
# auto-enabled and a standalone sidecar for the NVML peak; the sweep's own
# verification runs search between what ran and what OOMed. Then it re-runs
# the recommended largest safe batch for more steps (must not OOM) and the
# next value up (one step of the search's grid above it: should OOM, or
# land within the stated error of its prediction), and prints both.
#
#   OUT=/some/dir bash bench/gpu/sweep_lora.sh
#
# Writes $OUT/sweep.{json,csv,html,txt}, $OUT/recheck-safe.json,
# $OUT/recheck-next.json, $OUT/verdict.txt; run logs under $OUT/logs*.
# Needs target/release/memprof and memprof-sidecar (BIN to change), torch and
# peft. Under 4 minutes on an H100 (each configuration a few steps).
set -euo pipefail
: "${OUT:?set OUT to the output directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
PY=${PY:-python3}
# TRAINER: tests/fixtures/fake_trainer.py tries this script without a GPU.
TRAINER=${TRAINER:-$HERE/sweep_trainer.py}
GRID=${GRID:-2,4,8,16,32,64}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-5}
RECHECK_STEPS=${RECHECK_STEPS:-15}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

sweep() {
  "$BIN/memprof" sweep --nvml --agent-path "$ROOT/agent/python" --timeout 100 --headroom 0.1 "$@" \
    -- "$PY" "$TRAINER"
}

GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo "unknown GPU")
log "sweep BATCH_SIZE=$GRID at SEQ_LEN=$SEQ, $STEPS steps each, on $GPU"
sweep --vary "BATCH_SIZE=$GRID" --vary "SEQ_LEN=$SEQ" --steps "$STEPS" \
  --note "bench/gpu/sweep_lora.sh on $GPU: Llama-shaped decoder (d 2048, 16 layers, vocab 32000, bf16) with peft LoRA r=16, SEQ_LEN=$SEQ, $STEPS steps per configuration" \
  --json "$OUT/sweep.json" --csv "$OUT/sweep.csv" --html "$OUT/sweep.html" --logs "$OUT/logs" \
  | tee "$OUT/sweep.txt"

# The recommendation (the largest batch that ran under the limit, the
# sweep's verification included) and the next value up: one step of the
# search's grid above it (the bound the search ran into when nothing ran).
read -r SAFE NEXT < <("$PY" - "$OUT/sweep.json" <<'PYEOF'
import json, sys
m = [m for m in json.load(open(sys.argv[1]))["models"] if m["variable"] == "BATCH_SIZE"]
m = m[0] if m else {}
safe, bound, step = m.get("largestSafe"), m.get("bound"), m.get("step")
# One step above what ran (at most the bound, a tested value on the step).
nxt = safe + step if safe is not None and step else (bound["x"] if bound else None)
f = lambda x: "-" if x is None else str(int(x))
print(f(safe), f(nxt))
PYEOF
)
log "recommended largest safe BATCH_SIZE=$SAFE, next up $NEXT"
if [ "$SAFE" = "-" ]; then
  log "no recommendation (see $OUT/sweep.txt): nothing to re-run"
  exit 1
fi

log "re-run BATCH_SIZE=$SAFE for $RECHECK_STEPS steps (must not OOM)"
sweep --vary "BATCH_SIZE=$SAFE" --vary "SEQ_LEN=$SEQ" --steps "$RECHECK_STEPS" \
  --json "$OUT/recheck-safe.json" --logs "$OUT/logs-safe" >/dev/null
if [ "$NEXT" != "-" ]; then
  log "re-run BATCH_SIZE=$NEXT for $STEPS steps (predicted over the limit)"
  sweep --vary "BATCH_SIZE=$NEXT" --vary "SEQ_LEN=$SEQ" --steps "$STEPS" \
    --json "$OUT/recheck-next.json" --logs "$OUT/logs-next" >/dev/null
fi

"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/verdict.txt"
import json, os, sys
out = sys.argv[1]
GiB = 2**30
sweep = json.load(open(os.path.join(out, "sweep.json")))
m = [m for m in sweep["models"] if m["variable"] == "BATCH_SIZE"][0]
fit = m["fit"]
c = fit["curve"]
pred = lambda b: c["staticBytes"] + c["perUnitBytes"] * b + c.get("perUnitSquaredBytes", 0) * b * b
err = max(fit["marginBytes"], 0.05 * m["limitBytes"])
print("model: peak reserved = %.2f GiB + %.3f GiB x BATCH_SIZE + %.4f GiB x BATCH_SIZE^2 (%s, %d runs, max residual %.2f GiB, margin %.2f GiB)"
      % (c["staticBytes"] / GiB, c["perUnitBytes"] / GiB, c.get("perUnitSquaredBytes", 0) / GiB, c["family"], fit["n"],
         fit["maxResidualBytes"] / GiB, fit["marginBytes"] / GiB))
print("device total %.1f GiB, limit (%.0f%% headroom) %.1f GiB; stated error: max(the model's margin, 5%% of the limit) = %.2f GiB"
      % (m["deviceTotalBytes"] / GiB, 100 * m["headroom"], m["limitBytes"] / GiB, err / GiB))
ok = True
for name, want in (("recheck-safe.json", "safe"), ("recheck-next.json", "next")):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        print("%s: not run" % name)
        continue
    r = json.load(open(path))["runs"][0]
    b = int(r["values"]["BATCH_SIZE"])
    peak = r["peakReservedBytes"]
    seen = "-" if peak is None else "%.2f GiB" % (peak / GiB)
    nvml = "-" if r["nvmlPeakBytes"] is None else "%.2f GiB" % (r["nvmlPeakBytes"] / GiB)
    line = "BATCH_SIZE=%d (%s): %s after %s steps, peak reserved %s (predicted %.2f GiB), NVML peak %s, %.1f s" % (
        b, "recommended" if want == "safe" else "next up", r["status"], r["steps"], seen, pred(b) / GiB, nvml,
        r["durationSeconds"])
    if want == "safe":
        good = r["status"] == "ok"
        line += " -> %s" % ("PASS: no OOM" if good else "FAIL: the recommended batch did not run clean")
    else:
        within = peak is not None and abs(peak - pred(b)) <= err
        good = r["status"] == "oom" or within
        line += " -> %s" % ("PASS: OOM as predicted" if r["status"] == "oom" else
                            ("PASS: ran, within the stated error" if within else "FAIL: ran, outside the stated error"))
    ok = ok and good
    print(line)
print("verdict: %s" % ("PASS" if ok else "FAIL"))
PYEOF
log "done"
