"""What makes an unchanged CUDA training script run on fake CPU tensors.

Why the CPU and not a faked CUDA device: FakeTensorMode can label tensors
`cuda`, but the autograd engine asks the CUDA driver for the device's
context on backward ("hasPrimaryContext expects a valid device index"),
and there is no driver on a machine without a GPU. Fake tensors carry no
data, so the device only picks kernels; the memory that matters (shapes,
dtypes, lifetimes) is the same. So every CUDA request is sent to the CPU
and the script is told a GPU is there:

- device arguments (`device="cuda"`, `.to("cuda")`, `.cuda()`) become cpu;
- torch.cuda answers as one named GPU would (available, count, properties,
  memory queries return 0), and does nothing for streams and seeds;
- autocast("cuda") becomes autocast("cpu") with the same dtype;
- optimizers take the foreach path they take on CUDA (its temporaries are
  part of the real peak), unless the script chose;
- Module._apply reassigns parameters (fake parameters cannot be swapped);
- data-dependent reads (`loss.item()`, `if torch.isnan(x)`) answer 1 and
  False instead of raising;
- torch.distributed uses the "fake" backend (no peers, no network);
  DDP becomes FakeDDP (the module and its gradient buckets);
- torch.compile returns the function unchanged (the estimate is eager).
"""

import contextlib
import os
import types

import torch
from torch.overrides import TorchFunctionMode


def _cpu(value):
    if isinstance(value, torch.device) and value.type in ("cuda", "cpu"):
        return torch.device("cpu")
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    return value


class CudaToCpu(TorchFunctionMode):
    """Sends every CUDA device argument to the CPU; answers data-dependent reads."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0].to("cpu", **{k: v for k, v in kwargs.items() if k == "non_blocking"})
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.device:  # torch.device("cuda", 0) is a torch function too
            return _cpu(func(*args, **kwargs))
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        args = tuple(_cpu(a) for a in args)
        if func in _DATA_READS:
            return _read(func, args, kwargs)
        return func(*args, **kwargs)


_DATA_READS = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.tolist}


def _read(func, args, kwargs):
    try:
        return func(*args, **kwargs)
    except Exception:  # a fake tensor has no data to read
        if func is torch.Tensor.__bool__:
            return False
        if func is torch.Tensor.tolist:
            return torch.ones(args[0].shape).tolist() if args[0].dim() else 1
        return 1.0 if args[0].is_floating_point() else 1


def patch_cuda(gpu_name, total_bytes, world_size):
    """torch.cuda answers as `world_size` GPUs named `gpu_name` would."""
    props = types.SimpleNamespace(
        name=gpu_name, total_memory=int(total_bytes), major=9, minor=0,
        multi_processor_count=132, is_integrated=False,
    )
    answers = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: max(int(world_size), 1),
        "current_device": lambda: 0,
        "get_device_name": lambda device=None: gpu_name,
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: (9, 0),
        "is_bf16_supported": lambda *a, **k: True,
        "is_current_stream_capturing": lambda: False,
        "mem_get_info": lambda device=None: (int(total_bytes), int(total_bytes)),
    }
    for name in ("set_device", "synchronize", "empty_cache", "reset_peak_memory_stats",
                 "reset_max_memory_allocated", "manual_seed", "manual_seed_all", "init",
                 "set_per_process_memory_fraction"):
        answers[name] = lambda *a, **k: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved"):
        answers[name] = lambda *a, **k: 0
    for name, fn in answers.items():
        setattr(torch.cuda, name, fn)
    torch.cuda.memory_stats = lambda *a, **k: {}


def patch_autocast():
    """autocast("cuda", dtype) runs as autocast("cpu", dtype)."""
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def init(self, device_type, *args, **kwargs):
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    cls.__init__ = init


def patch_optimizers():
    """The foreach path CUDA takes by default, so its temporaries are counted."""
    from torch.optim import optimizer

    def default(params, differentiable, use_fused=False):
        return False, not differentiable

    optimizer._default_to_fused_or_foreach = default


def _apply(self, fn, recurse=True):
    if recurse:
        for child in self.children():
            child._apply(fn)
    for key, param in self._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            new = fn(param)
        if new is not param:
            replaced = torch.nn.Parameter(new, param.requires_grad)
            if param.grad is not None:
                replaced.grad = fn(param.grad)
            self._parameters[key] = replaced
    for key, buf in self._buffers.items():
        if buf is not None:
            self._buffers[key] = fn(buf)
    return self


def patch_modules():
    """Module.to/.cuda/.half etc. on fake parameters (no tensor swap)."""
    original_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        args = tuple(a for a in args if not isinstance(a, (str, torch.device, int)))
        kwargs.pop("device", None)
        return original_to(self, *args, **kwargs) if (args or kwargs) else self

    torch.nn.Module._apply = _apply
    torch.nn.Module.to = to
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.compile = lambda model=None, **kwargs: model if model is not None else (lambda m: m)


def patch_distributed(world_size):
    """init_process_group on the fake backend; DDP as FakeDDP."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        kwargs.update(backend="fake", store=FakeStore(),
                      rank=int(os.environ.get("RANK", 0)), world_size=int(world_size))
        kwargs.pop("init_method", None)
        return original(**kwargs)

    dist.init_process_group = init_process_group
    _patch_ddp()
    _patch_device_mesh()


class FakeDDP(torch.nn.Module):
    """DistributedDataParallel as memory sees it: the module, plus the
    reducer's flat gradient buckets (as large as the trainable parameters,
    unless gradient_as_bucket_view makes the gradients views of them).
    The real class cannot run on fake tensors (its reducer reads data)."""

    def __init__(self, module, *args, gradient_as_bucket_view=False, **kwargs):
        super().__init__()
        self.module = module
        nbytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
        self._buckets = None if gradient_as_bucket_view else torch.empty(nbytes, dtype=torch.uint8)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return contextlib.nullcontext()


def _patch_ddp():
    import torch.nn.parallel
    import torch.nn.parallel.distributed

    torch.nn.parallel.DistributedDataParallel = FakeDDP
    torch.nn.parallel.distributed.DistributedDataParallel = FakeDDP


def _patch_device_mesh():
    try:
        from torch.distributed import device_mesh
    except ImportError:
        return
    original = device_mesh.init_device_mesh

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def init_device_mesh(device_type, *args, **kwargs):
        # The mesh is small real data (rank layout, read with nonzero()).
        with unset_fake_temporarily():
            return original("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    torch.distributed.init_device_mesh = init_device_mesh


def install(gpu_name, total_bytes, world_size):
    """All of the above; returns the device mode to enter around the script."""
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    for var in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(var, "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    patch_cuda(gpu_name, total_bytes, world_size)
    patch_autocast()
    patch_optimizers()
    patch_modules()
    patch_distributed(world_size)
    return CudaToCpu()
