#!/usr/bin/env python3
"""Turns one scenario of a run.sh output folder into a small regression
fixture for crates/sidecar/tests/analysis_fixtures.rs:

  make_fixture.py OUTDIR NAME DEST.csv [--every 2] [--device "NVIDIA H100 80GB HBM3"]

The monitor's trace (`t_s,gpu,used_bytes,total_bytes`, Unix seconds) is
shifted to start within the first 10 s (a whole number of analysis buckets, so
the buckets fall where the sidecar's did), keeps every `--every`-th row, and
gains the trainer's `allocated_bytes,reserved_bytes` (from its newest step at
or before each row). What the test needs to know (the real OOM time, when the
leak or spike started) goes into `#` comment lines, which the trace parser skips.
"""
import argparse
import bisect
import csv
import json
import os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("name")
    p.add_argument("dest")
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--device", default="")
    p.add_argument("--gpu", type=int, default=None, help="keep one GPU and renumber it 0")
    p.add_argument("--steps", default="", help="step log to take allocator columns from")
    p.add_argument("--summary", default="", help="trainer summary JSON (default NAME.summary.json)")
    p.add_argument("--meta", action="append", default=[], help="extra KEY=VALUE comment")
    a = p.parse_args()
    extra = [m.split("=", 1) for m in a.meta]

    with open(os.path.join(a.outdir, f"{a.name}.trace.csv")) as f:
        rows = list(csv.DictReader(f))
    if a.gpu is not None:
        rows = [r for r in rows if int(r["gpu"]) == a.gpu]
    # Keep the phase of the analysis buckets (multiples of 10 s of Unix time,
    # as the sidecar saw them): shift by a whole number of buckets.
    t0 = float(rows[0]["t_s"]) // 10 * 10
    steps_path = a.steps or os.path.join(a.outdir, f"{a.name}.steps.csv")
    steps = []
    if os.path.exists(steps_path):
        with open(steps_path) as f:
            steps = [(float(s["t"]), int(s["allocated"]), int(s["reserved"])) for s in csv.DictReader(f)]
    times = [s[0] for s in steps]
    summ = {}
    sp = a.summary or os.path.join(a.outdir, f"{a.name}.summary.json")
    if os.path.exists(sp):
        with open(sp) as f:
            summ = json.load(f)

    meta = {"source": f"bench/gpu/run.sh {a.name}, nvml_probe monitor at 10 Hz", "date": "2026-11-22"}
    for k, v in extra:
        meta[k] = v
    if a.device:
        meta["device"] = a.device
    for k, key in (("trainer_start_s", "start"), ("leak_from_s", "leakFrom"), ("oom_at_s", "oomAt")):
        if summ.get(key):
            meta[k] = round(summ[key] - t0, 2)
    if summ.get("leakMBps"):
        meta["leak_mb_per_s"] = summ["leakMBps"]
    if summ.get("maxMemoryReserved"):
        meta["max_memory_reserved"] = summ["maxMemoryReserved"]
    with open(a.dest, "w") as out:
        for k, v in meta.items():
            out.write(f"# {k}={v}\n")
        out.write("t_s,gpu,used_bytes,total_bytes,allocated_bytes,reserved_bytes\n")
        for i, r in enumerate(rows):
            if i % a.every:
                continue
            t = float(r["t_s"])
            j = bisect.bisect_right(times, t) - 1
            alloc = f"{steps[j][1]},{steps[j][2]}" if j >= 0 and t - times[j] < 5 else ","
            gpu = 0 if a.gpu is not None else int(r["gpu"])
            out.write(f"{t - t0:.1f},{gpu},{r['used_bytes']},{r['total_bytes']},{alloc}\n")
    print(a.dest, os.path.getsize(a.dest), "bytes")


if __name__ == "__main__":
    main()
