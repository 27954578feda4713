#!/usr/bin/env python3
"""CPU and memory of running processes over a window, from /proc.

  procstat.py --window 60 --out stats.json name=PID [name=PID ...]

CPU is (utime + stime) over wall time, in percent of one core; RSS is VmRSS
at the end of the window and VmHWM (the peak) in KiB.
"""
import argparse
import json
import os
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("procs", nargs="+")
    a = p.parse_args()
    procs = dict(x.split("=", 1) for x in a.procs)
    start = {}
    t0 = time.monotonic()
    for name, pid in procs.items():
        try:
            start[name] = cpu_ticks(pid)
        except OSError:
            pass
    time.sleep(a.window)
    wall = time.monotonic() - t0
    res = {}
    for name, pid in procs.items():
        try:
            ticks = cpu_ticks(pid) - start[name]
            st = status(pid)
        except (OSError, KeyError) as e:
            res[name] = {"error": str(e)}
            continue
        res[name] = {
            "pid": int(pid),
            "wallS": round(wall, 2),
            "cpuS": ticks / TICK,
            "cpuPercentOfCore": round(100.0 * ticks / TICK / wall, 3),
            "rssKiB": st.get("VmRSS"),
            "hwmKiB": st.get("VmHWM"),
            "rssAnonKiB": st.get("RssAnon"),
            "rssFileKiB": st.get("RssFile"),
        }
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
