"""trace_modules(model): opt-in. What each top-level module keeps
allocated after its forward, the peak it adds above its start in backward,
and the optimizer step's own peak. Hooks read the allocator on the
training thread at every module boundary (two reads per module per forward,
two reads and one peak reset per backward, each one C call: tr.FastReads),
so this costs time on every step: bench/agent_trace_cost.py,
bench/gpu/breakdown_lora.py and docs/agent.md give the numbers. Use it to
find where memory goes, not for the whole run.

forwardBytes: allocated after the module's forward minus before (net: its
activations kept for backward and its output), the largest over the calls,
a decrease counting 0. backwardBytes: the allocator's peak during the
module's backward minus the allocated bytes at its start (what its backward
needs on top of what was there: gradient buffers, recomputation), the
largest over the calls. A backward's net change is usually negative (it
frees the module's activations): Python-only `backwardNetBytes`, signed.

The peak needs a reset of the allocator's peak statistics at each module's
backward start; the peak read there goes to the pushes (tr.PEAKS) and to
every other open measurement (tr.PeakWindow: watch()'s step window, the
optimizer step meter), so none of them loses a peak."""

import threading
import weakref

from . import _torchread as tr
from . import _watch
from ._config import Once

MAX_MODULES = 32
_CONTAINERS = {"ModuleList", "ModuleDict"}


def _children(module):
    try:
        return list(module.named_children())
    except Exception:
        return []


def _join(prefix, name):
    return "%s.%s" % (prefix, name) if prefix else name


def top_modules(model, limit=MAX_MODULES):
    """([(name, module)], how many were left out): the children of the
    model, going down through wrappers with one child (peft's PeftModel,
    DDP's module) and into ModuleList/ModuleDict (never called themselves,
    so a hook on them would never fire), at most `limit`."""
    prefix, module = "", model
    seen = 0
    while seen < 8:
        children = _children(module)
        if len(children) != 1:
            break
        prefix, module = _join(prefix, children[0][0]), children[0][1]
        seen += 1
    out = []
    for name, child in _children(module):
        if set(c.__name__ for c in type(child).__mro__) & _CONTAINERS:
            out.extend((_join(_join(prefix, name), n), c) for n, c in _children(child))
        else:
            out.append((_join(prefix, name), child))
    return out[:limit], max(0, len(out) - limit)


class Trace:
    """The handle trace_modules() returns: .remove(), .phases(),
    .optimizer_step_peak."""

    def __init__(self, torch, model, optimizer=None, backward=True):
        self.torch = torch
        self.modules, self.left_out = top_modules(model)
        self.forward = {}  # name -> largest net bytes over the calls (>= 0)
        self.backward = {}  # name -> largest peak added above the backward's start
        self.backward_net = {}  # name -> signed net change of the latest measured backward
        self._before_f = {}
        self._open_b = {}  # name -> [(allocated at start, PeakWindow)]
        self._pending = None  # (name, start, window): a backward torch ended before it ran
        self._backward_thread = None  # the autograd engine's thread, seen by the backward hooks
        self.optimizer_step_peak = None
        self.handles = []
        self.index = None
        self.held = False
        self._optimizer_id = None
        for name, m in self.modules:
            self._hook(name, m, backward)
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._optimizer_id = id(optimizer)
            _watch.subscribe(torch, optimizer, self._on_step, model)
        _watch.CARRIED.trace = weakref.ref(self)

    def _hook(self, name, m, backward):
        self.forward[name] = 0
        self.backward[name] = 0
        self.handles.append(m.register_forward_pre_hook(lambda mod, args: self._guard(self._enter_f, name)))
        self.handles.append(m.register_forward_hook(lambda mod, args, out: self._guard(self._leave_f, name)))
        pre = getattr(m, "register_full_backward_pre_hook", None)
        if backward and pre is not None:
            self.handles.append(pre(lambda mod, grad_out: self._guard(self._enter_b, name)))
            self.handles.append(m.register_full_backward_hook(
                lambda mod, grad_in, grad_out: self._guard(self._leave_b, name, grad_in)))

    def _guard(self, fn, *args):
        try:
            fn(*args)
        except Exception as exc:
            _say_once("trace: %r" % (exc,))
        return None

    def _device(self):
        """The current CUDA device once CUDA is up (None before). From then
        on pushes leave the peak statistics to the measurements (tr.PEAKS.held)."""
        if self.index is None:
            if not tr.cuda_ready(self.torch):
                return None
            self.index = int(self.torch.cuda.current_device())
            if not self.held:
                tr.PEAKS.held += 1
                self.held = True
        return self.index

    # --- forward: net --------------------------------------------------------

    def _enter_f(self, name):
        if threading.get_ident() != self._backward_thread:
            # A new step's forward (not a checkpointed module's recomputation,
            # which runs inside backward, on the engine's thread).
            self._drop_pending()
            for _, w in self._open_b.pop(name, []):  # a backward that never ended (aborted)
                tr.close_window(w)
        idx = self._device()
        self._before_f.setdefault(name, []).append(None if idx is None else tr.allocated_now(self.torch, idx))

    def _leave_f(self, name):
        stack = self._before_f.get(name)
        if not stack:
            return
        start = stack.pop()
        if start is not None:
            now = tr.allocated_now(self.torch, self.index)
            self.forward[name] = max(self.forward.get(name, 0), now - start)

    # --- backward: peak above the start ----------------------------------

    def _enter_b(self, name):
        self._backward_thread = threading.get_ident()
        self._settle_pending()
        idx = self._device()
        if idx is None:
            return
        start, _ = tr.peak_and_reset(self.torch, idx)
        self._open_b.setdefault(name, []).append((start, tr.open_window()))

    def _leave_b(self, name, grad_in):
        self._backward_thread = threading.get_ident()
        stack = self._open_b.get(name)
        if not stack:
            return
        start, window = stack.pop()
        self._settle_pending()
        if isinstance(grad_in, tuple) and grad_in and all(g is None for g in grad_in):
            # No input of the module needs a gradient (a frozen prefix, token
            # ids): torch calls this hook as soon as the output gradients
            # arrive, before the module's backward runs. Its window ends at
            # the next traced event instead: another module's backward, or
            # the optimizer step's start.
            self._pending = (name, start, window)
            return
        self._close(name, start, window)

    def _close(self, name, start, window):
        tr.close_window(window)
        now, peak = tr.allocated_now_and_peak(self.torch, self.index)
        peak = max(peak, window.seen.pop(self.index, 0))
        self.backward[name] = max(self.backward.get(name, 0), peak - start)
        self.backward_net[name] = now - start

    def _settle_pending(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            self._close(*pending)

    def _drop_pending(self):
        """A window still open at the next forward would take in the
        optimizer step and zero_grad (no optimizer was given): not measured."""
        pending, self._pending = self._pending, None
        if pending is not None:
            tr.close_window(pending[2])

    def _on_step(self, event, step, value):
        if event == "pre":
            self._guard(self._settle_pending)  # the meter has just handed its peak to the window
        if event == "post" and value is not None:
            self.optimizer_step_peak = max(self.optimizer_step_peak or 0, value)

    def phases(self):
        """[{module, forwardBytes, backwardBytes, backwardNetBytes}]: the C-2
        phases plus the signed net change of the latest measured backward
        (Python only, None until measured; the pushes leave it out)."""
        return [{"module": name, "forwardBytes": self.forward.get(name, 0), "backwardBytes": self.backward.get(name, 0),
                 "backwardNetBytes": self.backward_net.get(name)}
                for name, _ in self.modules]

    def remove(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
        self._drop_pending()
        for stack in self._open_b.values():
            for _, w in stack:
                tr.close_window(w)
        self._open_b = {}
        if self.held:
            tr.PEAKS.held = max(0, tr.PEAKS.held - 1)
            self.held = False
        if self._optimizer_id is not None:
            _watch.unsubscribe(self._optimizer_id, self._on_step)
            self._optimizer_id = None
        current = _watch.CARRIED.trace
        if current is not None and current() is self:
            # Later pushes keep what was measured.
            frozen = _Frozen(self.phases(), self.optimizer_step_peak)
            _watch.CARRIED.frozen = frozen
            _watch.CARRIED.trace = weakref.ref(frozen)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


class _Frozen:
    """A removed trace's numbers, for the pushes after it."""

    def __init__(self, phases, optimizer_step_peak):
        self._phases = phases
        self.optimizer_step_peak = optimizer_step_peak

    def phases(self):
        return self._phases


_say = Once()


def _say_once(message):
    _say(message[:60], "memprof-agent: %s; that module's numbers are incomplete", message)
