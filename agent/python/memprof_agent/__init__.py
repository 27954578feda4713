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

Standard library only at import; torch is used when the trainer has
imported it. Nothing here raises into training code, and the markers
(step, phase, record) call no torch API. See README.md and docs/agent.md.
"""

import contextlib
import os
import threading
import time

from . import _breakdown
from . import _core
from . import _history
from . import _phases
from . import _summary
from . import _torchread
from . import _transport
from . import _watch
from ._core import MARKERS, RISK, truthy
from ._remedy import MicroBatchLoop
from ._risk import RiskEvent
from ._transport import log

__all__ = [
    "start", "stop", "step", "phase", "record", "oom_guard", "report", "running",
    "breakdown", "watch", "last_breakdown", "trace_modules",
    "on_risk", "safe_point", "risk", "RiskEvent", "MicroBatchLoop",
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
        (MEMPROF_AGENT_URL; unauthenticated: docs/agent.md "Transport").
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
            if truthy(os.environ.get("MEMPROF_AGENT_DISABLE")):
                log.info("memprof-agent: disabled by MEMPROF_AGENT_DISABLE")
                return False
            env = os.environ
            MARKERS.configure(env)
            try:
                seconds = _core.parse_interval(interval if interval is not None else env.get("MEMPROF_AGENT_INTERVAL"))
            except (TypeError, ValueError) as exc:
                log.warning("memprof-agent: %s; using %ss", exc, _core.DEFAULT_INTERVAL)
                seconds = _core.DEFAULT_INTERVAL
            if record_history is None:
                record_history = truthy(env.get("MEMPROF_AGENT_RECORD_HISTORY"))
            entries = _env_int(env, "MEMPROF_AGENT_HISTORY_ENTRIES", _core.DEFAULT_HISTORY_ENTRIES)
            agent = _core.Agent(
                interval=seconds,
                target=_transport.resolve_target(socket, url, env),
                output=output or env.get("MEMPROF_AGENT_OUTPUT") or None,
                record_history=bool(record_history),
                history_entries=entries,
                history_at_high=truthy(env.get("MEMPROF_AGENT_HISTORY_AT_HIGH", "1")),
                history_entries_at_high=_env_int(env, "MEMPROF_AGENT_HISTORY_ENTRIES_AT_HIGH",
                                                 _history.DEFAULT_ENTRIES_AT_HIGH),
            )
            agent.start()
            _agent = agent
            return True
    except Exception as exc:
        log.warning("memprof-agent: not started (%r); training runs without it", exc)
        return False


def _env_int(env, name, default):
    try:
        value = int(env.get(name, default))
        return value if value > 0 else default
    except ValueError:
        return default


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

    With MEMPROF_AGENT_MAX_STEPS=N, the (N+1)-th call ends the run after N
    steps: final push, summary, then SystemExit(0) from here.

    It is also a safe point: on_risk callbacks queued since the previous
    one run here, in this thread (nothing queued: one length check)."""
    m = MARKERS
    try:
        m.step = n if n is not None else (m.step or 0) + 1
        m.calls += 1
        m.clock.append((time.monotonic(), m.calls, tokens, samples))
        if samples is not None:
            m.samples = samples
        if RISK.pending:
            RISK.run_pending()
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


def breakdown(model, optimizer=None, batch_size=None):
    """What holds the memory now, as a dict (docs/agent.md "Breakdown"):
    parameters, gradients, optimizer state, per-sample gradients, by module
    type, NaN/Inf and "large" flags, and the activations' peak when watch()
    measured it for this model. Runs one norm per parameter on the device
    (once; not for every step). Pushes carry the latest breakdown. Never
    raises: a failure leaves what could be computed and a note."""
    try:
        torch = _torchread.loaded_torch()
        step_no = MARKERS.step if isinstance(MARKERS.step, int) and not isinstance(MARKERS.step, bool) else None
        batch = batch_size if batch_size is not None else MARKERS.samples
        result = _breakdown.compute(torch, model, optimizer, batch_size=batch, step=step_no)
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


def record(name, note="", memory=False):
    """Records an event on the timeline (the seed's GPUMemoryProfiler.record).
    Cheap by default: a tuple appended to two bounded deques. memory=True also
    reads the current device's allocated/reserved bytes (one memory_stats()
    call, ~76 µs: not for every step).

    record("checkpoint", note="step=N") tells memprof the trainer saved a
    checkpoint (the operator may wait for one before a restart): such
    events are never dropped by the per-push bound and are sent again until
    a push carrying them is accepted."""
    try:
        allocated = reserved = None
        if memory:
            allocated, reserved = _current_memory()
        event = (time.time(), str(name), str(note) if note else "", MARKERS.step, MARKERS.phase(), allocated, reserved)
        MARKERS.add(event)
    except Exception:
        pass


def _current_memory():
    torch = _torchread.loaded_torch()
    if torch is None or not _torchread.cuda_ready(torch):
        return None, None
    try:
        stats = torch.cuda.memory_stats()
        return int(stats.get("allocated_bytes.all.current", 0)), int(stats.get("reserved_bytes.all.current", 0))
    except Exception:
        return None, None


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
