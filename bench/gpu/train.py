#!/usr/bin/env python3
"""A small real trainer for memprof's GPU scenarios.

A decoder-only transformer trains on synthetic tokens with bf16 autocast and
AdamW. Every `--peak-every` steps it runs a longer sequence, so activations
peak periodically (what a sidecar sees as a saw-tooth over the allocator's
staircase). Scenarios:

  steady  no leak, no spike: the sidecar must never say high/critical;
  leak    keeps `--leak-mbps` MB/s of GPU tensors alive until the real CUDA OOM;
          `--headroom-gb` of free memory is left after a ballast so the OOM
          comes within minutes;
  spike   holds an extra `--spike-gb` GiB for `--spike-s` seconds at `--spike-at` s.

Per step it logs `t,step,step_ms,allocated,reserved,max_reserved,dev_used`
(Unix seconds; bytes; dev_used from cudaMemGetInfo). At the end (or at the
OOM) it writes a JSON summary with the OOM time, the allocator peak and the
step-time median. DDP: run under torchrun; `--batch` may differ per rank via
`--rank-batches 8,16`.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MB = 1_000_000
GIB = 1 << 30


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.fc2 = nn.Linear(4 * d, d, bias=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=["steady", "leak", "spike"], default="steady")
    p.add_argument("--duration", type=float, default=120, help="seconds of training (leak: upper bound)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rank-batches", default="", help="per-rank batch sizes for DDP, comma-separated")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--peak-every", type=int, default=10, help="every N steps, a 2x longer sequence")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--leak-mbps", type=float, default=100.0)
    p.add_argument("--leak-start", type=float, default=20.0, help="seconds of clean training before the leak")
    p.add_argument("--headroom-gb", type=float, default=0.0, help="leave this much free after a ballast (0: no ballast)")
    p.add_argument("--spike-at", type=float, default=60.0)
    p.add_argument("--spike-gb", type=float, default=16.0)
    p.add_argument("--spike-s", type=float, default=15.0)
    p.add_argument("--step-log", dest="log", default="", help="per-step CSV")
    p.add_argument("--summary-json", dest="summary", default="", help="JSON summary")
    return p.parse_args()


def main():
    a = parse()
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    if ddp:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
    dev = torch.device("cuda", torch.cuda.current_device())
    if a.rank_batches:
        a.batch = int(a.rank_batches.split(",")[rank])
    if ddp:
        a.log = a.log.replace(".csv", f".r{rank}.csv") if a.log else ""
        a.summary = a.summary.replace(".json", f".r{rank}.json") if a.summary else ""
    torch.manual_seed(1234 + rank)
    model = GPT(a.vocab, a.d_model, a.layers, a.heads, 2 * a.seq).to(dev)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    log = open(a.log, "w") if a.log else None
    if log:
        log.write("t,step,step_ms,allocated,reserved,max_reserved,dev_used\n")
    gen = torch.Generator(device=dev).manual_seed(99 + rank)
    leak, kept = [], 0
    ballast = None
    spike = None
    oom_at = None
    oom_msg = ""
    step_ms = []
    start = time.time()
    leak_from = None
    step = 0
    try:
        while True:
            now = time.time()
            el = now - start
            if el >= a.duration:
                break
            # Leave `headroom_gb` free once the allocator has warmed up: after two
            # peak steps its cache holds the peak working set, so what the driver
            # still has free is what a leak can take.
            if a.headroom_gb > 0 and ballast is None and step == 2 * a.peak_every:
                torch.cuda.synchronize()
                free, _ = torch.cuda.mem_get_info()
                size = int(free - a.headroom_gb * 1e9)
                if size > 0:
                    ballast = torch.empty(size, dtype=torch.uint8, device=dev)
                    ballast.fill_(1)
                leak_from = time.time() + a.leak_start
            if a.scenario == "leak":
                if leak_from is None and a.headroom_gb <= 0 and el >= a.leak_start:
                    leak_from = now
                if leak_from is not None and now >= leak_from:
                    want = int(a.leak_mbps * MB * (now - leak_from))
                    if want - kept >= 1 << 20:
                        n = want - kept
                        # A tensor kept every step: what a list of losses with graphs,
                        # a growing cache or a metrics buffer on the GPU does.
                        leak.append(torch.ones(n, dtype=torch.uint8, device=dev))
                        kept += n
            if a.scenario == "spike":
                if spike is None and a.spike_at <= el < a.spike_at + a.spike_s:
                    spike = torch.ones(int(a.spike_gb * GIB), dtype=torch.uint8, device=dev)
                elif spike is not None and el >= a.spike_at + a.spike_s:
                    spike = None
                    torch.cuda.empty_cache()
            seq = 2 * a.seq if a.peak_every and step % a.peak_every == a.peak_every - 1 else a.seq
            x = torch.randint(0, a.vocab, (a.batch, seq + 1), device=dev, generator=gen)
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x[:, :-1])
                loss = F.cross_entropy(logits.float().view(-1, a.vocab), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            step_ms.append(ms)
            if log:
                free, total = torch.cuda.mem_get_info()
                log.write(
                    f"{time.time():.3f},{step},{ms:.3f},{torch.cuda.memory_allocated()},"
                    f"{torch.cuda.memory_reserved()},{torch.cuda.max_memory_reserved()},{total - free}\n"
                )
                if step % 50 == 0:
                    log.flush()
            step += 1
    except torch.OutOfMemoryError as e:
        oom_at = time.time()
        oom_msg = str(e).splitlines()[0][:300]
    if log:
        log.close()
    summary = {
        "rank": rank,
        "scenario": a.scenario,
        "batch": a.batch,
        "start": start,
        "leakFrom": leak_from,
        "leakMBps": a.leak_mbps if a.scenario == "leak" else 0,
        "oomAt": oom_at,
        "oomMessage": oom_msg,
        "steps": step,
        "stepMsMedian": sorted(step_ms)[len(step_ms) // 2] if step_ms else None,
        "maxMemoryReserved": torch.cuda.max_memory_reserved(),
        "maxMemoryAllocated": torch.cuda.max_memory_allocated(),
        "ballastBytes": ballast.numel() if ballast is not None else 0,
        "keptBytes": kept,
        "totalBytes": torch.cuda.mem_get_info()[1],
    }
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)
    if ddp:
        if oom_at is None:
            torch.distributed.destroy_process_group()
    sys.exit(1 if oom_at else 0)


if __name__ == "__main__":
    main()
