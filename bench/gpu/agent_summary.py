#!/usr/bin/env python3
"""Summarizes a bench/gpu/agent.sh output folder: per leak, when the agent's
analysis called the leak and raised the risk (relative to the leak's start
and to the real CUDA OOM), the time to OOM at half the leak's life, and what
the OOM snapshot named; grow: leak/cache calls; frag: retries, fragmentation
and advice with and without expandable segments; ab: the step-time overhead.

    agent_summary.py OUTDIR
"""
import glob
import json
import os
import sys

out = sys.argv[1]


def polls(name):
    path = os.path.join(out, name + ".polls.jsonl")
    if not os.path.exists(path):
        return []
    return [p for p in map(json.loads, open(path)) if "error" not in p]


def summary(name):
    path = os.path.join(out, name + ".summary.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def first(ps, pred):
    return next((p["t"] for p in ps if pred(p)), None)


def rel(t, origin):
    return None if t is None or origin is None else round(t - origin, 1)


for path in sorted(glob.glob(os.path.join(out, "leak*.summary.json"))):
    name = os.path.basename(path)[: -len(".summary.json")]
    s, ps = summary(name), polls(name)
    start, oom, rate = s.get("leakFrom"), s.get("oomAt"), s.get("leakMBps")
    if not (start and oom):
        print(f"{name}: no leak start or no OOM in the summary: {s}")
        continue
    visible = start + 0.01 * s["totalBytes"] / (rate * 1e6)  # 1% of the GPU leaked
    leak_at = first(ps, lambda p: p["t"] >= start and p.get("growth") == "leak")
    high_at = first(ps, lambda p: p["t"] >= start and p.get("risk") in ("high", "critical"))
    crit_at = first(ps, lambda p: p["t"] >= start and p.get("risk") == "critical")
    false_leak = [p["t"] - start for p in ps if p["t"] < start and p.get("growth") == "leak"]
    half = start + (oom - start) / 2
    near = [p for p in ps if p.get("tto") is not None and abs(p["t"] - half) <= 10]
    tto = None
    if near:
        p = min(near, key=lambda p: abs(p["t"] - half))
        truth = oom - p["t"]
        tto = {"at": rel(p["t"], start), "tto": round(p["tto"], 1), "truth": round(truth, 1),
               "errorPercent": round(100 * (p["tto"] - truth) / truth, 1), "assessedFrom": p.get("assessedFrom")}
    snap = next((p["oom"] for p in reversed(ps) if p.get("oom")), None)
    named = bool(snap) and any("train.py:155 " in f for b in snap["blocks"] for f in b["frames"])
    print(json.dumps({
        "scenario": name, "leakMBps": rate, "oomAfterLeakStart": round(oom - start, 1),
        "visibleAfterLeakStart": round(visible - start, 1),
        "leakCalledAfterLeakStart": rel(leak_at, start), "leakCalledAfterVisible": rel(leak_at, visible),
        "highAfterLeakStart": rel(high_at, start), "highBeforeOom": rel(oom, high_at),
        "criticalBeforeOom": rel(oom, crit_at), "leakCalledBeforeTheLeak": false_leak[:3],
        "ttoAtHalfLife": tto, "oomSnapshotNamesTheLeakLine": named,
        "oomSnapshotTop": snap and snap["blocks"][:3], "oomSnapshotSource": snap and snap.get("source"),
    }))

ps = polls("grow")
if ps:
    print(json.dumps({
        "scenario": "grow", "polls": len(ps), "growth": {g: sum(p.get("growth") == g for p in ps) for g in ("leak", "cache", "none")},
        "gpuLeakFlag": sum(bool(p.get("leak")) for p in ps), "risks": sorted({p.get("risk") for p in ps}),
        "trainer": summary("grow"),
    }))

for name in ("frag", "frag_expandable"):
    ps = polls(name)
    if ps:
        late = ps[len(ps) // 3:]
        print(json.dumps({
            "scenario": name, "trainer": summary(name),
            "maxRecentRetries": max((p.get("recentRetries") or 0) for p in late),
            "maxFragmentation": max((p.get("fragmentation") or 0) for p in late),
            "maxInactiveSplit": max((p.get("split") or 0) for p in late),
            "pollsWithAdvice": sum(bool(p.get("advice")) for p in late), "polls": len(late),
            "advice": next((p["advice"] for p in reversed(ps) if p.get("advice")), None),
        }))

s = summary("ab")
if s:
    print(json.dumps({"scenario": "ab", **s}))
