#!/usr/bin/env bash
# `memprof profile -- CMD` on a real GPU without the agent, beside a
# neighbour started apart from the command (another user's process): the
# profile tells its sidecar the command's pid (docs/cli.md), so its final
# report names the growth `neighbour` and raises no leak flag.
#
#   bench/gpu/neighbour_profile.sh OUTDIR [GPU_INDEX] [MBPS] [LIFE_S]
#
# From the repository root, with .gpu/memprof and .gpu/memprof-sidecar
# built here (`cargo build --release -p memprof -p memprof-sidecar`).
# OUTDIR gets profile.json (the final report), profile.log and summary.txt.
set -u
OUT=${1:?usage: $0 OUTDIR [GPU_INDEX] [MBPS] [LIFE_S]}
GPU=${2:-0} MBPS=${3:-400} LIFE=${4:-70}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MEMPROF=${MEMPROF:-$ROOT/.gpu/memprof}
PY=${PY:-python3}
mkdir -p "$OUT"
W=$(mktemp -d)
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap stop_all EXIT
export CUDA_VISIBLE_DEVICES=$GPU MEMPROF_AGENT_DISABLE=1 PYTHONUNBUFFERED=1
UUID=$(nvidia-smi -i "$GPU" --query-gpu=uuid --format=csv,noheader | tr -d ' ')

mkfifo "$W/nb.in"
$PY "$HERE/causes.py" neighbour "$OUT/neighbour.json" <"$W/nb.in" >"$W/nb.out" &
NB=$!
PIDS+=("$NB")
exec 3>"$W/nb.in"
for _ in $(seq 300); do grep -q ready "$W/nb.out" 2>/dev/null && break; sleep 0.1; done

"$MEMPROF" profile --backend nvml --devices "$UUID" --output "$OUT/profile.json" -- \
  $PY "$HERE/scenarios.py" --name steady --seed 1811 --d-model 1024 --layers 8 --heads 16 \
  --seq 1024 --batch-schedule 6 --peak-every 0 --empty-cache-every 3 --duration $((LIFE + 50)) \
  --summary-json "$OUT/trainer.summary.json" >"$OUT/profile.log" 2>&1 &
PROFILE=$!
PIDS+=("$PROFILE")
sleep 30 # the trainer warms up, its memory steady
FREE=$(nvidia-smi -i "$GPU" --query-gpu=memory.free --format=csv,noheader,nounits | tr -d ' ')
INITIAL=$(awk -v f="$FREE" -v m="$MBPS" -v l="$LIFE" 'BEGIN{b = f * 1048576 - m * 1e6 * l; print (b > 0 ? int(b) : 0)}')
echo "$(date +%s.%N) neighbour pid $NB begins: $INITIAL B, then $MBPS MB/s (free $FREE MiB)" >"$OUT/run.log"
echo "$INITIAL $MBPS" >&3
wait "$PROFILE"
echo "$(date +%s.%N) memprof profile exit $?" >>"$OUT/run.log"
exec 3>&-

$PY - "$OUT" "$NB" >"$OUT/summary.txt" <<'PYEOF'
import json, sys
out, nb = sys.argv[1], sys.argv[2]
r = json.load(open(f"{out}/profile.json"))
for g in r["gpus"]:
    c = g.get("cause") or {}
    print(f"gpu {g.get('index')}: risk={g.get('risk')} cause={c.get('cause')} "
          f"evidence={c.get('evidence')!r} leakSuspected={g.get('leakSuspected')}")
print(f"neighbour pid {nb}")
PYEOF
cat "$OUT/summary.txt" "$OUT/run.log"
