"""trace_modules(model): opt-in. What each top-level module adds to the
allocated bytes in its forward and in its backward, and the optimizer
step's own peak. Hooks read the allocator on the training thread at every
module boundary (two reads per module per forward and per backward, one
nested-stats read each), so this costs time on every step:
bench/agent_trace_cost.py and docs/agent.md give the numbers. Use it to
find where memory goes, not for the whole run.

A module's number is the allocated bytes after it minus before it (net:
what it left allocated), the largest seen over the calls so far; a net
decrease counts as 0 in pushes (what backward frees shows as 0)."""

import weakref

from . import _torchread as tr
from . import _watch
from ._transport import log

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

    def __init__(self, torch, model, optimizer=None):
        self.torch = torch
        self.modules, self.left_out = top_modules(model)
        self.forward = {}  # name -> largest net bytes over the calls
        self.backward = {}
        self._before_f = {}
        self._before_b = {}
        self.optimizer_step_peak = None
        self.handles = []
        self.index = None
        self._optimizer_id = None
        for name, m in self.modules:
            self._hook(name, m)
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._optimizer_id = id(optimizer)
            _watch.subscribe(torch, optimizer, self._on_step, model)
        _watch.CARRIED.trace = weakref.ref(self)

    def _hook(self, name, m):
        self.forward[name] = 0
        self.backward[name] = 0
        self.handles.append(m.register_forward_pre_hook(lambda mod, args: self._enter(self._before_f, name)))
        self.handles.append(m.register_forward_hook(lambda mod, args, out: self._leave(self._before_f, self.forward, name)))
        pre = getattr(m, "register_full_backward_pre_hook", None)
        if pre is not None:
            self.handles.append(pre(lambda mod, grad_out: self._enter(self._before_b, name)))
            self.handles.append(m.register_full_backward_hook(
                lambda mod, grad_in, grad_out: self._leave(self._before_b, self.backward, name)))

    def _allocated(self):
        if self.index is None:
            if not tr.cuda_ready(self.torch):
                return None
            self.index = int(self.torch.cuda.current_device())
        return tr.allocated_now(self.torch, self.index)

    def _enter(self, before, name):
        try:
            before.setdefault(name, []).append(self._allocated())
        except Exception as exc:
            _say_once("trace: %r" % (exc,))
        return None

    def _leave(self, before, into, name):
        try:
            stack = before.get(name)
            if stack:
                start = stack.pop()
                now = self._allocated()
                if start is not None and now is not None:
                    into[name] = max(into.get(name, 0), now - start)
        except Exception as exc:
            _say_once("trace: %r" % (exc,))
        return None

    def _on_step(self, event, step, value):
        if event == "post" and value is not None:
            self.optimizer_step_peak = max(self.optimizer_step_peak or 0, value)

    def phases(self):
        """[{module, forwardBytes, backwardBytes}], the C-2 phases."""
        return [{"module": name, "forwardBytes": self.forward.get(name, 0), "backwardBytes": self.backward.get(name, 0)}
                for name, _ in self.modules]

    def remove(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
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


_said = set()


def _say_once(message):
    key = message[:60]
    if key not in _said:
        _said.add(key)
        log.warning("memprof-agent: %s; that module's numbers are incomplete", message)
