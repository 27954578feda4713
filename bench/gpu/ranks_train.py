#!/usr/bin/env python3
"""One torchrun rank of bench/gpu/ranks_sidecar.sh: weights, a step's
activations allocated and freed, and on rank LEAK_RANK a leak of RATE MB/s
kept until DURATION ends (stopped well before the GPU fills). Each rank
uses cuda:(LOCAL_RANK % device_count): on a one-GPU machine every rank
shares GPU 0, as ranks that see one device do.

    ranks_train.py --duration S --leak-rank R --leak-mbps RATE
"""
import argparse
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--duration", type=float, default=120.0)
ap.add_argument("--leak-rank", type=int, default=1)
ap.add_argument("--leak-mbps", type=float, default=100.0)
args = ap.parse_args()

rank = int(os.environ.get("LOCAL_RANK", "0"))
dev = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(dev)
weights = torch.empty(int(1.5e9) // 4, dtype=torch.float32, device=dev)  # 1.5 GB
kept = []
start = time.time()
step = 0
while time.time() - start < args.duration:
    act = torch.empty(int(0.5e9) // 4, dtype=torch.float32, device=dev)  # the step's activations
    act.fill_(1.0)
    del act
    if rank == args.leak_rank:
        kept.append(torch.empty(int(args.leak_mbps * 1e6 * 0.1) // 4, dtype=torch.float32, device=dev))
    step += 1
    time.sleep(0.1)
torch.cuda.synchronize()
print("rank %d pid %d steps %d kept %.2f GB" % (rank, os.getpid(), step, sum(t.numel() * 4 for t in kept) / 1e9))
