"""The agent: what the markers write (plain Python fields), the daemon
thread that reads the allocator and pushes, the OOM push, the standalone
report. Nothing here raises into the trainer: every entry point from
training code catches everything."""

import atexit
import collections
import json
import os
import threading
import time

from . import _autostep
from . import _config
from . import _history
from . import _oom
from . import _risk
from . import _summary
from . import _torchread as tr
from . import _watch
from ._transport import OOM_CAP, SAMPLE_CAP, Transport, encode

MAX_EVENTS_PER_PUSH = 32
MAX_EVENTS_KEPT = 256
# Checkpoint events are kept apart from the others and re-sent until a push
# carrying them is accepted (the operator's restart decision reads them);
# more than this many unsent within one outage keeps the newest.
MAX_CHECKPOINTS_UNSENT = 16
CHECKPOINT_EVENT = "checkpoint"
# step() keeps the time of its newest calls for the summary's step time.
MAX_STEP_TIMES = 4096
MAX_NOTE = 256
PUSH_TIMEOUT = 1.0
OOM_TIMEOUT = 2.0


class Markers:
    """What step(), phase() and record() write: plain fields, no torch call,
    no lock (the GIL makes each write atomic; the daemon thread only reads).
    step() also appends (time, call, tokens, samples) to a bounded deque,
    for the summary's step time and throughput."""

    def __init__(self):
        self.step = None
        self.phases = []
        self.pending = collections.deque(maxlen=MAX_EVENTS_PER_PUSH)
        self.checkpoints = collections.deque(maxlen=MAX_CHECKPOINTS_UNSENT)
        self.checkpoints_evicted = 0
        self.kept = collections.deque(maxlen=MAX_EVENTS_KEPT)
        self.recorded = 0
        self.calls = 0
        self.clock = collections.deque(maxlen=MAX_STEP_TIMES)
        self.samples = None
        self.budget = None
        self.summary_path = None
        # The optimizer step counter (_autostep.AutoStep) while its hook is
        # in torch: step() hands over to the trainer's numbers through it.
        self.auto = None

    def configure(self, env):
        """The step budget and the summary file from the environment."""
        self.budget = _config.get("MEMPROF_AGENT_MAX_STEPS", env)
        self.summary_path = _config.get("MEMPROF_AGENT_SUMMARY", env)

    def phase(self):
        return self.phases[-1] if self.phases else None

    def add(self, event):
        """One record() event (a tuple whose second item is its name):
        checkpoints to their own queue, never bounded away by other events."""
        if event[1] == CHECKPOINT_EVENT:
            if len(self.checkpoints) == self.checkpoints.maxlen:
                self.checkpoints_evicted += 1
            self.checkpoints.append(event)
        else:
            self.pending.append(event)
            self.recorded += 1
        self.kept.append(event)

    def checkpoints_sent(self, events):
        for e in events:
            try:
                self.checkpoints.remove(e)
            except ValueError:
                pass


MARKERS = Markers()
MARKERS.configure(os.environ)
# The verdict, the trainer's on_risk callbacks and the directive acks
# (_risk.py); module-level so that on_risk() works before start().
RISK = _risk.Risk(MARKERS)
# Step numbers from optimizer steps while the trainer never calls step()
# (_autostep.py); armed by Agent.start() (MEMPROF_AGENT_AUTO_STEP).
AUTO = _autostep.AutoStep(MARKERS)

# Extra push fields: (function (kind, torch) -> dict or None, with_push),
# called on the agent's thread for every push (kind "sample", "final" or
# "oom"; torch None until the trainer imported it); their keys are added to
# the push unless already there. A contributor that raises is skipped (said
# once). _extras (host, grads, sizes, tracking) is one of them.
PUSH_CONTRIBUTORS = []


def add_push_contributor(fn, with_push=False):
    """Registers `fn` (see PUSH_CONTRIBUTORS) once; returns it.
    with_push=True: called as fn(kind, torch, push), `push` being the push
    built so far (devices, rssBytes, breakdown; not yet events, acks or
    sites), to be read, not changed."""
    if all(f is not fn for f, _ in PUSH_CONTRIBUTORS):
        PUSH_CONTRIBUTORS.append((fn, bool(with_push)))
    return fn


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
        self.sites = None
        self.timeline = _summary.Timeline()

    def observe(self, push):
        self.last_push = push
        self.timeline.add(push)
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
            "sites": self.sites,
            "risk": RISK.snapshot(),
            "lastPush": self.last_push,
        }


class Agent:
    """One per process: a daemon thread pushing every `interval` seconds
    to `target` (a _transport.Target or a URL)."""

    def __init__(self, interval, target, output, record_history, history_entries,
                 history_at_high=True, history_entries_at_high=_history.DEFAULT_ENTRIES_AT_HIGH,
                 auto_step=False):
        self.interval = interval
        self.auto_step = auto_step
        self.output = output
        self.transport = Transport(target, interval)
        self.history = _history.History(record_history, history_entries, history_at_high,
                                        history_entries_at_high, self.transport.say_once)
        self.summary = Summary()
        self.devices = tr.DeviceCache()
        self.pid = os.getpid()
        self.last_oom_push = None
        self.sites_due = None  # monotonic time at which to take the sites snapshot
        self.sites_outbox = None  # taken, not yet accepted by the sidecar
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._accounted = 0
        self.checkpoints_in_push = []
        self.sites_level = None
        self._thread = None
        self._hooks = None
        self._internal = []
        self.finished = False

    # --- life cycle -------------------------------------------------------

    def start(self):
        try:  # before the thread: it arms the counter too (torch imported later)
            AUTO.start(self.auto_step)
        except Exception as exc:
            AUTO.failure("cannot count optimizer steps", exc)
        self.history.start_if_asked()
        self._internal = [
            RISK.add("high", self._at_high, on_agent_thread=True, internal=True),
            RISK.add("critical", self._at_critical, on_agent_thread=True, internal=True),
        ]
        self._thread = threading.Thread(target=self._run, name="memprof-agent", daemon=True)
        self._thread.start()
        self._hooks = _oom.install_hooks(self)
        atexit.register(self.at_exit)

    def stop(self):
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=PUSH_TIMEOUT + 1.0)
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        for h in self._internal:
            h.remove()
        self._internal = []
        AUTO.stop()
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

    # --- risk: what the agent itself does at high and critical -------------

    def _at_high(self, event):
        self.history.at_risk("risk %s (%s)" % (event.level, event.source))

    def _at_critical(self, event):
        """Allocation sites once recording has run for two intervals (at
        least 1 s), so that blocks allocated since carry frames: now if it
        has, else when it will have. Not "was it on before this callback":
        a verdict that jumps to critical runs the high callback first, which
        turns recording on a moment earlier."""
        self.history.at_risk("risk %s (%s)" % (event.level, event.source))
        self.sites_level = event.level
        now, since = time.monotonic(), self.history.since
        self.sites_due = now if since is None else max(now, since + max(2 * self.interval, 1.0))

    def _take_sites(self):
        if self.sites_due is None or time.monotonic() < self.sites_due:
            return
        torch = tr.loaded_torch()
        if torch is None or not tr.cuda_ready(torch):
            return
        self.sites_due = None
        sites = _history.allocation_sites(torch, self.sites_level, self.history)
        self.sites_outbox = self.summary.sites = sites

    # --- pushes -----------------------------------------------------------

    def build(self, kind, reset_peaks=True):
        """A push of the current numbers (docs/agent-wire.md)."""
        torch = tr.loaded_torch()
        push = {"version": 1, "kind": kind, "time": time.time(), "pid": self.pid}
        rank, local_rank, world = tr.ranks(torch)
        for key, value in (("rank", rank), ("localRank", local_rank), ("worldSize", world)):
            if value is not None and value >= 0:
                push[key] = value
        step = _as_int(MARKERS.step)
        if step is None and AUTO.on:  # counting optimizer steps (_autostep.py), none taken yet
            step = AUTO.steps
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
        for contribute, with_push in list(PUSH_CONTRIBUTORS):
            self._contribute(contribute, with_push, push, kind, torch)
        self._take_events(push)
        return push

    def _contribute(self, fn, with_push, push, kind, torch):
        try:
            extra = fn(kind, torch, push) if with_push else fn(kind, torch)
            for key, value in (extra or {}).items():
                push.setdefault(key, value)
        except Exception as exc:
            name = getattr(fn, "__qualname__", repr(fn))
            self.transport.say_once("contrib-" + name, "memprof-agent: push field contributor %s failed (%r); left out", name, exc)

    def _take_events(self, push):
        """Every unsent checkpoint first (they stay queued until a push
        carrying them is accepted), then other events up to the bound."""
        checkpoints = list(MARKERS.checkpoints)
        events = []
        while MARKERS.pending and len(events) < MAX_EVENTS_PER_PUSH - len(checkpoints):
            events.append(MARKERS.pending.popleft())
        # Events recorded so far are taken, still pending, or were pushed
        # out of the bounded queue (dropped).
        accounted = MARKERS.recorded - len(MARKERS.pending)
        dropped = accounted - self._accounted - len(events) + MARKERS.checkpoints_evicted
        self._accounted = accounted
        MARKERS.checkpoints_evicted = 0
        push["events"] = [_event_json(e) for e in sorted(checkpoints + events, key=lambda e: e[0])]
        self.checkpoints_in_push = checkpoints
        if dropped > 0:
            push["droppedEvents"] = dropped

    def tick(self, kind="sample"):
        """Reads, summarizes, and sends unless backing off."""
        if not self._lock.acquire(timeout=OOM_TIMEOUT):
            return
        try:
            self.history.start_if_asked()
            if self._hooks is not None and not self._hooks.observing:
                self._hooks.observing = _oom.attach_observer(self._hooks)
            if AUTO.wanted():  # torch imported after start()
                AUTO.arm(lazily=True)
            self._take_sites()
            push = self.build(kind)
            self.summary.observe(push)
            # The final push is tried even while backing off: it is the last.
            if kind == "final" or self.transport.ready():
                self.send(push, SAMPLE_CAP, PUSH_TIMEOUT)
            else:
                self.transport.dropped += 1
        finally:
            self._lock.release()

    def send(self, push, cap, timeout):
        """Sends a push with the acks and the sites snapshot that wait for
        one; acts on the answer. What a refused push carried waits for the
        next one (acks, checkpoints, sites)."""
        acks = RISK.take_acks()
        if acks:
            push["acks"] = acks
        sites = self.sites_outbox
        if sites is not None:
            push["sites"] = sites
            cap = max(cap, OOM_CAP)  # once per escalation; frames are the bulk
        checkpoints = self.checkpoints_in_push
        reply = self.transport.send(encode(push, cap), timeout)
        if not reply:
            RISK.give_back(acks)
            return None
        MARKERS.checkpoints_sent(checkpoints)
        if sites is not None and self.sites_outbox is sites:
            self.sites_outbox = None
        try:
            self._act_on(reply)
        except Exception as exc:  # a callback on this thread, torch: never the push's business
            self.transport.say_once("reply", "memprof-agent: acting on the sidecar's answer failed (%r)", exc)
        return reply

    def _act_on(self, reply):
        if getattr(reply, "history", False):
            self.history.at_risk("the sidecar asked")
        verdict = getattr(reply, "verdict", None)
        if verdict is not None:
            RISK.observe(verdict)
        for d in getattr(reply, "directives", ()):
            RISK.directive(d)

    def on_oom(self, device, requested, message, from_observer=False):
        """One synchronous push with the snapshot, before the OOM propagates."""
        _oom.push(self, device, requested, message, from_observer)

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
    out.update(getattr(e, "extra", None) or {})  # _timeline.Event: max*, elapsed, detail
    return out


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None
