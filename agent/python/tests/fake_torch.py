"""A fake `torch` with the small surface the agent reads (torch.cuda's
allocator statistics, snapshot, OOM observer; torch.distributed), for the
agent's tests only: they must run without a GPU or torch. It records every
call, so a test can prove that the markers call no torch API.

Not a model of PyTorch's behaviour beyond the documented shapes of
memory_stats() and memory._snapshot() (../shared/AGENT-FACTS.md), and, for
the breakdown, the nn.Module / Parameter / optimizer surface it reads
(named_modules, named_parameters(recurse=False), numel, element_size,
data_ptr, .grad, optimizer.state, step hooks, forward/backward hooks;
torch.optim.optimizer's global step post-hook),
with the same names and signatures as torch's."""

import collections
import math
import sys
import threading
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
        self.peak_reserved = 0  # the reserved peak is at least the current reserved
        self.split = 64 << 20  # inactive split bytes now
        self.peak_split = 0  # the split peak is at least the current split
        self.total = 80 * GiB
        self.num_ooms = 0
        self.retries = 0
        self.initialized = True
        self.raise_in_stats = None
        self.observers = []
        self.history = None
        self.snapshot = {"segments": []}
        # memory_stats()' pool counters (torch's keys: allocation.{small,large}_pool.*,
        # oversize_allocations.*, inactive_split.*, max_split_size; -1: not set,
        # SIZE_MAX as torch's int64 shows it).
        self.pool_current = {"small_pool": 0, "large_pool": 0}
        self.pool_allocated = {"small_pool": 0, "large_pool": 0}
        self.oversize = (0, 0)
        self.inactive_splits = 0
        self.max_split_size = -1

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
            "inactive_split_bytes.all.current": self.split,
            "inactive_split_bytes.all.peak": max(self.peak_split, self.split),
            "requested_bytes.all.current": self.allocated - 1000,
            "allocated_bytes.all.peak": max(self.peak_allocated, self.allocated),
            "reserved_bytes.all.peak": max(self.peak_reserved, self.reserved),
            "segment.all.current": 12,
            "num_alloc_retries": self.retries,
            "num_ooms": self.num_ooms,
            "max_split_size": self.max_split_size,
            "allocation.all.current": sum(self.pool_current.values()),
            "allocation.small_pool.current": self.pool_current["small_pool"],
            "allocation.large_pool.current": self.pool_current["large_pool"],
            "allocation.all.allocated": sum(self.pool_allocated.values()),
            "allocation.small_pool.allocated": self.pool_allocated["small_pool"],
            "allocation.large_pool.allocated": self.pool_allocated["large_pool"],
            "oversize_allocations.current": self.oversize[0],
            "oversize_allocations.allocated": self.oversize[1],
            "inactive_split.all.current": self.inactive_splits,
        }

    def request(self, size, n=1):
        """n allocation requests of `size` bytes kept live: the pool
        counters as the caching allocator moves them (<= 1 MiB: small pool)."""
        pool = "small_pool" if size <= (1 << 20) else "large_pool"
        self.pool_current[pool] += n
        self.pool_allocated[pool] += n
        if pool == "large_pool" and 0 < self.max_split_size < size:
            self.oversize = (self.oversize[0] + n, self.oversize[1] + n)

    def reset_peak_memory_stats(self, device=None):
        self.log("reset_peak_memory_stats")
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved
        self.peak_split = self.split

    def memory_stats_as_nested_dict(self, device=None):
        self.log("memory_stats_as_nested_dict")
        return self._nested()

    def _cuda_memoryStats(self, device):
        """torch._C's: what memory_stats_as_nested_dict calls (device: an int)."""
        self.log("_cuda_memoryStats")
        if not isinstance(device, int):
            raise TypeError("invalid argument to memory_allocated")
        return self._nested()

    def _cuda_resetPeakMemoryStats(self, device):
        self.log("_cuda_resetPeakMemoryStats")
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved
        self.peak_split = self.split

    def _nested(self):
        if self.raise_in_stats is not None:
            raise self.raise_in_stats
        return {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": max(self.peak_allocated, self.allocated)}},
            "reserved_bytes": {"all": {"current": self.reserved, "peak": max(self.peak_reserved, self.reserved)}},
            "inactive_split_bytes": {"all": {"current": self.split, "peak": max(self.peak_split, self.split)}},
        }

    def alloc(self, n):
        """What an allocation does to the statistics (tests drive it)."""
        self.allocated += int(n)
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, n):
        self.allocated -= int(n)

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


# --- tensors, modules, optimizers: the surface memprof_agent.breakdown,
# watch and trace_modules read, with real torch's names and signatures.


class DType:
    def __init__(self, name, itemsize, floating=True):
        self.name, self.itemsize, self.is_floating_point = name, itemsize, floating

    def __repr__(self):
        return "torch." + self.name


float32 = DType("float32", 4)
bfloat16 = DType("bfloat16", 2)
float16 = DType("float16", 2)
int8 = DType("int8", 1, floating=False)


class Device:
    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)

    def __repr__(self):
        return "device(%r)" % str(self)


CUDA0 = Device("cuda", 0)
CPU = Device("cpu")
_next_ptr = [1 << 20]


class Tensor:
    """Every element equals `fill`, except one element `special` when set
    (a NaN, an infinity, an outlier): enough to give norms and isnan/isinf
    real answers without holding the elements."""

    def __init__(self, *shape, dtype=float32, device=CUDA0, fill=0.02, special=None, ptr=None):
        self.shape = tuple(shape)
        self.dtype, self.device, self.fill, self.special = dtype, device, fill, special
        self.requires_grad = False
        self.grad = None
        self._post_accumulate = []
        if ptr is None:
            ptr = _next_ptr[0]
            _next_ptr[0] += max(1, self.numel() * dtype.itemsize) + 512
        self._ptr = ptr

    is_sparse = False

    def register_post_accumulate_grad_hook(self, fn):
        """torch >= 2.1: fn(param) after its .grad was accumulated in backward."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        self._post_accumulate.append(fn)
        return _Handle(self._post_accumulate, fn)

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self):
        return self.dtype.itemsize

    def data_ptr(self):
        return 0 if self.device.type == "meta" else self._ptr

    def dim(self):
        return len(self.shape)

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def detach(self):
        return self

    def view_as_same(self):
        """Another tensor object on the same memory (a tied weight's view)."""
        return Tensor(*self.shape, dtype=self.dtype, device=self.device, fill=self.fill, special=self.special, ptr=self._ptr)

    def _values(self):
        n = self.numel()
        if self.special is None:
            return [(self.fill, n)]
        return [(self.fill, n - 1), (self.special, 1)]


class Scalar:
    def __init__(self, value):
        self.value = value

    def float(self):
        return self

    def item(self):
        return self.value

    def any(self):
        return self


class Parameter(Tensor):
    def __init__(self, data=None, requires_grad=True, **kw):
        if data is not None:
            super().__init__(*data.shape, dtype=data.dtype, device=data.device, fill=data.fill, special=data.special)
        else:
            super().__init__(**kw)
        self.requires_grad = requires_grad


def param(*shape, requires_grad=True, **kw):
    p = Parameter(Tensor(*shape, **kw), requires_grad=requires_grad)
    return p


def vector_norm(t, ord=2, dim=None, keepdim=False, dtype=None):
    total = 0.0
    for v, n in t._values():
        if v != v:
            return Scalar(float("nan"))
        if v in (float("inf"), float("-inf")):
            return Scalar(float("inf"))
        total += v * v * n
    norm = math.sqrt(total)
    if (dtype or t.dtype) is float16 and norm > 65504.0:
        norm = float("inf")  # torch returns the norm in the tensor's dtype (or `dtype`)
    return Scalar(norm)


def _foreach_norm(tensors, ord=2, dtype=None):
    """torch._foreach_norm(Tensor[] self, Scalar ord=2, ScalarType? dtype=None):
    one 0-dim norm per tensor (one fused kernel on a GPU)."""
    if STATE[0] is not None:
        STATE[0].log("_foreach_norm")
    return [vector_norm(t, ord, dtype=dtype) for t in tensors]


def stack(scalars):
    def tolist():
        if STATE[0] is not None:
            STATE[0].log("tolist")  # the device-to-host copy: a sync
        return [s.value for s in scalars]

    return types.SimpleNamespace(tolist=tolist)


def isnan(t):
    return Scalar(any(v != v for v, _ in t._values()))


def isinf(t):
    return Scalar(any(v in (float("inf"), float("-inf")) for v, _ in t._values()))


def isfinite(t):
    class _All:
        def all(self):
            return Scalar(all(v == v and v not in (float("inf"), float("-inf")) for v, _ in t._values()))

    return _All()


class _Handle:
    def __init__(self, hooks, fn):
        self.hooks, self.fn = hooks, fn

    def remove(self):
        if self.fn in self.hooks:
            self.hooks.remove(self.fn)


class _DictHandle:
    """torch.utils.hooks.RemovableHandle over an OrderedDict of hooks."""

    _next = [0]

    def __init__(self, hooks, fn):
        self.hooks, self.id = hooks, self._next[0]
        self._next[0] += 1
        hooks[self.id] = fn

    def remove(self):
        self.hooks.pop(self.id, None)


class _NoGrad:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# The modules whose forward ran since the last backward(), for run_backward().
TAPE = []


class Module:
    """nn.Module's registration, traversal and hooks. forward() calls the
    children in order and allocates `fwd_bytes` on the fake device (set
    by tests); run_backward() runs each module's backward, last called
    first: `bwd_temp` bytes allocated and freed again (its peak), then
    `bwd_bytes` (net; negative: it frees), inside the full backward hooks;
    with `inputs_need_grad` False the hooks both fire first, as torch does
    for a module none of whose inputs requires a gradient."""

    fwd_bytes = 0
    bwd_bytes = 0
    bwd_temp = 0
    inputs_need_grad = True
    recompute = False  # checkpointed: its forward runs again inside its backward
    device = None

    def __init__(self):
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})
        self._fpre, self._fpost, self._bpre, self._bpost = [], [], [], []

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def named_children(self):
        return list(self._modules.items())

    def named_modules(self, prefix=""):
        seen, out = set(), []

        def walk(m, path):
            if id(m) in seen:
                return
            seen.add(id(m))
            out.append((path, m))
            for n, c in m._modules.items():
                walk(c, "%s.%s" % (path, n) if path else n)

        walk(self, prefix)
        return out

    def named_parameters(self, prefix="", recurse=True):
        if not recurse:
            return [("%s.%s" % (prefix, n) if prefix else n, p) for n, p in self._parameters.items() if p is not None]
        seen, out = set(), []
        for path, m in self.named_modules(prefix):
            for n, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    out.append(("%s.%s" % (path, n) if path else n, p))
        return out

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def register_forward_pre_hook(self, fn):
        self._fpre.append(fn)
        return _Handle(self._fpre, fn)

    def register_forward_hook(self, fn):
        self._fpost.append(fn)
        return _Handle(self._fpost, fn)

    def register_full_backward_pre_hook(self, fn):
        self._bpre.append(fn)
        return _Handle(self._bpre, fn)

    def register_full_backward_hook(self, fn):
        self._bpost.append(fn)
        return _Handle(self._bpost, fn)

    def forward(self, x):
        for _, c in self._modules.items():
            if not isinstance(c, (ModuleDict, ModuleList)) or isinstance(c, Sequential):
                x = c(x)
            else:
                for _, e in c._modules.items():
                    x = e(x)
        return x

    def __call__(self, x):
        for fn in list(self._fpre):
            fn(self, (x,))
        TAPE.append(self)
        if STATE[0] is not None and self.fwd_bytes:
            STATE[0].alloc(self.fwd_bytes)
        out = self.forward(x)
        for fn in list(self._fpost):
            fn(self, (x,), out)
        return out


class Linear(Module):
    def __init__(self, i, o, bias=True, **kw):
        super().__init__()
        self.in_features, self.out_features = i, o
        self.weight = param(o, i, **kw)
        if bias:
            self.bias = param(o, fill=0.0, **{k: v for k, v in kw.items() if k != "fill"})


class Embedding(Module):
    def __init__(self, n, d, **kw):
        super().__init__()
        self.weight = param(n, d, **dict({"fill": 1.0}, **kw))


class LayerNorm(Module):
    def __init__(self, d, **kw):
        super().__init__()
        self.weight = param(d, fill=1.0, **kw)
        self.bias = param(d, fill=0.0, **kw)


class ModuleList(Module):
    def __init__(self, items=()):
        super().__init__()
        for i, m in enumerate(items):
            setattr(self, str(i), m)


class Sequential(ModuleList):
    pass


class ModuleDict(Module):
    def __init__(self, items=None):
        super().__init__()
        for k, m in (items or {}).items():
            setattr(self, k, m)


class MultiheadAttention(Module):
    def __init__(self, d, **kw):
        super().__init__()
        self.in_proj_weight = param(3 * d, d, **kw)
        self.in_proj_bias = param(3 * d, fill=0.0, **kw)
        self.out_proj = Linear(d, d, **kw)


GRAD = object()  # a gradient (the hooks only look at whether it is None)


def run_backward(on_thread=True):
    """What loss.backward() does to the hooks, on another thread (torch's
    engine runs CUDA backward on a thread of its own; the caller waits;
    on_thread=False: on the caller's, for bench/agent_trace_cost.py, where
    starting a thread per step would swamp what it measures):
    full backward pre-hook, the module's backward (its forward again first
    when `recompute`; bwd_temp, bwd_bytes), full backward hook with the
    input gradients (all None when no input needs one: then torch calls it
    right after the pre-hook, before the module's backward), last called first."""
    tape = TAPE[:]
    del TAPE[:]
    if not on_thread:
        return _backward(tape)
    failed = []

    def engine():
        try:
            _backward(tape)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=engine)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def _backward(tape):
    for m in reversed(tape):
        for fn in list(m._bpre):
            fn(m, (GRAD,))
        if not m.inputs_need_grad:
            for fn in list(m._bpost):
                fn(m, (None,), (GRAD,))
        if m.recompute:
            n = len(TAPE)
            m(None)
            del TAPE[n:]
        fake = STATE[0]
        if fake is not None:
            fake.alloc(m.bwd_temp)
            fake.free(m.bwd_temp)
            fake.alloc(m.bwd_bytes)
        if m.inputs_need_grad:
            for fn in list(m._bpost):
                fn(m, (GRAD,), (GRAD,))


class AdamW:
    """An optimizer with torch's step-hook API and Adam's state: step (a
    CPU scalar, as torch keeps it unless fused/capturable), exp_avg and
    exp_avg_sq shaped like the parameter, made at the first step. Each
    step allocates `step_bytes` temporarily (foreach kernels' scratch)."""

    def __init__(self, params, step_bytes=0):
        self.param_groups = [{"params": list(params)}]
        self.state = {}
        self.step_bytes = step_bytes
        self._pre, self._post = collections.OrderedDict(), collections.OrderedDict()

    def register_step_pre_hook(self, fn):
        return _DictHandle(self._pre, fn)

    def register_step_post_hook(self, fn):
        return _DictHandle(self._post, fn)

    def step(self):
        # torch iterates its hook dicts live (Optimizer.profile_hook_step):
        # a hook removed from inside a hook raises here, as it does there.
        for fn in self._pre.values():
            fn(self, (), {})
        fake = STATE[0]
        if fake is not None and self.step_bytes:
            fake.alloc(self.step_bytes)
            fake.free(self.step_bytes)
        for p in self.param_groups[0]["params"]:
            if p.grad is None or p in self.state:
                continue
            like = dict(dtype=p.dtype, device=p.device, fill=0.0)
            self.state[p] = {"step": Tensor(dtype=float32, device=CPU, fill=1.0),
                             "exp_avg": Tensor(*p.shape, **like), "exp_avg_sq": Tensor(*p.shape, **like)}
        OPTIM[0].run_post_hooks(self, self._post)


# torch.optim.optimizer's global step post-hooks (torch >= 2.0:
# register_optimizer_step_post_hook), as torch runs them after an
# optimizer's own (Optimizer.profile_hook_step): iterated live, so a hook
# added or removed while they run makes step() raise, as it does there.
# Made by exec into a module named torch.optim.optimizer, so the loop's
# frames belong to that module, as torch's do.
_OPTIMIZER_SOURCE = """
import collections
import itertools

_global_optimizer_post_hooks = collections.OrderedDict()


class _Handle:
    _next = [0]

    def __init__(self, hooks):
        self.hooks, self.id = hooks, self._next[0]
        self._next[0] += 1

    def remove(self):
        if self.id in self.hooks:
            del self.hooks[self.id]


def register_optimizer_step_post_hook(hook):
    handle = _Handle(_global_optimizer_post_hooks)
    _global_optimizer_post_hooks[handle.id] = hook
    return handle


def run_post_hooks(optimizer, own):
    for post_hook in itertools.chain(own.values(), _global_optimizer_post_hooks.values()):
        post_hook(optimizer, (), {})
"""


def optimizer_module(global_hook=True):
    """A fresh torch.optim.optimizer; global_hook=False: as torch < 2.0,
    without register_optimizer_step_post_hook."""
    m = types.ModuleType("torch.optim.optimizer")
    exec(compile(_OPTIMIZER_SOURCE, "<fake torch/optim/optimizer.py>", "exec"), m.__dict__)
    if not global_hook:
        del m.register_optimizer_step_post_hook
    return m


OPTIM = [optimizer_module()]


def make_grads(model, fill=0.02, special=None):
    """The gradients a backward pass leaves: every trainable parameter's
    .grad (all elements `fill`; special={name: value} puts one element of
    that parameter's gradient at value: a NaN, an infinity, an outlier)."""
    special = special or {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.grad = Tensor(*p.shape, dtype=p.dtype, device=p.device, fill=fill, special=special.get(name))


class _Engine:
    """torch.autograd.Variable._execution_engine: queue_callback(fn) runs fn
    when the current backward pass ends, and only works inside one."""

    def __init__(self):
        self.callbacks = None

    def queue_callback(self, fn):
        if self.callbacks is None:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        self.callbacks.append(fn)


ENGINE = _Engine()


def backward_grads(model, fill=0.02, special=None):
    """A backward pass as the engine runs it for the parameters: each
    trainable parameter's gradient accumulated (make_grads), its
    post-accumulate-grad hooks called, then the queued final callbacks."""
    ENGINE.callbacks = []
    try:
        make_grads(model, fill=fill, special=special)
        for _, p in model.named_parameters():
            if p.requires_grad:
                for fn in list(p._post_accumulate):
                    fn(p)
        callbacks = ENGINE.callbacks
    finally:
        ENGINE.callbacks = None
    for fn in callbacks:
        fn()


STATE = [None]


NAMES = ("torch", "torch.cuda", "torch.cuda.memory", "torch._C", "torch.distributed", "torch.nn", "torch.linalg", "torch.autograd",
         "torch.optim", "torch.optim.optimizer")
# The installed torch's modules the fake replaced, kept for real(): once
# torch is imported, importing it again after uninstall() took it out of
# sys.modules aborts the interpreter (its C extension initializes once).
_REAL = {}


def install():
    """Puts a fake `torch` into sys.modules; returns its state."""
    for name in NAMES:
        m = sys.modules.get(name)
        if m is not None and not getattr(m, "_memprof_fake", False):
            _REAL[name] = m
    fake = FakeTorch()
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+fake"
    torch.OutOfMemoryError = OutOfMemoryError
    cuda = types.ModuleType("torch.cuda")
    for name in (
        "is_available", "is_initialized", "device_count", "current_device", "memory_stats",
        "reset_peak_memory_stats", "mem_get_info", "get_device_properties", "memory_stats_as_nested_dict",
    ):
        setattr(cuda, name, getattr(fake, name))
    cuda.OutOfMemoryError = OutOfMemoryError
    memory = types.ModuleType("torch.cuda.memory")
    memory._snapshot = fake._snapshot
    memory._record_memory_history = fake._record_memory_history
    cuda.memory = memory
    c = types.ModuleType("torch._C")
    c._cuda_attach_out_of_memory_observer = fake.attach_observer
    c._cuda_memoryStats = fake._cuda_memoryStats
    c._cuda_resetPeakMemoryStats = fake._cuda_resetPeakMemoryStats
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: False
    torch.cuda, torch._C, torch.distributed = cuda, c, dist
    nn = types.ModuleType("torch.nn")
    for cls in (Module, Parameter, Linear, Embedding, LayerNorm, ModuleList, Sequential, ModuleDict, MultiheadAttention):
        setattr(nn, cls.__name__, cls)
    linalg = types.ModuleType("torch.linalg")
    linalg.vector_norm = vector_norm
    torch.nn, torch.linalg, torch.Tensor = nn, linalg, Tensor
    torch.is_tensor = lambda x: isinstance(x, Tensor)
    torch.stack, torch.isnan, torch.isinf, torch.no_grad = stack, isnan, isinf, _NoGrad
    torch.isfinite, torch._foreach_norm = isfinite, _foreach_norm
    autograd = types.ModuleType("torch.autograd")
    autograd.Variable = type("Variable", (), {"_execution_engine": ENGINE})
    torch.autograd = autograd
    optim = types.ModuleType("torch.optim")
    optim.optimizer = OPTIM[0] = optimizer_module()
    optim.AdamW = AdamW
    torch.optim = optim
    ENGINE.callbacks = None
    torch.float32, torch.bfloat16, torch.float16 = float32, bfloat16, float16
    STATE[0] = fake
    del TAPE[:]
    modules = {"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory, "torch._C": c,
               "torch.distributed": dist, "torch.nn": nn, "torch.linalg": linalg, "torch.autograd": autograd,
               "torch.optim": optim, "torch.optim.optimizer": optim.optimizer}
    for m in modules.values():
        m._memprof_fake = True
    sys.modules.update(modules)
    return fake


def uninstall():
    STATE[0] = None
    for name in NAMES:
        sys.modules.pop(name, None)


def real():
    """The installed torch, or None: imported once, or put back from what
    install() replaced."""
    if "torch" in _REAL:
        sys.modules.update(_REAL)
        return _REAL["torch"]
    try:
        import torch
    except ImportError:
        return None
    return torch
