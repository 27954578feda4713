"""The remediation helpers with the real frameworks on CPU: the split keeps
every optimizer step's gradient (final weights equal to an unsplit run's,
float64), the checkpoint on high is taken and recorded. Runs where torch,
transformers and lightning are installed (the GPU machine; a venv with
torch 2.11, transformers 5.17, lightning 2.6.6 here); elsewhere each test
is skipped, the fake-framework tests (test_remedy.py)
covering the same logic."""

import sys

import pytest

from conftest import memprof_agent

_reply = memprof_agent._reply


@pytest.fixture
def torch(real_torch):
    real_torch.manual_seed(0)
    return real_torch


def critical(level="critical"):
    memprof_agent._core.RISK.observe(_reply.Verdict(level, source="agent", at=1.0))


def data(torch, n=40, d=6):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.arange(1.0, d + 1, dtype=torch.float64) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) > 0.3).to(torch.float64)
    mask[0] = 1.0
    return x, y, mask


# --- the plain-loop helper ------------------------------------------------

def run_loop(torch, split_at=None, micro=5, accumulation=2, steps=4, token_mean=False):
    x, y, mask = data(torch)
    model = torch.nn.Linear(x.shape[1], 1, dtype=torch.float64)
    with torch.no_grad():
        model.weight.fill_(0.1)
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    count = (lambda b: b["mask"].sum()) if token_mean else None
    loop = memprof_agent.MicroBatchLoop(accumulation=accumulation, count=count)
    batches = [{"x": x[i:i + micro], "y": y[i:i + micro], "mask": mask[i:i + micro]} for i in range(0, micro * accumulation * steps, micro)]
    losses = []
    for n, batch in enumerate(batches):
        if n == split_at:
            critical()
        for part in loop.parts(batch):
            err = (model(part.data["x"]).squeeze(-1) - part.data["y"]) ** 2
            loss = (err * part.data["mask"]).sum() / part.data["mask"].sum() if token_mean else err.mean()
            part.backward(loss)
        losses.append(float(loop.last_loss))
        if loop.step_due():
            opt.step()
            opt.zero_grad()
    loop.close()
    return model, loop, losses


@pytest.mark.parametrize("token_mean", [False, True])
def test_a_split_loop_ends_with_the_unsplit_weights(torch, token_mean):
    ref, _, ref_losses = run_loop(torch, token_mean=token_mean)
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    got, loop, losses = run_loop(torch, split_at=3, token_mean=token_mean)
    assert loop.factor == 2 and loop.optimizer_steps == 4
    assert torch.allclose(ref.weight, got.weight, rtol=0, atol=1e-12)
    assert torch.allclose(ref.bias, got.bias, rtol=0, atol=1e-12)
    assert losses == pytest.approx(ref_losses, abs=1e-12), "last_loss is the micro-batch's loss"


def test_without_weights_a_token_mean_split_would_differ(torch):
    """The control: the weights matter (equal shares are wrong when parts
    hold different numbers of counted tokens)."""
    ref, _, _ = run_loop(torch, token_mean=True)
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    got, _, _ = run_loop(torch, split_at=3, token_mean=True)
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    orig = memprof_agent._remedy.weights
    memprof_agent._remedy.weights = lambda parts, count=None: orig(parts, None)
    try:
        wrong, _, _ = run_loop(torch, split_at=3, token_mean=True)
    finally:
        memprof_agent._remedy.weights = orig
    assert torch.allclose(ref.weight, got.weight, rtol=0, atol=1e-12)
    assert not torch.allclose(ref.weight, wrong.weight, rtol=0, atol=1e-6)


# --- transformers -----------------------------------------------------------

class _Reg:
    """A regression model for the Trainer: forward(x, labels) -> {"loss"}."""


def hf_model(torch, accepts_kwargs):
    class Reg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 1, dtype=torch.float64)
            with torch.no_grad():
                self.lin.weight.fill_(0.1)
                self.lin.bias.zero_()

        def forward(self, x, labels=None):
            err = (self.lin(x).squeeze(-1) - labels) ** 2
            return {"loss": err.mean()}

    class RegKw(Reg):
        def forward(self, x, labels=None, num_items_in_batch=None, **kwargs):
            err = (self.lin(x).squeeze(-1) - labels) ** 2
            if num_items_in_batch is None:
                return {"loss": err.mean()}
            return {"loss": err.sum() / num_items_in_batch}

    return RegKw() if accepts_kwargs else Reg()


def run_hf(torch, tmp_path, split_at=None, high_at=None, accepts_kwargs=False, micro=5, accumulation=2, steps=4):
    transformers = pytest.importorskip("transformers")
    from memprof_agent.hf import MemprofCallback

    x, y, _ = data(torch)
    ds = [{"x": x[i], "labels": y[i]} for i in range(micro * accumulation * steps)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        max_steps=steps, learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", report_to=[],
        use_cpu=True, save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )

    class Trigger(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == split_at:
                critical()
            if state.global_step == high_at:
                critical("high")

    model = hf_model(torch, accepts_kwargs)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=[Trigger()])
    trainer._signature_columns = ["x", "labels"]
    cb = MemprofCallback.install(trainer)
    trainer.train()
    cb.close()
    return model, cb, trainer


@pytest.mark.parametrize("accepts_kwargs", [False, True])
def test_the_hf_callback_splits_and_ends_with_the_unsplit_weights(torch, tmp_path, accepts_kwargs):
    ref, _, _ = run_hf(torch, tmp_path / "a", accepts_kwargs=accepts_kwargs)
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    got, cb, trainer = run_hf(torch, tmp_path / "b", split_at=1, accepts_kwargs=accepts_kwargs)
    assert cb.split.factor == 2 and cb.split.changes == [("5 x 2", "2-3 x 4")]
    assert trainer.state.global_step == 4
    assert torch.allclose(ref.lin.weight, got.lin.weight, rtol=0, atol=1e-12)


def test_the_hf_callback_checkpoints_on_high_and_records_it(torch, tmp_path):
    _, cb, trainer = run_hf(torch, tmp_path, high_at=2)
    assert (tmp_path / "checkpoint-2").is_dir()
    events = [e for e in memprof_agent._core.MARKERS.kept if e[1] == "checkpoint"]
    assert [e[2] for e in events] == ["step=2"]


# --- lightning ----------------------------------------------------------

def run_lightning(torch, tmp_path, split_at=None, high_at=None, micro=5, accumulation=2, steps=4):
    L = pytest.importorskip("lightning")
    from memprof_agent.lightning import MemprofCallback

    x, y, _ = data(torch)
    n = micro * accumulation * steps

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 1, dtype=torch.float64)
            with torch.no_grad():
                self.lin.weight.fill_(0.1)
                self.lin.bias.zero_()

        def training_step(self, batch, batch_idx):
            bx, by = batch
            return ((self.lin(bx).squeeze(-1) - by) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Trigger(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == split_at:
                critical()
            if batch_idx == high_at:
                critical("high")

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:n], y[:n]), batch_size=micro, shuffle=False)
    cb = MemprofCallback(dirpath=str(tmp_path / "ckpt"))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulation,
                        callbacks=[Trigger(), cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    module = Module()
    trainer.fit(module, loader)
    for h in cb.handles:
        h.remove()
    return module, cb, trainer


def test_the_lightning_callback_splits_and_ends_with_the_unsplit_weights(torch, tmp_path):
    ref, _, _ = run_lightning(torch, tmp_path / "a")
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    got, cb, trainer = run_lightning(torch, tmp_path / "b", split_at=2)
    assert cb.split.factor == 2 and trainer.global_step == 4
    assert torch.allclose(ref.lin.weight, got.lin.weight, rtol=0, atol=1e-12)


def test_the_lightning_callback_checkpoints_on_high_at_a_step_boundary(torch, tmp_path):
    _, cb, trainer = run_lightning(torch, tmp_path, high_at=2)
    assert [p.rsplit("/", 1)[1] for p in cb.saved] == ["memprof-step=2.ckpt"]
    events = [e for e in memprof_agent._core.MARKERS.kept if e[1] == "checkpoint"]
    assert [e[2] for e in events] == ["step=2"]


def test_the_framework_modules_import_without_their_frameworks():
    import subprocess

    code = ("import sys; sys.modules['transformers'] = None; sys.modules['lightning'] = None; "
            "sys.modules['pytorch_lightning'] = None; import memprof_agent.hf as h, memprof_agent.lightning as l; "
            "print(h.MemprofCallback.__mro__[1].__name__, l.MemprofCallback.__mro__[1].__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(__import__("conftest").HERE.parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["object", "object"]
