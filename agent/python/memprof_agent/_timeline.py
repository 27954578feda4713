"""The event timeline (seed 002's GPUMemoryProfiler):
record(name, note) with allocated, reserved, max allocated, max reserved
and the elapsed time; record_detailed() with tensors and parameter counts;
per-stage deltas (against the previous event and against a named earlier
one); a console table, a JSON export keyed by event name, a timestamped
log file (MEMPROF_AGENT_LOG_DIR).

Cost: record() reads the allocator once (one nested-stats read of the
current device, tr.nested_stats: ~25 us on an H100) and appends to bounded
deques; step() and phase() never come here. Runs on the caller's thread;
nothing raises into it."""

import collections
import json
import os
import sys
import time

from . import _torchread as tr
from . import _config
from ._core import MARKERS
from ._transport import log

MAX_TIMELINE = 4096
MAX_NAMES = 1024
MAX_TENSORS = 64
MAX_NOTE = 256
MAX_TENSOR_NAME = 128
MAX_DIMS = 8

ORIGIN_WALL = time.time()
ORIGIN = time.monotonic()


class Event(tuple):
    """The 7-tuple the push reads (t, name, note, step, phase, allocated,
    reserved) plus `extra`: the seed tools' push fields
    (_core._event_json merges them)."""


class Timeline:
    """Every recorded event (the newest MAX_TIMELINE), the latest event of
    each name (for `since=`), the running maxima, the log file."""

    def __init__(self):
        self.records = collections.deque(maxlen=MAX_TIMELINE)
        self.by_name = {}
        self.count = 0
        self.max_allocated = 0
        self.max_reserved = 0
        self.last_memory = None  # the latest record with allocator numbers
        self.log = LogFile()



# --- reading ------------------------------------------------------------------


def read_memory(agent=None):
    """(allocated, reserved, max allocated, max reserved) of the current
    device from one allocator read, or None before CUDA is up. The maxima
    are since the start of the run as far as the agent saw: the allocator's
    peak since its last reset (the agent resets it at every push), the
    peaks pushes and measurements have read (the agent's summary, PeakCarry)
    and earlier records."""
    torch = tr.loaded_torch()
    if torch is None or not tr.cuda_ready(torch):
        return None
    index = int(torch.cuda.current_device())
    s = tr.nested_stats(torch, index)
    allocated = int(s["allocated_bytes"]["all"]["current"])
    reserved = int(s["reserved_bytes"]["all"]["current"])
    peak_a = max(int(s["allocated_bytes"]["all"]["peak"]), allocated, tr.PEAKS.allocated.get(index, 0))
    peak_r = max(int(s["reserved_bytes"]["all"]["peak"]), reserved, tr.PEAKS.reserved.get(index, 0))
    seen = agent.summary.devices.get(index) if agent is not None else None
    if seen:
        peak_a = max(peak_a, int(seen.get("peakAllocatedBytes", 0)))
        peak_r = max(peak_r, int(seen.get("peakReservedBytes", 0)))
    TIMELINE.max_allocated = peak_a = max(TIMELINE.max_allocated, peak_a)
    TIMELINE.max_reserved = peak_r = max(TIMELINE.max_reserved, peak_r)
    return allocated, reserved, peak_a, peak_r


def _tensor_info(name, t):
    shape = [int(d) for d in tuple(getattr(t, "shape", ()))]
    dtype = str(getattr(t, "dtype", "?")).replace("torch.", "")
    info = {"name": tr.truncate(name, MAX_TENSOR_NAME), "shape": shape[:MAX_DIMS], "dtype": dtype,
            "device": str(getattr(t, "device", "?")), "bytes": int(t.numel()) * int(t.element_size())}
    if len(shape) > MAX_DIMS:
        info["dims"] = len(shape)
    return info


def tensors_info(tensors):
    """[{name, shape, dtype, device, bytes}] of a dict of tensors, a list,
    or one tensor (at most MAX_TENSORS; what is not a tensor is left out),
    and how many were left out."""
    torch = tr.loaded_torch()
    is_tensor = (lambda x: torch.is_tensor(x)) if torch is not None else (lambda x: hasattr(x, "numel"))
    if isinstance(tensors, dict):
        items = list(tensors.items())
    elif isinstance(tensors, (list, tuple)):
        items = [(str(i), t) for i, t in enumerate(tensors)]
    else:
        items = [("tensor", tensors)]
    out, left = [], 0
    for name, t in items:
        if not is_tensor(t):
            continue
        if len(out) >= MAX_TENSORS:
            left += 1
            continue
        out.append(_tensor_info(str(name), t))
    return out, left


def model_info(model):
    """{parameters, trainableParameters, parametersBytes} of an nn.Module
    (each parameter once), or of seed 002's dict {total_params,
    trainable_params}."""
    if isinstance(model, dict):
        out = {}
        for key, field in (("total_params", "parameters"), ("trainable_params", "trainableParameters")):
            v = model.get(key, model.get(field))
            if isinstance(v, int) and not isinstance(v, bool):
                out[field] = v
        return out
    total = trainable = nbytes = 0
    seen = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = int(p.numel())
        total += n
        nbytes += n * int(p.element_size())
        if getattr(p, "requires_grad", False):
            trainable += n
    return {"parameters": total, "trainableParameters": trainable, "parametersBytes": nbytes}


# --- recording ----------------------------------------------------------------


def record(name, note="", memory=True, since=None, tensors=None, model=None, agent=None):
    """One event: on the push (MARKERS), on the timeline, in the log file."""
    now, elapsed = time.time(), time.monotonic() - ORIGIN
    name, note = str(name), str(note) if note else ""
    mem = read_memory(agent) if memory else None
    rec = {"t": now, "elapsed": round(elapsed, 6), "name": name}
    if note:
        rec["note"] = tr.truncate(note, MAX_NOTE)
    step = MARKERS.step if isinstance(MARKERS.step, int) and not isinstance(MARKERS.step, bool) else None
    if step is not None:
        rec["step"] = step
    phase = MARKERS.phase()
    if phase is not None:
        rec["phase"] = str(phase)
    if mem is not None:
        rec["allocatedBytes"], rec["reservedBytes"], rec["maxAllocatedBytes"], rec["maxReservedBytes"] = mem
    extra = {k: rec[k] for k in ("elapsed", "maxAllocatedBytes", "maxReservedBytes") if k in rec}
    detail = _details(rec, tensors, model)
    if detail:
        extra["detail"] = detail
    _deltas(rec, since)
    event = Event((now, name, note, MARKERS.step, phase, rec.get("allocatedBytes"), rec.get("reservedBytes")))
    event.extra = extra
    MARKERS.add(event)  # a checkpoint goes to its own queue, kept until a push carrying it is accepted
    _keep(rec)
    TIMELINE.log.write(rec)
    return rec


def _details(rec, tensors, model):
    """record_detailed's parts: on the timeline in full, in the push as
    four numbers."""
    detail = {}
    if tensors is not None:
        infos, left = tensors_info(tensors)
        rec["tensors"] = infos
        if left:
            rec["tensorsLeftOut"] = left
        detail["tensors"] = len(infos) + left
        detail["tensorBytes"] = sum(i["bytes"] for i in infos)
    if model is not None:
        rec["model"] = model_info(model)
        for key in ("parameters", "trainableParameters"):
            if key in rec["model"]:
                detail[key] = rec["model"][key]
    return detail


def _delta(rec, base):
    out = {"event": tr.truncate(base["name"], tr.MAX_NAME), "seconds": round(rec["elapsed"] - base["elapsed"], 6)}
    for key in ("allocatedBytes", "reservedBytes", "maxAllocatedBytes", "maxReservedBytes"):
        if key in rec and key in base:
            out[key] = rec[key] - base[key]
    return out


def _deltas(rec, since):
    """Against the previous event with allocator numbers (or the previous
    event, when this one has none) and against the latest earlier event
    named `since`."""
    previous = TIMELINE.last_memory if "allocatedBytes" in rec else (TIMELINE.records[-1] if TIMELINE.records else None)
    if previous is not None:
        rec["deltaPrevious"] = _delta(rec, previous)
    if since is not None:
        base = TIMELINE.by_name.get(str(since))
        rec["deltaSince"] = _delta(rec, base) if base is not None else {"event": str(since), "missing": True}


def _keep(rec):
    TIMELINE.records.append(rec)
    TIMELINE.count += 1
    if rec["name"] in TIMELINE.by_name or len(TIMELINE.by_name) < MAX_NAMES:
        TIMELINE.by_name[rec["name"]] = rec
    if "allocatedBytes" in rec:
        TIMELINE.last_memory = rec


# --- showing ------------------------------------------------------------------


def human(n):
    """Bytes as MiB (GiB from 10 GiB), signed when asked by the caller."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= 10 * (1 << 30):
        return "%s%.2f GiB" % (sign, n / float(1 << 30))
    return "%s%.1f MiB" % (sign, n / float(1 << 20))


def _signed(n):
    return "-" if n is None else ("+" if n >= 0 else "") + human(n)


def summary():
    """What the table's foot says: events, peaks, the stage that added the
    most allocated memory."""
    records = list(TIMELINE.records)
    grew = [r for r in records if "allocatedBytes" in r.get("deltaPrevious", {})]
    top = max(grew, key=lambda r: r["deltaPrevious"]["allocatedBytes"], default=None)
    return {
        "events": TIMELINE.count,
        "droppedEvents": max(0, TIMELINE.count - len(records)),
        "maxAllocatedBytes": TIMELINE.max_allocated or None,
        "maxReservedBytes": TIMELINE.max_reserved or None,
        "largestIncrease": None if top is None else {
            "event": top["name"], "after": top["deltaPrevious"]["event"], "elapsed": top["elapsed"],
            "allocatedBytes": top["deltaPrevious"]["allocatedBytes"]},
    }


def format_timeline(limit=None):
    """The console table (seed 002's print_report), as text."""
    records = list(TIMELINE.records)[-limit:] if limit else list(TIMELINE.records)
    head = "%9s  %-24s %7s %12s %12s %12s %12s %13s  %s" % (
        "elapsed", "event", "step", "allocated", "reserved", "max alloc", "max resv", "Δ alloc", "note / vs")
    lines = ["memprof timeline (pid %d, current CUDA device)" % os.getpid(), head]
    for r in records:
        vs = r.get("deltaSince")
        since = ""
        if vs is not None:
            since = "vs %s: missing" % vs["event"] if vs.get("missing") else "vs %s: %s" % (vs["event"], _signed(vs.get("allocatedBytes")))
        note = "  ".join(x for x in (r.get("note", ""), since) if x)
        lines.append("%8.2fs  %-24s %7s %12s %12s %12s %12s %13s  %s" % (
            r["elapsed"], tr.truncate(r["name"], 24), r.get("step", "-"), human(r.get("allocatedBytes")),
            human(r.get("reservedBytes")), human(r.get("maxAllocatedBytes")), human(r.get("maxReservedBytes")),
            _signed(r.get("deltaPrevious", {}).get("allocatedBytes")), note))
        for t in r.get("tensors", []):
            lines.append("%9s    %s %s %s %s %s" % ("", t["name"], "x".join(map(str, t["shape"])) or "scalar", t["dtype"], t["device"], human(t["bytes"])))
        if "model" in r:
            m = r["model"]
            lines.append("%9s    model: %s parameters, %s trainable" % ("", _count(m.get("parameters")), _count(m.get("trainableParameters"))))
    s = summary()
    foot = "%d events" % s["events"]
    if s["droppedEvents"]:
        foot += " (%d oldest not shown)" % s["droppedEvents"]
    foot += "; max allocated %s, max reserved %s" % (human(s["maxAllocatedBytes"]), human(s["maxReservedBytes"]))
    if s["largestIncrease"]:
        li = s["largestIncrease"]
        foot += "; largest increase %s at %s (after %s)" % (_signed(li["allocatedBytes"]), li["event"], li["after"])
    lines.append(foot)
    return "\n".join(lines)


def _count(n):
    return "-" if n is None else "{:,}".format(n)


def export(path):
    """JSON keyed by event name (seed 002's save_to_json): {name: [each
    occurrence, oldest first]} under "events", plus the summary. Written
    atomically; returns the path."""
    events = {}
    for r in TIMELINE.records:
        occurrence = {k: v for k, v in r.items() if k != "name"}
        occurrence["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["t"])) + ("%.6f" % (r["t"] % 1))[1:]
        events.setdefault(r["name"], []).append(occurrence)
    doc = {"version": 1, "pid": os.getpid(), "startedAt": ORIGIN_WALL, "generatedAt": time.time(),
           "events": events, "summary": summary()}
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return path


class LogFile:
    """A timestamped log file in MEMPROF_AGENT_LOG_DIR (read at the first
    record): one line per event, opened once, line-buffered. A failure is
    said once and ends logging."""

    def __init__(self):
        self.f = None
        self.path = None
        self.failed = False
        self.pid = os.getpid()

    def _open(self):
        directory = _config.get("MEMPROF_AGENT_LOG_DIR")
        if not directory:
            self.failed = True  # not asked for: never look again
            return
        os.makedirs(directory, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(ORIGIN_WALL))
        rank = os.environ.get("RANK")
        name = "memprof-timeline-%s-pid%d%s.log" % (stamp, os.getpid(), "-rank%s" % rank if rank and rank.isdigit() else "")
        self.path = os.path.join(directory, name)
        self.f = open(self.path, "a", buffering=1)
        self.f.write("%s memprof timeline of pid %d started (elapsed counts from here)\n" % (_stamp(ORIGIN_WALL), os.getpid()))

    def write(self, rec):
        if self.failed or os.getpid() != self.pid:
            return
        try:
            if self.f is None:
                self._open()
                if self.f is None:
                    return
            self.f.write(log_line(rec) + "\n")
        except Exception as exc:
            self.failed = True
            log.warning("memprof-agent: cannot write the timeline log in MEMPROF_AGENT_LOG_DIR (%r); not logging", exc)

    def close(self):
        try:
            if self.f is not None:
                self.f.close()
        except Exception:
            pass
        self.f = None


def _stamp(t):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + ("%.3f" % (t % 1))[1:]


def log_line(rec):
    parts = [_stamp(rec["t"]), "event=%s" % rec["name"]]
    for key, label in (("allocatedBytes", "allocated"), ("reservedBytes", "reserved"),
                       ("maxAllocatedBytes", "maxAllocated"), ("maxReservedBytes", "maxReserved")):
        if key in rec:
            parts.append("%s=%s" % (label, human(rec[key]).replace(" ", "")))
    parts.append("elapsed=%.2fs" % rec["elapsed"])
    if "step" in rec:
        parts.append("step=%d" % rec["step"])
    d = rec.get("deltaPrevious", {})
    if "allocatedBytes" in d:
        parts.append("dAllocated=%s(vs %s)" % (_signed(d["allocatedBytes"]).replace(" ", ""), d["event"]))
    vs = rec.get("deltaSince")
    if vs is not None and "allocatedBytes" in vs:
        parts.append("dSince=%s(vs %s)" % (_signed(vs["allocatedBytes"]).replace(" ", ""), vs["event"]))
    if "model" in rec:
        parts.append("parameters=%s trainable=%s" % (rec["model"].get("parameters", "-"), rec["model"].get("trainableParameters", "-")))
    for t in rec.get("tensors", []):
        parts.append("tensor[%s]=%s:%s:%s:%s" % (t["name"], "x".join(map(str, t["shape"])), t["dtype"], t["device"], t["bytes"]))
    if rec.get("note"):
        parts.append("note=%s" % json.dumps(rec["note"], ensure_ascii=False))
    return " | ".join(parts)


def print_at_exit():
    """MEMPROF_AGENT_TIMELINE=1: the table on stderr at interpreter exit
    (not in a forked child, not when nothing was recorded)."""
    try:
        if TIMELINE.count and os.getpid() == TIMELINE.log.pid:
            sys.stderr.write(format_timeline() + "\n")
    except Exception:
        pass


def at_exit_wanted():
    return _config.get("MEMPROF_AGENT_TIMELINE")


TIMELINE = Timeline()


def reset():
    """Forgets the timeline (tests)."""
    TIMELINE.log.close()
    TIMELINE.__init__()
