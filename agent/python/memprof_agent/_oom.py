"""The OOM push: one synchronous push with the allocator's snapshot before
a CUDA out-of-memory error propagates, and the hooks that trigger it
(sys.excepthook, threading.excepthook, the allocator's OOM observer).

The numbers of an OOM push are the allocator's state before the exception
unwound (`preOom`, docs/agent.md): after it, the tensors of the failing
step are freed, and a leak would look like cache or fragmentation. The
observer runs before the exception exists, so what it reads is that state;
the other triggers run after the unwinding and take the allocator's peaks
since the previous push instead (upper bounds, marked `source: peaks`).
When MEMPROF_AGENT_OOM_SNAPSHOT names a file, the allocator's own snapshot
is written there too (_snapfile), after the push."""

import os
import sys
import threading
import time

from . import _snapfile
from . import _torchread as tr

# After an OOM push, the exception hook and oom_guard do not push the same
# OOM again (the observer fires first, then the exception unwinds).
OOM_DEDUP_SECONDS = 10.0
# Device fields that stay true after the unwinding (identity, limits, counters).
_KEPT_AFTER = ("index", "uuid", "name", "totalBytes", "allocRetries", "numOoms")


def push(agent, device, requested, message, from_observer):
    from ._core import MARKERS, OOM_TIMEOUT, PUSH_TIMEOUT  # _core imports this module
    from ._transport import OOM_CAP

    now = time.monotonic()
    if not from_observer and agent.last_oom_push is not None and now - agent.last_oom_push < OOM_DEDUP_SECONDS:
        return
    agent.last_oom_push = now
    previous = agent.summary.last_push
    # Waits at most briefly for a push in flight; the OOM push goes anyway.
    got = agent._lock.acquire(timeout=PUSH_TIMEOUT)
    try:
        torch = tr.loaded_torch()
        p = agent.build("oom", reset_peaks=False)
        p["preOom"] = pre_oom(p, previous, from_observer)
        p["devices"] = [dict(d) for d in p["preOom"]["devices"]]
        if requested is None and message:
            requested = tr.requested_from_message(message)
        if torch is not None:
            p["oom"] = tr.oom_snapshot(torch, device, requested, message)
        else:
            p["oom"] = {"message": tr.truncate(message or "", tr.MAX_MESSAGE), "source": "none", "blocks": []}
        agent.summary.observe(p)
        agent.summary.oom = p["oom"]
        agent.send(p, OOM_CAP, OOM_TIMEOUT)
        agent.write_output()
        agent.write_summary(MARKERS.calls if MARKERS.calls else None)
        if torch is not None:
            # After the push: the sidecar hears of the OOM first, whatever the file costs.
            _snapfile.write(torch, os.getpid(), p.get("rank"), device)
    finally:
        if got:
            agent._lock.release()


def pre_oom(p, previous, from_observer):
    """The allocator's state before the exception unwound: what the observer
    read, or (after the unwinding) the peaks since the previous push and,
    in case a periodic push reset them in between, that push's peaks."""
    if from_observer:
        return {"source": "observer", "time": p["time"], "devices": [dict(d) for d in p["devices"]]}
    before = {d.get("index"): d for d in (previous or {}).get("devices", [])}
    devices = []
    for d in p["devices"]:
        b = before.get(d["index"], {})
        e = {k: d[k] for k in _KEPT_AFTER if k in d}
        e["allocatedBytes"] = max(d.get("peakAllocatedBytes", d["allocatedBytes"]), b.get("peakAllocatedBytes", 0))
        e["reservedBytes"] = max(d.get("peakReservedBytes", d["reservedBytes"]), b.get("peakReservedBytes", 0))
        e["allocatedBytes"] = min(e["allocatedBytes"], e["reservedBytes"])
        e["peakAllocatedBytes"], e["peakReservedBytes"] = e["allocatedBytes"], e["reservedBytes"]
        if "totalBytes" in e and e["reservedBytes"] > e["totalBytes"]:
            e.pop("totalBytes")
        devices.append(e)
    return {"source": "peaks", "time": p["time"], "devices": devices}


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
