"""watch_gradients(model): an opt-in check of the gradients after backward
every N steps (seed 001's gradient anomalies): NaN/Inf,
unusually large (a parameter's gradient norm above FACTOR x the running
median of that parameter's earlier norms) and vanishing (below EPS while
the parameter is trainable), and the global norm.

When: with an optimizer, at its step pre-hook (the gradients are complete
and about to be used; gradient accumulation counts one check per optimizer
step; what the trainer did between backward and step, e.g. clipping, is
already applied). Without one, at the end of every N-th backward pass: a
post-accumulate-grad hook on one trainable parameter queues an autograd
engine callback, which runs once every gradient has been accumulated.

Cost of a check: one fused norm kernel per (device, dtype) group of
gradients (torch._foreach_norm, in float32 so fp16 norms do not overflow),
one stack per device and one device-to-host copy per device: one sync per
device. Other steps: one Python call of a hook. Nothing raises into the
trainer."""

import collections
import math
import time
import weakref

from . import _torchread as tr
from ._config import Once, log

DEFAULT_EVERY = 50
DEFAULT_FACTOR = 10.0
DEFAULT_EPS = 1e-10
WINDOW = 16  # earlier checks the running median covers
MIN_HISTORY = 3  # a parameter's checks before "large" can be said
MAX_NAMES = 16
MAX_PARAMETER_NAME = 128


def _median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def grad_norms(torch, grads):
    """[float] the L2 norm of each gradient, float32 accumulation, one
    device-to-host copy per device. Returns (norms, copies)."""
    by_device = collections.OrderedDict()
    for i, g in enumerate(grads):
        by_device.setdefault(str(g.device), collections.OrderedDict()).setdefault(g.dtype, []).append(i)
    out = [0.0] * len(grads)
    copies = 0
    with torch.no_grad():
        for groups in by_device.values():
            order, parts = [], []
            for idx in groups.values():
                parts.extend(_group_norms(torch, [grads[i] for i in idx]))
                order.extend(idx)
            values = torch.stack(parts).tolist()
            copies += 1
            for i, v in zip(order, values):
                out[i] = float(v)
    return out, copies


def _group_norms(torch, ts):
    """0-dim float32 norms of tensors of one device and dtype: one fused
    kernel when torch._foreach_norm takes a dtype, else one per tensor."""
    foreach = getattr(torch, "_foreach_norm", None)
    if foreach is not None:
        try:
            return list(foreach(ts, 2, dtype=torch.float32))
        except (TypeError, RuntimeError, NotImplementedError):
            pass  # an older torch (no dtype), or tensors it refuses
    return [torch.linalg.vector_norm(t, dtype=torch.float32) for t in ts]


class GradWatch:
    """One watched model: its hooks, the running history of each
    parameter's norm, the latest check."""

    def __init__(self, torch, model, optimizer=None, every=DEFAULT_EVERY, factor=DEFAULT_FACTOR,
                 eps=DEFAULT_EPS, markers=None):
        self.torch = torch
        self.model = weakref.ref(model)
        self.every = max(1, int(every))
        self.factor, self.eps = float(factor), float(eps)
        self.markers = markers
        self.history = {}
        self.global_history = collections.deque(maxlen=WINDOW)
        self.count = self.checks = 0
        self.first_nonfinite_step = None
        self.result = None  # the push's `grads`
        self.detail = None  # last_gradients(): the result plus the flagged norms
        self.handles = []
        self.mode = None
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self.handles.append(optimizer.register_step_pre_hook(self._on_step))
            self.mode = "optimizer"
        else:
            self._hook_backward(model)

    def _hook_backward(self, model):
        engine = getattr(getattr(getattr(self.torch, "autograd", None), "Variable", None), "_execution_engine", None)
        if getattr(engine, "queue_callback", None) is None:
            raise RuntimeError("this torch has no autograd engine callbacks: pass the optimizer")
        for _, p in model.named_parameters():
            if getattr(p, "requires_grad", False) and hasattr(p, "register_post_accumulate_grad_hook"):
                self.handles.append(p.register_post_accumulate_grad_hook(self._on_accumulate))
                self.engine, self.mode = engine, "backward"
                return
        raise RuntimeError("no trainable parameter with post-accumulate-grad hooks (torch >= 2.1): pass the optimizer")

    # --- hooks: one Python call per step ------------------------------------

    def _on_step(self, optimizer, args, kwargs):
        self.count += 1
        if self.count % self.every == 0:
            self.check()
        return None

    def _on_accumulate(self, param):
        # Once per backward pass (the hooked parameter's gradient is
        # accumulated once per pass); the check waits for the pass's end.
        try:
            self.count += 1
            if self.count % self.every == 0:
                self.engine.queue_callback(self.check)
        except Exception as exc:
            _say_once("hook", "memprof-agent: watch_gradients could not schedule its check (%r); gradients not checked", exc)

    def remove(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []

    # --- the check ------------------------------------------------------------

    def check(self):
        """Checks the gradients now (also callable by hand). Never raises."""
        try:
            model = self.model()
            if model is None:
                return self.remove()
            named = [(n, p.grad) for n, p in model.named_parameters()
                     if getattr(p, "requires_grad", False) and p.grad is not None and not getattr(p.grad, "is_sparse", False)]
            norms, copies = grad_norms(self.torch, [g for _, g in named]) if named else ([], 0)
            self._judge(named, norms, copies)
        except Exception as exc:
            _say_once("check", "memprof-agent: checking the gradients failed (%r); will try again at the next check", exc)

    def _judge(self, named, norms, copies):
        nonfinite, large, vanishing, flagged = [], [], [], {}
        for (name, g), norm in zip(named, norms):
            if not math.isfinite(norm):
                if self._overflowed(g):
                    large.append((float("inf"), name))  # finite elements, a norm beyond float32
                else:
                    nonfinite.append(name)
                flagged[name] = None
                continue
            past = self.history.setdefault(name, collections.deque(maxlen=WINDOW))
            if len(past) >= MIN_HISTORY:
                median = _median(past)
                if median > 0 and norm > self.factor * median:
                    large.append((norm / median, name))
                    flagged[name] = norm
            if norm < self.eps:
                vanishing.append(name)
                flagged[name] = norm
            past.append(norm)
        total = math.sqrt(sum(n * n for n in norms)) if norms and not nonfinite and all(math.isfinite(n) for n in norms) else None
        self._publish(named, nonfinite, large, vanishing, flagged, total, copies)

    def _overflowed(self, g):
        try:
            return bool(self.torch.isfinite(g).all().item())
        except Exception:
            return False

    def _publish(self, named, nonfinite, large, vanishing, flagged, total, copies):
        self.checks += 1
        step = self.markers.step if self.markers is not None and isinstance(self.markers.step, int) and not isinstance(self.markers.step, bool) else self.count
        if nonfinite and self.first_nonfinite_step is None:
            self.first_nonfinite_step = step
            log.warning("memprof-agent: NaN/Inf gradients at step %s in %d parameters (first: %s)", step, len(nonfinite), nonfinite[0])
        large.sort(key=lambda x: -x[0])
        if large:
            _say_once("large", "memprof-agent: unusually large gradients at step %s (first: %s, %.3gx its running median)",
                      step, large[0][1], large[0][0])
        median = _median(self.global_history) if self.global_history else None
        if total is not None:
            self.global_history.append(total)
        names = lambda xs: [tr.truncate(n, MAX_PARAMETER_NAME, keep_end=True) for n in xs[:MAX_NAMES]]
        result = {
            "step": step, "every": self.every, "checks": self.checks, "checked": len(named), "at": time.time(),
            "nonFinite": names(nonfinite), "large": names([n for _, n in large]), "vanishing": names(vanishing),
            "nonFiniteCount": len(nonfinite), "largeCount": len(large), "vanishingCount": len(vanishing),
            "globalNorm": total, "globalNormMedian": median, "firstNonFiniteStep": self.first_nonfinite_step,
        }
        self.result = result
        self.detail = dict(result, norms={n: v for n, v in list(flagged.items())[:64]}, copies=copies,
                           largeRatios={n: r for r, n in large[:MAX_NAMES]})


WATCHED = [None]


def watch(torch, model, optimizer=None, every=DEFAULT_EVERY, factor=DEFAULT_FACTOR, eps=DEFAULT_EPS, markers=None):
    """Replaces the current watch (its hooks removed) with one on `model`."""
    unwatch()
    WATCHED[0] = GradWatch(torch, model, optimizer, every, factor, eps, markers)
    return WATCHED[0]


def unwatch():
    w = WATCHED[0]
    WATCHED[0] = None
    if w is not None:
        w.remove()


def push_field(push, torch, kind):
    w = WATCHED[0]
    return dict(w.result) if w is not None and w.result is not None else None


_say_once = Once()
