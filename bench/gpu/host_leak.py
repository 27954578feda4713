#!/usr/bin/env python3
"""A trainer that leaks host memory: a small model trains
on the GPU while a Python list keeps CPU tensors at a paced rate (a list of
per-step CPU copies, the classic host leak), so the agent's `host` field
(RSS and the cgroup) grows while GPU memory stays flat.

    python3 host_leak.py --leak-mbps 30 --duration 100 --summary S.json

Writes the measured host growth (RSS at start and end) into the summary.
Run by bench/gpu/host_leak.sh beside `memprof profile`.
"""
import argparse
import json
import os
import time

import torch


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--leak-mbps", type=float, default=30.0)
    p.add_argument("--duration", type=float, default=100.0)
    p.add_argument("--summary", required=True)
    a = p.parse_args()
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept, kept_bytes = [], 0
    start = time.time()
    rss0 = rss()
    while time.time() - start < a.duration:
        x = torch.randn(64, 4096, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        due = a.leak_mbps * 1e6 * (time.time() - start)
        while kept_bytes < due:
            # torch.ones touches its pages: they count in the RSS (torch.empty would not).
            t = torch.ones(4 * 1024 * 1024, dtype=torch.uint8)
            kept.append(t)
            kept_bytes += t.numel()
        time.sleep(0.01)
    end = time.time()
    with open(a.summary, "w") as f:
        json.dump({"leakMBps": a.leak_mbps, "seconds": end - start, "keptBytes": kept_bytes,
                   "rssStart": rss0, "rssEnd": rss(), "measuredBytesPerSecond": (rss() - rss0) / (end - start)}, f)


if __name__ == "__main__":
    main()
