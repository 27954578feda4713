#!/usr/bin/env bash
# One device call on 2 GPUs (nvidia-h200-x2), under one deadline:
#   1. the held-out DDP and FSDP2 estimate points, every rank
#      (estimate_calibrate.py --ranks-only; real runs start in the first
#      third of the budget, their fake runs beside them on the CPU);
#   2. the need check on their ranks (recommend_need_ranks.py NAME...).
# Everything lands packed in OUT/need-ranks.tgz, also when a step fails.
#
#   bash bench/gpu/need_ranks.sh OUT SECONDS NAME...
set -u
out=$1 budget=$2
shift 2
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=$PWD/agent/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# NVLink multicast stays off: a program using it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
d=$out/r
mkdir -p "$d/est" "$d/need"
trap 'tar czf "$out/need-ranks.tgz" -C "$d" .' EXIT
{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
} >"$d/gpus.txt" 2>&1
cat "$d/gpus.txt"
timeout $((budget / 2)) python3 bench/gpu/estimate_calibrate.py --out "$d/est" --ranks-only \
  --until $((start + budget / 3)) 2>&1 | tee "$d/est.txt"
left=$((start + budget - $(date +%s)))
timeout "$left" python3 bench/gpu/recommend_need_ranks.py "$d/need" --until $((start + budget)) "$@" 2>&1 |
  tee "$d/need.txt"
echo "wall $(($(date +%s) - start)) s"
