#!/usr/bin/env python3
"""GPU measurement of memprof_agent.track and of the
size histogram's allocator snapshot (item 5).

bench/gpu/train.py's GPT (d=1024, 8 layers, bf16 autocast, AdamW) on
synthetic tokens, in phases of a fixed number of steps:

  A     no tracking: median step time;
  B     track(every=1): a sample at every step (the worst case): median step
        time, the sample's own time, objects walked, tensors found;
  C     track(every=20): the amortised cost;
  A'    no tracking again (drift);
  leak  the trainer keeps a [64, 1024] float32 CUDA tensor and a CPU
        tensor from every step in a list, track(every=5): the top tensor
        grower must be cuda:0 float32 [64, 1024] with +5 tensors and +5 x
        256 KiB, the CPU one must be there too, and `list` must not be a
        grower (one list that grows in length counts once);
  sites the same with allocation history recording on
        (_record_memory_history, python stacks): the leak's site must name
        this file's line; the snapshot's cost is printed;
  sizes the size histogram's reading (memory_stats + _snapshot) without
        and with history recording: its time and buckets.

    OUT=/some/dir python3 bench/gpu/tracking_cost.py

Prints the numbers; exits 1 when a correctness check fails (costs are
reported, not judged). Under a minute on an H100.
"""
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "agent", "python"))
sys.path.insert(0, HERE)
import memprof_agent  # noqa: E402
from memprof_agent import _sizes, _tracking  # noqa: E402
from train import GPT  # noqa: E402

OUT = os.environ.get("OUT", ".")
os.makedirs(OUT, exist_ok=True)
VOCAB, D, LAYERS, HEADS, SEQ, BATCH = 32000, 1024, 8, 16, 512, 8
FAILED = []
KEPT = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def setup():
    torch.manual_seed(0)
    model = GPT(VOCAB, D, LAYERS, HEADS, SEQ).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)


def train_step(model, opt, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def leak_one():
    KEPT.append(torch.randn(64, 1024, device="cuda"))  # the line the sites phase must name
    KEPT.append(torch.zeros(256))


def phase(model, opt, x, steps, leak=False):
    """Median step time (ms) and the samples taken, as (ms, [sample seconds])."""
    times, samples = [], []
    for _ in range(steps):
        before = _tracking.TRACKER.samples[-1] if _tracking.TRACKER.samples else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        memprof_agent.step()  # takes the sample when one is due
        train_step(model, opt, x)
        if leak:
            leak_one()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        after = _tracking.TRACKER.samples[-1] if _tracking.TRACKER.samples else None
        if after is not None and after is not before:
            samples.append(after.seconds)
    return statistics.median(times[3:]) * 1e3, samples


def costs(model, opt, x):
    out = {}
    memprof_agent.track(False)
    out["A_ms"], _ = phase(model, opt, x, 30)
    memprof_agent.track(every=1)
    out["B_ms"], s = phase(model, opt, x, 30)
    r = _tracking.TRACKER.result
    out["B_sample_ms"] = statistics.median(s) * 1e3
    out["objects"], out["tensors"] = r["scannedObjects"], r["liveTensors"]
    t0 = time.perf_counter()
    gc.collect()
    out["gc_collect_ms"] = (time.perf_counter() - t0) * 1e3
    memprof_agent.track(every=20)
    out["C_ms"], _ = phase(model, opt, x, 60)
    memprof_agent.track(False)
    out["A2_ms"], _ = phase(model, opt, x, 30)
    for k, v in out.items():
        print("  %-14s %s" % (k, "%.2f" % v if isinstance(v, float) else v), flush=True)
    return out


def leak(model, opt, x, sites):
    del KEPT[:]
    _tracking.TRACKER.__init__()
    memprof_agent.track(every=5, sites=sites)
    _, samples = phase(model, opt, x, 16, leak=True)
    r = _tracking.TRACKER.result
    print(memprof_agent.tracking_report(), flush=True)
    top = r["tensors"][0] if r["tensors"] else {}
    check(top.get("device") == "cuda:0" and top.get("dtype") == "float32" and top.get("shape") == [64, 1024]
          and top.get("count") == 5 and top.get("bytes") == 5 * 64 * 1024 * 4,
          "the leak is the top tensor grower: %s" % json.dumps(top))
    cpu = [g for g in r["tensors"] if g["device"] == "cpu" and g["shape"] == [256]]
    check(bool(cpu) and cpu[0]["count"] == 5, "the CPU leak is there too: %s" % cpu[:1])
    check(not any(o["type"] == "list" for o in r["objects"]), "a list growing in length is not a growing type")
    if sites:
        check(r["siteSource"] == "history" and "tracking_cost.py" in (top.get("site") or ""),
              "the leak's allocating site names this file: %s" % top.get("site"))
    else:
        check(r["siteSource"] == "none" and top.get("site") is None, "no history: the site is unknown")
    memprof_agent.track(False)
    return {"result": r, "sample_ms": [x * 1e3 for x in samples]}


def sizes(label):
    s = _sizes.Sizes()
    t0 = time.perf_counter()
    s.read(torch, time.monotonic())
    total = (time.perf_counter() - t0) * 1e3
    out = dict(s.last, reading_ms=total)
    print("  %-8s reading %.2f ms (snapshot %.2f ms), %s blocks, source %s, buckets %s" % (
        label, total, 1e3 * (out.get("snapshotSeconds") or 0), out.get("blocks"), out["source"], out["buckets"]), flush=True)
    check(out["source"] == "snapshot" or label == "history", "%s: the histogram comes from the snapshot" % label)
    return out


def main():
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)), flush=True)
    model, opt = setup()
    x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda")
    for _ in range(3):
        train_step(model, opt, x)
    report = {}
    print("== costs (ms per step; sample ms)", flush=True)
    report["costs"] = costs(model, opt, x)
    print("== sizes", flush=True)
    report["sizes"] = sizes("plain")
    print("== leak, no history", flush=True)
    report["leak"] = leak(model, opt, x, sites=None)
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    print("== leak, with history", flush=True)
    report["leak_sites"] = leak(model, opt, x, sites=True)
    report["sizes_history"] = sizes("history")
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(os.path.join(OUT, "tracking_cost.json"), "w") as f:
        json.dump({"failed": FAILED, **report}, f, indent=1, default=str)
    print("FAILED: %s" % FAILED if FAILED else "all checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
