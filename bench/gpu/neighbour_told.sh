#!/usr/bin/env bash
# NVML alone, told the trainer's pid, blames a neighbour (docs/analysis.md,
# "Whose growth, from NVML alone"), on a real GPU: a steady trainer (it
# empties its cache every 3 s, so it asks for memory again) and, started
# apart from it (another user's process, not the trainer's child), a
# neighbour that grows MBPS MB/s until the card is full. Two standalone
# sidecars watch the GPU without the agent: `told` with
# `--trainer-pid-file` (what `memprof profile` passes), `untold` without.
# Each one's report is polled once a second (report_poll.py).
#
#   bench/gpu/neighbour_told.sh OUTDIR [GPU_INDEX] [MBPS] [LIFE_S]
#
# From the repository root, with .gpu/memprof-sidecar built here
# (`cargo build --release -p memprof-sidecar`). OUTDIR gets told.polls.jsonl,
# untold.polls.jsonl, the logs, the neighbour's record and summary.txt:
# per sidecar, the cause at its first high and the seconds of leak flag.
set -u
OUT=${1:?usage: $0 OUTDIR [GPU_INDEX] [MBPS] [LIFE_S]}
GPU=${2:-0} MBPS=${3:-400} LIFE=${4:-80}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIDECAR=${SIDECAR:-$ROOT/.gpu/memprof-sidecar}
PY=${PY:-python3}
mkdir -p "$OUT"
W=$(mktemp -d)
PIDS=()
stop_all() {
  touch "$W/stop"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap stop_all EXIT
export CUDA_VISIBLE_DEVICES=$GPU MEMPROF_AGENT_DISABLE=1 PYTHONUNBUFFERED=1
UUID=$(nvidia-smi -i "$GPU" --query-gpu=uuid --format=csv,noheader | tr -d ' ')

for n in told untold; do
  extra=()
  [ "$n" = told ] && extra=(--trainer-pid-file "$W/trainer.pid")
  NO_COLOR=1 "$SIDECAR" --standalone --backend nvml --gpus "$UUID" --interval 1s \
    --listen 127.0.0.1:0 --agent-socket "$W/$n.sock" --output "$OUT/$n.report.json" \
    "${extra[@]}" >"$OUT/$n.events.jsonl" 2>"$OUT/$n.sidecar.log" &
  PIDS+=("$!")
  for _ in $(seq 200); do [ -S "$W/$n.sock" ] && break; sleep 0.05; done
  (cd "$HERE" && exec $PY report_poll.py "$W/$n.sock" "$OUT/$n.polls.jsonl" "$W/stop") &
  PIDS+=("$!")
done

# The neighbour first (its CUDA context takes seconds), told when to begin.
mkfifo "$W/nb.in"
$PY "$HERE/causes.py" neighbour "$OUT/neighbour.json" <"$W/nb.in" >"$W/nb.out" &
NB=$!
PIDS+=("$NB")
exec 3>"$W/nb.in"
for _ in $(seq 300); do grep -q ready "$W/nb.out" 2>/dev/null && break; sleep 0.1; done

$PY "$HERE/scenarios.py" --name steady --seed 1801 --d-model 1024 --layers 8 --heads 16 \
  --seq 1024 --batch-schedule 6 --peak-every 0 --empty-cache-every 3 --duration $((LIFE + 60)) \
  --summary-json "$OUT/trainer.summary.json" >"$OUT/trainer.log" 2>&1 &
TRAINER=$!
PIDS+=("$TRAINER")
echo "$TRAINER" >"$W/trainer.pid"
sleep 25 # the trainer warms up, its memory steady
FREE=$(nvidia-smi -i "$GPU" --query-gpu=memory.free --format=csv,noheader,nounits | tr -d ' ')
INITIAL=$(awk -v f="$FREE" -v m="$MBPS" -v l="$LIFE" 'BEGIN{b = f * 1048576 - m * 1e6 * l; print (b > 0 ? int(b) : 0)}')
echo "$(date +%s.%N) neighbour pid $NB begins: $INITIAL B, then $MBPS MB/s (free $FREE MiB)" >"$OUT/run.log"
echo "$INITIAL $MBPS" >&3
wait "$TRAINER"
echo "$(date +%s.%N) trainer exit $?" >>"$OUT/run.log"
sleep 3
exec 3>&-

$PY - "$OUT" "$TRAINER" "$NB" >"$OUT/summary.txt" <<'EOF'
import json, sys
out, trainer, nb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for n in ("told", "untold"):
    first, leak, last = None, 0, None
    for line in open(f"{out}/{n}.polls.jsonl"):
        r = json.loads(line).get("report")
        if not r:
            continue
        g = r["gpus"][0]
        last = g
        leak += 1 if g.get("leakSuspected") else 0
        if first is None and g.get("risk") in ("high", "critical"):
            first = g
    cause = (first or {}).get("cause") or {}
    print(f"{n}: first high cause={cause.get('cause')} evidence={cause.get('evidence')!r}; "
          f"seconds of leak flag={leak}; last risk={(last or {}).get('risk')}")
print(f"trainer pid {trainer}, neighbour pid {nb}")
EOF
cat "$OUT/summary.txt"
