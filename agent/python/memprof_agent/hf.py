"""memprof's remediation for Hugging Face transformers' Trainer: on `high`,
a checkpoint at the end of the current optimizer step; on `critical`, every
micro-batch split in two inside the training step for the rest of the run
(docs/agent.md "In-process remediation").

    from memprof_agent.hf import MemprofCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    MemprofCallback.install(trainer)       # adds the callback, wraps training_step
    trainer.train()

Why inside the step: the Trainer reads gradient_accumulation_steps and the
data loader's batch size when an epoch starts (its loop prefetches
gradient_accumulation_steps batches per optimizer step and counts update
steps from them), so neither can change mid-run without restarting the
loader and the schedule. Splitting each loaded micro-batch inside
training_step gives the same gradients with half the activations, and
nothing else of the Trainer (steps, schedule, logging, checkpoints) sees a
difference. Each part goes through the Trainer's own training_step (its
loss scaling, autocast, accelerator.backward); every part but the last
runs under accelerator.no_sync(model).

Loss weights: with num_items_in_batch (a model that accepts loss kwargs,
transformers' default for causal LMs) the loss is a sum over the whole
accumulation window divided by its token count: parts need no weight.
Otherwise each part's loss is weighted by its share of samples, or of
count(inputs) when given (e.g. tokens whose label is not -100).

Limits, said once and acknowledged as not done: DeepSpeed (it counts
micro-steps itself), FSDP/XLA/Megatron with several processes (collectives
in every forward). A checkpoint is written by the Trainer on the main
process only: under DDP, one that rank 0 does not ask for writes nothing.
Imports without transformers (the class then has no base and is unusable)."""

import contextlib
import logging

from . import _remedy
from . import record
from ._core import RISK

try:  # transformers is the trainer's, never imported by memprof_agent itself
    from transformers import TrainerCallback as _Base
except Exception:  # transformers absent or broken: importing this module still works
    _Base = object

log = logging.getLogger("memprof_agent")
_UNSAFE = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")


class MemprofCallback(_Base):
    """The TrainerCallback. install(trainer) is the usual way in; a
    callback never attached to a Trainer can checkpoint but not split."""

    def __init__(self, trainer=None, count=None, checkpoint=True, split=True, register=True):
        self.trainer = None
        self.count = count
        self.split = _remedy.Split()
        self.checkpoint_enabled, self.split_enabled = checkpoint, split
        self._save_wanted = False
        self._original = None
        self.handles = []
        if register:
            self.handles = [RISK.add("high", self._on_high, weak=True), RISK.add("critical", self._on_critical, weak=True)]
        if trainer is not None:
            self.attach(trainer)

    @classmethod
    def install(cls, trainer, **kwargs):
        cb = cls(trainer=trainer, **kwargs)
        trainer.add_callback(cb)
        return cb

    def attach(self, trainer):
        """Wraps trainer.training_step (an instance attribute; the class's
        method, or the user's override, is called for every part)."""
        if self.trainer is trainer:
            return
        self.trainer = trainer
        self._original = trainer.training_step
        trainer.training_step = self.training_step
        args = getattr(trainer, "args", None)
        self.split.micro = getattr(args, "per_device_train_batch_size", None)
        self.split.accumulation = getattr(args, "gradient_accumulation_steps", None)

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.trainer is not None and self._original is not None:
            self.trainer.training_step = self._original
            self.trainer = None

    # --- on_risk callbacks (run at the Trainer's step boundaries) --------

    def _on_high(self, event):
        if not self.checkpoint_enabled:
            return "checkpoint on high turned off", False
        self._save_wanted = True
        return "checkpoint at the end of this step", True

    def _on_critical(self, event):
        if not self.split_enabled:
            return "split on critical turned off", False
        return self.split.double(self._refusal())

    def _refusal(self):
        t = self.trainer
        if t is None:
            return "the callback is not attached to a Trainer (use MemprofCallback.install(trainer))"
        kind = str(getattr(getattr(t, "accelerator", None), "distributed_type", "NO")).upper().rsplit(".", 1)[-1]
        world = getattr(getattr(t, "args", None), "world_size", 1) or 1
        if "DEEPSPEED" in kind:
            return "DeepSpeed counts micro-steps itself"
        if world > 1 and any(u in kind for u in _UNSAFE):
            return "%s with %d processes runs collectives in every forward" % (kind, world)
        return None

    # --- TrainerCallback events --------------------------------------------

    def on_step_begin(self, args, state, control, **kwargs):
        RISK.run_pending()
        return control

    def on_substep_end(self, args, state, control, **kwargs):
        RISK.run_pending()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        RISK.run_pending()
        if self._save_wanted:
            self._save_wanted = False
            control.should_save = True  # the Trainer saves right after this event
        return control

    def on_save(self, args, state, control, **kwargs):
        record("checkpoint", note="step=%d" % state.global_step)
        return control

    # --- the split training step -------------------------------------------

    def training_step(self, model, inputs, num_items_in_batch=None, *args, **kwargs):
        k = self.split.factor
        n = _remedy.batch_len(inputs)
        if n is not None:
            self.split.micro = n
        if k <= 1 or n is None or n < 2:
            return self._original(model, inputs, num_items_in_batch, *args, **kwargs)
        t = self.trainer
        parts = _remedy.split_batch(inputs, k)
        summed = (getattr(t, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) \
            or getattr(t, "compute_loss_func", None) is not None
        shares = [None] * len(parts) if summed else _remedy.weights(parts, self.count)
        total = None
        for i, (part, share) in enumerate(zip(parts, shares)):
            last = i == len(parts) - 1
            with (contextlib.nullcontext() if last else t.accelerator.no_sync(model)), _scaled(t, share):
                loss = self._original(model, part, num_items_in_batch, *args, **kwargs)
            total = loss if total is None else total + loss
        return total


@contextlib.contextmanager
def _scaled(trainer, share):
    """trainer.compute_loss multiplied by `share` while a part runs (None:
    unchanged). An instance attribute over the class's method, removed after."""
    if share is None:
        yield
        return
    had = "compute_loss" in vars(trainer)
    original = trainer.compute_loss

    def compute_loss(*args, **kwargs):
        out = original(*args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] * share,) + tuple(out[1:])
        return out * share

    trainer.compute_loss = compute_loss
    try:
        yield
    finally:
        if had:
            trainer.compute_loss = original
        else:
            del trainer.compute_loss
