"""The agent: what the markers write (plain Python fields), the daemon
thread that reads the allocator and pushes, the OOM push, the standalone
report. Nothing here raises into the trainer: every entry point from
training code catches everything."""

import atexit
import collections
import json
import os
import sys
import threading
import time

from . import _extras
from . import _summary
from . import _torchread as tr
from . import _watch
from ._transport import OOM_CAP, SAMPLE_CAP, Transport, encode

DEFAULT_URL = "http://127.0.0.1:9464/v1/agent"
DEFAULT_INTERVAL = 1.0
DEFAULT_HISTORY_ENTRIES = 100000
MAX_EVENTS_PER_PUSH = 32
MAX_EVENTS_KEPT = 256
# step() keeps the time of its newest calls for the summary's step time.
MAX_STEP_TIMES = 4096
MAX_NOTE = 256
PUSH_TIMEOUT = 1.0
OOM_TIMEOUT = 2.0
# After an OOM push, the exception hook and oom_guard do not push the same
# OOM again (the observer fires first, then the exception unwinds).
OOM_DEDUP_SECONDS = 10.0


class Markers:
    """What step(), phase() and record() write: plain fields, no torch call,
    no lock (the GIL makes each write atomic; the daemon thread only reads).
    step() also appends (time, call, tokens, samples) to a bounded deque,
    for the summary's step time and throughput."""

    def __init__(self):
        self.step = None
        self.phases = []
        self.pending = collections.deque(maxlen=MAX_EVENTS_PER_PUSH)
        self.kept = collections.deque(maxlen=MAX_EVENTS_KEPT)
        self.recorded = 0
        self.calls = 0
        self.clock = collections.deque(maxlen=MAX_STEP_TIMES)
        self.samples = None
        self.budget = None
        self.summary_path = None

    def configure(self, env):
        """The step budget and the summary file from the environment."""
        self.budget = _summary.parse_budget(env.get("MEMPROF_AGENT_MAX_STEPS"))
        self.summary_path = env.get("MEMPROF_AGENT_SUMMARY") or None

    def phase(self):
        return self.phases[-1] if self.phases else None


MARKERS = Markers()
MARKERS.configure(os.environ)


def truthy(value):
    return str(value or "").strip().lower() not in ("", "0", "false", "no", "off")


def parse_interval(text, default=DEFAULT_INTERVAL):
    """Seconds from '1', '0.5', '1s' or '500ms'; between 10 ms and 60 s."""
    if text is None or str(text).strip() == "":
        return default
    raw = str(text).strip().lower()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    value = float(raw) * scale
    if not (0.01 <= value <= 60.0):
        raise ValueError("interval %r is outside 10ms..60s" % text)
    return value


class Summary:
    """What the standalone report says, kept as pushes are built: per device
    the highest allocated/reserved, the highest allocated seen per phase at
    push time (sampled; docs/agent.md says why), and the step rate."""

    def __init__(self):
        self.devices = {}
        self.first_step = None
        self.last_step = None
        self.last_push = None
        self.oom = None

    def observe(self, push):
        self.last_push = push
        step = push.get("step")
        if step is not None:
            point = (push["time"], step)
            if self.first_step is None:
                self.first_step = point
            self.last_step = point
        phase = push.get("phase")
        for d in push.get("devices", []):
            s = self.devices.setdefault(d["index"], {"peakAllocatedBytes": 0, "peakReservedBytes": 0, "phasePeaks": {}})
            s["peakAllocatedBytes"] = max(s["peakAllocatedBytes"], d.get("peakAllocatedBytes", d["allocatedBytes"]))
            s["peakReservedBytes"] = max(s["peakReservedBytes"], d.get("peakReservedBytes", d["reservedBytes"]))
            if phase is not None and (phase in s["phasePeaks"] or len(s["phasePeaks"]) < 16):
                s["phasePeaks"][phase] = max(s["phasePeaks"].get(phase, 0), d["allocatedBytes"])
            s["last"] = d

    def steps_per_second(self):
        if not (self.first_step and self.last_step):
            return None
        (t0, s0), (t1, s1) = self.first_step, self.last_step
        if t1 <= t0 or s1 < s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def report(self, events):
        return {
            "version": 1,
            "generatedAt": time.time(),
            "pid": os.getpid(),
            "stepsPerSecond": self.steps_per_second(),
            "lastStep": self.last_step[1] if self.last_step else None,
            "devices": [dict(index=i, **s) for i, s in sorted(self.devices.items())],
            "events": list(events),
            "oom": self.oom,
            "lastPush": self.last_push,
        }


class Agent:
    """One per process: a daemon thread pushing every `interval` seconds."""

    def __init__(self, interval, url, output, record_history, history_entries):
        self.interval = interval
        self.output = output
        self.want_history = record_history
        self.history_entries = history_entries
        self.history_on = False
        self.transport = Transport(url, interval)
        self.summary = Summary()
        self.devices = tr.DeviceCache()
        self.pid = os.getpid()
        self.last_oom_push = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._recorded_at_push = 0
        self._thread = None
        self._hooks = None
        self.finished = False

    # --- life cycle -------------------------------------------------------

    def start(self):
        self._maybe_record_history()
        self._thread = threading.Thread(target=self._run, name="memprof-agent", daemon=True)
        self._thread.start()
        self._hooks = install_hooks(self)
        atexit.register(self.at_exit)

    def stop(self):
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=PUSH_TIMEOUT + 1.0)
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        try:
            atexit.unregister(self.at_exit)
        except Exception:
            pass

    def alive(self):
        """False in a forked child (a DataLoader worker): it is not the trainer."""
        return os.getpid() == self.pid and not self._stop.is_set()

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as exc:  # never let the thread die
                self.transport.say_once("tick", "memprof-agent: reading the allocator failed (%r); will keep trying", exc)

    def at_exit(self):
        try:
            if os.getpid() != self.pid or self.finished:
                return
            self.finish(MARKERS.calls if MARKERS.calls else None)
        except Exception:
            pass

    def finish(self, steps):
        """The last push, the report and the summary, once (interpreter exit
        or the step budget, whichever comes first)."""
        self.finished = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=PUSH_TIMEOUT + 1.0)
        self.tick(kind="final")
        self.write_output()
        self.write_summary(steps)

    def write_summary(self, steps):
        path = MARKERS.summary_path
        if path:
            _summary.write(path, _summary.build(self, MARKERS.clock, steps, _watch.CARRIED.for_push()))

    # --- pushes -----------------------------------------------------------

    def _maybe_record_history(self):
        if not self.want_history or self.history_on:
            return
        torch = tr.loaded_torch()
        # Only once CUDA is up: turning recording on might initialize CUDA
        # from here (a context on a device the trainer may never use).
        if torch is None or not tr.cuda_ready(torch):
            return
        try:
            self.history_on = tr.record_history(torch, self.history_entries)
        except Exception as exc:
            self.want_history = False
            self.transport.say_once("history", "memprof-agent: cannot record allocator history (%r); OOM snapshots will have no stack frames", exc)

    def build(self, kind, reset_peaks=True):
        """A push of the current numbers (docs/agent.md)."""
        torch = tr.loaded_torch()
        push = {"version": 1, "kind": kind, "time": time.time(), "pid": self.pid}
        rank, local_rank, world = tr.ranks(torch)
        for key, value in (("rank", rank), ("localRank", local_rank), ("worldSize", world)):
            if value is not None and value >= 0:
                push[key] = value
        step = _as_int(MARKERS.step)
        if step is not None and step >= 0:
            push["step"] = step
        phase = MARKERS.phase()
        if phase is not None:
            push["phase"] = tr.truncate(phase, tr.MAX_NAME)
        rss = _rss_bytes()
        if rss is not None:
            push["rssBytes"] = rss
        devices = []
        if torch is not None:
            version = getattr(torch, "__version__", None)
            if version:
                push["torchVersion"] = tr.truncate(version, tr.MAX_NAME)
            if tr.cuda_ready(torch):
                devices = tr.read_devices(torch, self.devices, reset_peaks=reset_peaks)
        push["devices"] = devices
        breakdown = _watch.CARRIED.for_push()
        if breakdown is not None:
            push["breakdown"] = breakdown
        _extras.extend(push, torch, kind)  # issue 19's fields (agent-seed's hook; agent-rt's extension point replaces it)
        self._take_events(push)
        return push

    def _take_events(self, push):
        events = []
        while MARKERS.pending and len(events) < MAX_EVENTS_PER_PUSH:
            events.append(MARKERS.pending.popleft())
        recorded = MARKERS.recorded
        dropped = recorded - self._recorded_at_push - len(events)
        self._recorded_at_push = recorded
        push["events"] = [_event_json(e) for e in events]
        if dropped > 0:
            push["droppedEvents"] = dropped

    def tick(self, kind="sample"):
        """Reads, summarizes, and sends unless backing off."""
        if not self._lock.acquire(timeout=OOM_TIMEOUT):
            return
        try:
            self._maybe_record_history()
            if self._hooks is not None and not self._hooks.observing:
                self._hooks.observing = attach_observer(self._hooks)
            push = self.build(kind)
            self.summary.observe(push)
            # The final push is tried even while backing off: it is the last.
            if kind == "final" or self.transport.ready():
                self.transport.send(encode(push, SAMPLE_CAP), PUSH_TIMEOUT)
            else:
                self.transport.dropped += 1
        finally:
            self._lock.release()

    def on_oom(self, device, requested, message, from_observer=False):
        """One synchronous push with the snapshot, before the OOM propagates."""
        now = time.monotonic()
        if not from_observer and self.last_oom_push is not None and now - self.last_oom_push < OOM_DEDUP_SECONDS:
            return
        self.last_oom_push = now
        # Waits at most briefly for a push in flight; the OOM push goes anyway.
        got = self._lock.acquire(timeout=PUSH_TIMEOUT)
        try:
            torch = tr.loaded_torch()
            push = self.build("oom", reset_peaks=False)
            if requested is None and message:
                requested = tr.requested_from_message(message)
            if torch is not None:
                push["oom"] = tr.oom_snapshot(torch, device, requested, message)
            else:
                push["oom"] = {"message": tr.truncate(message or "", tr.MAX_MESSAGE), "source": "none", "blocks": []}
            self.summary.observe(push)
            self.summary.oom = push["oom"]
            self.transport.send(encode(push, OOM_CAP), OOM_TIMEOUT)
            self.write_output()
            self.write_summary(MARKERS.calls if MARKERS.calls else None)
        finally:
            if got:
                self._lock.release()

    def write_output(self):
        if not self.output:
            return
        try:
            report = self.summary.report(_event_json(e) for e in MARKERS.kept)
            tmp = "%s.tmp.%d" % (self.output, os.getpid())
            with open(tmp, "w") as f:
                json.dump(report, f, indent=1)
            os.replace(tmp, self.output)
        except Exception as exc:
            self.transport.say_once("output", "memprof-agent: cannot write %s (%r)", self.output, exc)


def _as_int(value):
    if value is None:
        return None
    try:
        # Not int(tensor) on a CUDA tensor: that would synchronize. A step
        # is an int in practice; anything else is dropped.
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    except Exception:
        pass
    return None


def _event_json(e):
    t, name, note, step, phase, allocated, reserved = e
    out = {"t": t, "name": tr.truncate(name, tr.MAX_NAME)}
    if note:
        out["note"] = tr.truncate(note, MAX_NOTE)
    step = _as_int(step)
    if step is not None and step >= 0:
        out["step"] = step
    if phase is not None:
        out["phase"] = tr.truncate(phase, tr.MAX_NAME)
    if allocated is not None:
        out["allocatedBytes"] = allocated
        out["reservedBytes"] = reserved
    out.update(getattr(e, "extra", None) or {})  # _timeline.Event: max*, elapsed, detail (agent-seed's hook)
    return out


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


class Hooks:
    """sys.excepthook, threading.excepthook and the allocator's OOM
    observer, chained to what was there before."""

    def __init__(self, agent):
        self.agent = agent
        self.prev_sys = sys.excepthook
        self.prev_thread = getattr(threading, "excepthook", None)
        self.active = True
        self.observing = False

    def remove(self):
        self.active = False
        if sys.excepthook is self.sys_hook:
            sys.excepthook = self.prev_sys
        if self.prev_thread is not None and threading.excepthook is self.thread_hook:
            threading.excepthook = self.prev_thread

    def _maybe_push(self, exc):
        try:
            if self.active and self.agent.alive() and tr.is_cuda_oom(exc):
                self.agent.on_oom(None, None, str(exc))
        except Exception:
            pass

    def sys_hook(self, exc_type, exc, tb):
        self._maybe_push(exc)
        self.prev_sys(exc_type, exc, tb)

    def thread_hook(self, args):
        self._maybe_push(args.exc_value)
        self.prev_thread(args)

    def observer(self, device, alloc, device_alloc, device_free):
        """Called by the allocator before it raises (its lock released)."""
        try:
            if self.active and self.agent.alive():
                message = (
                    "CUDA out of memory on device %s: tried to allocate %d bytes "
                    "(device total %d, free %d)" % (device, alloc, device_alloc, device_free)
                )
                self.agent.on_oom(device, alloc, message, from_observer=True)
        except Exception:
            pass


def install_hooks(agent):
    hooks = Hooks(agent)
    sys.excepthook = hooks.sys_hook
    if hooks.prev_thread is not None:
        threading.excepthook = hooks.thread_hook
    hooks.observing = attach_observer(hooks)
    return hooks


def attach_observer(hooks):
    """The allocator's OOM observer is private API: used when present,
    otherwise the exception hooks and oom_guard() catch the OOM. Attached
    once torch is imported and CUDA is up (it cannot be detached: a stopped
    agent's observer does nothing)."""
    torch = tr.loaded_torch()
    if torch is None or not tr.cuda_ready(torch):
        return False
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False
    try:
        attach(hooks.observer)
        return True
    except Exception:
        return False
