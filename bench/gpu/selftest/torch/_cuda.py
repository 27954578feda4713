"""torch.cuda, torch._C and torch.distributed of the stand-in (see __init__)."""
import contextlib
import time
import types

from torch import _A, _module

cuda = _module("cuda")
memory = _module("cuda.memory")
cuda.memory = memory
_C = _module("_C")
distributed = _module("distributed")


def _stats(device=None):
    return {
        "allocated_bytes.all.current": _A.allocated, "reserved_bytes.all.current": _A.reserved,
        "active_bytes.all.current": _A.allocated, "inactive_split_bytes.all.current": 0,
        "requested_bytes.all.current": _A.allocated, "allocated_bytes.all.peak": _A.peak_alloc,
        "reserved_bytes.all.peak": _A.peak_res, "segment.all.current": 1, "allocation.all.current": 1,
        "num_alloc_retries": 0, "num_ooms": _A.num_ooms,
    }


def _reset_peaks(device=None):
    _A.peak_alloc, _A.peak_res = _A.allocated, _A.reserved


def _empty_cache():
    _A.reserved = _A.allocated


def _set_device(d):
    _A.initialized = True


def _mem_get_info(device=None):
    return (_A.total - _A.context - _A.reserved, _A.total)


def _props(device=None):
    # The sim sidecar's GPU is GPU-sim-0000-00: the agent's push names it.
    return types.SimpleNamespace(name="fake GPU", uuid="sim-0000-00", total_memory=_A.total)


def _attach(fn):
    _A.observers.append(fn)


for _name, _fn in (
    ("is_available", lambda: True), ("is_initialized", lambda: _A.initialized),
    ("device_count", lambda: 1), ("current_device", lambda: 0), ("set_device", _set_device),
    ("synchronize", lambda device=None: time.sleep(_A.sync_s)), ("memory_stats", _stats),
    ("reset_peak_memory_stats", _reset_peaks), ("empty_cache", _empty_cache),
    ("mem_get_info", _mem_get_info), ("get_device_properties", _props),
    ("memory_allocated", lambda device=None: _A.allocated), ("memory_reserved", lambda device=None: _A.reserved),
    ("max_memory_allocated", lambda device=None: _A.peak_alloc),
    ("max_memory_reserved", lambda device=None: _A.peak_res),
):
    setattr(cuda, _name, _fn)
memory._snapshot = lambda: {"segments": []}
_C._cuda_attach_out_of_memory_observer = _attach
distributed.is_available = lambda: False
distributed.is_initialized = lambda: False


class _Stream:
    """A side stream: the stand-in's allocator has one pool for all."""

    def __init__(self, device=None):
        self.device = device


@contextlib.contextmanager
def _on_stream(s):
    yield s


cuda.Stream = _Stream
cuda.stream = _on_stream
cuda.init = lambda: None
