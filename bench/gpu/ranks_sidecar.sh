#!/usr/bin/env bash
# Several trainer processes, one sidecar: torchrun's ranks each start the
# agent (the startup hook on PYTHONPATH) and push to the pod's one sidecar
# (--standalone --backend nvml, 1 s). Rank 1 leaks; rank 0 does not. The
# sidecar's report, polled once a second, must call the leak from the
# allocator's own numbers (docs/agent-wire.md, "Several trainer processes").
#
#   bench/gpu/ranks_sidecar.sh OUTDIR NAME=SIDECAR_BINARY ...   (e.g. new=.gpu/new old=.gpu/old)
# Then: python3 bench/gpu/ranks_check.py OUTDIR NAME ...
set -u
OUT=${1:?usage: ranks_sidecar.sh OUTDIR NAME=BINARY ...}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PY:-python3}
DURATION=${DURATION:-150}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SOCKDIR=$(mktemp -d "${TMPDIR:-/tmp}/memprof-ranks.XXXXXX")
trap 'rm -rf "$SOCKDIR"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt" 2>&1
$PY -c "import torch; print(torch.__version__)" >>"$OUT/device.txt" 2>&1
PORT=9580
for spec in "$@"; do
  name=${spec%%=*}
  bin=${spec#*=}
  PORT=$((PORT + 1))
  sock="$SOCKDIR/$name.sock"
  "$bin" --standalone --backend nvml --interval 1s --listen "127.0.0.1:$PORT" --agent-socket "$sock" \
    --output "$OUT/$name.report.json" >"$OUT/$name.events.jsonl" 2>"$OUT/$name.sidecar.log" &
  sc=$!
  rm -f "$OUT/$name.stop"
  sleep 2
  $PY "$HERE/agent_poll.py" "$sock" "$OUT/$name.polls.jsonl" "$OUT/$name.stop" &
  poll=$!
  echo "[$(date +%T)] $name: torchrun, 2 ranks, ${DURATION}s"
  PYTHONPATH="$ROOT/agent/python/bootstrap:$ROOT/agent/python" MEMPROF_AGENT_SOCKET="$sock" \
    $PY -m torch.distributed.run --standalone --nproc-per-node 2 "$HERE/ranks_train.py" \
    --duration "$DURATION" >"$OUT/$name.trainer.log" 2>&1
  echo "[$(date +%T)] $name: trainer exit $?"
  # The last report, whole.
  PYTHONPATH="$HERE" $PY -c 'import sys; from uds_http import request; s, b = request(sys.argv[1], "GET", "/v1/report"); open(sys.argv[2], "wb").write(b if isinstance(b, bytes) else b.encode())' \
    "$sock" "$OUT/$name.last.json"
  touch "$OUT/$name.stop"
  wait "$poll"
  kill -TERM "$sc"
  wait "$sc"
done
