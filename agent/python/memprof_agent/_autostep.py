"""Step numbers without step(): when the trainer never calls
memprof_agent.step(), pushes carry `step` = the optimizer steps taken so
far, counted by torch's global optimizer step post-hook
(torch.optim.optimizer.register_optimizer_step_post_hook, torch >= 2.0).

Why: the analysis tells memory that grows while training steps run (a leak,
a growing demand) from memory that grows while none runs (weights loading,
building a second model, setup), which is never a leak. A trainer that
never calls step() pushed no step at all, so the two looked the same.

Rules (docs/agent.md "Step numbers"):
- The trainer's step() wins: its first call (before or after start())
  turns counting off for good and takes the hook out; step() then numbers
  from its own n (or 1). Counting writes MARKERS.step only: never
  MARKERS.calls or the step clock, so the step budget
  (MEMPROF_AGENT_MAX_STEPS), the on_risk safe points, track(every=N) and
  the summary's step time stay step()'s alone.
- Several optimizers: the steps of the first optimizer that stepped count.
  Counting every optimizer's would count a GAN's generator and
  discriminator, or ZeroRedundancyOptimizer and the local optimizer it
  wraps, twice per training step. When that optimizer is garbage collected
  (a trainer that builds a new one per stage), the next one to step counts
  on from the same number.
- Cost per optimizer step: a few field reads and writes and an id(); no
  torch call, no sync.
- Registered once, at start() when the trainer has imported torch (on the
  caller's thread), else on the agent's thread once it has.
- torch iterates its hook dicts live (Optimizer.profile_hook_step): a hook
  added or removed while an optimizer.step() runs the global post-hooks
  makes that step raise, in the trainer. So the agent's thread adds the
  hook only while torch holds no other global post-hook (iterating an empty
  dict is one C call under the GIL: nothing can come between), and the
  hook is taken out only while no thread is inside torch.optim.optimizer;
  until then it stays, returning at once, and the next step() tries again.
- A failure is said once and leaves counting off, the pushes without a
  step (a number that stopped would read as "no step runs"); nothing here
  raises into the trainer.

Standard library only; torch is taken from sys.modules, never imported."""

import sys
import weakref

from ._config import log

OPTIMIZER_MODULE = "torch.optim.optimizer"


class AutoStep:
    """The counter and its hook. MARKERS.step is written on the training
    thread only (the hook, step()); until the first optimizer step it stays
    None and the push says `step` 0 while `on` (Agent.build), so the agent's
    thread, which may arm the hook, never writes it."""

    def __init__(self, markers):
        self.markers = markers
        self.enabled = False  # MEMPROF_AGENT_AUTO_STEP, set at start()
        self.on = False  # the hook counts
        self.handle = None  # torch's RemovableHandle while the hook is in
        self.counted = None  # id() of the optimizer whose steps count
        self.ref = None  # weak reference to it (None when it cannot have one)
        self.steps = 0
        self.failed = False  # said once; never armed again
        self.waiting_said = False

    # --- arming -------------------------------------------------------------

    def start(self, enabled):
        """At the agent's start, on the caller's thread: arms now when torch
        is imported (else the agent's ticks do, arm(lazily=True))."""
        self.enabled = bool(enabled)
        if self.enabled:
            self.arm(lazily=False)

    def wanted(self):
        """Whether the hook should be added: enabled, not failed, not yet in,
        and the trainer never called step()."""
        return self.enabled and not self.failed and self.handle is None and not self.markers.calls

    def arm(self, lazily):
        """Adds the hook once torch is imported; True when it counts.
        lazily: called on the agent's thread (see the module's docstring)."""
        if not self.wanted():
            return False
        module = sys.modules.get(OPTIMIZER_MODULE)
        if module is None:
            return False  # torch not imported (yet)
        try:
            register = getattr(module, "register_optimizer_step_post_hook", None)
            if register is None:
                self.failed = True
                log.info("memprof-agent: this torch has no global optimizer step hook (torch >= 2.0 has); "
                         "pushes carry `step` only from memprof_agent.step()")
                return False
            if lazily and not _adding_is_safe(module):
                if not self.waiting_said:
                    self.waiting_said = True
                    log.info("memprof-agent: torch was imported after start() and holds another global optimizer "
                             "post-hook; optimizer steps are counted once it is gone (call memprof_agent.step(), "
                             "or start() after importing torch)")
                return False
            if not lazily and _inside_optimizer_step():
                return False  # start() from inside an optimizer step: the agent's ticks try again
            self.handle = register(self.hook)
        except Exception as exc:
            self.failure("cannot count optimizer steps", exc)
            return False
        self.on = True
        self.markers.auto = self
        if self.markers.calls:  # step() was called meanwhile (the agent's thread raced it): step()'s
            self.on = False
        return self.on

    # --- the hook (the training thread, after every optimizer.step()) --------

    def hook(self, optimizer, args, kwargs):
        if not self.on or self.markers.calls:
            return
        try:
            if id(optimizer) != self.counted:
                if self.counted is not None:
                    return  # another optimizer: the first one's steps count
                self.adopt(optimizer)
            self.steps += 1
            self.markers.step = self.steps
        except Exception as exc:
            self.failure("counting optimizer steps failed", exc)

    def adopt(self, optimizer):
        """The optimizer whose steps count, until it is garbage collected."""
        try:
            self.ref = weakref.ref(optimizer, self.forget)
        except TypeError:
            self.ref = None  # no weak references: counted by id() alone, for good
        self.counted = id(optimizer)

    def forget(self, ref):
        # Its optimizer is gone: the next optimizer that steps counts.
        if ref is self.ref:
            self.counted = self.ref = None

    def failure(self, what, exc):
        """Counting off for good, said once; never raises."""
        was_on, self.on = self.on, False
        first, self.failed = not self.failed, True
        try:
            if was_on and not self.markers.calls:
                self.markers.step = None  # a number that stopped would read as "no step runs"
        except Exception:
            pass
        try:
            if first:
                log.warning("memprof-agent: %s (%r); pushes carry `step` only from memprof_agent.step()", what, exc)
        except Exception:
            pass

    # --- off --------------------------------------------------------------------

    def user_step(self):
        """The trainer called step() (before that call counts): its numbers
        from now on, for good; the hook goes (now if safe, else at a later
        step())."""
        if self.on:
            self.on = False
            if not self.markers.calls:
                self.markers.step = None  # step() numbers from its own n, or 1
        self.remove()

    def stop(self):
        """The agent stops: counting off, the hook out when safe."""
        self.on = False
        self.remove()

    def remove(self):
        """Takes the hook out of torch unless an optimizer step runs its
        hooks now; True when it is out."""
        if self.handle is not None:
            if _inside_optimizer_step():
                return False
            handle, self.handle = self.handle, None
            try:
                handle.remove()
            except Exception:
                pass
        if self.markers.auto is self:
            self.markers.auto = None
        return True


def _adding_is_safe(module):
    """From another thread: only while torch holds no global post-hook (an
    empty OrderedDict is iterated within one C call while the GIL is held)."""
    hooks = getattr(module, "_global_optimizer_post_hooks", None)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    return gil and isinstance(hooks, dict) and not hooks


def _inside_optimizer_step():
    """Whether a thread runs code of torch.optim.optimizer now (an
    optimizer.step() calling its hooks). Walks every thread's stack: only
    when the hook is added or removed, never per step."""
    for frame in sys._current_frames().values():
        f = frame
        while f is not None:
            if f.f_globals.get("__name__") == OPTIMIZER_MODULE:
                return True
            f = f.f_back
    return False
