#!/usr/bin/env bash
# Issue 29's recording of one causes set (record.sh) in one device call, with
# nvidia-smi's view before and after. causes-dev holds the in-process
# remediation pair (demandsplit beside its control, growdemand).
#
#   bench/gpu/causes.sh OUTDIR causes-dev|causes-heldout [GPU_INDEX]
#
# From the repository root, .gpu/memprof-sidecar built here. OUTDIR gets
# SET.tar.gz (record.sh's archive), SET.log (its console) and SET.env.txt.
# DEADLINE_S defaults to 400 for causes-dev and 530 for causes-heldout: each
# fits one 10-minute call with its archive.
set -u
OUT=${1:?usage: $0 OUTDIR SET [GPU_INDEX]}
SET=${2:?usage: $0 OUTDIR SET [GPU_INDEX]}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
case $SET in causes-dev) d=400 ;; *) d=530 ;; esac
export DEADLINE_S=${DEADLINE_S:-$d} MIN_S=${MIN_S:-12} GPU_INDEX=${3:-0}
{
  nvidia-smi
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count())'
  echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-} (unset for the recording: no expandable_segments)"
} >"$OUT/$SET.env.txt" 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
bash "$HERE/record.sh" "$OUT/$SET" "$SET" >"$OUT/$SET.log" 2>&1
echo "record.sh exit $?" >>"$OUT/$SET.env.txt"
nvidia-smi >>"$OUT/$SET.env.txt" 2>&1
