#!/usr/bin/env bash
# `memprof node-check` on a real GPU machine: does it find the
# GPU device nodes and say which gpuAccess mode to pick? Self-checking: exits
# non-zero when nvidia-smi sees GPUs but node-check finds none, when the
# number of /dev/nvidiaN it lists differs from nvidia-smi's count, or when it
# picks no mode. The lab's machine is a container, not a Kubernetes node:
# no kubelet socket and usually no runtime config, so `agentOnly` (or
# `envvar` if a runtime config is mounted) is the expected pick; what this
# proves is the device discovery and that it runs on a GPU host.
#
#   bench/gpu/node_check.sh OUTDIR
#
# Needs the release binary: cargo build --release --bin memprof.
set -euo pipefail
OUT=${1:?usage: node_check.sh OUTDIR}
MEMPROF=${MEMPROF:-target/release/memprof}
mkdir -p "$OUT"

nvidia-smi -L >"$OUT/nvidia-smi-L.txt"
gpus=$(grep -c '^GPU ' "$OUT/nvidia-smi-L.txt" || true)
ls -l /dev/nvidia* >"$OUT/dev-nvidia.txt" 2>&1 || true

set +e
"$MEMPROF" node-check >"$OUT/node-check.txt" 2>"$OUT/node-check.err"
rc=$?
set -e
cat "$OUT/node-check.txt"

fail() { echo "node_check: FAIL: $*" >&2; exit 1; }
[ "$gpus" -gt 0 ] || fail "nvidia-smi lists no GPU: not a GPU machine"
[ "$rc" -eq 0 ] || fail "node-check exited $rc with $gpus GPU(s) present"
listed=$(grep -o '^OK    [0-9]* GPU device node(s)' "$OUT/node-check.txt" | grep -o '[0-9]\+' || true)
[ "${listed:-0}" -eq "$gpus" ] || fail "node-check lists ${listed:-0} device node(s), nvidia-smi $gpus"
grep -q '^pick: gpuAccess=\(envvar\|agentOnly\): ' "$OUT/node-check.txt" || fail "no pick line"
echo "node_check: OK ($gpus GPU(s); $(grep -o 'gpuAccess=[A-Za-z]*' "$OUT/node-check.txt"))"
