"""memprof_agent.trace_modules on the fake torch: which modules it hooks
(top level, through single-child wrappers and into ModuleLists, at most
32), the bytes each adds in forward and backward, the optimizer step's own
peak, the handle's remove(), and the phases in the push."""

from conftest import closed_port, fake_torch as ft, memprof_agent

MiB = 1 << 20


class Leaf(ft.Module):
    def __init__(self, fwd, bwd):
        super().__init__()
        self.lin = ft.Linear(8, 8)
        self.fwd_bytes, self.bwd_bytes = fwd, bwd


class Net(ft.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.emb = Leaf(1 * MiB, 0)
        self.blocks = ft.ModuleList(Leaf(10 * MiB, 3 * MiB) for _ in range(blocks))
        self.head = Leaf(5 * MiB, 7 * MiB)


class Wrapper(ft.Module):
    """peft's PeftModel / DDP: one child, the model."""

    def __init__(self, model):
        super().__init__()
        self.model = model


def step(model, opt, fake):
    model(None)
    ft.run_backward()
    ft.make_grads(model)
    opt.step()
    fake.free(fake.allocated - (3 << 30))  # everything but the first 3 GiB goes


def test_each_top_level_module_says_what_it_adds_in_forward_and_backward(fake):
    model = Wrapper(Net())
    opt = ft.AdamW(model.parameters(), step_bytes=64 * MiB)
    handle = memprof_agent.trace_modules(model, opt)
    for _ in range(3):
        step(model, opt, fake)
    phases = {p["module"]: (p["forwardBytes"], p["backwardBytes"]) for p in handle.phases()}
    assert phases == {
        "model.emb": (1 * MiB, 0),
        "model.blocks.0": (10 * MiB, 3 * MiB),
        "model.blocks.1": (10 * MiB, 3 * MiB),
        "model.head": (5 * MiB, 7 * MiB),
    }
    assert handle.optimizer_step_peak == 64 * MiB
    handle.remove()
    assert all(not m._fpre and not m._fpost and not m._bpre and not m._bpost for _, m in model.named_modules())
    assert len(opt._pre) == 0 and len(opt._post) == 0
    fake.calls.clear()
    step(model, opt, fake)
    assert fake.calls == []


def test_at_most_32_modules_are_traced(fake):
    model = Net(blocks=40)
    handle = memprof_agent.trace_modules(model)
    assert len(handle.modules) == 32 and handle.left_out == 42 - 32
    model(None)
    assert len(handle.phases()) == 32
    handle.remove()


def test_the_phases_ride_in_the_breakdown_of_the_push_and_stay_after_remove(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    model = Net()
    opt = ft.AdamW(model.parameters(), step_bytes=32 * MiB)
    memprof_agent.watch(model, opt)
    with memprof_agent.trace_modules(model):  # the watched optimizer is measured too
        for _ in range(4):
            step(model, opt, fake)
        b = memprof_agent._agent.build("sample")["breakdown"]
    assert b["optimizerStepPeakBytes"] == 32 * MiB
    assert b["phases"][1] == {"module": "blocks.0", "forwardBytes": 10 * MiB, "backwardBytes": 3 * MiB}
    after = memprof_agent._agent.build("sample")["breakdown"]
    assert after["phases"] == b["phases"]


def test_a_module_that_frees_more_than_it_takes_counts_zero_in_the_push(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    model = Net()
    memprof_agent.breakdown(model)
    with memprof_agent.trace_modules(model):
        fake.alloc(100 * MiB)
        model.head.fwd_bytes = -50 * MiB  # frees what earlier modules held
        model(None)
        phases = memprof_agent._agent.build("sample")["breakdown"]["phases"]
    assert [p["forwardBytes"] for p in phases][-1] == 0


def test_trace_modules_never_raises(fake):
    handle = memprof_agent.trace_modules(object())
    assert handle.phases() == [] and handle.remove() is None
    model = Net()
    opt = ft.AdamW(model.parameters())
    with memprof_agent.trace_modules(model, opt):
        fake.raise_in_stats = RuntimeError("CUDA error")
        model(None)  # the hooks' reads fail; forward, backward and the optimizer step go on
        ft.run_backward()
        ft.make_grads(model)
        opt.step()
    assert len(opt.state) == len(opt.param_groups[0]["params"])
