#!/usr/bin/env bash
# A two-process torchrun on one GPU, profiled without Kubernetes and rolled
# up locally: torchrun starts one `memprof profile` per
# rank (--no-python), each profile starts its sidecar (NVML, GPU 0) and the
# rank's trainer with the agent auto-started (--agent-path, no code change);
# then `memprof rollup` rolls the two reports up with the operator's roll-up.
#
#   OUT=/some/dir bench/gpu/torchrun_local.sh
#
# The trainer (inline below, real PyTorch on cuda:0, no process group:
# torchrun's RANK/LOCAL_RANK/WORLD_SIZE are all the agent needs) holds
# (1 + RANK) GiB; rank 1 also keeps 64 MiB every 0.1 s for LEAK_SECONDS
# (a leak of ~640 MB/s). Self-checking: exits 1 and says why unless
#   - both profiles exit 0 and name their rank and pid in their summary;
#   - each rank's report has rank = RANK, node = this host, GPU 0, and the
#     agent's allocator section (its own process's numbers: rank 1's peak
#     allocated above rank 0's by at least 1 GiB);
#   - `memprof rollup` reads both: 2/2 ranks reporting, a bottleneck rank,
#     the agents of 2 ranks; rank 1's allocator growth is `leak`.
# Files under $OUT: node-rank{0,1}.json, rank{0,1}.txt (each profile's
# output), rollup.txt, rollup.json, torchrun.log, check.txt.
#
# Env: BIN (memprof binaries, default target/release), PY (python3, with
# torch), TORCHRUN (default: $PY -m torch.distributed.run), LEAK_SECONDS (20).
set -u
OUT=${OUT:?set OUT to the output directory}
BIN=${BIN:-target/release}
PY=${PY:-python3}
TORCHRUN=${TORCHRUN:-"$PY -m torch.distributed.run"}
LEAK_SECONDS=${LEAK_SECONDS:-20}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$BIN" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }
for b in memprof memprof-sidecar; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: build with cargo build --release" >&2; exit 2; }
done

cat >"$OUT/train.py" <<'EOF'
import os, sys, time
import torch
rank = int(os.environ["RANK"])
dev = torch.device("cuda:0")
import memprof_agent  # started already by the startup hook; step markers below
held = torch.empty((1 + rank) << 30, dtype=torch.uint8, device=dev)
kept = []
leak_seconds = float(sys.argv[1])
x = torch.randn(4096, 4096, device=dev)
began = time.time()
n = 0
while time.time() - began < leak_seconds + 5:
    memprof_agent.step(n)
    y = x @ x
    if rank == 1 and time.time() - began < leak_seconds:
        kept.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    time.sleep(0.1)
    n += 1
print("rank", rank, "pid", os.getpid(), "steps", n, "kept", len(kept))
EOF

# Each rank's profile writes its own output: torchrun gives each its RANK.
cat >"$OUT/rank.sh" <<EOF
#!/usr/bin/env bash
exec "$BIN/memprof" profile --devices 0 --interval 200ms \\
  --thresholds '{"bucketSeconds":2,"fitWindowSeconds":20,"trustSpanSeconds":10}' \\
  --agent-path "$ROOT/agent/python" --output "$OUT/node-rank{rank}.json" \\
  -- "$PY" "$OUT/train.py" "$LEAK_SECONDS" >"$OUT/rank\$RANK.txt" 2>&1
EOF
chmod +x "$OUT/rank.sh"

log "torchrun --nproc_per_node 2 --no-python rank.sh (memprof profile per rank)"
$TORCHRUN --standalone --nproc_per_node 2 --no-python "$OUT/rank.sh" >"$OUT/torchrun.log" 2>&1
RC=$?
log "torchrun exited $RC"
"$BIN/memprof" rollup "$OUT"/node-rank0.json "$OUT"/node-rank1.json --expected-ranks 2 >"$OUT/rollup.txt" 2>&1
"$BIN/memprof" rollup -o json "$OUT"/node-rank0.json "$OUT"/node-rank1.json --expected-ranks 2 >"$OUT/rollup.json" 2>>"$OUT/rollup.txt"
cat "$OUT/rollup.txt"

"$PY" - "$OUT" "$RC" <<'EOF' | tee "$OUT/check.txt"
import json, os, socket, sys
out, rc = sys.argv[1], int(sys.argv[2])
bad = []
def need(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        bad.append(what)
need(rc == 0, "torchrun and both profiles exited 0 (rc %d)" % rc)
reports = []
for r in (0, 1):
    text = open(os.path.join(out, "rank%d.txt" % r)).read()
    need("(rank %d, pid " % r in text, "rank %d's summary names its rank and pid" % r)
    try:
        rep = json.load(open(os.path.join(out, "node-rank%d.json" % r)))
    except Exception as e:
        need(False, "rank %d's report: %s" % (r, e))
        continue
    reports.append(rep)
    need(rep.get("rank") == r, "rank %d's report has rank %s" % (r, rep.get("rank")))
    need(bool(rep.get("nodeName")), "rank %d's report names its node (%s)" % (r, rep.get("nodeName")))
    need([g["index"] for g in rep.get("gpus", [])] == [0], "rank %d's report is about GPU 0" % r)
    need(rep.get("allocator") is not None, "rank %d's agent reached its own profile" % r)
if len(reports) == 2 and all(r.get("allocator") for r in reports):
    p0 = reports[0]["allocator"].get("peakAllocatedBytes") or 0
    p1 = reports[1]["allocator"].get("peakAllocatedBytes") or 0
    need(p1 - p0 >= 1 << 30, "each rank's allocator is its own process's (peak allocated %.1f vs %.1f GiB)" % (p0 / 2**30, p1 / 2**30))
    need(reports[1]["allocator"].get("growth") == "leak", "rank 1's growth is leak (%s)" % reports[1]["allocator"].get("growth"))
try:
    st = json.load(open(os.path.join(out, "rollup.json")))
    need(st.get("ranks") == "2/2", "rollup: 2/2 ranks reporting (%s)" % st.get("ranks"))
    need((st.get("bottleneck") or {}).get("rank") in (0, 1), "rollup names a bottleneck rank (%s)" % st.get("bottleneck"))
    need((st.get("allocator") or {}).get("ranksWithAgent") == 2, "rollup: the agents of 2 ranks")
except Exception as e:
    need(False, "rollup.json: %s" % e)
print("PASS" if not bad else "FAILED: %d check(s)" % len(bad))
sys.exit(1 if bad else 0)
EOF
