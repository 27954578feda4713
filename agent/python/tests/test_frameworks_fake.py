"""The Hugging Face and Lightning callbacks against stand-ins that follow
what those frameworks do (transformers 5.17 Trainer.training_step and
_run_epoch; Lightning 2.6.6 _AutomaticOptimization's closure: training_step,
then zero_grad on the first batch of a window, then backward of the loss
divided by accumulate_grad_batches), with exact-fraction losses as in
test_remedy.py. test_frameworks_real.py runs the real ones where installed."""

import contextlib
import types
from fractions import Fraction

import pytest

from conftest import memprof_agent
from test_remedy import GRAD, Loss, T, same, verdict

RISK = memprof_agent._core.RISK


@pytest.fixture(autouse=True)
def zero():
    GRAD[0] = Fraction(0)


class SumLoss(Loss):
    """sum(per-sample gradients) / num_items: a loss over a whole window."""

    def __init__(self, grads, total, scale=Fraction(1)):
        super().__init__(grads, scale)
        self.total = total

    def __mul__(self, k):
        return SumLoss(self.grads, self.total, self.scale * Fraction(k))

    def value(self):
        return self.scale * Fraction(sum(self.grads), self.total)

    def backward(self):
        GRAD[0] += self.value()


# --- transformers ----------------------------------------------------------

class HFTrainer:
    """Trainer's surface the callback touches; training_step as 5.17's."""

    def __init__(self, micro=5, accumulation=2, accepts_kwargs=False, kind="NO", world=1):
        self.args = types.SimpleNamespace(per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
                                          world_size=world)
        self.log = []
        outer = self

        class Accelerator:
            distributed_type = kind

            @contextlib.contextmanager
            def no_sync(self, model):
                outer.log.append("no_sync")
                yield

        self.accelerator = Accelerator()
        self.model_accepts_loss_kwargs = accepts_kwargs
        self.compute_loss_func = None
        self.current_gradient_accumulation_steps = accumulation
        self.callbacks = []

    def add_callback(self, cb):
        self.callbacks.append(cb)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            return SumLoss(inputs["x"].values, num_items_in_batch)
        return Loss(inputs["x"].values)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if (not self.model_accepts_loss_kwargs or num_items_in_batch is None) and self.compute_loss_func is None:
            loss = loss * Fraction(1, self.current_gradient_accumulation_steps)
        self.log.append(("backward", len(inputs["x"].values)))
        loss.backward()
        return loss

    def train(self, data, at=None):
        """_run_epoch's order of events; `at`: {global_step: level} verdicts."""
        args, control = self.args, types.SimpleNamespace(should_save=False)
        steps, state = [], types.SimpleNamespace(global_step=0)
        for w in range(0, len(data), args.gradient_accumulation_steps):
            window = data[w:w + args.gradient_accumulation_steps]
            items = sum(len(b["x"].values) for b in window)
            for cb in self.callbacks:
                cb.on_step_begin(args, state, control)
            for i, inputs in enumerate(window):
                ctx = self.accelerator.no_sync(None) if i < len(window) - 1 else contextlib.nullcontext()
                with ctx:
                    self.training_step(None, inputs, items if self.model_accepts_loss_kwargs else None)
                if i < len(window) - 1:
                    for cb in self.callbacks:
                        cb.on_substep_end(args, state, control)
            steps.append(GRAD[0])
            GRAD[0] = Fraction(0)
            state.global_step += 1
            if at and state.global_step in at:
                verdict(at[state.global_step])
            for cb in self.callbacks:
                cb.on_step_end(args, state, control)
            if control.should_save:
                control.should_save = False
                self.log.append(("save", state.global_step))
                for cb in self.callbacks:
                    cb.on_save(args, state, control)
        return steps


def hf_data(n=8, micro=5):
    return [{"x": T(range(k * micro + 1, (k + 1) * micro + 1)), "attention": T([1] * micro)} for k in range(n)]


@pytest.mark.parametrize("accepts_kwargs", [False, True])
def test_hf_split_keeps_each_optimizer_steps_gradient(accepts_kwargs):
    from memprof_agent.hf import MemprofCallback

    ref = HFTrainer(accepts_kwargs=accepts_kwargs).train(hf_data())
    t = HFTrainer(accepts_kwargs=accepts_kwargs)
    cb = MemprofCallback.install(t)
    got = t.train(hf_data(), at={1: "critical"})
    assert same(got, ref)
    assert cb.split.changes == [("5 x 2", "2-3 x 4")]
    # After the split: two backwards per loaded batch; every part but a
    # batch's last under no_sync, on top of the Trainer's own no_sync.
    assert [e for e in t.log if e[0] == "backward"][2:6] == [("backward", 3), ("backward", 2)] * 2
    assert "compute_loss" not in vars(t), "the scaling wrapper is removed after each part"
    cb.close()
    assert t.training_step.__func__ is HFTrainer.training_step


def test_hf_checkpoints_at_the_end_of_the_step_on_high_and_records_it():
    from memprof_agent.hf import MemprofCallback

    t = HFTrainer()
    MemprofCallback.install(t)
    t.train(hf_data(), at={2: "high"})
    assert [e for e in t.log if e[0] == "save"] == [("save", 2)]
    assert [(e[1], e[2]) for e in memprof_agent._core.MARKERS.checkpoints] == [("checkpoint", "step=2")]


@pytest.mark.parametrize("kind,world,why", [("DistributedType.DEEPSPEED", 1, "DeepSpeed"),
                                            ("DistributedType.FSDP", 2, "collectives in every forward")])
def test_hf_refuses_where_a_split_would_break_the_run(kind, world, why):
    from memprof_agent.hf import MemprofCallback

    t = HFTrainer(kind=kind, world=world)
    cb = MemprofCallback.install(t)
    RISK.directive(memprof_agent._reply.Directive("d", "notifyTrainer", "critical", ""))
    t.train(hf_data(2))
    (ack,) = RISK.take_acks()
    assert ack["ok"] is False and why in ack["action"] and cb.split.factor == 1


def test_hf_callback_not_attached_cannot_split():
    from memprof_agent.hf import MemprofCallback

    cb = MemprofCallback()
    assert cb._on_critical(None) == ("split refused: the callback is not attached to a Trainer (use MemprofCallback.install(trainer))", False)


# --- lightning ---------------------------------------------------------------

class LModule:
    automatic_optimization = True

    def __init__(self):
        self.zeroed = 0

    def training_step(self, batch, batch_idx):
        return {"loss": Loss(batch[0].values), "extra": batch_idx}

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.zeroed += 1
        GRAD[0] = Fraction(0)


class LTrainer:
    def __init__(self, accumulation=2, world=1, tmp="/tmp"):
        self.accumulate_grad_batches = accumulation
        self.world_size = world
        self.current_epoch = 0
        self.global_step = 0
        self.optimizers = ["opt"]
        self.default_root_dir = tmp
        self.saved = []
        self.backwards = []
        trainer = self

        class Strategy:
            def backward(self, loss, optimizer):
                trainer.backwards.append(loss.value())
                loss.backward()

        self.strategy = Strategy()

    def save_checkpoint(self, path):
        self.saved.append(path)
        for cb in self.callbacks:
            cb.on_save_checkpoint(self, self.module, {})

    def fit(self, module, data, callbacks, at=None):
        self.module, self.callbacks = module, callbacks
        for cb in callbacks:
            cb.setup(self, module, "fit")
        steps = []
        for idx, batch in enumerate(data):
            for cb in callbacks:
                cb.on_train_batch_start(self, module, batch, idx)
            out = module.training_step(batch, idx)                     # the closure's step_fn
            if idx % self.accumulate_grad_batches == 0:
                module.optimizer_zero_grad(self.current_epoch, idx, "opt")  # its zero_grad_fn
            (out["loss"] * Fraction(1, self.accumulate_grad_batches)).backward()  # its backward_fn
            if (idx + 1) % self.accumulate_grad_batches == 0:
                steps.append(GRAD[0])
                self.global_step += 1
            if at and idx in at:
                verdict(at[idx])
            for cb in callbacks:
                cb.on_train_batch_end(self, module, out, batch, idx)
        for cb in callbacks:
            cb.teardown(self, module, "fit")
        return steps


def l_data(n=8, micro=5):
    return [(T(range(k * micro + 1, (k + 1) * micro + 1)),) for k in range(n)]


@pytest.mark.parametrize("split_at", [0, 1, 3])
def test_lightning_split_keeps_each_optimizer_steps_gradient(split_at):
    """split_at 1 and 3: the next batch is the first of a window, where
    Lightning zeroes after training_step: the split step must zero first."""
    from memprof_agent.lightning import MemprofCallback

    ref = LTrainer().fit(LModule(), l_data(), [])
    cb = MemprofCallback(checkpoint=False)
    module = LModule()
    got = LTrainer().fit(module, l_data(), [cb], at={split_at: "critical"})
    assert same(got, ref) and cb.split.factor == 2
    assert module.training_step.__func__ is LModule.training_step, "unwrapped at teardown"


def test_lightning_checkpoints_at_the_next_step_boundary(tmp_path):
    from memprof_agent.lightning import MemprofCallback

    t = LTrainer(tmp=str(tmp_path))
    cb = MemprofCallback()
    t.fit(LModule(), l_data(), [cb], at={2: "high"})
    assert t.saved == [str(tmp_path / "memprof" / "memprof-step=2.ckpt")]
    assert [(e[1], e[2]) for e in memprof_agent._core.MARKERS.checkpoints] == [("checkpoint", "step=2")]


@pytest.mark.parametrize("world,manual,why", [(2, False, "2 processes"), (1, True, "manual optimization")])
def test_lightning_refuses_what_it_cannot_do_safely(world, manual, why):
    from memprof_agent.lightning import MemprofCallback

    module = LModule()
    module.automatic_optimization = not manual
    t = LTrainer(world=world)
    cb = MemprofCallback()
    RISK.directive(memprof_agent._reply.Directive("d", "notifyTrainer", "critical", ""))
    t.fit(module, l_data(2), [cb])
    (ack,) = RISK.take_acks()
    assert ack["ok"] is False and why in ack["action"] and cb.split.factor == 1
    assert t.saved == [] or world == 1
