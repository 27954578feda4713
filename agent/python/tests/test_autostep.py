"""Step numbers without step() (memprof_agent/_autostep.py): pushes of a
trainer that never calls memprof_agent.step() carry the optimizer steps
taken so far, counted by torch's global optimizer step post-hook (the fake
torch's torch.optim.optimizer runs it as torch does, after the optimizer's
own post-hooks, iterating the hooks live). The trainer's step() takes over
for good; counting never spends the step budget, runs on_risk callbacks or
takes tracking samples; a failure never reaches the trainer; the
environment turns it off."""

import logging
import sys

import pytest

from conftest import closed_port, fake_torch, memprof_agent, wait_until

_core = memprof_agent._core
MARKERS = _core.MARKERS


def start(**kw):
    assert memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port(), **kw)
    return memprof_agent._agent


def global_hooks():
    return sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks


def push_step():
    return memprof_agent._agent.build("sample").get("step")


def test_pushes_carry_the_optimizer_steps_taken_so_far(fake, unix_sidecar):
    server = unix_sidecar()
    assert memprof_agent.start(interval=0.05, socket=server.path)
    opt = fake_torch.AdamW([])
    assert server.wait_pushes(1)[0]["step"] == 0, "armed at start(): no optimizer step yet"
    fake.calls.clear()
    for _ in range(3):
        opt.step()
    assert fake.calls == [], "the hook calls no torch API"
    assert wait_until(lambda: server.pushes[-1].get("step") == 3)
    # Nothing of step()'s own: the step budget, the step clock and the
    # summary's step count are untouched.
    assert MARKERS.calls == 0 and len(MARKERS.clock) == 0
    assert len(global_hooks()) == 1, "registered once"
    memprof_agent.stop()
    assert len(global_hooks()) == 0, "stop() takes the hook out"


def test_the_first_optimizer_that_stepped_counts_until_it_is_gone(fake):
    start()
    generator, discriminator = fake_torch.AdamW([]), fake_torch.AdamW([])
    for _ in range(4):
        discriminator.step()
        generator.step()
    assert push_step() == 4, "one training step, two optimizer steps: counted once"
    del discriminator  # gone: the next one to step counts on
    generator.step()
    assert push_step() == 5
    fresh = fake_torch.AdamW([])
    fresh.step()
    assert push_step() == 5, "the generator counts now, not the later one"
    del generator
    fresh.step()
    fresh.step()
    assert push_step() == 7, "the next one to step counts on"


def test_the_trainers_step_takes_over_for_good(fake):
    start()
    opt = fake_torch.AdamW([])
    for _ in range(5):
        opt.step()
    assert push_step() == 5 and len(global_hooks()) == 1
    memprof_agent.step()
    assert push_step() == 1, "the trainer's numbering, from 1, not from the optimizer's count"
    assert len(global_hooks()) == 0, "the hook is out of torch"
    assert MARKERS.auto is None
    opt.step()
    opt.step()
    assert push_step() == 1
    memprof_agent.step(100)
    assert push_step() == 100
    # For good: a new start() does not count again.
    memprof_agent.stop()
    start()
    opt.step()
    assert len(global_hooks()) == 0 and push_step() == 100


def test_a_step_call_before_start_means_no_counting(fake):
    start()
    assert len(global_hooks()) == 1 and push_step() == 0
    memprof_agent.stop()
    MARKERS.__init__()
    memprof_agent.step(7)
    start()
    assert len(global_hooks()) == 0
    fake_torch.AdamW([]).step()
    assert push_step() == 7


def test_step_called_inside_an_optimizer_step_leaves_the_hook_until_it_is_safe(fake):
    """torch iterates the global post-hooks live: taking ours out from a
    global post-hook after it would make optimizer.step() raise."""
    start()
    opt = fake_torch.AdamW([])
    opt.step()
    calls = []

    def trainers_hook(optimizer, args, kwargs):
        if not calls:
            calls.append(1)
            memprof_agent.step(10)

    def another_hook(optimizer, args, kwargs):
        pass

    register = sys.modules["torch.optim.optimizer"].register_optimizer_step_post_hook
    handles = [register(trainers_hook), register(another_hook)]
    opt.step()  # "OrderedDict mutated during iteration" without the wait
    assert calls and push_step() == 10
    assert len(global_hooks()) == 3, "ours stays while torch iterates the hooks"
    opt.step()
    assert push_step() == 10, "and counts nothing"
    memprof_agent.step(11)
    assert list(global_hooks().values()) == [trainers_hook, another_hook], "out at the next step() outside"
    for h in handles:
        h.remove()


def test_counting_never_spends_the_budget_runs_callbacks_or_samples(fake, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_MAX_STEPS", "2")
    start()
    ran = []
    memprof_agent.on_risk("high", ran.append)
    _core.RISK.observe(memprof_agent._reply.Verdict("critical", source="agent", at=1.0))
    assert _core.RISK.pending, "a callback waits for a safe point"
    memprof_agent.track(every=1)
    opt = fake_torch.AdamW([])
    for _ in range(10):
        opt.step()  # never SystemExit
    assert push_step() == 10
    assert ran == [] and _core.RISK.pending, "optimizer steps are no safe points"
    assert len(memprof_agent._tracking.TRACKER.samples) == 0, "nor tracking steps"
    # step() keeps its budget: its 3rd call ends the run.
    memprof_agent.step()
    assert len(ran) == 1
    memprof_agent.step()
    with pytest.raises(SystemExit):
        memprof_agent.step()


def test_a_failing_hook_says_it_once_and_never_raises(fake, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="memprof_agent")
    start()
    assert push_step() == 0

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(memprof_agent._autostep, "weakref", type(sys)("weakref"))
    memprof_agent._autostep.weakref.ref = broken
    opt = fake_torch.AdamW([])
    for _ in range(3):
        opt.step()  # never raises
    said = [r for r in caplog.records if "counting optimizer steps failed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "boom" in said[0].getMessage()
    assert not _core.AUTO.on
    assert push_step() is None, "off: no step rather than one that stopped"
    # The trainer's step() still takes over (and takes the hook out).
    memprof_agent.step(4)
    assert push_step() == 4 and len(global_hooks()) == 0


def test_the_environment_turns_it_off(fake, monkeypatch):
    start()
    fake_torch.AdamW([]).step()
    assert push_step() == 1, "on by default"
    memprof_agent.stop()
    MARKERS.__init__()
    _core.AUTO.__init__(MARKERS)
    monkeypatch.setenv("MEMPROF_AGENT_AUTO_STEP", "0")
    start()
    fake_torch.AdamW([]).step()
    assert push_step() is None
    assert len(global_hooks()) == 0


def test_torch_imported_after_start_is_counted_from_the_agents_thread(unix_sidecar):
    server = unix_sidecar()
    fake_torch.uninstall()
    try:
        assert memprof_agent.start(interval=0.05, socket=server.path)
        assert "step" not in server.wait_pushes(1)[-1]
        fake_torch.install()
        assert wait_until(lambda: len(global_hooks()) == 1)
        opt = fake_torch.AdamW([])
        opt.step()
        opt.step()
        assert wait_until(lambda: server.pushes[-1].get("step") == 2)
    finally:
        memprof_agent.stop()
        fake_torch.uninstall()


def test_after_start_with_another_global_hook_it_waits(fake, caplog):
    """The agent's thread adds the hook only while torch holds none: adding
    one while an optimizer step iterates them would make it raise."""
    caplog.set_level(logging.INFO, logger="memprof_agent")
    optim = sys.modules.pop("torch.optim.optimizer")
    try:
        agent = start()
    finally:
        sys.modules["torch.optim.optimizer"] = optim
    other = optim.register_optimizer_step_post_hook(lambda *a: None)
    agent.tick()
    assert len(global_hooks()) == 1 and MARKERS.step is None
    assert any("holds another global optimizer post-hook" in r.getMessage() for r in caplog.records)
    other.remove()
    agent.tick()
    assert len(global_hooks()) == 1 and MARKERS.auto is not None
    fake_torch.AdamW([]).step()
    assert push_step() == 1


def test_torch_without_the_global_hook(fake, caplog):
    caplog.set_level(logging.INFO, logger="memprof_agent")
    old = fake_torch.optimizer_module(global_hook=False)
    sys.modules["torch.optim.optimizer"] = fake_torch.OPTIM[0] = old
    start()
    fake_torch.AdamW([]).step()
    assert push_step() is None
    said = [r for r in caplog.records if "no global optimizer step hook" in r.getMessage()]
    assert len(said) == 1
    memprof_agent._agent.tick()
    assert len([r for r in caplog.records if "no global optimizer step hook" in r.getMessage()]) == 1


def test_with_real_torch_sgd_steps_are_counted_and_step_takes_over(real_torch):
    torch = real_torch
    from torch.optim.optimizer import _global_optimizer_post_hooks as hooks

    before = len(hooks)
    start()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert push_step() == 3 and len(hooks) == before + 1
    memprof_agent.step()
    assert push_step() == 1 and len(hooks) == before
    opt.step()
    assert push_step() == 1
