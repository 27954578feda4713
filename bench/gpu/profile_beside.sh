#!/usr/bin/env bash
# `memprof profile` beside a real PyTorch job on this machine's GPU (NVML):
# the trainer (train.py, scenario leak: clean steps, then 1 GB/s of tensors
# kept alive until the real CUDA OOM, with a ballast leaving 16 GB free so
# it comes within the window) starts first; `memprof profile --duration 30`
# watches it, prints its plain progress lines and the summary table, and draws
# the timeline. Then `memprof analyze` reads the trace the profile kept.
#
#   OUT=/some/dir bench/gpu/profile_beside.sh
#
# Everything goes under $OUT: profile.txt (progress + summary table),
# profile_summary.txt (the table alone), profile.svg, profile.json (final
# report), profile.csv (every sample), analyze.txt, analyze.svg, train.log,
# train_steps.csv, train_summary.json. Runs in about a minute.
#
# Env: BIN (memprof binaries, default target/release), PY (python3),
# LEAK_MBPS (1000), HEADROOM_GB (16), THRESHOLDS: analysis thresholds for
# both commands; by default a short horizon (2 s buckets, 20 s fit window,
# trusted after 10 s) so that a 30 s profile can call a trend; set it to
# '{}' for the defaults (10 s buckets, 300 s window, 60 s trust).
set -u
OUT=${OUT:?set OUT to the output directory}
BIN=${BIN:-target/release}
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
THRESHOLDS=${THRESHOLDS:-'{"bucketSeconds":2,"fitWindowSeconds":20,"trustSpanSeconds":10}'}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }

for b in memprof memprof-sidecar; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: build with cargo build --release" >&2; exit 2; }
done

log "trainer: leak ${LEAK_MBPS:-1000} MB/s after 8 s, ${HEADROOM_GB:-16} GB headroom"
"$PY" "$HERE/train.py" --scenario leak --leak-mbps "${LEAK_MBPS:-1000}" --leak-start 8 \
  --headroom-gb "${HEADROOM_GB:-16}" --duration 60 \
  --step-log "$OUT/train_steps.csv" --summary-json "$OUT/train_summary.json" \
  >"$OUT/train.log" 2>&1 &
TRAIN=$!
# Let the trainer come up (imports, CUDA context: ~12 s on an H100 box) so
# the 30 s window holds its steps, its leak and its OOM: wait for its first
# logged step, at most 60 s.
for _ in $(seq 120); do
  [ -s "$OUT/train_steps.csv" ] && [ "$(wc -l <"$OUT/train_steps.csv")" -ge 2 ] && break
  kill -0 "$TRAIN" 2>/dev/null || break
  sleep 0.5
done

log "memprof profile --duration 30"
"$BIN/memprof" profile --duration 30 --interval 200ms --thresholds "$THRESHOLDS" \
  --plot "$OUT/profile.svg" --output "$OUT/profile.json" --trace-out "$OUT/profile.csv" \
  >"$OUT/profile.txt" 2>"$OUT/profile.err"
PROFILE_RC=$?
log "memprof profile exited $PROFILE_RC"
sed -n '/^memprof profile:/,$p' "$OUT/profile.txt" >"$OUT/profile_summary.txt"
cat "$OUT/profile_summary.txt"

# The trainer ends at its OOM or its --duration; stop it by PID if not.
if kill -0 "$TRAIN" 2>/dev/null; then
  kill -TERM "$TRAIN" 2>/dev/null
fi
wait "$TRAIN" 2>/dev/null
log "trainer exited $? (1 = the CUDA OOM it was driven to)"

log "memprof analyze"
"$BIN/memprof" analyze "$OUT/profile.csv" --thresholds "$THRESHOLDS" \
  --plot "$OUT/analyze.svg" >"$OUT/analyze.txt" 2>&1
log "memprof analyze exited $?"
head -30 "$OUT/analyze.txt"
exit "$PROFILE_RC"
