#!/usr/bin/env bash
# Regenerates tests/fixtures/traces/ from run.sh output folders:
#   bench/gpu/make_fixtures.sh RUN2_DIR RUN3_DIR [RUN_DDP_DIR]
# RUN2_DIR holds steady and spike (spike:120,80,16,15), RUN3_DIR leak100/300/1000,
# RUN_DDP_DIR (nvidia-h200-x2) leak1000 and the ddp_rank* traces.
set -eu
R2=${1:?}
R3=${2:?}
DDP=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
DEST="$HERE/../../tests/fixtures/traces"
D="NVIDIA H100 80GB HBM3"
mk() { python3 "$HERE/make_fixture.py" --every 1 --device "$D" "$@"; }
mk "$R2" steady "$DEST/steady_h100.csv"
start=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['start'])" "$R2/spike.summary.json")
t0=$(awk -F, 'NR==2{printf "%d", int($1/10)*10}' "$R2/spike.trace.csv")
at=$(awk -v s="$start" -v t="$t0" 'BEGIN{printf "%.2f", s + 80 - t}')
mk "$R2" spike "$DEST/spike_h100.csv" --meta "spike_at_s=$at" --meta spike_seconds=15 --meta spike_gib=16
for r in 100 300 1000; do mk "$R3" "leak$r" "$DEST/leak${r}_h100.csv"; done
if [ -n "$DDP" ]; then
  # The H200 pair: a 1 GB/s leak with 100 GB free, and the two ranks of a DDP
  # job with batches 8 and 24 (each monitor read only its rank's GPU).
  H="NVIDIA H200"
  python3 "$HERE/make_fixture.py" --every 1 --device "$H" "$DDP" leak1000 "$DEST/leak1000_h200.csv"
  for r in 0 1; do
    python3 "$HERE/make_fixture.py" --every 2 --device "$H" "$DDP" "ddp_rank$r" \
      "$DEST/ddp_rank${r}_h200.csv" --steps "$DDP/ddp.steps.r$r.csv" \
      --summary "$DDP/ddp.summary.r$r.json" --meta "rank=$r"
  done
fi
