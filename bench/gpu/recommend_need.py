"""What a run needs under a cap, read from the allocator's own peaks, and
whether a request built on it is tight: completes at the request, fails
10 % below.

A capped caching allocator frees every cached segment that holds no live
block and retries before it fails, so what it cannot give back is the
memory of segments that still hold a live block: the allocated bytes plus
the free pieces split off inside those segments (torch's
`inactive_split_bytes`). The agent already reads both statistics; their
peaks (`allocated_bytes.all.peak`, `inactive_split_bytes.all.peak`) are an
upper bound of that memory at its own peak, which the reserved peak is too.

For each configuration (recommend_least.py's, and others):
  1. measure, uncapped: recommend_cap.py's run (STEPS training steps, an
     evaluation pass, a checkpoint) plus the two peaks above and the same
     sum sampled between the step's parts (after the forward, the backward,
     the optimizer step; during evaluation and the checkpoint);
  2. for each request rule below, the request as memprof_analysis::recommend
     computes it (need + context + margin, rounded up to 128 MiB), and fresh
     capped runs at the request and at 90 % of it (less the context, as
     recommend_cap.py caps).

Rules: `reserved` (today's: the reserved peak, at least the allocated),
`split` (allocated peak + inactive split peak), `least-of` (the smaller).

    CUDA_VISIBLE_DEVICES=N python3 bench/gpu/recommend_need.py OUT.json WORKERS [--measure-only] NAME...

Runs WORKERS configurations at once on the one GPU (each process has its
own allocator; a cap is a fraction of the whole card, so they do not
interfere while their sum fits). Writes OUT.json after every configuration.
"""
import io
import json
import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recommend_cap as rc  # noqa: E402
import recommend_least as rl  # noqa: E402

HELD_OUT = [
    ("lm-b12-s1024", {"WORKLOAD": "lm", "BATCH": "12", "SEQ": "1024"}),
    ("lm-b2-s2048", {"WORKLOAD": "lm", "BATCH": "2", "SEQ": "2048"}),
    ("lm-d1536-b8-s1024", {"WORKLOAD": "lm", "DIM": "1536", "LAYERS": "12", "HEADS": "12",
                           "BATCH": "8", "SEQ": "1024"}),
    ("lora-b24-s1024", {"WORKLOAD": "lora", "BATCH": "24", "SEQ": "1024"}),
    ("lora-b8-s512", {"WORKLOAD": "lora", "BATCH": "8", "SEQ": "512"}),
    ("cnn-b64", {"WORKLOAD": "cnn", "BATCH": "64"}),
    ("cnn-b192", {"WORKLOAD": "cnn", "BATCH": "192"}),
]
CONFIGS = dict(list(rl.CONFIGS.items()) + HELD_OUT)
RULES = ("reserved", "split", "least-of")


def held(torch):
    s = torch.cuda.memory_stats()
    return s.get("active_bytes.all.current", 0) + s.get("inactive_split_bytes.all.current", 0)


def measure():
    """rc.run_workload's run, with the allocator's peaks and sampled need."""
    import torch
    import estimate_workloads as w

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    kind = os.environ["WORKLOAD"]
    model, opt = w.build(kind, device)
    samples, reserved_after = [], []
    for _ in range(rc.STEPS):
        x, y = w.batch(kind, device)
        loss = w.loss_of(kind, model, x, y)
        samples.append(held(torch))
        loss.backward()
        samples.append(held(torch))
        opt.step()
        samples.append(held(torch))
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        reserved_after.append(torch.cuda.memory_reserved())
    model.eval()
    with torch.no_grad():
        x, y = w.batch(kind, device)
        w.loss_of(kind, model, x, y).item()
        samples.append(held(torch))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    samples.append(held(torch))
    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": s["allocated_bytes.all.peak"], "reserved": s["reserved_bytes.all.peak"],
        "activePeak": s["active_bytes.all.peak"],
        "inactiveSplitPeak": s["inactive_split_bytes.all.peak"],
        "heldSampledMax": max(samples), "reservedNow": torch.cuda.memory_reserved(),
        "deviceUsed": total - free, "deviceTotal": total, "reservedAfterStep": reserved_after,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
    }


def need_of(m, rule):
    reserved = max(m["reserved"], m["allocated"])
    split = m["allocated"] + m["inactiveSplitPeak"]
    return {"reserved": reserved, "split": split, "least-of": min(reserved, split)}[rule]


def request_of(m, need):
    """memprof_analysis::recommend's request for one rank: need + context + margin."""
    trend = m["reservedAfterStep"]
    half = len(trend) // 2
    late = max(trend) - max(trend[:half]) if half else 0
    margin = max(rc.MIN_MARGIN_BYTES, math.ceil(need * rc.MIN_MARGIN_FRACTION), late)
    total = need + rc.CONTEXT_BYTES + margin
    return -(-total // rc.STEP_BYTES) * rc.STEP_BYTES


def spawn_measure(env):
    t = time.time()
    p = subprocess.run([sys.executable, __file__, "--child-measure"], env=env,
                       capture_output=True, text=True, timeout=150)
    try:
        out = json.loads((p.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        out = {"error": (p.stderr or p.stdout)[-500:]}
    out["exit"], out["seconds"] = p.returncode, round(time.time() - t, 1)
    return out


def one(name, measure_only):
    env = dict(os.environ, **CONFIGS[name])
    m = spawn_measure(env)
    row = {"name": name, "env": CONFIGS[name], "heldOut": name in dict(HELD_OUT), "measured": m}
    if m["exit"] != 0 or measure_only:
        return row
    total, tried = m["deviceTotal"], {}
    for rule in RULES:
        request = request_of(m, need_of(m, rule))
        if request not in tried:
            at = (request - rc.CONTEXT_BYTES) / total
            below = (0.9 * request - rc.CONTEXT_BYTES) / total
            tried[request] = {"at": rc.spawn(env, "capped", at)["exit"],
                              "below": rc.spawn(env, "capped", below)["exit"]}
        row[rule] = dict(requestBytes=request, needBytes=need_of(m, rule), **tried[request])
    return row


def main():
    args = sys.argv[1:]
    out, workers = args[0], int(args[1])
    measure_only = "--measure-only" in args
    names = [a for a in args[2:] if not a.startswith("--")]
    rows, lock = [], threading.Lock()

    def run(n):
        r = one(n, measure_only)
        with lock:
            rows.append(r)
            with open(out, "w") as f:
                json.dump({"contextBytes": rc.CONTEXT_BYTES, "rows": rows}, f, indent=1)
            print(line(r), flush=True)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, names))


def line(r):
    m, mib = r["measured"], lambda b: f"{b / 2**20:,.0f}"
    if m.get("exit") != 0:
        return f"{r['name']}: measure failed: {m}"
    verdict = lambda c: {0: "ok", 3: "OOM"}.get(c, f"exit {c}")
    rules = " ".join(f"{k} {mib(r[k]['requestBytes'])} {verdict(r[k]['at'])}/{verdict(r[k]['below'])}"
                     for k in RULES if k in r)
    return (f"{r['name']:18} alloc {mib(m['allocated'])} reserved {mib(m['reserved'])} "
            f"split-peak {mib(m['inactiveSplitPeak'])} sampled {mib(m['heldSampledMax'])} {rules}")


if __name__ == "__main__":
    if sys.argv[1] == "--child-measure":
        print(json.dumps(measure()))
    else:
        main()
