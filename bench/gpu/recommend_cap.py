"""Does the recommendation hold on the GPU? For each workload of
estimate_workloads.py (a decoder LM at two sizes, a LoRA fine-tune, a CNN):

  1. measure: STEPS training steps, an evaluation pass and a checkpoint
     (model and optimizer state saved to host memory), uncapped; the
     trainer's own peak (torch.cuda.max_memory_reserved, at least
     max_memory_allocated) and the reserved after each step;
  2. the request, as memprof_analysis::recommend computes it from the same
     evidence: peak + CUDA context (calibration.json contextBytes; one rank,
     no NCCL) + margin (the larger of 64 MiB, 2 % of the peak, the reserved
     cache's growth over the later half of the steps), rounded up to 128 MiB;
  3. the same run again in a fresh process, the caching allocator capped
     with torch.cuda.set_per_process_memory_fraction at the request less
     the context (what the allocator may hold when the request is the
     process's whole GPU memory), then at 90 % of the request less the
     context. Each capped run completes (exit 0) or raises CUDA OOM (exit 3).

    python3 bench/gpu/recommend_cap.py all OUTDIR     # the table, OUTDIR/recommend_cap.json
"""

import io
import json
import math
import os
import subprocess
import sys
import time

CONTEXT_BYTES = 804_061_184
STEP_BYTES = 128 << 20
MIN_MARGIN_BYTES = 64 << 20
MIN_MARGIN_FRACTION = 0.02
STEPS = 8

CONFIGS = [
    ("lm-b8-s1024", {"WORKLOAD": "lm", "BATCH": "8", "SEQ": "1024"}),
    ("lm-b16-s2048", {"WORKLOAD": "lm", "BATCH": "16", "SEQ": "2048"}),
    ("lora-b16-s1024", {"WORKLOAD": "lora", "BATCH": "16", "SEQ": "1024"}),
    ("cnn-b128", {"WORKLOAD": "cnn", "BATCH": "128"}),
]


def run_workload(fraction):
    """One run in this process: steps, evaluation, checkpoint. Returns the evidence."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import estimate_workloads as w

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    kind = os.environ["WORKLOAD"]
    model, opt = w.build(kind, device)
    reserved_after = []
    for _ in range(STEPS):
        x, y = w.batch(kind, device)
        loss = w.loss_of(kind, model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        reserved_after.append(torch.cuda.memory_reserved())
    model.eval()
    with torch.no_grad():
        x, y = w.batch(kind, device)
        w.loss_of(kind, model, x, y).item()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.max_memory_reserved(),
        "reservedNow": torch.cuda.memory_reserved(),
        "deviceUsed": total - free,
        "deviceTotal": total,
        "reservedAfterStep": reserved_after,
        "checkpointBytes": buf.getbuffer().nbytes,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }


def child(mode, fraction):
    import torch

    try:
        ev = run_workload(None if mode == "measure" else float(fraction))
    except (torch.OutOfMemoryError, RuntimeError) as e:
        # cuBLAS and cuDNN report a failed allocation as their own error.
        text = str(e)
        if not any(k in text for k in ("out of memory", "ALLOC_FAILED", "OUT_OF_MEMORY")):
            raise
        print(json.dumps({"oom": text[:300]}))
        sys.exit(3)
    print(json.dumps(ev))


def request_of(ev):
    """The request memprof_analysis::recommend gives for this one rank's evidence."""
    peak = max(ev["reserved"], ev["allocated"])
    trend = ev["reservedAfterStep"]
    half = len(trend) // 2
    late = max(trend) - max(trend[:half]) if half else 0
    floor = max(MIN_MARGIN_BYTES, math.ceil(peak * MIN_MARGIN_FRACTION))
    margin = max(floor, late)
    total = peak + CONTEXT_BYTES + margin
    return -(-total // STEP_BYTES) * STEP_BYTES, peak, margin, late


def spawn(env, mode, fraction=""):
    t = time.time()
    p = subprocess.run([sys.executable, __file__, mode, str(fraction)], env=env,
                       capture_output=True, text=True, timeout=120)
    line = (p.stdout.strip().splitlines() or ["{}"])[-1]
    try:
        out = json.loads(line)
    except ValueError:
        out = {"error": (p.stderr or p.stdout)[-500:]}
    if p.returncode not in (0, 3) and "error" not in out:
        out["error"] = p.stderr[-500:]
    out["exit"], out["seconds"] = p.returncode, round(time.time() - t, 1)
    return out


def one(name, extra):
    env = dict(os.environ, **extra)
    measured = spawn(env, "measure")
    if measured["exit"] != 0:
        return {"name": name, "measured": measured}
    request, peak, margin, late = request_of(measured)
    total = measured["deviceTotal"]
    at = (request - CONTEXT_BYTES) / total
    below = (0.9 * request - CONTEXT_BYTES) / total
    return {
        "name": name, "env": extra, "measured": measured,
        "requestBytes": request, "peakBytes": peak, "marginBytes": margin, "lateGrowthBytes": late,
        "contextActualBytes": measured["deviceUsed"] - measured["reservedNow"],
        "atRequest": dict(spawn(env, "capped", at), fraction=at),
        "tenPercentBelow": dict(spawn(env, "capped", below), fraction=below),
    }


def main_all(outdir):
    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, extra in CONFIGS:
        rows.append(one(name, extra))
        with open(os.path.join(outdir, "recommend_cap.json"), "w") as f:
            json.dump({"contextBytes": CONTEXT_BYTES, "steps": STEPS, "rows": rows}, f, indent=1)
    mib = lambda b: f"{b / 2**20:,.0f}"
    print(f"{'config':16} {'alloc MiB':>10} {'reserved':>9} {'request':>8} {'ctx real':>8} {'at request':>11} {'-10%':>6}")
    for r in rows:
        if "requestBytes" not in r:
            print(f"{r['name']:16} measure failed: {r['measured']}")
            continue
        m = r["measured"]
        verdict = lambda c: "ok" if c["exit"] == 0 else ("OOM" if c["exit"] == 3 else f"exit {c['exit']}")
        print(f"{r['name']:16} {mib(m['allocated']):>10} {mib(m['reserved']):>9} {mib(r['requestBytes']):>8} "
              f"{mib(r['contextActualBytes']):>8} {verdict(r['atRequest']):>11} {verdict(r['tenPercentBelow']):>6}")


if __name__ == "__main__":
    if sys.argv[1] == "all":
        main_all(sys.argv[2])
    else:
        child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
