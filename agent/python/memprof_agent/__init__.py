"""memprof's in-process agent for PyTorch trainers.

    import memprof_agent
    memprof_agent.start()                 # daemon thread, pushes every second
    for n, batch in enumerate(loader):
        memprof_agent.step(n)
        with memprof_agent.phase("forward"):
            loss = model(batch)
        ...
    memprof_agent.record("eval", note="epoch 3")

    memprof_agent.on_risk("critical", cb)     # cb(event) at the next step() once the risk is critical
    memprof_agent.watch(model, optimizer)     # breakdown at step 2, activations over step 3
    memprof_agent.breakdown(model, optimizer) # or now, as a dict
    with memprof_agent.trace_modules(model):  # opt-in, costs time per step
        ...
    memprof_agent.watch_gradients(model, optimizer, every=50)  # NaN/Inf, large, vanishing
    memprof_agent.track(every=100)            # opt-in: what grows between samples
    memprof_agent.record_detailed("loaded", tensors={"x": x}, model=model)
    memprof_agent.print_timeline(); memprof_agent.export_timeline("t.json")

Standard library only at import; torch is used when the trainer has
imported it. Nothing here raises into training code, and the markers
step and phase call no torch API (record reads the allocator once). See
README.md and docs/agent.md.
"""

import atexit
import contextlib
import os
import sys
import threading
import time

from . import _breakdown
from . import _config
from . import _core
from . import _extras  # registers the issue-19 push fields (host, grads, sizes, tracking)
from . import _grads
from . import _host
from . import _phases
from . import _sizes
from . import _summary
from . import _timeline
from . import _torchread
from . import _tracking
from . import _transport
from . import _watch
from ._core import MARKERS, RISK
from ._remedy import MicroBatchLoop
from ._risk import RiskEvent
from ._transport import log

__all__ = [
    "start", "stop", "step", "phase", "record", "oom_guard", "report", "running",
    "breakdown", "watch", "last_breakdown", "trace_modules",
    "on_risk", "safe_point", "risk", "RiskEvent", "MicroBatchLoop",
    "record_detailed", "timeline", "print_timeline", "export_timeline",
    "watch_gradients", "last_gradients", "track", "tracking_sample", "tracking_report",
]
__version__ = "0.1.0"

_agent = None
_start_lock = threading.Lock()


def start(interval=None, url=None, output=None, record_history=None, socket=None):
    """Starts the agent once per process; later calls return the running one.

    interval: seconds between pushes (MEMPROF_AGENT_INTERVAL, default 1).
    socket: the sidecar's Unix socket (MEMPROF_AGENT_SOCKET; default
        /var/run/memprof/agent.sock when it exists, else no sidecar).
    url: an http:// loopback URL instead, for old sidecars and tests
        (MEMPROF_AGENT_URL; unauthenticated: docs/agent-wire.md "Transport").
    output: write a JSON report to this file at exit and after an OOM
        (MEMPROF_AGENT_OUTPUT), for use without a sidecar.
    record_history: record allocation stack frames from the start so an OOM
        snapshot names the allocating code (MEMPROF_AGENT_RECORD_HISTORY=1);
        costs time on every allocation. Without it, recording starts when
        the sidecar's verdict reaches high (MEMPROF_AGENT_HISTORY_AT_HIGH=0
        turns that off).

    Returns True when the agent runs, False when disabled or it could not
    start (the reason is logged once). Never raises."""
    global _agent
    try:
        with _start_lock:
            if _agent is not None and _agent.alive():
                return True
            env = os.environ
            if _config.get("MEMPROF_AGENT_DISABLE", env):
                log.info("memprof-agent: disabled by MEMPROF_AGENT_DISABLE")
                return False
            MARKERS.configure(env)
            _configure_seed_parts(env)
            if interval is None:
                seconds = _config.get("MEMPROF_AGENT_INTERVAL", env)
            else:
                try:
                    seconds = _config.parse_interval(interval)
                except (TypeError, ValueError) as exc:
                    log.warning("memprof-agent: %s; using %ss", exc, _config.DEFAULT_INTERVAL)
                    seconds = _config.DEFAULT_INTERVAL
            if record_history is None:
                record_history = _config.get("MEMPROF_AGENT_RECORD_HISTORY", env)
            agent = _core.Agent(
                interval=seconds,
                target=_transport.resolve_target(socket, url, env),
                output=output or _config.get("MEMPROF_AGENT_OUTPUT", env),
                record_history=bool(record_history),
                history_entries=_config.get("MEMPROF_AGENT_HISTORY_ENTRIES", env),
                history_at_high=_config.get("MEMPROF_AGENT_HISTORY_AT_HIGH", env),
                history_entries_at_high=_config.get("MEMPROF_AGENT_HISTORY_ENTRIES_AT_HIGH", env),
                auto_step=_config.get("MEMPROF_AGENT_AUTO_STEP", env),
            )
            agent.start()
            _agent = agent
            return True
    except Exception as exc:
        log.warning("memprof-agent: not started (%r); training runs without it", exc)
        return False


def stop():
    """Stops the agent and removes its hooks (for tests and notebooks)."""
    global _agent
    try:
        with _start_lock:
            if _agent is not None:
                _agent.stop()
            _agent = None
    except Exception:
        pass


def running():
    """Whether the agent runs in this process."""
    return _agent is not None and _agent.alive()


def step(n=None, tokens=None, samples=None):
    """Marks the start of a training step (n, or the previous step + 1);
    tokens= and samples= are what this step processes (for the summary's
    throughput and the breakdown's batch size). Cheap: a few Python field
    writes and a clock read, no torch call.

    Without any step() call, pushes carry the optimizer steps taken so far
    as `step` (MEMPROF_AGENT_AUTO_STEP); the first call turns that off for
    good: the pushes carry this numbering from then on.

    With MEMPROF_AGENT_MAX_STEPS=N, the (N+1)-th call ends the run after N
    steps: final push, summary, then SystemExit(0) from here.

    It is also a safe point: on_risk callbacks queued since the previous
    one run here, in this thread (nothing queued: one length check). With
    track(every=N), every N-th call takes a tracking sample here (a walk of
    the live objects; off: one field check)."""
    m = MARKERS
    try:
        if m.auto is not None:  # optimizer steps were counted: this trainer numbers its own from now on
            m.auto.user_step()
        m.step = n if n is not None else (m.step or 0) + 1
        m.calls += 1
        m.clock.append((time.monotonic(), m.calls, tokens, samples))
        if samples is not None:
            m.samples = samples
    except Exception:
        pass
    try:
        if RISK.pending:
            RISK.run_pending()
    except Exception:
        pass
    try:
        if _tracking.TRACKER.every:  # opt-in: track(); 0 when off
            _tracking.TRACKER.at_step(m.calls, m.step)
    except Exception:
        pass
    if m.budget is not None and m.calls > m.budget:
        _budget_exit()


def _budget_exit():
    """The step budget is spent: the final push first, then the summary
    (Agent.finish), then SystemExit(0) for the trainer to unwind."""
    steps = MARKERS.budget
    MARKERS.budget = None  # once
    try:
        if _agent is not None and _agent.alive():
            _agent.finish(steps)
        elif MARKERS.summary_path:
            _summary.write(MARKERS.summary_path, _summary.build(None, MARKERS.clock, steps, _watch.CARRIED.for_push()))
        log.info("memprof-agent: step budget of %d steps spent (MEMPROF_AGENT_MAX_STEPS); exiting", steps)
    except Exception:
        pass
    raise SystemExit(0)


def breakdown(model, optimizer=None, batch_size=None, sequence_length=None):
    """What holds the memory now, as a dict (docs/agent.md "Breakdown"):
    parameters, gradients, optimizer state, per-sample gradients, by module
    type, the largest parameters and layers, DP-SGD's norms and (given the
    sequence length, for ghost clipping) temporary matrices, NaN/Inf and
    "large" flags, and the activations' peak when watch()
    measured it for this model. Runs one norm per parameter on the device
    (once; not for every step). Pushes carry the latest breakdown. Never
    raises: a failure leaves what could be computed and a note."""
    try:
        torch = _torchread.loaded_torch()
        step_no = MARKERS.step if isinstance(MARKERS.step, int) and not isinstance(MARKERS.step, bool) else None
        batch = batch_size if batch_size is not None else MARKERS.samples
        result = _breakdown.compute(torch, model, optimizer, batch_size=batch, step=step_no,
                                    sequence_length=sequence_length)
        w = _watched[0]
        if w is not None and w.model() is model and w.result is not None:
            for key in ("activationsPeakBytes", "optimizerStepPeakBytes"):
                result[key] = w.result.get(key)
        _watch.CARRIED.breakdown = result
        return _watch.CARRIED.current()
    except Exception as exc:
        log.warning("memprof-agent: breakdown failed (%r)", exc)
        out = _breakdown.empty(batch_size=batch_size)
        out["notes"].append("breakdown: %r" % (exc,))
        return out


_watched = [None]


def watch(model, optimizer=None, batch_size=None):
    """Takes the breakdown automatically: at the second optimizer step (the
    optimizer then has its state, the gradients exist), the activations'
    peak over the third; every push after carries it. Stores weak
    references and two optimizer step hooks, removed at the first forward
    after the third step (without an optimizer: a forward pre-hook on the
    model, the third and fourth forward). Returns True when armed. Never
    raises."""
    try:
        previous = _watched[0]
        if previous is not None:
            previous.finish()
        _watched[0] = _watch.Watch(_torchread.loaded_torch(), model, optimizer, batch_size, MARKERS)
        return True
    except Exception as exc:
        log.warning("memprof-agent: watch() failed (%r); no automatic breakdown", exc)
        return False


def last_breakdown():
    """The breakdown the pushes carry (watch() or the latest breakdown()),
    or None."""
    try:
        return _watch.CARRIED.current()
    except Exception:
        return None


class _NoTrace:
    modules, left_out, optimizer_step_peak = [], 0, None

    def phases(self):
        return []

    def remove(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def trace_modules(model, optimizer=None, backward=True):
    """Opt-in: for each top-level module (at most 32), the bytes its forward
    leaves allocated and the peak its backward adds above its start, and
    the optimizer step's own peak (optimizer=, or the one given to watch()).
    backward=False hooks forwards only (cheaper; no full backward hooks).
    Costs allocator reads at every module boundary of every step
    (docs/agent.md). Returns a handle: .remove() (or use it as a context
    manager), .phases(). Never raises."""
    try:
        if optimizer is None and _watched[0] is not None and _watched[0].optimizer is not None:
            optimizer = _watched[0].optimizer()
        return _phases.Trace(_torchread.loaded_torch(), model, optimizer, backward=backward)
    except Exception as exc:
        log.warning("memprof-agent: trace_modules() failed (%r); not tracing", exc)
        return _NoTrace()


class phase(contextlib.ContextDecorator):
    """`with phase("forward"):` or `@phase("optimizer")`: marks the phase the
    trainer is in, so pushes say where memory was. Cheap: a list append."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        try:
            MARKERS.phases.append(self.name)
        except Exception:
            pass
        return self

    def __exit__(self, *exc):
        try:
            if MARKERS.phases:
                MARKERS.phases.pop()
        except Exception:
            pass
        return False


def record(name, note="", memory=True, since=None):
    """Records an event on the timeline (seed 002's GPUMemoryProfiler.record):
    the current device's allocated, reserved, max allocated and max
    reserved bytes (one allocator read, ~25 us: call it at stage
    boundaries, not in inner loops; memory=False reads nothing) and the
    seconds since the agent was imported. since="name": also the change
    since the latest earlier event of that name. Returns the event as a
    dict (None if it could not be recorded).

    record("checkpoint", note="step=N") tells memprof the trainer saved a
    checkpoint (the operator may wait for one before a restart): such
    events are never dropped by the per-push bound and are sent again until
    a push carrying them is accepted."""
    try:
        return _timeline.record(name, note, memory=memory, since=since, agent=_agent)
    except Exception:
        return None


def record_detailed(name, note="", tensors=None, model=None, since=None):
    """record() plus the shapes, dtypes, devices and bytes of `tensors` (a
    dict of name -> tensor, a list, or one tensor; at most 64) and the
    parameter counts of `model` (an nn.Module: total, trainable, bytes; or
    seed 002's dict {"total_params", "trainable_params"}). No device work."""
    try:
        return _timeline.record(name, note, since=since, tensors=tensors, model=model, agent=_agent)
    except Exception:
        return None


def timeline():
    """The recorded events (the newest 4096), oldest first, as dicts."""
    try:
        return [dict(r) for r in _timeline.TIMELINE.records]
    except Exception:
        return []


def print_timeline(file=None):
    """Prints the timeline as a table (stdout by default); returns the text."""
    try:
        text = _timeline.format_timeline()
        print(text, file=file if file is not None else sys.stdout)
        return text
    except Exception:
        return ""


def export_timeline(path):
    """Writes the timeline as JSON keyed by event name; returns the path,
    or None when it could not be written (said once in the log)."""
    try:
        return _timeline.export(path)
    except Exception as exc:
        log.warning("memprof-agent: cannot export the timeline to %s (%r)", path, exc)
        return None


def watch_gradients(model, optimizer=None, every=50, factor=10.0, eps=1e-10):
    """Opt-in: checks the gradients every `every` optimizer steps (at its
    step pre-hook), or, without an optimizer, at the end of every
    `every`-th backward pass: NaN/Inf, a parameter's gradient norm above
    `factor` x its running median (large), below `eps` (vanishing), and the
    global norm; pushes carry the latest check (`grads`). One fused norm
    and one device-to-host copy per device per check. Replaces an earlier
    watch. Returns True when armed. Never raises."""
    try:
        _grads.watch(_torchread.loaded_torch(), model, optimizer, every=every, factor=factor, eps=eps, markers=MARKERS)
        return True
    except Exception as exc:
        log.warning("memprof-agent: watch_gradients() failed (%r); gradients not checked", exc)
        return False


def last_gradients():
    """The latest gradient check as a dict (with the flagged parameters'
    norms), or None."""
    w = _grads.WATCHED[0]
    return dict(w.detail) if w is not None and w.detail is not None else None


def track(enabled=True, every=100, sites=None):
    """Opt-in reference tracking: every `every`-th step() call walks the
    live objects (gc) and groups tensors by device, dtype, shape and
    allocating site, Python objects by type; pushes carry the top growers
    between the last two samples (`tracking`). sites: look up allocating
    sites in the allocator's snapshot (default: when the agent records
    allocation history). track(False) stops. Returns True."""
    try:
        _tracking.TRACKER.configure(enabled, every, sites)
        return True
    except Exception:
        return False


def tracking_sample():
    """Takes a tracking sample now (a point of the caller's choosing);
    returns the comparison with the previous sample, or None."""
    step_no = MARKERS.step if isinstance(MARKERS.step, int) else None
    return _tracking.TRACKER.sample(step=step_no)


def tracking_report():
    """What grew between the last two tracking samples, as text for the
    terminal."""
    try:
        return _tracking.report()
    except Exception as exc:
        return "memprof tracking: no report (%r)" % (exc,)


def _configure_seed_parts(env):
    """The environment of the seed tools' parts, read at start()."""
    _sizes.configure(env)
    if _tracking.configure_from_env(env):
        atexit.register(_tracking.print_at_exit)


def _history_on():
    return _agent is not None and _agent.history.on


def _reset_seed_parts():
    """Forgets the timeline, the gradient watch, tracking and the size
    histogram's state (tests)."""
    _timeline.reset()
    _grads.unwatch()
    _tracking.TRACKER.__init__()
    _tracking.TRACKER.history_on = _history_on
    _sizes.SIZES[0] = _sizes.Sizes()
    _host.READER[0] = _host.HostReader()
    _extras._say.clear()
    _config.SAY.clear()


_tracking.TRACKER.history_on = _history_on
if _timeline.at_exit_wanted():
    atexit.register(_timeline.print_at_exit)


class oom_guard(contextlib.ContextDecorator):
    """`with oom_guard():` or `@oom_guard()`: on a CUDA out-of-memory error
    inside, one final push with the allocator's snapshot (bounded: 2 s)
    before the exception propagates unchanged."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc is not None and _agent is not None and _agent.alive() and _torchread.is_cuda_oom(exc):
                _agent.on_oom(None, None, str(exc))
        except Exception:
            pass
        return False


def on_risk(level, callback, rearm_after=60.0, on_agent_thread=False):
    """Runs callback(event) once per escalation of the risk to `level`
    ("low", "medium", "high", "critical") or above: the sidecar's verdict
    in a push's answer, or an operator's notifyTrainer directive. It runs
    in the training thread at the next safe point (step(), safe_point(),
    or a memprof helper), never inside a step. It fires again only after
    the verdict stayed below `level` for `rearm_after` seconds.

    The callback gets a RiskEvent (level, threshold, previous, source,
    reason, tto, leak, directive, step) and may return a short text saying
    what it did, or (text, ok) when it could not act (sent to the operator
    in the directive's ack). An
    exception in it is logged once and never reaches training.
    on_agent_thread=True runs it on the agent's thread right away instead:
    only for callbacks that touch nothing of the training (an alert).

    Returns a handle with .remove(). Raises ValueError for a level it does
    not know (at registration only)."""
    return RISK.add(level, callback, rearm_after=rearm_after, on_agent_thread=on_agent_thread)


def safe_point():
    """Runs the on_risk callbacks queued since the previous safe point, in
    this thread; returns how many ran. For loops that do not call step();
    cheap when nothing is queued. Never raises."""
    try:
        return RISK.run_pending()
    except Exception:
        return 0


def risk():
    """The sidecar's latest verdict as a dict (risk, ttoSeconds, leak,
    source, at), or None before the first one."""
    v = RISK.verdict
    return v.as_dict() if v is not None else None


def report():
    """The standalone report as a dict (what MEMPROF_AGENT_OUTPUT gets), or
    None when the agent does not run."""
    try:
        if _agent is None:
            return None
        return _agent.summary.report(_core._event_json(e) for e in MARKERS.kept)
    except Exception:
        return None


def _after_fork_in_child():
    # A forked child (a DataLoader worker) is not the trainer: it neither
    # pushes nor writes the report. Its markers stay harmless field writes.
    global _agent
    _agent = None
    RISK.pending.clear()
    RISK.acks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
