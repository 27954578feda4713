"""The split that keeps the global batch, without torch: batches as small
tensor-likes, losses as exact fractions whose backward() adds to a gradient
store, so "the same gradient as the unsplit batch" is checked exactly.
(test_frameworks_real.py checks the same with real torch, transformers and
Lightning where they are installed.)"""

import contextlib
import sys
import types
from fractions import Fraction

import pytest

from conftest import memprof_agent

_remedy = memprof_agent._remedy
_reply = memprof_agent._reply
RISK = memprof_agent._core.RISK


class T:
    """A 1-D tensor-like: shape, slicing, nothing else."""

    def __init__(self, values):
        self.values = list(values)
        self.shape = (len(self.values),)

    def __getitem__(self, s):
        return T(self.values[s])

    def sum(self):
        return sum(self.values)


class Loss:
    """A mean loss over some samples whose per-sample gradient is known:
    backward() adds scale * mean(gradient) to GRAD (a Fraction)."""

    def __init__(self, grads, scale=Fraction(1)):
        self.grads, self.scale = grads, scale

    def __mul__(self, k):
        return Loss(self.grads, self.scale * Fraction(k))

    def detach(self):
        return self

    def backward(self):
        GRAD[0] += self.scale * Fraction(sum(self.grads), len(self.grads))

    def value(self):
        return self.scale * Fraction(sum(self.grads), len(self.grads))

    def __add__(self, other):
        return Sum(self.value() + other.value())


class Sum:
    def __init__(self, v):
        self.v = v

    def value(self):
        return self.v

    def __add__(self, other):
        return Sum(self.v + other.value())


GRAD = [Fraction(0)]


def verdict(level):
    RISK.observe(_reply.Verdict(level, source="agent", at=1.0))


def batches(n_batches, micro):
    """Per-sample gradients 1, 2, 3, ... (distinct, so a wrong weight shows)."""
    out, k = [], 1
    for _ in range(n_batches):
        out.append({"x": T(range(k, k + micro)), "id": "not per-sample"})
        k += micro
    return out


def same(a, b):
    """Equal up to floating-point rounding (the weights are floats, as with
    torch); a wrong weight is off by far more."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * abs(y) for x, y in zip(a, b))


def train(loop, data, split_before=None, on_step=None):
    """The documented loop; returns the gradient at each optimizer step."""
    steps = []
    for n, batch in enumerate(data):
        if n == split_before:
            verdict("critical")
        for part in loop.parts(batch):
            assert part.data["id"] == "not per-sample"
            part.backward(Loss(part.data["x"].values))
        if loop.step_due():
            steps.append(GRAD[0])
            GRAD[0] = Fraction(0)
            if on_step:
                on_step()
    return steps


@pytest.fixture(autouse=True)
def zero():
    GRAD[0] = Fraction(0)


@pytest.mark.parametrize("micro,split_before", [(8, 0), (7, 3), (5, 5), (3, 1)])
def test_a_split_gives_each_optimizer_step_the_unsplit_gradient(micro, split_before):
    data = batches(12, micro)
    ref = train(_remedy.MicroBatchLoop(accumulation=3, register=False), data)
    loop = _remedy.MicroBatchLoop(accumulation=3)
    got = train(loop, data, split_before=split_before)
    assert loop.factor == 2
    assert same(got, ref) and len(got) == 4, "same gradient, same optimizer steps"


def test_splitting_again_keeps_it_exact_down_to_single_samples(monkeypatch):
    data = batches(8, 4)
    ref = train(_remedy.MicroBatchLoop(accumulation=2, register=False), data)
    loop = _remedy.MicroBatchLoop(accumulation=2, register=False)
    seen = []
    for n, batch in enumerate(data):
        if n in (1, 3, 5):
            seen.append(loop.request_split())
        for part in loop.parts(batch):
            part.backward(Loss(part.data["x"].values))
        if loop.step_due():
            seen.append(GRAD[0])
            GRAD[0] = Fraction(0)
    got = [g for g in seen if isinstance(g, Fraction)]
    texts = [s for s in seen if isinstance(s, tuple)]
    assert same(got, ref)
    assert texts == [("split micro-batch 4 x 2 -> 2 x 4, global batch kept", True),
                     ("split micro-batch 2 x 4 -> 1 x 8, global batch kept", True),
                     ("split refused: micro-batch of 4 already cut into single samples", False)]


def test_a_token_mean_loss_needs_count_weights():
    """Parts with different numbers of counted tokens: weights by count
    keep it exact; the count function is what the loss averages over."""
    data = [{"x": T([1, 2, 3, 4, 5]), "mask": T([1, 1, 0, 1, 0])}, {"x": T([6, 7, 8, 9, 10]), "mask": T([0, 1, 1, 1, 1])}]

    def run(loop):
        GRAD[0] = Fraction(0)
        for batch in data:
            for part in loop.parts(batch):
                grads = [g for g, m in zip(part.data["x"].values, part.data["mask"].values) if m]
                part.backward(Loss(grads))
            loop.step_due()
        return GRAD[0]

    ref = run(_remedy.MicroBatchLoop(accumulation=2, register=False))
    split = _remedy.MicroBatchLoop(accumulation=2, register=False, count=lambda b: b["mask"].sum())
    split.request_split()
    assert same([run(split)], [ref])
    by_samples = _remedy.MicroBatchLoop(accumulation=2, register=False)
    by_samples.request_split()
    assert not same([run(by_samples)], [ref]), "the control: sample weights are wrong for a token mean"


def test_last_loss_is_the_micro_batchs_own_loss():
    loop = _remedy.MicroBatchLoop(accumulation=2, register=False)
    loop.request_split()
    loop.request_split()
    for part in loop.parts({"x": T([1, 2, 3, 4, 5])}):
        part.backward(Loss(part.data["x"].values))
    assert same([loop.last_loss.value()], [Fraction(3)])


def test_only_the_last_backward_of_an_optimizer_step_synchronizes():
    log = []

    class DDP:
        @contextlib.contextmanager
        def no_sync(self):
            log.append("no_sync")
            yield

    loop = _remedy.MicroBatchLoop(accumulation=2, model=DDP(), register=False)
    loop.request_split()
    syncs = []
    for batch in batches(4, 4):
        for part in loop.parts(batch):
            syncs.append(part.sync)
        loop.step_due()
    assert syncs == [False, False, False, True] * 2
    assert log == ["no_sync"] * 6


def test_on_high_the_checkpoint_waits_for_the_optimizer_step_boundary_and_is_recorded():
    saved = []
    loop = _remedy.MicroBatchLoop(accumulation=3, checkpoint=lambda step: saved.append(step))
    data = batches(9, 2)
    for n, batch in enumerate(data):
        if n == 4:
            verdict("high")
        for part in loop.parts(batch):
            part.backward(Loss(part.data["x"].values))
        loop.step_due()
    assert saved == [2], "batch 4 is inside step 2's window: saved after it"
    events = [e for e in memprof_agent._core.MARKERS.checkpoints]
    assert [(e[1], e[2]) for e in events] == [("checkpoint", "step=2")]
    assert loop.factor == 1, "high checkpoints, it does not split"


def test_a_directive_gets_the_split_arithmetic_in_its_ack():
    loop = _remedy.MicroBatchLoop(accumulation=4)
    data = batches(2, 16)
    for part in loop.parts(data[0]):
        part.backward(Loss(part.data["x"].values))
    RISK.directive(_reply.Directive("job/critical-1", "notifyTrainer", "critical", "policy"))
    for part in loop.parts(data[1]):  # the safe point: the callbacks run here
        part.backward(Loss(part.data["x"].values))
    assert loop.factor == 2
    assert RISK.take_acks() == [{"id": "job/critical-1", "ok": True,
                                 "action": "no checkpoint function given to MicroBatchLoop; split micro-batch 16 x 4 -> 8 x 8, global batch kept"}]


def dist(world):
    torch = types.ModuleType("torch")
    d = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_world_size=lambda: world)
    torch.distributed = d
    return torch


def test_several_processes_without_ddp_refuse_the_split(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", dist(2))
    loop = _remedy.MicroBatchLoop(accumulation=2, model=types.SimpleNamespace(), register=False)
    text, done = loop.request_split()
    assert not done and "world size 2" in text and loop.factor == 1

    class DistributedDataParallel:
        def no_sync(self):
            return contextlib.nullcontext()

    ok = _remedy.MicroBatchLoop(accumulation=2, model=DistributedDataParallel(), register=False)
    assert ok.request_split()[1] and ok.factor == 2


@pytest.mark.parametrize("batch,n,parts", [
    ({"a": T(range(5)), "b": [T(range(5)), "meta"], "c": 3}, 5, [[0, 1, 2], [3, 4]]),
    ((T(range(4)), T(range(4))), 4, [[0, 1], [2, 3]]),
    ([{"a": T(range(3))}], 3, [[0, 1], [2]]),
    (["t0", "t1", "t2", "t3"], 4, None),
])
def test_batches_are_cut_along_the_first_dimension(batch, n, parts):
    assert _remedy.batch_len(batch) == n
    cut = _remedy.split_batch(batch, 2)
    assert len(cut) == 2
    if isinstance(batch, dict):
        assert [c["a"].values for c in cut] == parts
        assert [c["b"][1] for c in cut] == ["meta", "meta"] and [c["c"] for c in cut] == [3, 3]
    elif isinstance(batch, tuple):
        assert [c[0].values for c in cut] == parts and [c[1].values for c in cut] == parts
    elif isinstance(batch[0], dict):
        assert [c[0]["a"].values for c in cut] == parts
    else:
        assert cut == [["t0", "t1"], ["t2", "t3"]]


def test_a_named_tuple_batch_keeps_its_type():
    import collections

    B = collections.namedtuple("B", "x y")
    cut = _remedy.split_batch(B(T(range(4)), T(range(4))), 2)
    assert type(cut[0]) is B and cut[1].y.values == [2, 3]


def test_a_helper_nobody_holds_stops_answering():
    import gc

    loop = _remedy.MicroBatchLoop(accumulation=1)
    assert len(RISK.handlers) == 2
    del loop
    gc.collect()
    RISK.directive(_reply.Directive("d", "notifyTrainer", "critical", ""))
    assert RISK.take_acks() == [{"id": "d", "action": "no on_risk callback at critical or below", "ok": False}]
    assert RISK.handlers == []
