"""memprof's remediation for PyTorch Lightning: on `high`, a checkpoint at
the next optimizer-step boundary; on `critical`, every micro-batch split in
two inside training_step for the rest of the run (docs/agent.md
"In-process remediation").

    from memprof_agent.lightning import MemprofCallback
    trainer = L.Trainer(callbacks=[MemprofCallback()], accumulate_grad_batches=4)

Why inside the step: Lightning can change accumulate_grad_batches between
epochs (GradientAccumulationScheduler), but the loader's batch size only by
rebuilding the loaders (BatchSizeFinder does so before training, and not
under DDP: Lightning-AI#20994); doubling accumulation alone would double
the global batch. So each loaded batch is cut into parts; every part but
the last is backpropagated here through the strategy (precision plugin,
on_before_backward / on_after_backward hooks, gradient scaler) with its
share of the loss divided by accumulate_grad_batches, as Lightning divides
the returned loss; the last part's loss is returned for Lightning to
backpropagate. The optimizer step, clipping and schedule are Lightning's.
Lightning zeroes the gradients after training_step returns, before its
backward, on the first batch of each accumulation window: on such a batch
the split step zeroes them itself before its first backward, and
Lightning's zeroing (LightningModule.optimizer_zero_grad) is skipped once.

Limits, said once and acknowledged as not done: manual optimization (the
module calls backward itself: use memprof_agent.MicroBatchLoop there);
several processes (the DDP forward wraps the whole training_step, so parts
cannot run under no_sync; Trainer.save_checkpoint is a collective). The
loss logged by self.log inside training_step is the last part's.
Imports without Lightning (the class then has no base and is unusable)."""

import logging
import os
import sys

from . import _remedy
from . import record
from ._core import RISK

log = logging.getLogger("memprof_agent")


def _callback_base():
    """Lightning's Callback from the package the trainer uses: `lightning`
    or `pytorch_lightning` (each checks callbacks against its own class)."""
    names = ("lightning.pytorch.callbacks", "pytorch_lightning.callbacks")
    for name in sorted(names, key=lambda n: n.split(".")[0] not in sys.modules):
        try:
            module = __import__(name, fromlist=["Callback"])
            return module.Callback
        except Exception:
            continue
    return object


_Base = _callback_base()


class MemprofCallback(_Base):
    """The Lightning Callback (module docstring). dirpath: where the
    checkpoint on high goes (default <default_root_dir>/memprof)."""

    def __init__(self, dirpath=None, count=None, checkpoint=True, split=True, register=True):
        self.dirpath = dirpath
        self.count = count
        self.checkpoint_enabled, self.split_enabled = checkpoint, split
        self.split = _remedy.Split()
        self.trainer = self.module = None
        self._original = None
        self._original_zero_grad = None
        self._zeroed = False
        self._save_wanted = False
        self.saved = []
        self.handles = []
        if register:
            self.handles = [RISK.add("high", self._on_high, weak=True), RISK.add("critical", self._on_critical, weak=True)]

    # --- Lightning hooks ---------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        if stage != "fit" or self.module is pl_module:
            return
        self.trainer, self.module = trainer, pl_module
        self._original = pl_module.training_step
        pl_module.training_step = self.training_step
        self._original_zero_grad = pl_module.optimizer_zero_grad
        pl_module.optimizer_zero_grad = self.optimizer_zero_grad
        self.split.accumulation = getattr(trainer, "accumulate_grad_batches", 1)

    def teardown(self, trainer, pl_module, stage):
        if self.module is pl_module and self._original is not None:
            pl_module.training_step = self._original
            pl_module.optimizer_zero_grad = self._original_zero_grad
            self.module = self._original = self._original_zero_grad = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        RISK.run_pending()
        at_boundary = batch_idx % max(1, trainer.accumulate_grad_batches) == 0
        if self._save_wanted and at_boundary:
            self._save_wanted = False
            self._save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        RISK.run_pending()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # Any checkpoint Lightning takes (ModelCheckpoint's too), as it is
        # written: the operator's restart decision reads these events.
        record("checkpoint", note="step=%d" % trainer.global_step)

    # --- on_risk callbacks -------------------------------------------------

    def _world(self):
        world = getattr(self.trainer, "world_size", 1) if self.trainer is not None else 1
        return world or 1

    def _on_high(self, event):
        if not self.checkpoint_enabled:
            return "checkpoint on high turned off", False
        if self.trainer is None:
            return "the callback is not attached to a Trainer yet", False
        if self._world() > 1:
            return "no checkpoint: save_checkpoint is collective (%d processes)" % self._world(), False
        self._save_wanted = True
        return "checkpoint at the next step boundary", True

    def _save(self, trainer):
        root = self.dirpath or os.path.join(trainer.default_root_dir, "memprof")
        path = os.path.join(root, "memprof-step=%d.ckpt" % trainer.global_step)
        trainer.save_checkpoint(path)
        self.saved.append(path)
        log.warning("memprof-agent: checkpoint saved to %s (risk high)", path)

    def _on_critical(self, event):
        if not self.split_enabled:
            return "split on critical turned off", False
        return self.split.double(self._refusal())

    def _refusal(self):
        if self.module is None:
            return "the callback has not seen the LightningModule yet (fit not started)"
        if not getattr(self.module, "automatic_optimization", True):
            return "manual optimization: use MicroBatchLoop in training_step"
        if self._world() > 1:
            return "%d processes: parts cannot skip the DDP gradient sync" % self._world()
        return None

    # --- the split training step -------------------------------------------

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        if self._zeroed:  # the split step zeroed before its own backward
            self._zeroed = False
            return None
        return self._original_zero_grad(epoch, batch_idx, optimizer)

    def training_step(self, batch, batch_idx, *args, **kwargs):
        k = self.split.factor
        n = _remedy.batch_len(batch)
        if n is not None:
            self.split.micro = n
        if k <= 1 or n is None or n < 2:
            return self._original(batch, batch_idx, *args, **kwargs)
        trainer = self.trainer
        accumulation = max(1, trainer.accumulate_grad_batches)
        parts = _remedy.split_batch(batch, k)
        shares = _remedy.weights(parts, self.count)
        if batch_idx % accumulation == 0:
            # Lightning would zero after this returns, erasing these parts' gradients.
            self._original_zero_grad(trainer.current_epoch, batch_idx, trainer.optimizers[0])
            self._zeroed = True
        for part, share in zip(parts[:-1], shares[:-1]):
            out = self._original(part, batch_idx, *args, **kwargs)
            loss = out["loss"] if isinstance(out, dict) else out
            trainer.strategy.backward(loss * (share / accumulation), None)
        out = self._original(parts[-1], batch_idx, *args, **kwargs)
        if isinstance(out, dict):
            return dict(out, loss=out["loss"] * shares[-1])
        return out * shares[-1]
