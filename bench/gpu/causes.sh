#!/usr/bin/env bash
# The recording of one causes set (record.sh) on one GPU, with nvidia-smi's
# view before and after. Two sets ran at once on a two-GPU machine, one per
# GPU, in one device call (docs/gpu-results.md says which).
#
#   bench/gpu/causes.sh OUTDIR causes-dev|causes-heldout|causes-fresh|causes-fresh2 [GPU_INDEX]
#
# From the repository root, .gpu/memprof-sidecar built here. OUTDIR gets
# SET.tar.gz (record.sh's archive), SET.log (its console) and SET.env.txt.
# DEADLINE_S defaults to 545 s: a set fits one 10-minute call with its
# archive.
set -u
OUT=${1:?usage: $0 OUTDIR SET [GPU_INDEX]}
SET=${2:?usage: $0 OUTDIR SET [GPU_INDEX]}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export DEADLINE_S=${DEADLINE_S:-545} MIN_S=${MIN_S:-12} GPU_INDEX=${3:-0}
{
  nvidia-smi
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count())'
  echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-} (unset for the recording: no expandable_segments)"
} >"$OUT/$SET.env.txt" 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
bash "$HERE/record.sh" "$OUT/$SET" "$SET" >"$OUT/$SET.log" 2>&1
echo "record.sh exit $?" >>"$OUT/$SET.env.txt"
nvidia-smi >>"$OUT/$SET.env.txt" 2>&1
