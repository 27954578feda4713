#!/usr/bin/env bash
# memprof GPU scenarios: a real trainer (train.py) with the sidecar's
# sample -> analyse path beside it, on a machine with NVIDIA GPUs.
#
#   bench/gpu/run.sh OUTDIR PHASE[:ARG,...] ...
#
# Phases (each runs the trainer and a 10 Hz monitor; seconds, GB):
#   bench                          sampler cost on the idle GPU(s)
#   steady:DUR                     no leak; also a 1 Hz monitor, nvidia-smi -lms 100,
#                                  CPU/RSS of all three, and the sampler cost under load
#   ab:DUR,WIN                     step time with the monitor on/off in WIN-second windows
#   spike:DUR,AT,GB,S              GB GiB held for S seconds at AT
#   leak:RATE,HEADROOM,MAXDUR      RATE MB/s kept until the CUDA OOM, HEADROOM GB left free
#   ddp:DUR,BATCHES                torchrun over every GPU, per-rank batch sizes (e.g. 8/24)
#
# The monitor is `nvml_probe monitor` (crates/sidecar/examples/nvml_probe.rs, built with
# `cargo build --release -p memprof-sidecar --example nvml_probe`: the library's
# Monitor over NvmlSampler, as the sidecar runs it); MONITOR=sidecar uses
# `memprof-sidecar --standalone --backend nvml` instead.
set -u
OUT=${1:?usage: run.sh OUTDIR PHASE...}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
PROBE=${PROBE:-target/release/examples/nvml_probe}
SIDECAR=${SIDECAR:-target/release/memprof-sidecar}
MONITOR=${MONITOR:-probe}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }

# start_monitor NAME HZ [extra args]: sets MON_PID.
start_monitor() {
  local name=$1 hz=$2
  shift 2
  rm -f "$OUT/$name.stop"
  if [ "$MONITOR" = sidecar ]; then
    local ms
    ms=$(awk -v hz="$hz" 'BEGIN{printf "%dms", 1000/hz}')
    PORT_N=$((PORT_N + 1))
    echo "$((9470 + PORT_N))" >"$OUT/$name.port"
    "$SIDECAR" --standalone --backend nvml --interval "$ms" --listen "127.0.0.1:$((9470 + PORT_N))" \
      --trace-out "$OUT/$name.trace.csv" --output "$OUT/$name.report.json" "$@" \
      >"$OUT/$name.events.jsonl" 2>"$OUT/$name.monitor.log" &
  else
    "$PROBE" monitor --hz "$hz" --trace "$OUT/$name.trace.csv" --events "$OUT/$name.events.jsonl" \
      --report "$OUT/$name.report.json" --stop-file "$OUT/$name.stop" ${MONITOR_ARGS:-} "$@" \
      2>"$OUT/$name.monitor.log" &
  fi
  MON_PID=$!
  echo "$name $(date +%s.%N) $MON_PID" >>"$OUT/monitors.txt"
}

PORT_N=0

stop_monitor() { # NAME PID: the probe stops at its next analysis once the file exists
  touch "$OUT/$1.stop"
  if [ -f "$OUT/$1.port" ]; then # the sidecar's own sampler-duration histogram
    $PY -c "import sys,urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=5).read().decode())" \
      "$(cat "$OUT/$1.port")" >"$OUT/$1.metrics.txt" 2>&1
  fi
  [ "$MONITOR" = sidecar ] && kill -TERM "$2" 2>/dev/null
  wait "$2" 2>/dev/null
}

train() { # NAME ARGS... : runs train.py in the background, sets TRAIN_PID
  local name=$1
  shift
  $PY "$HERE/train.py" --step-log "$OUT/$name.steps.csv" --summary-json "$OUT/$name.summary.json" "$@" \
    >"$OUT/$name.train.log" 2>&1 &
  TRAIN_PID=$!
}

phase_bench() {
  log "bench: sampler cost, idle"
  "$PROBE" bench --samples 20000 >"$OUT/bench_idle.json" 2>&1
  cat "$OUT/bench_idle.json"
}

phase_steady() {
  local dur=${1:-180}
  log "steady: ${dur}s"
  nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv -lms 100 >"$OUT/steady.smi.csv" 2>&1 &
  local smi=$!
  start_monitor steady 10
  local m10=$MON_PID
  start_monitor steady1hz 1
  local m1=$MON_PID
  train steady --scenario steady --duration "$dur"
  local tr=$TRAIN_PID
  sleep 30
  $PY "$HERE/procstat.py" --window $((dur - 45)) --out "$OUT/steady.procstat.json" \
    monitor10hz=$m10 monitor1hz=$m1 nvidia_smi=$smi trainer=$tr >/dev/null &
  local ps=$!
  sleep 20
  log "steady: sampler cost under load"
  "$PROBE" bench --samples 20000 >"$OUT/bench_loaded.json" 2>&1
  wait $tr
  wait $ps
  sleep 2
  stop_monitor steady $m10
  stop_monitor steady1hz $m1
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  cat "$OUT/steady.procstat.json"
}

phase_ab() {
  local dur=${1:-120} win=${2:-15}
  log "ab: ${dur}s, ${win}s windows"
  train ab --scenario steady --duration "$dur"
  local tr=$TRAIN_PID t_end
  t_end=$(($(date +%s) + dur - 5))
  sleep 20
  local i=0
  echo "state,t0,t1" >"$OUT/ab.windows.csv"
  while [ $(($(date +%s) + win)) -le "$t_end" ]; do
    local t0 t1
    if [ $((i % 2)) -eq 0 ]; then
      t0=$(date +%s.%N)
      sleep "$win"
      t1=$(date +%s.%N)
      echo "off,$t0,$t1" >>"$OUT/ab.windows.csv"
    else
      start_monitor "ab$i" 10
      local m=$MON_PID
      sleep 1
      t0=$(date +%s.%N)
      sleep $((win - 1))
      t1=$(date +%s.%N)
      stop_monitor "ab$i" $m
      echo "on,$t0,$t1" >>"$OUT/ab.windows.csv"
    fi
    i=$((i + 1))
  done
  wait $tr
}

phase_spike() {
  local dur=${1:-120} at=${2:-80} gb=${3:-16} s=${4:-15}
  log "spike: ${dur}s, ${gb} GiB at ${at}s for ${s}s"
  start_monitor spike 10
  local m=$MON_PID
  train spike --scenario spike --duration "$dur" --spike-at "$at" --spike-gb "$gb" --spike-s "$s"
  wait $TRAIN_PID
  sleep 2
  stop_monitor spike $m
}

phase_leak() {
  local rate=${1:-100} head=${2:-24} maxdur=${3:-400}
  local name="leak$rate"
  log "leak: ${rate} MB/s, ${head} GB headroom, at most ${maxdur}s"
  start_monitor "$name" 10
  local m=$MON_PID
  train "$name" --scenario leak --leak-mbps "$rate" --headroom-gb "$head" --leak-start 20 --duration "$maxdur"
  wait $TRAIN_PID
  log "leak: trainer exited $?"
  sleep 3
  stop_monitor "$name" $m
  tail -n 2 "$OUT/$name.train.log"
}

phase_ddp() {
  local dur=${1:-90} batches=${2:-8/24}
  local n
  n=$(nvidia-smi -L | wc -l)
  log "ddp: ${n} ranks, batches ${batches}, ${dur}s"
  local pids=() r
  for ((r = 0; r < n; r++)); do
    start_monitor "ddp_rank$r" 10 --gpus "$r" --pod "train-$r" --rank "$r"
    pids+=("$MON_PID")
  done
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    $PY -m torch.distributed.run --standalone --nproc-per-node "$n" "$HERE/train.py" --scenario steady \
    --duration "$dur" --rank-batches "${batches//\//,}" --step-log "$OUT/ddp.steps.csv" --summary-json "$OUT/ddp.summary.json" \
    >"$OUT/ddp.train.log" 2>&1
  log "ddp: torchrun exited $?"
  for ((r = 0; r < n; r++)); do
    stop_monitor "ddp_rank$r" "${pids[$r]}"
  done
}

for p in "$@"; do
  name=${p%%:*}
  args=""
  [ "$name" != "$p" ] && args=${p#*:}
  IFS=, read -r -a a <<<"$args"
  "phase_$name" "${a[@]}"
done
log "done"
$PY "$HERE/summarize.py" "$OUT" || true
