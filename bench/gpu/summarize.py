#!/usr/bin/env python3
"""Summarizes a bench/gpu/run.sh output folder into one JSON (and a short table).

  summarize.py OUTDIR [--json results.json]

Per scenario: the monitor's worst risk and first high/critical times, the
real OOM time, the time-to-OOM estimate at half the leak's remaining time
against the truth, spike detection, the sampled peak against the allocator's
peak, step times with the monitor on/off, sampler cost, CPU and RSS.
"""
import csv
import glob
import json
import os
import statistics
import sys

RISKS = ["none", "low", "medium", "high", "critical"]


def load_json(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_events(p):
    out = []
    try:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def load_csv(p):
    try:
        with open(p) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def first_at(events, level):
    for e in events:
        if RISKS.index(e.get("risk", "none")) >= RISKS.index(level):
            return e["t"]
    return None


def peak_check(d, name):
    """Sampled NVML peak vs the allocator's peak plus what NVML sees beyond it
    (CUDA context, libraries): overhead = median(dev_used - reserved) over steps."""
    trace = load_csv(os.path.join(d, f"{name}.trace.csv"))
    steps = load_csv(os.path.join(d, f"{name}.steps.csv"))
    summ = load_json(os.path.join(d, f"{name}.summary.json"))
    if not trace or not steps or not summ:
        return None
    sampled = max(int(r["used_bytes"]) for r in trace)
    over = statistics.median(int(s["dev_used"]) - int(s["reserved"]) for s in steps)
    alloc_peak = summ["maxMemoryReserved"] + over
    return {
        "sampledPeak": sampled,
        "allocatorPeak": summ["maxMemoryReserved"],
        "overhead": over,
        "errorPercent": round(100.0 * (sampled - alloc_peak) / alloc_peak, 3),
    }


def scenario(d, name):
    ev = load_events(os.path.join(d, f"{name}.events.jsonl"))
    summ = load_json(os.path.join(d, f"{name}.summary.json")) or {}
    r = {"name": name, "assessments": len(ev)}
    if ev:
        worst = max(ev, key=lambda e: RISKS.index(e["risk"]))
        r["worstRisk"] = worst["risk"]
        r["highCount"] = sum(1 for e in ev if RISKS.index(e["risk"]) >= 3)
        r["leakFlagged"] = any(e.get("leak") for e in ev)
        r["spikeFlagged"] = any(e.get("spike") for e in ev)
        r["firstSpikeAt"] = next((e["t"] for e in ev if e.get("spike")), None)
    r["stepMsMedian"] = summ.get("stepMsMedian")
    r["peak"] = peak_check(d, name)
    oom = summ.get("oomAt")
    if oom:
        r["oomAt"] = oom
        start = summ.get("leakFrom") or summ.get("start")
        r["leakFrom"] = start
        for lvl in ("medium", "high", "critical"):
            t = first_at(ev, lvl)
            r[f"first_{lvl}_before_oom_s"] = round(oom - t, 1) if t else None
        half = start + (oom - start) / 2
        near = [e for e in ev if e.get("tto") is not None]
        if near:
            e = min(near, key=lambda e: abs(e["t"] - half))
            truth = oom - e["t"]
            r["ttoAtHalf"] = {
                "t": e["t"],
                "estimate": e["tto"],
                "truth": round(truth, 1),
                "errorPercent": round(100.0 * (e["tto"] - truth) / truth, 1),
                "risk": e["risk"],
            }
    return r


def ab(d):
    win = load_csv(os.path.join(d, "ab.windows.csv"))
    steps = load_csv(os.path.join(d, "ab.steps.csv"))
    if not win or not steps:
        return None
    on, off = [], []
    for s in steps:
        t, ms = float(s["t"]), float(s["step_ms"])
        for w in win:
            if float(w["t0"]) <= t < float(w["t1"]):
                (on if w["state"] == "on" else off).append(ms)
    if not on or not off:
        return None
    mon, moff = statistics.median(on), statistics.median(off)
    return {
        "stepsOn": len(on),
        "stepsOff": len(off),
        "medianOnMs": round(mon, 3),
        "medianOffMs": round(moff, 3),
        "deltaPercent": round(100.0 * (mon - moff) / moff, 3),
    }


def main():
    d = sys.argv[1]
    res = {
        "benchIdle": load_json(os.path.join(d, "bench_idle.json")),
        "benchLoaded": load_json(os.path.join(d, "bench_loaded.json")),
        "procstat": load_json(os.path.join(d, "steady.procstat.json")),
        "ab": ab(d),
        "scenarios": [],
    }
    names = sorted(
        {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(d, "*.events.jsonl"))}
    )
    for n in names:
        if n.startswith("ab"):
            continue
        res["scenarios"].append(scenario(d, n))
    for p in sorted(glob.glob(os.path.join(d, "ddp.summary.r*.json"))):
        res.setdefault("ddp", []).append(load_json(p))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(res, f, indent=1)
    for k in ("benchIdle", "benchLoaded"):
        b = res[k]
        if b:
            print(k, "per-GPU us", b.get("perGpuUs"), "with util", b.get("perGpuUsWithUtilization"))
    print("procstat", json.dumps(res["procstat"]))
    print("ab", json.dumps(res["ab"]))
    for s in res["scenarios"]:
        print(json.dumps(s))
    for s in res.get("ddp", []):
        print("ddp", json.dumps(s))


if __name__ == "__main__":
    main()
