"""A fake `torch` with the small surface the agent reads (torch.cuda's
allocator statistics, snapshot, OOM observer; torch.distributed), for the
agent's tests only: they must run without a GPU or torch. It records every
call, so a test can prove that the markers call no torch API.

Not a model of PyTorch's behaviour beyond the documented shapes of
memory_stats() and memory._snapshot() (../shared/AGENT-FACTS.md)."""

import sys
import types

GiB = 1 << 30


class OutOfMemoryError(RuntimeError):
    pass


class FakeTorch:
    """State and call log behind the fake module."""

    def __init__(self):
        self.calls = []
        self.allocated = 3 * GiB
        self.reserved = 4 * GiB
        self.peak_allocated = 5 * GiB
        self.total = 80 * GiB
        self.num_ooms = 0
        self.retries = 0
        self.initialized = True
        self.raise_in_stats = None
        self.observers = []
        self.history = None
        self.snapshot = {"segments": []}

    def log(self, name):
        self.calls.append(name)

    # torch.cuda
    def is_available(self):
        self.log("is_available")
        return True

    def is_initialized(self):
        self.log("is_initialized")
        return self.initialized

    def device_count(self):
        self.log("device_count")
        return 1

    def current_device(self):
        self.log("current_device")
        return 0

    def memory_stats(self, device=None):
        self.log("memory_stats")
        if self.raise_in_stats is not None:
            raise self.raise_in_stats
        return {
            "allocated_bytes.all.current": self.allocated,
            "reserved_bytes.all.current": self.reserved,
            "active_bytes.all.current": self.allocated,
            "inactive_split_bytes.all.current": 64 << 20,
            "requested_bytes.all.current": self.allocated - 1000,
            "allocated_bytes.all.peak": max(self.peak_allocated, self.allocated),
            "reserved_bytes.all.peak": self.reserved,
            "segment.all.current": 12,
            "num_alloc_retries": self.retries,
            "num_ooms": self.num_ooms,
        }

    def reset_peak_memory_stats(self, device=None):
        self.log("reset_peak_memory_stats")
        self.peak_allocated = self.allocated

    def mem_get_info(self, device=None):
        self.log("mem_get_info")
        return (self.total - self.reserved - GiB, self.total)

    def get_device_properties(self, device):
        self.log("get_device_properties")
        return types.SimpleNamespace(name="Fake H100", uuid="370fbfe4-cafa-4f4c-9b2e-000000000000", total_memory=self.total)

    def _snapshot(self):
        self.log("_snapshot")
        return self.snapshot

    def _record_memory_history(self, enabled="all", max_entries=0, stacks="all", **kw):
        self.log("_record_memory_history")
        self.history = {"max_entries": max_entries, "stacks": stacks}

    def attach_observer(self, fn):
        self.log("_cuda_attach_out_of_memory_observer")
        self.observers.append(fn)

    def oom(self, alloc=2 * GiB):
        """What the allocator does on an OOM: observers, then the exception."""
        self.num_ooms += 1
        for fn in list(self.observers):
            fn(0, alloc, self.total, GiB)
        return OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
        )


def leak_snapshot(fake, leak_file="train.py"):
    """A snapshot whose largest live block was allocated by the trainer's `leak()`."""
    def frames(name, line):
        return [
            {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
            {"filename": leak_file, "line": line, "name": name},
            {"filename": leak_file, "line": 99, "name": "main"},
        ]

    fake.snapshot = {
        "segments": [
            {
                "device": 0,
                "total_size": 8 * GiB,
                "blocks": [
                    {"size": 6 * GiB, "requested_size": 6 * GiB, "state": "active_allocated", "frames": frames("leak", 42)},
                    {"size": GiB, "requested_size": GiB, "state": "inactive", "frames": []},
                    {"size": 512 << 20, "requested_size": 500 << 20, "state": "active_allocated", "frames": frames("forward", 7)},
                ],
            }
        ]
        + [
            {"device": 0, "total_size": 2 << 20, "blocks": [{"size": 1 << 20, "state": "active_allocated", "frames": frames("small", i)}]}
            for i in range(40)
        ]
    }


def install():
    """Puts a fake `torch` into sys.modules; returns its state."""
    fake = FakeTorch()
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+fake"
    torch.OutOfMemoryError = OutOfMemoryError
    cuda = types.ModuleType("torch.cuda")
    for name in (
        "is_available", "is_initialized", "device_count", "current_device", "memory_stats",
        "reset_peak_memory_stats", "mem_get_info", "get_device_properties",
    ):
        setattr(cuda, name, getattr(fake, name))
    cuda.OutOfMemoryError = OutOfMemoryError
    memory = types.ModuleType("torch.cuda.memory")
    memory._snapshot = fake._snapshot
    memory._record_memory_history = fake._record_memory_history
    cuda.memory = memory
    c = types.ModuleType("torch._C")
    c._cuda_attach_out_of_memory_observer = fake.attach_observer
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: False
    torch.cuda, torch._C, torch.distributed = cuda, c, dist
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory, "torch._C": c, "torch.distributed": dist})
    return fake


def uninstall():
    for name in ("torch", "torch.cuda", "torch.cuda.memory", "torch._C", "torch.distributed"):
        sys.modules.pop(name, None)
