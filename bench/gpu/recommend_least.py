"""The least GPU memory each workload of estimate_workloads.py needs, found
on the GPU, beside what a recommendation built on the reserved peak asks.

For each configuration: one uncapped run (recommend_cap.py's: STEPS training
steps, an evaluation pass, a checkpoint) measures the peaks; then fresh
processes capped with torch.cuda.set_per_process_memory_fraction bisect,
BISECT times, the least cap (of the caching allocator, the context apart)
between the allocated peak and the reserved-based request under which the
run completes. Under a cap the caching allocator frees its unused cache and
retries before it fails, so the least is what the run really needs: the
allocated peak plus what whole segments and rounding keep unusable.

    CUDA_VISIBLE_DEVICES=N python3 bench/gpu/recommend_least.py OUT.json NAME [NAME...]

NAME: one of CONFIGS below. Prints one line per configuration and writes
every run to OUT.json.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recommend_cap as rc  # noqa: E402

BISECT = 5
CONFIGS = dict(rc.CONFIGS + [
    ("lm-b4-s512", {"WORKLOAD": "lm", "BATCH": "4", "SEQ": "512"}),
    ("lm-b24-s1024", {"WORKLOAD": "lm", "BATCH": "24", "SEQ": "1024"}),
    ("lora-b8-s2048", {"WORKLOAD": "lora", "BATCH": "8", "SEQ": "2048"}),
    ("cnn-b256", {"WORKLOAD": "cnn", "BATCH": "256"}),
])


def least(name):
    env = dict(os.environ, **CONFIGS[name])
    measured = rc.spawn(env, "measure")
    if measured["exit"] != 0:
        return {"name": name, "measured": measured}
    request, peak, margin, late = rc.request_of(measured)
    total = measured["deviceTotal"]
    lo, hi = measured["allocated"] / total, (request - rc.CONTEXT_BYTES) / total
    runs = []
    for _ in range(BISECT):
        f = (lo + hi) / 2
        r = rc.spawn(env, "capped", f)
        runs.append(dict(r, fraction=f))
        if r["exit"] == 0:
            hi = f
        elif r["exit"] == 3:
            lo = f
        else:
            break
    return {
        "name": name, "env": CONFIGS[name], "measured": measured, "requestBytes": request,
        "leastBytes": int(hi * total), "failedBytes": int(lo * total), "runs": runs,
    }


def main():
    out, names = sys.argv[1], sys.argv[2:]
    rows = []
    for n in names:
        rows.append(least(n))
        with open(out, "w") as f:
            json.dump({"contextBytes": rc.CONTEXT_BYTES, "bisect": BISECT, "rows": rows}, f, indent=1)
        r = rows[-1]
        if "leastBytes" not in r:
            print(f"{n}: measure failed: {r['measured']}", flush=True)
            continue
        m, mib = r["measured"], lambda b: f"{b / 2**20:,.0f}"
        print(f"{n:16} allocated {mib(m['allocated'])} MiB reserved {mib(m['reserved'])} MiB "
              f"least {mib(r['leastBytes'])} MiB (fails at {mib(r['failedBytes'])}) "
              f"request {mib(r['requestBytes'])} MiB (allocator {mib(r['requestBytes'] - rc.CONTEXT_BYTES)})",
              flush=True)


if __name__ == "__main__":
    main()
