"""watch(model, optimizer): the breakdown taken automatically at the
trainer's second optimizer step, the activations' peak measured over the
third, both carried in every push after that; and the optimizer step
windows that watch() and trace_modules() measure.

Why optimizer hooks and not step(): step() must stay a field write (it is
called every step), while an optimizer step pre-hook is called exactly when
the gradients and the optimizer state exist, which is when the static part
is complete. watch() stores weak references and registers two hooks; they
are removed at the first forward after the third optimizer step, so nothing
runs per step after that. Everything here runs on the training thread and catches everything."""

import weakref

from . import _breakdown as bd
from . import _torchread as tr
from ._config import Once


class Carried:
    """What the pushes carry: the latest breakdown (watch() or breakdown()),
    with the phases of an active trace_modules() merged in when read. Set on
    the training thread, read on the agent's thread (a reference swap)."""

    def __init__(self):
        self.breakdown = None
        self.trace = None  # weakref to the active Trace (or to a removed one's numbers)
        self.frozen = None  # keeps a removed trace's numbers alive

    def current(self):
        """The latest breakdown as the Python API returns it, or None."""
        b = self.breakdown
        if b is None:
            return None
        out = dict(b)
        trace = self.trace() if self.trace is not None else None
        if trace is not None:
            out["phases"] = trace.phases()
            peaks = [x for x in (b.get("optimizerStepPeakBytes"), trace.optimizer_step_peak) if x is not None]
            out["optimizerStepPeakBytes"] = max(peaks) if peaks else None
        return out

    def for_push(self):
        b = self.current()
        return bd.for_push(b) if b is not None else None


CARRIED = Carried()


class StepMeter:
    """Around each optimizer step of one optimizer, while someone listens:
    the peak allocated since the previous step ended (forward and backward)
    and the optimizer step's own peak above what it started with. Both come
    from resetting the allocator's peak statistics at the step's start and
    end; the peaks read before each reset are handed to the next push
    (tr.PEAKS), and pushes do not reset them while a meter runs."""

    def __init__(self, torch, optimizer, model=None):
        self.torch = torch
        self.optimizer = weakref.ref(optimizer)
        self.model = weakref.ref(model) if model is not None else None
        self.indices = None  # found at the first step: the model may move to the GPU after watch()
        self.listeners = []
        self.steps = 0
        self.before = None
        self.held = False
        self.window = None  # peaks others' resets read inside our intervals (tr.PeakWindow)
        self.running = False
        self.closing = False
        self.handles = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]

    def _find_devices(self):
        optimizer = self.optimizer()
        params = [p for g in getattr(optimizer, "param_groups", []) for p in g.get("params", [])] if optimizer is not None else []
        self.indices = tr.cuda_indices(params) if tr.cuda_ready(self.torch) else []
        if self.indices and not self.held:
            tr.PEAKS.held += 1
            self.held = True
            self.window = tr.open_window()

    def _reset(self):
        """(allocated now, peak since the last reset), summed over devices."""
        if self.indices is None:
            self._find_devices()
        if not self.indices:
            return None, None
        now = peak = 0
        for i in self.indices:
            a, p = tr.peak_and_reset(self.torch, i, self.window)
            now, peak = now + a, peak + p
        return now, peak

    def _pre(self, optimizer, args, kwargs):
        if self.closing:
            return None
        self.running = True
        try:
            self.steps += 1
            now, peak = self._reset()
            self.before = now
            for fn in list(self.listeners):
                fn("pre", self.steps, peak)
        except Exception as exc:
            _say_once("meter", "memprof-agent: measuring the optimizer step failed (%r); not measured", exc)
        finally:
            self.running = False
        return None

    def _post(self, optimizer, args, kwargs):
        if self.closing:
            return
        self.running = True
        try:
            _, peak = self._reset()
            above = None if peak is None or self.before is None else max(0, peak - self.before)
            for fn in list(self.listeners):
                fn("post", self.steps, above)
        except Exception as exc:
            _say_once("meter", "memprof-agent: measuring the optimizer step failed (%r); not measured", exc)
        finally:
            self.running = False

    def remove(self):
        """Stops measuring. The hooks go now when called outside
        optimizer.step(); from inside one of its hooks (watch() finishing
        at step 3) they go at the model's next forward: torch iterates the
        optimizer's hook dicts live, and removing an entry there makes
        optimizer.step() raise. Until then (for good, without a model)
        they return at once."""
        self.closing = True
        model = self.model() if self.model is not None else None
        if not self.running:
            self._remove_hooks()
        elif model is not None:
            once = []

            def remove_then_forget(module, args):
                self._remove_hooks()
                for h in once:
                    h.remove()  # safe: torch copies the forward pre-hooks before calling them

            once.append(model.register_forward_pre_hook(remove_then_forget))
        if self.held:
            tr.PEAKS.held = max(0, tr.PEAKS.held - 1)
            self.held = False
        if self.window is not None:
            tr.close_window(self.window)
            self.window = None

    def _remove_hooks(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []


_meters = {}


def subscribe(torch, optimizer, fn, model=None):
    """Adds fn(event, step, bytes) to the optimizer's meter (made on first use)."""
    meter = _meters.get(id(optimizer))
    if meter is None or meter.closing:
        meter = _meters[id(optimizer)] = StepMeter(torch, optimizer, model)
    meter.listeners.append(fn)
    return meter


def unsubscribe(optimizer_id, fn):
    meter = _meters.get(optimizer_id)
    if meter is None:
        return
    if fn in meter.listeners:
        meter.listeners.remove(fn)
    if not meter.listeners:
        meter.remove()
        _meters.pop(optimizer_id, None)


def reset():
    """Forgets every watch, meter and carried breakdown (tests)."""
    for meter in list(_meters.values()):
        meter.remove()
    _meters.clear()
    CARRIED.__init__()
    tr.PEAKS.__init__()
    del tr.OPEN_WINDOWS[:]
    import memprof_agent

    memprof_agent._watched[0] = None


_say_once = Once()


def cuda_indices_of(torch, model):
    """The CUDA devices of the model's parameters, when CUDA is up."""
    if torch is None or not tr.cuda_ready(torch):
        return []
    try:
        return tr.cuda_indices(p for p in model.parameters())
    except Exception:
        return []


class Watch:
    """Breakdown at optimizer step 2, activations over step 3 (docs/agent.md).
    Without an optimizer (or one without step hooks), the model's forward
    calls mark the steps instead: breakdown and window start at the third
    forward, the peak read at the fourth."""

    def __init__(self, torch, model, optimizer, batch_size, markers):
        self.torch = torch
        self.model = weakref.ref(model)
        self.optimizer_id = id(optimizer) if optimizer is not None else None
        self.optimizer = weakref.ref(optimizer) if optimizer is not None else None
        self.batch_size = batch_size
        self.markers = markers
        self.indices = None
        self.result = None
        self.done = False
        self.forwards = 0
        self.handle = None
        self.held = False
        self.window = None
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            subscribe(torch, optimizer, self.on_step, model)
        else:
            self.handle = model.register_forward_pre_hook(self.on_forward)

    # --- with an optimizer -------------------------------------------------

    def on_step(self, event, step, value):
        if self.done:
            return
        if event == "pre" and step == 2:
            self.take_breakdown(step)
        elif event == "pre" and step == 3:
            self.set_activations(value)
        elif event == "post" and step == 3 and self.result is not None:
            self.result["optimizerStepPeakBytes"] = value
            self.finish()

    # --- without -------------------------------------------------------------

    def on_forward(self, module, args):
        try:
            if self.done:
                return None
            self.forwards += 1
            if self.forwards == 3:
                self.indices = cuda_indices_of(self.torch, module)
                self.take_breakdown(self.forwards)
                if self.indices:
                    tr.PEAKS.held += 1
                    self.held = True
                    self.window = tr.open_window()
                    for i in self.indices:
                        tr.peak_and_reset(self.torch, i, self.window)
            elif self.forwards == 4:
                peak = None
                if self.indices:
                    peak = sum(tr.peak_and_reset(self.torch, i, self.window)[1] for i in self.indices)
                self.set_activations(peak)
                self.finish()
        except Exception as exc:
            _say_once("watch", "memprof-agent: watch() failed (%r); no automatic breakdown", exc)
            self.finish()
        return None

    # --- steps -----------------------------------------------------------------

    def take_breakdown(self, count):
        model = self.model()
        if self.indices is None:
            self.indices = cuda_indices_of(self.torch, model) if model is not None else []
        optimizer = self.optimizer() if self.optimizer is not None else None
        if model is None:
            return self.finish()
        step = self.markers.step if isinstance(self.markers.step, int) else count
        batch = self.batch_size if self.batch_size is not None else self.markers.samples
        self.result = bd.compute(self.torch, model, optimizer, batch_size=batch, step=step)
        if not self.indices:
            self.result["notes"].append("no CUDA device holds the parameters: activations not measured")
        CARRIED.breakdown = self.result

    def set_activations(self, peak):
        if self.result is None or peak is None:
            return
        self.result["activationsPeakBytes"] = max(0, int(peak) - int(self.result["staticBytes"]))
        if self.batch_size is None and self.markers.samples is not None:
            self.result["batchSize"] = self.markers.samples
        CARRIED.breakdown = self.result

    def finish(self):
        self.done = True
        if self.handle is not None:
            try:
                self.handle.remove()
            except Exception:
                pass
            self.handle = None
        if self.held:
            tr.PEAKS.held = max(0, tr.PEAKS.held - 1)
            self.held = False
        if self.window is not None:
            tr.close_window(self.window)
            self.window = None
        if self.optimizer_id is not None:
            unsubscribe(self.optimizer_id, self.on_step)
