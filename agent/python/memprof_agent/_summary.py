"""The summary file (MEMPROF_AGENT_SUMMARY, docs/agent.md "Summary file"):
one JSON object per trainer process, written atomically at interpreter
exit, at the step budget and right before a CUDA OOM propagates; what
`memprof sweep` reads per configuration. And the step budget
(MEMPROF_AGENT_MAX_STEPS)."""

import json
import os

from ._transport import log

WARMUP_STEPS = 2
# Timeline points kept in the summary; past this every other one is dropped
# and only every second push is kept from then on, so a long run keeps its
# whole shape at a coarser grain.
MAX_TIMELINE = 512


class Timeline:
    """Memory over the run, one point per push (the push already read the
    allocator: no extra torch call): seconds since the first push, the step
    and phase then, allocated and reserved bytes summed over the process's
    devices. Bounded by MAX_TIMELINE (halved when full)."""

    def __init__(self, limit=MAX_TIMELINE):
        self.limit = max(2, int(limit))
        self.points = []
        self.origin = None
        self.every = 1
        self.seen = 0

    def add(self, push):
        devices = push.get("devices") or []
        if not devices:
            return
        self.seen += 1
        if (self.seen - 1) % self.every:
            return
        t = push.get("time", 0.0)
        if self.origin is None:
            self.origin = t
        self.points.append({
            "t": round(t - self.origin, 3),
            "step": push.get("step"),
            "phase": push.get("phase"),
            "allocatedBytes": sum(int(d.get("allocatedBytes", 0)) for d in devices),
            "reservedBytes": sum(int(d.get("reservedBytes", 0)) for d in devices),
        })
        if len(self.points) >= self.limit:
            self.points = self.points[::2]
            self.every *= 2


def _quantile(sorted_values, q):
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def step_rates(clock):
    """From the step() calls [(monotonic time, call number, tokens,
    samples)]: the seconds between consecutive calls, leaving out the
    intervals begun by the first WARMUP_STEPS calls; the tokens and samples
    given to a call belong to the interval it begins (step() is called at
    the start of a step). Returns (stepSeconds or None, tokens/s, samples/s)."""
    calls = list(clock)
    intervals = []
    tokens = samples = 0
    tokens_known = samples_known = True
    for (t0, n0, tok, smp), (t1, n1, _, _) in zip(calls, calls[1:]):
        if n0 <= WARMUP_STEPS or n1 != n0 + 1:
            continue
        intervals.append(t1 - t0)
        tokens_known = tokens_known and tok is not None
        samples_known = samples_known and smp is not None
        tokens += tok or 0
        samples += smp or 0
    if not intervals:
        return None, None, None
    ordered = sorted(intervals)
    seconds = {"median": _quantile(ordered, 0.5), "p90": _quantile(ordered, 0.9), "n": len(ordered)}
    total = sum(intervals)
    per_s = (lambda x, known: float(x) / total if known and total > 0 else None)
    return seconds, per_s(tokens, tokens_known), per_s(samples, samples_known)


def build(agent, clock, steps, breakdown):
    """The C-1 object. `agent` may be None (the budget fired in a process
    whose agent does not run): the allocator numbers are then null."""
    devices = agent.summary.devices if agent is not None else {}
    oom = agent.summary.oom if agent is not None else None
    totals = [d.get("last", {}).get("totalBytes") for d in devices.values()]
    seconds, tokens, samples = step_rates(clock)
    return {
        "version": 1,
        "pid": os.getpid(),
        "steps": steps,
        "oom": oom is not None,
        "oomMessage": oom.get("message") if oom else None,
        "peakAllocatedBytes": sum(d["peakAllocatedBytes"] for d in devices.values()) if devices else None,
        "peakReservedBytes": sum(d["peakReservedBytes"] for d in devices.values()) if devices else None,
        "deviceTotalBytes": sum(totals) if totals and all(t is not None for t in totals) else None,
        "nvmlPeakUsedBytes": None,
        "stepSeconds": seconds,
        "tokensPerSecond": tokens,
        "samplesPerSecond": samples,
        "breakdown": breakdown,
        "timeline": list(agent.summary.timeline.points) if agent is not None else [],
    }


def write(path, summary):
    """Atomically (tmp + rename); never raises, says a failure once."""
    try:
        tmp = "%s.tmp.%d" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(tmp, path)
        return True
    except Exception as exc:
        log.warning("memprof-agent: cannot write the summary %s (%r)", path, exc)
        return False
