"""The allocator's own snapshot written to a file on a CUDA OOM, for
PyTorch's memory_viz (https://pytorch.org/memory_viz,
`python -m torch.cuda._memory_viz`): `torch.cuda.memory._snapshot()`
pickled, as `torch.cuda.memory._dump_snapshot` writes it, when
MEMPROF_AGENT_OOM_SNAPSHOT names a file (`{pid}`, `{rank}`, `{device}` and
`{host}` filled in).

Bounded, and why:
- one file per process (MAX_FILES): a trainer that catches OOMs and retries
  (oom_guard, a smaller batch) would otherwise write one per attempt into
  the pod's disk, whose ephemeral-storage limit evicts the pod; the first
  OOM holds the state that explains it;
- at most MAX_BYTES: with allocation history recorded, `device_traces`
  (the ring of allocation events, 100000 by default, each with its stack)
  is most of the file; past the bound the traces are dropped and the
  segments, which say what held the memory, kept (the file says so in
  the log line); past it even then, nothing is written.
The snapshot is taken on the trainer's thread in the OOM path (the
observer, before the exception exists): the time is spent once, at an OOM.
Never raises: each kind of failure is said once."""

import os
import pickle
import socket
import time

from . import _config
from ._config import Once

ENV = "MEMPROF_AGENT_OOM_SNAPSHOT"
MAX_FILES = 1
MAX_BYTES = 256 * 1024 * 1024
_say = Once()
_written = []  # paths written by this process


def path_for(template, pid, rank=None, device=None, host=None):
    """The file name: the template with {pid}, {rank}, {device} and {host}
    filled in (a missing rank or device reads `na`)."""
    values = {"pid": pid, "rank": "na" if rank is None else rank, "device": "na" if device is None else device,
              "host": host if host is not None else socket.gethostname()}
    out = template
    for key, value in values.items():
        out = out.replace("{%s}" % key, str(value))
    return out


def encoded(snapshot, max_bytes=MAX_BYTES):
    """(bytes, traces dropped) of the pickled snapshot within max_bytes, or
    (None, True) when even its segments alone do not fit."""
    data = pickle.dumps(snapshot)
    if len(data) <= max_bytes:
        return data, False
    lean = dict(snapshot)
    lean["device_traces"] = [[] for _ in snapshot.get("device_traces") or []]
    data = pickle.dumps(lean)
    return (data, True) if len(data) <= max_bytes else (None, True)


def write(torch, pid, rank=None, device=None, env=None):
    """Writes the snapshot where MEMPROF_AGENT_OOM_SNAPSHOT says, at most
    MAX_FILES per process; the path written, or None."""
    template = _config.get(ENV, env)
    if not template or len(_written) >= MAX_FILES:
        return None
    path = None
    try:
        path = path_for(template, pid, rank, device)
        started = time.monotonic()
        data, dropped = encoded(torch.cuda.memory._snapshot())
        if data is None:
            _say("too large", "memprof-agent: OOM snapshot over %d MiB even without its traces; not written to %s",
                 MAX_BYTES >> 20, path)
            return None
        _store(path, data)
        _written.append(path)
        _config.log.warning("memprof-agent: CUDA OOM snapshot (%d bytes in %.2f s%s) written to %s: open it at "
                            "https://pytorch.org/memory_viz", len(data), time.monotonic() - started,
                            ", allocation traces dropped to stay under %d MiB" % (MAX_BYTES >> 20) if dropped else "",
                            path)
        return path
    except Exception as exc:
        _say(("failed", type(exc).__name__), "memprof-agent: cannot write the OOM snapshot to %s (%r); "
             "training goes on", path or template, exc)
        return None


def _store(path, data):
    """Whole or not at all: a reader never sees half a pickle."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
