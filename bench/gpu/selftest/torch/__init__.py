"""A stand-in `torch` for rehearsing bench/gpu/record.sh on a machine without
a GPU or PyTorch (bench/gpu/record_selftest.sh puts this folder first on
PYTHONPATH). Test-only: it models what scenarios.py and the agent read and
nothing else, and it is no measurement of anything.

What it models: tensors as shapes that count their bytes (no data), a
caching allocator's allocated/reserved/peak bytes and a device of
FAKE_TORCH_TOTAL_GB (default 80) where an allocation past the total calls
the OOM observers and raises OutOfMemoryError; autograd as saved inputs
(a result of an op on a tensor that needs a gradient keeps its inputs alive
until backward() or until it is dropped; under no_grad() nothing is kept);
AdamW's state (2 x the parameters, at the first step); a step's duration as
a sleep of FAKE_TORCH_SYNC_S (default 0.03) in cuda.synchronize(). The
surface is the one train.py's GPT, scenarios.py and memprof_agent use.
"""
import contextlib
import math
import os
import sys
import time
import types

__version__ = "0.0+fake"
GIB = 1 << 30
_pyfloat = float  # before torch's `float` below shadows it


class OutOfMemoryError(RuntimeError):
    pass


class _Dtype:
    def __init__(self, name, size):
        self.name, self.itemsize = name, size

    def __repr__(self):
        return "torch." + self.name


uint8, int64, float32, bfloat16 = _Dtype("uint8", 1), _Dtype("int64", 8), _Dtype("float32", 4), _Dtype("bfloat16", 2)
float = float32  # noqa: A001 (torch's name)


class _Allocator:
    def __init__(self):
        self.total = int(float_env("FAKE_TORCH_TOTAL_GB", 80) * 1e9)
        self.context = 500_000_000
        self.allocated = self.reserved = self.peak_alloc = self.peak_res = 0
        self.num_ooms = 0
        self.observers = []
        self.initialized = False
        self.grad = True
        self.autocast = False
        self.sync_s = float_env("FAKE_TORCH_SYNC_S", 0.03)

    def alloc(self, n):
        if self.allocated + n > self.total - self.context:
            self.num_ooms += 1
            free = self.total - self.context - self.reserved
            for fn in list(self.observers):
                fn(0, n, self.total, max(free, 0))
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate %.2f GiB (fake torch)" % (n / GIB))
        self.initialized = True
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak_alloc = max(self.peak_alloc, self.allocated)
        self.peak_res = max(self.peak_res, self.reserved)

    def free(self, n):
        self.allocated -= n


def float_env(name, default):
    try:
        return _pyfloat(os.environ.get(name, default))
    except ValueError:
        return default


_A = _Allocator()


class Tensor:
    """A shape that holds its bytes (or its base's, for a view) and, when it
    needs a gradient, the inputs it was computed from."""

    def __init__(self, shape, dtype=float32, deps=(), base=None, requires_grad=False):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self._base = base
        self._bytes = 0 if base is not None else self.numel() * dtype.itemsize
        if self._bytes:
            _A.alloc(self._bytes)
        self.requires_grad = requires_grad or any(getattr(d, "requires_grad", False) for d in deps)
        self._deps = tuple(deps) if (_A.grad and self.requires_grad) else ()
        self.grad = None
        self.device = "cuda:0"

    def __del__(self):
        if self._bytes:
            _A.free(self._bytes)
            self._bytes = 0

    def numel(self):
        return math.prod(self.shape)

    def element_size(self):
        return self.dtype.itemsize

    def dim(self):
        return len(self.shape)

    def _view(self, shape):
        return Tensor(shape, self.dtype, deps=(self,), base=self._base or self)

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        shape = [len(range(*i.indices(n))) if isinstance(i, slice) else n for i, n in zip(idx, self.shape)]
        return self._view(shape + list(self.shape[len(idx):]))

    def view(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        return self._view(shape)

    reshape = view

    def transpose(self, a, b):
        s = list(self.shape)
        s[a], s[b] = s[b], s[a]
        return self._view(s)

    def split(self, size, dim=0):
        n = self.shape[dim]
        return [self._view(self.shape[:dim] + (min(size, n - i),) + self.shape[dim + 1:]) for i in range(0, n, size)]

    def float(self):
        return Tensor(self.shape, float32, deps=(self,))

    def __add__(self, other):
        shape = self.shape if len(self.shape) >= len(other.shape) else other.shape
        return Tensor(shape, float32, deps=(self, other))

    def mean(self):
        return Tensor((), float32, deps=(self,))

    def __mul__(self, scale):  # a loss times its share (MicroBatchLoop's parts)
        return Tensor(self.shape, float32, deps=(self,))

    def detach(self):
        return Tensor(self.shape, self.dtype)

    def item(self):
        return 1.0

    def fill_(self, value):
        return self

    def to(self, *a, **k):
        return self

    def backward(self):
        """Gradients for the leaves that need them; the graph's saved tensors go."""
        seen, stack = set(), [self]
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if isinstance(t, Parameter) and t.grad is None:
                t.grad = Tensor(t.shape, float32)
            stack.extend(t._deps)
            if not isinstance(t, Parameter):
                t._deps = ()


class Parameter(Tensor):
    def __init__(self, data):
        Tensor.__init__(self, data.shape, float32, requires_grad=True)


def _graph_op(shape, dtype, *inputs):
    return Tensor(shape, bfloat16 if _A.autocast and dtype is None else (dtype or float32), deps=inputs)


def randint(low, high, size, device=None, generator=None):
    return Tensor(size, int64)


def ones(n, dtype=float32, device=None):
    return Tensor((n,) if isinstance(n, int) else n, dtype)


empty = ones


def arange(n, device=None):
    return Tensor((n,), int64)


def stack(tensors):
    return Tensor((len(tensors),), float32, deps=tuple(tensors))


def manual_seed(seed):
    return None


class device:  # noqa: N801 (torch's name)
    def __init__(self, type_, index=None):
        self.type, self.index = type_, index


class Generator:
    def __init__(self, device=None):
        pass

    def manual_seed(self, seed):
        return self


@contextlib.contextmanager
def no_grad():
    old, _A.grad = _A.grad, False
    try:
        yield
    finally:
        _A.grad = old


@contextlib.contextmanager
def autocast(device_type, dtype=None):
    old, _A.autocast = _A.autocast, True
    try:
        yield
    finally:
        _A.autocast = old


def _module(name):
    m = types.ModuleType("torch." + name)
    sys.modules[m.__name__] = m
    globals()[name] = m
    return m


from . import _nn  # noqa: E402,F401  (torch.nn, torch.nn.functional, torch.optim)
from . import _cuda  # noqa: E402,F401 (torch.cuda, torch._C, torch.distributed)
