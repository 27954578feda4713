#!/usr/bin/env python3
"""Trim a bench/gpu/record.sh set for the repository (tests/fixtures/recordings/).

    python3 bench/gpu/trim_recording.py SRC_DIR DEST_DIR

Nothing is changed, only left out: pushes keep `t` (when the sidecar received
it) and `push`; step logs keep `t,kept`, every step until the leak's kept
bytes reach 1 % of the GPU (what `memprof analyze --evaluate` calls visible)
and every 25th after; traces, summaries, sidecar logs, per-process usage
(NAME.processes.csv), GPU utilization (NAME.utilization.csv) and PCIe
receive throughput (NAME.received.csv), where
recorded, device.txt and
plan.txt are copied whole (plan.txt without a scenario that was never
recorded); polls, risk events, final reports and trainer
logs are left out (they describe the sidecar that recorded, not the data).
"""
import csv
import json
import os
import shutil
import sys


def gpu_total(trace):
    with open(trace) as f:
        for line in f:
            if line.startswith("#") or line.startswith("t_s"):
                continue
            return int(line.split(",")[3])
    raise SystemExit(f"{trace}: no sample")


def trim_pushes(src, dst):
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out.write(json.dumps({"t": rec["t"], "push": rec["push"]}, separators=(",", ":")) + "\n")


def trim_steps(src, dst, visible):
    with open(src) as f, open(dst, "w", newline="") as out:
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["t", "kept"])
        seen_visible = False
        for i, row in enumerate(csv.DictReader(f)):
            kept = int(float(row["kept"] or 0))
            if not seen_visible or i % 25 == 0:
                w.writerow([row["t"], kept])
            seen_visible = seen_visible or kept >= visible


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "device.txt"), dst)
    with open(os.path.join(dst, "plan.txt"), "w") as plan:
        for line in open(os.path.join(src, "plan.txt")):
            parts = line.split()
            if len(parts) < 2:
                continue
            n = parts[1]
            if not os.path.exists(os.path.join(src, f"{n}.trace.csv")):
                print(f"{n}: not recorded (skipped by record.sh's deadline?), left out of plan.txt too")
                continue
            plan.write(line)
            visible = gpu_total(os.path.join(src, f"{n}.trace.csv")) // 100
            for ext in ("trace.csv", "summary.json", "sidecar.log", "processes.csv", "utilization.csv", "received.csv"):
                if ext in ("processes.csv", "utilization.csv", "received.csv") and not os.path.exists(os.path.join(src, f"{n}.{ext}")):
                    continue  # recorded before proc_poll.py
                shutil.copy(os.path.join(src, f"{n}.{ext}"), dst)
            trim_pushes(os.path.join(src, f"{n}.pushes.jsonl"), os.path.join(dst, f"{n}.pushes.jsonl"))
            trim_steps(os.path.join(src, f"{n}.steps.csv"), os.path.join(dst, f"{n}.steps.csv"), visible)


if __name__ == "__main__":
    main()
