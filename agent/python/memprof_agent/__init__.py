"""memprof's in-process agent for PyTorch trainers.

    import memprof_agent
    memprof_agent.start()                 # daemon thread, pushes every second
    for n, batch in enumerate(loader):
        memprof_agent.step(n)
        with memprof_agent.phase("forward"):
            loss = model(batch)
        ...
    memprof_agent.record("eval", note="epoch 3")

Standard library only at import; torch is used when the trainer has
imported it. Nothing here raises into training code, and the markers
(step, phase, record) call no torch API. See README.md and docs/agent.md.
"""

import contextlib
import os
import threading
import time

from . import _core
from . import _torchread
from ._core import MARKERS, truthy
from ._transport import log

__all__ = ["start", "stop", "step", "phase", "record", "oom_guard", "report", "running"]
__version__ = "0.1.0"

_agent = None
_start_lock = threading.Lock()


def start(interval=None, url=None, output=None, record_history=None):
    """Starts the agent once per process; later calls return the running one.

    interval: seconds between pushes (MEMPROF_AGENT_INTERVAL, default 1).
    url: the sidecar's endpoint (MEMPROF_AGENT_URL, default
        http://127.0.0.1:9464/v1/agent).
    output: write a JSON report to this file at exit and after an OOM
        (MEMPROF_AGENT_OUTPUT), for use without a sidecar.
    record_history: record allocation stack frames so an OOM snapshot names
        the allocating code (MEMPROF_AGENT_RECORD_HISTORY=1); costs time on
        every allocation, measure before leaving it on.

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
            try:
                seconds = _core.parse_interval(interval if interval is not None else env.get("MEMPROF_AGENT_INTERVAL"))
            except (TypeError, ValueError) as exc:
                log.warning("memprof-agent: %s; using %ss", exc, _core.DEFAULT_INTERVAL)
                seconds = _core.DEFAULT_INTERVAL
            if record_history is None:
                record_history = truthy(env.get("MEMPROF_AGENT_RECORD_HISTORY"))
            try:
                entries = int(env.get("MEMPROF_AGENT_HISTORY_ENTRIES", _core.DEFAULT_HISTORY_ENTRIES))
            except ValueError:
                entries = _core.DEFAULT_HISTORY_ENTRIES
            agent = _core.Agent(
                interval=seconds,
                url=url or env.get("MEMPROF_AGENT_URL") or _core.DEFAULT_URL,
                output=output or env.get("MEMPROF_AGENT_OUTPUT") or None,
                record_history=bool(record_history),
                history_entries=entries,
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


def step(n=None):
    """Marks the current training step (n, or the previous step + 1). Cheap:
    writes one Python field."""
    try:
        MARKERS.step = n if n is not None else (MARKERS.step or 0) + 1
    except Exception:
        pass


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
    call, ~76 µs: not for every step)."""
    try:
        allocated = reserved = None
        if memory:
            allocated, reserved = _current_memory()
        event = (time.time(), str(name), str(note) if note else "", MARKERS.step, MARKERS.phase(), allocated, reserved)
        MARKERS.pending.append(event)
        MARKERS.kept.append(event)
        MARKERS.recorded += 1
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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
