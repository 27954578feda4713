#!/usr/bin/env python3
"""Trainer scenarios for the in-process agent, beside train.py's:

  grow   the model of train.py with a sequence length that grows every
         --grow-every seconds: the allocator's cache grows, nothing leaks;
  frag   no model: tensors of alternating sizes under an allocator limit of
         --headroom-gb, which splits cached blocks and makes the allocator
         free its cache and retry (run it with and without
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True);
  ab     the model of train.py, steady, with the agent stopped and started
         in alternating windows of --window seconds (the one scenario that
         calls the agent: the A/B needs it); prints the median step time of
         each side.

The agent is started by the startup hook (PYTHONPATH), not by this file,
except for ab's toggling. Writes a JSON summary (--summary-json).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import GPT  # noqa: E402

MB = 1 << 20


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["grow", "frag", "ab"])
    p.add_argument("--duration", type=float, default=120)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256, help="grow: first sequence length")
    p.add_argument("--seq-step", type=int, default=128)
    p.add_argument("--grow-every", type=float, default=10)
    p.add_argument("--headroom-gb", type=float, default=8, help="frag: the allocator's memory limit")
    p.add_argument("--window", type=float, default=10, help="ab: seconds per window")
    p.add_argument("--summary-json", default="")
    return p.parse_args()


def model_and_opt(dev, max_len):
    torch.manual_seed(1234)
    model = GPT(32000, 1024, 8, 16, max_len).to(dev)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)


def train_step(model, opt, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def grow(a, dev):
    max_seq = a.seq + a.seq_step * int(a.duration / a.grow_every + 1)
    model, opt = model_and_opt(dev, max_seq)
    start, steps, seq = time.time(), 0, a.seq
    while time.time() - start < a.duration:
        seq = a.seq + a.seq_step * int((time.time() - start) / a.grow_every)
        x = torch.randint(0, 32000, (a.batch, seq + 1), device=dev)
        train_step(model, opt, x)
        steps += 1
    torch.cuda.synchronize()
    return {"start": start, "steps": steps, "lastSeq": seq}


def frag(a, dev):
    """Tensors of a new size each round (20, 28, 36, 24, 32 MB), every other
    one kept into the next round, within a --headroom-gb allocator limit
    (set_per_process_memory_fraction): cached blocks of the wrong size are
    split or useless, so the allocator keeps freeing its cache and retrying."""
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(a.headroom_gb * 1e9 / total, dev)
    budget = a.headroom_gb * 1e9 * 0.8
    sizes = [20, 28, 36, 24, 32]
    kept = []
    start, rounds, ooms = time.time(), 0, 0
    while time.time() - start < a.duration:
        size = sizes[rounds % len(sizes)] * MB
        try:
            new = [torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(int(budget / 2 / size))]
            kept = new[::2]
            del new
            time.sleep(0.5)  # held: what a push sees
        except torch.OutOfMemoryError:
            ooms += 1
            kept = []
            time.sleep(0.1)
        rounds += 1
    stats = torch.cuda.memory_stats()
    return {"start": start, "rounds": rounds, "oomsCaught": ooms,
            "numAllocRetries": stats.get("num_alloc_retries"),
            "inactiveSplitBytes": stats.get("inactive_split_bytes.all.current"),
            "reservedBytes": stats.get("reserved_bytes.all.current"),
            "allocConf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def ab(a, dev):
    import memprof_agent

    model, opt = model_and_opt(dev, 1024)
    x = torch.randint(0, 32000, (a.batch, 1024 + 1), device=dev)
    for _ in range(20):  # warm-up
        train_step(model, opt, x)
    torch.cuda.synchronize()
    times = {"on": [], "off": []}
    start = time.time()
    window = 0
    while time.time() - start < a.duration:
        side = "on" if window % 2 == 0 else "off"
        if side == "on":
            memprof_agent.start()
        else:
            memprof_agent.stop()
        end = time.time() + a.window
        while time.time() < end:
            t0 = time.perf_counter()
            train_step(model, opt, x)
            torch.cuda.synchronize()
            times[side].append((time.perf_counter() - t0) * 1e3)
        window += 1
    memprof_agent.start()
    med = {k: statistics.median(v) for k, v in times.items() if v}
    return {"start": start, "steps": {k: len(v) for k, v in times.items()},
            "stepMsMedian": med,
            "overheadPercent": 100 * (med["on"] / med["off"] - 1) if len(med) == 2 else None}


def main():
    a = parse()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    out = {"scenario": a.scenario, **{"grow": grow, "frag": frag, "ab": ab}[a.scenario](a, dev)}
    out["end"] = time.time()
    if a.summary_json:
        with open(a.summary_json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
