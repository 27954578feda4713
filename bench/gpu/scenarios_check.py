#!/usr/bin/env python3
"""Summarises a bench/gpu/record.sh set (a folder, or the archive unpacked):
per scenario, the truth (leak start, leak rate, real OOM time) against what
the live sidecar said (with the agent's pushes) and, with --memprof, what
`memprof analyze -o json --estimate-every 1` says from the NVML trace alone.

    scenarios_check.py OUTDIR [--memprof BIN] [--json FILE]

Per scenario: when the leak began (`leakFrom`, s after the trainer's start),
when it became visible (its kept bytes reached 1 % of the GPU), when the real
OOM came (s after the leak began = the leak's life); the first leak flag
(the GPU's `leakSuspected`, and the allocator's `growth: leak`), the first
high/critical and critical, each in seconds after the leak began (negative:
before it; for a scenario with no leak, any flag is a false one, in seconds
after the trainer's start); the time to OOM at half the leak's life against
the truth (the poll nearest to it within 5 s); and the verdict after the OOM
(the last poll's and the final report's growth, fragmentation and advice).
The closing lines count, for the live sidecar and the NVML-only replay: leaks
flagged, false flags, leak flags within 15 s of visible, and TTO within 20 %
at half-life for leaks that lived 30 s or more (the recording campaign's targets).
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import sys

RISKS = ["none", "low", "medium", "high", "critical"]


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def load_csv(path):
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def plan_rows(d):
    """name -> truth (oom | leak | none), from the set's plan.txt."""
    rows = {}
    try:
        for line in open(os.path.join(d, "plan.txt")):
            f = line.split()
            if len(f) >= 5:
                rows[f[1]] = {"truth": f[2], "expect": float(f[3]), "cap": float(f[4])}
    except OSError:
        pass
    return rows


def rel(t, origin):
    return None if t is None or origin is None else round(t - origin, 1)


def risk_at_least(risk, level):
    return risk in RISKS and RISKS.index(risk) >= RISKS.index(level)


def visible_at(steps, total):
    """First step-log time at which the kept bytes reached 1 % of the GPU."""
    for r in steps:
        try:
            if total and int(r["kept"]) >= 0.01 * total:
                return float(r["t"])
        except (KeyError, ValueError):
            return None
    return None


def live_series(polls):
    """(t, gpu entry, allocator section) per poll that had a report."""
    out = []
    for p in polls:
        rep = p.get("report")
        if rep:
            out.append((p["t"], (rep.get("gpus") or [{}])[0], rep.get("allocator") or {}))
    return out


def sidecar_origin(log_path):
    """The sidecar's clock origin in Unix seconds (its trace's `t_s` counts
    from it): the stamp of its first risk transition, logged right after its
    first sample, else of its first line; as `memprof analyze --evaluate`
    reads it (crates/analysis/src/evaluate/recording.rs)."""
    try:
        with open(log_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None

    def stamp(line):
        word = (line.split() or [""])[0]
        try:
            return datetime.datetime.fromisoformat(word.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None

    for line in [l for l in lines if "risk changed" in l] + lines:
        t = stamp(line)
        if t is not None:
            return t
    return None


def nvml_series(memprof, trace, origin=0.0):
    """(t, estimate) per line of `memprof analyze -o json --estimate-every 1`,
    `t` moved to Unix seconds by the sidecar's clock origin (the trace counts
    from the sidecar's start; the summary's times are Unix seconds)."""
    try:
        res = subprocess.run([memprof, "analyze", "-o", "json", "--estimate-every", "1", trace],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if res.returncode != 0:
        return None, res.stderr.strip()[-300:]
    out = []
    for line in res.stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") in ("estimate", "risk") and "t" in e:
            e["t"] += origin
            out.append(e)
    out.sort(key=lambda e: e["t"])
    return out, None


def judge(items, s, visible):
    """Verdict times of one series against the truth. items: (t, gpu leak
    flag, allocator leak call or None, risk, tto); readings after the OOM
    are left out (they describe a process that is gone)."""
    start, leak_from, oom = s.get("start"), s.get("leakFrom"), s.get("oomAt")
    end = oom or s.get("end") or float("inf")
    items = [i for i in items if i[0] <= end]
    origin = leak_from or start

    def first(pred, after=None):
        return next((i[0] for i in items if pred(i) and (after is None or i[0] >= after)), None)

    out = {
        "leakFlag": rel(first(lambda i: i[1], leak_from), origin),
        "allocatorLeak": rel(first(lambda i: i[2], leak_from), origin),
        "highOrCritical": rel(first(lambda i: risk_at_least(i[3], "high"), leak_from), origin),
        "critical": rel(first(lambda i: risk_at_least(i[3], "critical"), leak_from), origin),
        "worstRisk": max((i[3] for i in items if i[3] in RISKS), key=RISKS.index, default=None),
    }
    before = [i for i in items if leak_from is None or i[0] < leak_from]
    out["falseLeakFlags"] = sum(1 for i in before if i[1] or i[2])
    out["firstFalseFlag"] = rel(next((i[0] for i in before if i[1] or i[2]), None), start)
    if visible is not None and out["leakFlag"] is not None:
        out["leakFlagAfterVisible"] = round(leak_from + out["leakFlag"] - visible, 1)
    if oom and leak_from:
        half = leak_from + (oom - leak_from) / 2
        near = [i for i in items if i[4] is not None and abs(i[0] - half) <= 5]
        if near:
            t, _, _, risk, tto = min(near, key=lambda i: abs(i[0] - half))
            truth = oom - t
            out["ttoAtHalf"] = {"at": rel(t, leak_from), "estimate": round(tto, 1), "truth": round(truth, 1),
                                "errorPercent": round(100 * (tto - truth) / truth, 1), "risk": risk}
    return out


def after_oom(d, name, polls, s):
    """What the sidecar said once the trainer was gone."""
    oom = s.get("oomAt")
    if not oom:
        return None
    last = next((p["report"] for p in reversed(polls) if p.get("report")), None)
    before = next((p["report"] for p in reversed(polls) if p.get("report") and p["t"] < oom), None)
    final = load_json(os.path.join(d, name + ".report.json"))

    def brief(rep):
        if not rep:
            return None
        a, g = rep.get("allocator") or {}, (rep.get("gpus") or [{}])[0]
        oom_snap = a.get("oom") or {}
        return {"growth": a.get("growth"), "fragmentation": a.get("fragmentation"), "advice": a.get("advice"),
                "risk": g.get("risk"), "leak": g.get("leakSuspected"), "numOoms": a.get("numOoms"),
                "oomSource": oom_snap.get("source"), "oomBlocks": len(oom_snap.get("blocks") or [])}

    return {"lastPollBeforeOom": brief(before), "lastPoll": brief(last), "finalReport": brief(final)}


def scenario(d, name, truth, memprof):
    s = load_json(os.path.join(d, name + ".summary.json")) or {}
    steps = load_csv(os.path.join(d, name + ".steps.csv"))
    polls = load_jsonl(os.path.join(d, name + ".polls.jsonl"))
    pushes = load_jsonl(os.path.join(d, name + ".pushes.jsonl"))
    start, leak_from, oom = s.get("start"), s.get("leakFrom"), s.get("oomAt")
    vis = visible_at(steps, s.get("totalBytes"))
    r = {"name": name, "truth": truth, "exit": s.get("exit"), "steps": s.get("steps"),
         "leakFrom": rel(leak_from, start), "leakMBps": s.get("leakMBps"), "leakMeasuredMBps": s.get("leakMeasuredMBps"),
         "life": rel(oom, leak_from), "oomAt": rel(oom, start), "visible": rel(vis, leak_from),
         "headroomGB": round(s["headroomBytes"] / 1e9, 2) if s.get("headroomBytes") else None,
         "pushes": len(pushes), "pushesForwarded": sum(1 for p in pushes if p.get("forwarded")),
         "pushesRefused": sum(1 for p in pushes if p.get("forwarded") and p.get("status", 0) >= 300),
         "polls": len(polls)}
    live = [(t, g.get("leakSuspected"), a.get("growth") == "leak", g.get("risk"), g.get("timeToOomSeconds"))
            for t, g, a in live_series(polls)]
    r["live"] = judge(live, s, vis) if live else None
    if live:
        r["live"]["assessedFrom"] = sorted({g.get("assessedFrom") or "-" for _, g, _ in live_series(polls)})
    if memprof:
        origin = sidecar_origin(os.path.join(d, name + ".sidecar.log"))
        series, err = nvml_series(memprof, os.path.join(d, name + ".trace.csv"), origin or 0.0)
        if origin is None and not err:
            err = "no time in the sidecar's log: the trace's seconds cannot be placed"
        r["nvml"] = {"error": err} if err else judge(
            [(e["t"], e.get("leakSuspected"), None, e.get("risk"), e.get("timeToOomSeconds")) for e in series], s, vis)
    r["afterOom"] = after_oom(d, name, polls, s)
    return r


def totals(results, key):
    """The leak-flag and TTO counts for one series (live or nvml)."""
    leaks = [r for r in results if r["truth"] in ("oom", "leak") and r.get(key) and "error" not in r[key]]
    clean = [r for r in results if r["truth"] == "none" and r.get(key) and "error" not in r[key]]
    flagged = [r for r in leaks if r[key]["leakFlag"] is not None or r[key].get("allocatorLeak") is not None]
    fast = [r for r in leaks if r[key].get("leakFlagAfterVisible") is not None and r[key]["leakFlagAfterVisible"] <= 15]
    long_lived = [r for r in leaks if r.get("life") and r["life"] >= 30]
    tto_ok = [r for r in long_lived if r[key].get("ttoAtHalf") and abs(r[key]["ttoAtHalf"]["errorPercent"]) <= 20]
    false = [r for r in results if r.get(key) and "error" not in r[key]
             and (r[key]["falseLeakFlags"] or (r["truth"] == "none" and r[key]["leakFlag"] is not None))]
    return {"leaksFlagged": "%d/%d" % (len(flagged), len(leaks)),
            "scenariosWithFalseFlags": "%d/%d" % (len(false), len(leaks) + len(clean)),
            "leakFlagWithin15sOfVisible": "%d/%d" % (len(fast), len(leaks)),
            "ttoWithin20PercentAtHalf(life>=30s)": "%d/%d" % (len(tto_ok), len(long_lived))}


def line(r):
    def v(x):
        return "-" if x is None else x

    out = ["%-11s %-4s exit=%-10s leak@%-5s life=%-6s vis=%-5s" % (
        r["name"], r["truth"], v(r["exit"]), v(r["leakFrom"]), v(r["life"]), v(r["visible"]))]
    for key in ("live", "nvml"):
        j = r.get(key)
        if not j or "error" in (j or {}):
            continue
        tto = j.get("ttoAtHalf")
        out.append("  %-4s leak=%-5s alloc=%-5s high=%-5s crit=%-5s false=%s worst=%s tto@half=%s" % (
            key, v(j["leakFlag"]), v(j.get("allocatorLeak")), v(j["highOrCritical"]), v(j["critical"]),
            j["falseLeakFlags"], v(j["worstRisk"]),
            "%s vs %s (%+.1f%%)" % (tto["estimate"], tto["truth"], tto["errorPercent"]) if tto else "-"))
    a = r.get("afterOom")
    if a and a.get("finalReport"):
        f = a["finalReport"]
        out.append("  after the OOM: final report growth=%s fragmentation=%s advice=%s" % (
            v(f["growth"]), v(f["fragmentation"]), "yes" if f["advice"] else "no"))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--memprof", default="", help="memprof binary: replay each NVML trace (NVML-only baseline)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    plan = plan_rows(a.outdir)
    sched = load_csv(os.path.join(a.outdir, "schedule.csv"))
    names = [r["name"] for r in sched] or sorted(plan)
    results = [scenario(a.outdir, n, plan.get(n, {}).get("truth", "?"), a.memprof) for n in names]
    for r, srow in zip(results, sched or [{}] * len(results)):
        r["schedule"] = srow
    out = {"scenarios": results, "live": totals(results, "live")}
    if a.memprof:
        out["nvml"] = totals(results, "nvml")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print("times in s: leak@ after the trainer's start; life, vis(ible) and verdicts after the leak began "
          "(no leak: after the start)")
    for r in results:
        print(line(r))
    for key in ("live", "nvml"):
        if key in out:
            print(key, json.dumps(out[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
