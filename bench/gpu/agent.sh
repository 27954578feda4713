#!/usr/bin/env bash
# The in-process agent on a real GPU: a real PyTorch trainer with
# the agent started by the startup hook (PYTHONPATH, no code change), the
# real memprof-sidecar (--standalone --backend nvml, 1 s) beside it, its
# report polled once a second.
#
#   bench/gpu/agent.sh OUTDIR PHASE[:ARG,...] ...
#
# Phases:
#   leak:RATE,HEADROOM,MAXDUR   train.py's leak (RATE MB/s until the CUDA OOM), history on
#   leakdefault:RATE,HEADROOM,MAXDUR  the same in the default deployment: history off
#                               until the sidecar's verdict reaches high
#   grow:DUR                    agent_train.py grow (sequence length grows: cache, no leak)
#   frag:DUR                    agent_train.py frag, then again with expandable_segments:True
#   ab:DUR,WIN                  agent_train.py ab: step time with the agent on/off
# Summary: bench/gpu/agent_summary.py OUTDIR
set -u
OUT=${1:?usage: agent.sh OUTDIR PHASE...}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIDECAR=${SIDECAR:-$ROOT/.gpu/memprof-sidecar}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }
PORT=9480
# The sidecars' agent sockets, in a directory only this user can enter.
SOCKDIR=$(mktemp -d "${TMPDIR:-/tmp}/memprof-agent-gpu.XXXXXX")
trap 'rm -rf "$SOCKDIR"' EXIT

# with_sidecar NAME CMD...: runs CMD with a sidecar and a poller beside it;
# the agent pushes over the sidecar's socket (MEMPROF_AGENT_SOCKET).
with_sidecar() {
  local name=$1
  shift
  PORT=$((PORT + 1))
  local sock="$SOCKDIR/$name.sock"
  "$SIDECAR" --standalone --backend nvml --interval 1s --listen "127.0.0.1:$PORT" \
    --agent-socket "$sock" \
    --output "$OUT/$name.report.json" >"$OUT/$name.events.jsonl" 2>"$OUT/$name.sidecar.log" &
  local sc=$!
  rm -f "$OUT/$name.stop"
  $PY "$HERE/agent_poll.py" "$sock" "$OUT/$name.polls.jsonl" "$OUT/$name.stop" &
  local poll=$!
  sleep 2
  log "$name: $*"
  PYTHONPATH="$ROOT/agent/python/bootstrap:$ROOT/agent/python" \
    MEMPROF_AGENT_SOCKET="$sock" "$@" >"$OUT/$name.trainer.log" 2>&1
  log "$name: trainer exit $?"
  sleep 3
  touch "$OUT/$name.stop"
  wait "$poll"
  kill -TERM "$sc"
  wait "$sc"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt" 2>&1
$PY -c "import torch; print(torch.__version__)" >>"$OUT/device.txt" 2>&1
for phase in "$@"; do
  kind=${phase%%:*}
  args=${phase#*:}
  IFS=, read -r a1 a2 a3 <<<"$args"
  case $kind in
  leak | leakdefault)
    # leak records allocation history from the start; leakdefault leaves it
    # to the agent (on at the sidecar's high), as the default deployment does.
    history=1
    [ "$kind" = leakdefault ] && history=
    MEMPROF_AGENT_RECORD_HISTORY=$history with_sidecar "$kind$a1" \
      $PY "$HERE/train.py" --scenario leak --leak-mbps "$a1" --headroom-gb "$a2" --duration "$a3" \
      --summary-json "$OUT/$kind$a1.summary.json"
    ;;
  grow)
    with_sidecar grow $PY "$HERE/agent_train.py" grow --duration "$a1" --summary-json "$OUT/grow.summary.json"
    ;;
  frag)
    with_sidecar frag $PY "$HERE/agent_train.py" frag --duration "$a1" --summary-json "$OUT/frag.summary.json"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with_sidecar frag_expandable \
      $PY "$HERE/agent_train.py" frag --duration "$a1" --summary-json "$OUT/frag_expandable.summary.json"
    ;;
  ab)
    with_sidecar ab $PY "$HERE/agent_train.py" ab --duration "$a1" --window "$a2" --summary-json "$OUT/ab.summary.json"
    ;;
  *) log "unknown phase $phase" ;;
  esac
done
$PY "$HERE/agent_summary.py" "$OUT" | tee "$OUT/summary.txt"
