"""The storage event trace of a fake run, and the tracked peak per category.

With torch >= 2.5, PyTorch's own MemTracker (torch.distributed._tools)
does the tracking and the categories (parameters, buffers, gradients,
optimizer state, activations, temporaries); this subclass also keeps every
storage's birth and death in order, which the allocator model replays. Its
512 B rounding is applied to the fake CPU device too (it rounds only CUDA
storages, and here everything is on the CPU).

Older torch (2.1 to 2.4, FakeTensorMode but no MemTracker): a dispatch
mode sees every op's output storages and their deaths, with no categories
(all "Other"); the peaks are as exact, the breakdown is missing.
"""

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import allocator
from .. import _config


def _storage_nbytes(st):
    return int(st.nbytes())


class DispatchTracker(TorchDispatchMode):
    """The fallback: each op output's storage, alloc on first sight, free on death."""

    name = "dispatch"

    def __init__(self):
        super().__init__()
        self.events = []
        self._seen = {}
        self._live = 0
        self._peak = 0
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._see(t.untyped_storage())
        return out

    def _see(self, st):
        key = id(st)
        if key in self._seen and self._seen[key]() is st:
            return
        self._next += 1
        token, size = self._next, _storage_nbytes(st)
        self._seen[key] = weakref.ref(st, lambda _, t=token, s=size, k=key: self._die(t, s, k))
        self.events.append(("alloc", token, size))
        self._live += allocator.round_size(size)
        self._peak = max(self._peak, self._live)

    def _die(self, token, size, key):
        self.events.append(("free", token))
        self._live -= allocator.round_size(size)
        self._seen.pop(key, None)

    def peak(self):
        """(bytes per category at the peak, the peak)."""
        return {"Other": self._peak}, self._peak

    def after_step(self):
        """Nothing to reset between steps."""


def memtracker_class():
    """A MemTracker that records its storage events, or None where torch has none."""
    try:
        from torch.distributed._tools import mem_tracker
    except ImportError:
        return None

    def rounded(self):
        return math.ceil(self.size * self.element_size / 512) * 512

    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded

    class EventMemTracker(mem_tracker.MemTracker):
        name = "MemTracker"

        def __init__(self):
            super().__init__()
            self.events = []

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            kind = u_type.name
            if kind in ("DEL", "SIZE"):
                self.events.append(("free", id(winfo)))
            if kind in ("ADD", "SIZE"):
                self.events.append(("alloc", id(winfo), winfo.size * winfo.element_size))
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # MemTracker hooks every parameter, and register_hook raises on a
            # frozen one (a LoRA base): hook only those that get gradients.
            sizes = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for param in module.parameters():
                    if param.requires_grad and param not in self._param_to_grad_hook_handles:
                        self._param_to_grad_hook_handles[param] = self._grad_hooks(param)
            return sizes

        def _grad_hooks(self, param):
            def seen(grad):
                self._update_and_maybe_create_winfos(grad, mem_tracker._MemRefType.GRAD)

            return (param.register_hook(seen),
                    param.register_post_accumulate_grad_hook(lambda p: seen(p.grad)))

        def _pre_fw_hook(self, module, inputs):
            # A root module called twice in one step (gradient accumulation,
            # evaluation) is a new iteration to MemTracker: start its stats anew.
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:
                self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

        def peak(self):
            by_device = self.get_tracker_snapshot("peak")
            categories, total = {}, 0
            for snap in by_device.values():
                for k, v in snap.items():
                    if k == "Total":
                        total += v
                    else:
                        categories[k.value] = categories.get(k.value, 0) + v
            return categories, total

        def after_step(self):
            self.reset_mod_stats()

    return EventMemTracker


def make_tracker():
    """MemTracker where torch has it, else the dispatch fallback (also when
    MEMPROF_ESTIMATE_TRACKER=dispatch: a way round a MemTracker that fails
    on some script)."""
    if _config.get("MEMPROF_ESTIMATE_TRACKER") == "dispatch":
        return DispatchTracker()
    cls = memtracker_class()
    return cls() if cls is not None else DispatchTracker()
