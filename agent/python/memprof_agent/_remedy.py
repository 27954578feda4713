"""In-process remediation that keeps the global batch: on `high` a
checkpoint, on `critical` every micro-batch is split into twice as many
parts, each backpropagated on its own with its share of the loss, so the
micro-batch halves, the backward passes per optimizer step double, and the
gradient of each optimizer step is the one the unsplit batch would give
(up to floating-point summation order). The data loader, the optimizer
cadence and the learning-rate schedule do not change.

Exactness: a part's loss is weighted by count(part) / count(batch), where
count is the number of what the loss averages over: samples by default
(a loss that is a mean over samples); pass count= for a mean over tokens,
e.g. count=lambda b: (b["labels"] != -100).sum(). A loss that is already
a sum divided by a fixed total (transformers' num_items_in_batch) needs no
weight. With that, sum_i w_i * mean(part_i) = mean(batch) exactly.

Multi-process (torch.distributed, world size > 1): splitting is safe under
DistributedDataParallel when every part but the last of an optimizer step
runs under no_sync() (no collective in forward or backward there), so each
rank can split on its own verdict; under FSDP, DeepSpeed or tensor/pipeline
parallelism every forward runs collectives, ranks that split differently
would wait for each other forever, and the split is refused (said once,
acknowledged as not done)."""

import contextlib
import logging

from ._core import RISK
from ._risk import _cut

log = logging.getLogger("memprof_agent")


def batch_len(batch):
    """Samples in a batch: dim 0 of its first tensor (dicts, lists and
    tuples are searched in order), or the length of a list of non-tensors."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else None
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return None
    for v in values:
        n = batch_len(v)
        if n is not None:
            return n
    if isinstance(batch, list) and batch and not any(isinstance(v, (dict, list, tuple)) for v in batch):
        return len(batch)
    return None


def split_batch(batch, parts):
    """`parts` consecutive slices of a batch along dim 0, sizes differing by
    at most one; entries that are not per-sample (shape[0] other than the
    batch's, scalars, other objects) are passed to every part unchanged."""
    n = batch_len(batch)
    parts = max(1, min(int(parts), n or 1))
    bounds, start = [], 0
    for i in range(parts):
        size = n // parts + (1 if i < n % parts else 0)
        bounds.append((start, start + size))
        start += size
    return [_slice(batch, n, a, b) for a, b in bounds]


def _slice(v, n, a, b):
    shape = getattr(v, "shape", None)
    if shape is not None:
        return v[a:b] if len(shape) > 0 and int(shape[0]) == n else v
    if isinstance(v, dict):
        return type(v)((k, _slice(x, n, a, b)) for k, x in v.items()) if type(v) is dict else _dict_like(v, n, a, b)
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(_slice(x, n, a, b) for x in v))
    if isinstance(v, (list, tuple)):
        if len(v) == n and not any(getattr(x, "shape", None) is not None or isinstance(x, (dict, list, tuple)) for x in v):
            return v[a:b]
        return type(v)(_slice(x, n, a, b) for x in v)
    return v


def _dict_like(v, n, a, b):
    """A Mapping subclass (transformers' BatchEncoding): same type when it
    can be built from a dict, else a plain dict."""
    items = {k: _slice(x, n, a, b) for k, x in v.items()}
    try:
        return type(v)(items)
    except Exception:
        return items


def weights(parts, count=None):
    """Each part's share of the batch's loss: count(part) / sum of counts
    (samples when count is None). Tensors stay tensors (no device sync)."""
    counts = [count(p) if count is not None else batch_len(p) for p in parts]
    total = counts[0]
    for c in counts[1:]:
        total = total + c
    return [c / total for c in counts]


def distributed_refusal(model):
    """Why splitting would be unsafe in this process, or None (module doc)."""
    import sys

    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    try:
        world = dist.get_world_size() if dist is not None and dist.is_available() and dist.is_initialized() else 1
    except Exception:
        world = 1
    if world <= 1:
        return None
    if model is None or type(model).__name__ != "DistributedDataParallel" or not hasattr(model, "no_sync"):
        return ("world size %d without a DistributedDataParallel model: ranks splitting differently "
                "would desynchronize collectives" % world)
    return None


class Split:
    """How many parts each micro-batch is cut into, and the arithmetic the
    acks and logs say (16x4 -> 8x8, global batch kept)."""

    def __init__(self, max_factor=None):
        self.factor = 1
        self.micro = None  # samples per micro-batch as loaded (the last seen)
        self.accumulation = None  # loader batches per optimizer step
        self.max_factor = max_factor
        self.changes = []

    def double(self, refusal=None):
        """Doubles the parts; returns (text for the ack, done)."""
        if refusal:
            log.warning("memprof-agent: not splitting the micro-batch: %s", refusal)
            return _cut("split refused: " + refusal), False
        micro = self.micro
        if micro is not None and self.factor >= micro:
            return "split refused: micro-batch of %d already cut into single samples" % micro, False
        if self.max_factor is not None and self.factor * 2 > self.max_factor:
            return "split refused: at the limit of %d parts per micro-batch" % self.max_factor, False
        before = self.describe()
        self.factor *= 2
        after = self.describe()
        self.changes.append((before, after))
        log.warning("memprof-agent: splitting each micro-batch in %d: %s -> %s (global batch kept)", self.factor, before, after)
        return _cut("split micro-batch %s -> %s, global batch kept" % (before, after)), True

    def describe(self):
        acc = self.accumulation or 1
        if self.micro is None:
            return "1/%d x %d" % (self.factor, acc * self.factor)
        return "%s x %d" % (_per_part(self.micro, self.factor), acc * self.factor)


def _per_part(micro, factor):
    if micro % factor == 0:
        return str(micro // factor)
    return "%d-%d" % (micro // factor, micro // factor + 1)


class Part:
    """One part of a micro-batch: `data`, `scale` (its loss weight, the
    accumulation included), `index` of `count`, `sync` (the last backward
    of the optimizer step). backward(loss) runs (loss * scale).backward()."""

    __slots__ = ("data", "scale", "index", "count", "sync", "loop")

    def __init__(self, data, scale, index, count, sync, loop):
        self.data, self.scale, self.index, self.count, self.sync, self.loop = data, scale, index, count, sync, loop

    def backward(self, loss, **kwargs):
        scaled = loss * self.scale
        scaled.backward(**kwargs)
        self.loop._add_loss(loss.detach() * (self.scale * self.loop.accumulation))
        return scaled


class MicroBatchLoop:
    """For plain PyTorch loops: yields the parts of each micro-batch and
    says when to step the optimizer, keeping the global batch when the
    verdict asks for a split (module docstring).

        loop = memprof_agent.MicroBatchLoop(accumulation=4, model=ddp_model,
                                            checkpoint=lambda step: save(step))
        for batch in loader:
            for part in loop.parts(batch):
                loss = loss_fn(model(part.data["x"]), part.data["y"])  # a mean
                part.backward(loss)        # do not divide by accumulation yourself
            if loop.step_due():
                optimizer.step(); optimizer.zero_grad()

    accumulation: loader batches per optimizer step (as configured).
    model: the DistributedDataParallel module, if any: every backward but
        the last of an optimizer step runs under model.no_sync(); without
        it, gradients are synchronized as your model does.
    checkpoint: fn(optimizer_step) saving a checkpoint; called on `high`
        at the next optimizer-step boundary (a memprof "checkpoint" event
        is recorded after it returns).
    count: fn(part data) -> what the loss averages over (default samples).
    register: False to drive it yourself (request_split(), request_checkpoint())."""

    def __init__(self, accumulation=1, model=None, checkpoint=None, count=None, register=True, max_split=None):
        self.accumulation = max(1, int(accumulation))
        self.model = model
        self.checkpoint_fn = checkpoint
        self.count = count
        self.split = Split(max_factor=max_split)
        self.split.accumulation = self.accumulation
        self.in_window = 0
        self.optimizer_steps = 0
        self.last_loss = None
        self._loss = None
        self._checkpoint_wanted = False
        self.handles = []
        if register:
            self.handles = [RISK.add("high", self._on_high, weak=True), RISK.add("critical", self._on_critical, weak=True)]

    @property
    def factor(self):
        return self.split.factor

    def close(self):
        """Unregisters the on_risk callbacks."""
        for h in self.handles:
            h.remove()
        self.handles = []

    # --- on_risk callbacks (run at a safe point: parts() or step()) -------

    def _on_high(self, event):
        if self.checkpoint_fn is None:
            return "no checkpoint function given to MicroBatchLoop", False
        self._checkpoint_wanted = True
        if self.in_window == 0:
            return self._checkpoint()
        return "checkpoint at the end of optimizer step %d" % (self.optimizer_steps + 1)

    def _on_critical(self, event):
        return self.request_split()

    def request_split(self):
        """Doubles the parts per micro-batch now; returns (text, done)."""
        return self.split.double(distributed_refusal(self.model))

    def request_checkpoint(self):
        self._checkpoint_wanted = True

    def _checkpoint(self):
        self._checkpoint_wanted = False
        step = self.optimizer_steps
        self.checkpoint_fn(step)
        from . import record

        record("checkpoint", note="step=%d" % step)
        return "checkpoint saved at optimizer step %d" % step

    # --- the loop ----------------------------------------------------------

    def parts(self, batch):
        """The parts of one loader batch (one part unless split), each with
        its loss scale; a safe point for on_risk callbacks first."""
        RISK.run_pending()
        if self.in_window == 0 and self._checkpoint_wanted and self.checkpoint_fn is not None:
            self._checkpoint()
        n = batch_len(batch)
        if n is not None:
            self.split.micro = n
        pieces = split_batch(batch, self.split.factor) if self.split.factor > 1 and n else [batch]
        shares = weights(pieces, self.count) if len(pieces) > 1 else [1.0]
        last_batch = self.in_window + 1 >= self.accumulation
        self._loss = None
        for i, (piece, share) in enumerate(zip(pieces, shares)):
            sync = last_batch and i == len(pieces) - 1
            with self._sync_context(sync):
                yield Part(piece, share / self.accumulation, i, len(pieces), sync, self)
        self.in_window += 1
        self.last_loss = self._loss

    def _sync_context(self, sync):
        no_sync = getattr(self.model, "no_sync", None)
        if sync or no_sync is None:
            return contextlib.nullcontext()
        return no_sync()

    def _add_loss(self, value):
        self._loss = value if self._loss is None else self._loss + value

    def step_due(self):
        """True once per optimizer step, after its `accumulation` loader
        batches: step the optimizer and zero the gradients then."""
        if self.in_window < self.accumulation:
            return False
        self.in_window = 0
        self.optimizer_steps += 1
        return True
