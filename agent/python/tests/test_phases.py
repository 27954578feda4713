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


# --- backward: the peak above the start, not the net change ------------------


def test_backward_is_the_peak_added_above_its_start_and_the_net_change_is_kept_signed(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    model = Net()
    memprof_agent.breakdown(model)
    for m in (getattr(model.blocks, "0"), getattr(model.blocks, "1")):
        m.bwd_temp, m.bwd_bytes = 20 * MiB, -8 * MiB  # gradient buffers, then its activations freed
    with memprof_agent.trace_modules(model) as handle:
        model(None)
        ft.run_backward()
        phases = {p["module"]: p for p in handle.phases()}
        pushed = memprof_agent._agent.build("sample")["breakdown"]["phases"]
    assert phases["blocks.0"]["backwardBytes"] == 20 * MiB  # the net (-8 MiB) would read as "costs nothing"
    assert phases["blocks.0"]["backwardNetBytes"] == -8 * MiB
    assert phases["head"]["backwardBytes"] == phases["head"]["backwardNetBytes"] == 7 * MiB
    assert pushed[1] == {"module": "blocks.0", "forwardBytes": 10 * MiB, "backwardBytes": 20 * MiB}


def test_a_module_whose_inputs_need_no_gradient_is_measured_until_the_next_event(fake):
    """torch calls the full backward hook of such a module (token ids in, a
    frozen prefix) when its output gradients arrive, before its backward
    runs: the window ends at the next traced event instead."""
    model = Net()
    model.emb.inputs_need_grad = getattr(model.blocks, "0").inputs_need_grad = False
    model.emb.bwd_temp, getattr(model.blocks, "0").bwd_temp = 30 * MiB, 40 * MiB
    opt = ft.AdamW(model.parameters())
    handle = memprof_agent.trace_modules(model, opt)
    step(model, opt, fake)
    phases = {p["module"]: p for p in handle.phases()}
    assert phases["blocks.0"]["backwardBytes"] == 40 * MiB  # ended at emb's backward start
    assert phases["blocks.0"]["backwardNetBytes"] == 3 * MiB
    assert phases["emb"]["backwardBytes"] == 30 * MiB  # ended at the optimizer step's start
    handle.remove()
    assert memprof_agent._torchread.OPEN_WINDOWS == []
    # Without an optimizer the last one would take in the optimizer step and
    # zero_grad: not measured.
    model = Net()
    model.emb.inputs_need_grad, model.emb.bwd_temp = False, 30 * MiB
    with memprof_agent.trace_modules(model) as handle:
        for _ in range(2):
            model(None)
            ft.run_backward()
        phases = {p["module"]: p for p in handle.phases()}
    assert phases["emb"]["backwardBytes"] == 0 and phases["emb"]["backwardNetBytes"] is None
    assert memprof_agent._torchread.OPEN_WINDOWS == []


def run_watched(fake, traced):
    """Steps 1-3 of watch() on one model, with or without trace_modules."""
    memprof_agent._watch.reset()
    fake.allocated = fake.peak_allocated = 3 << 30
    model = Net()
    for m in (getattr(model.blocks, "0"), getattr(model.blocks, "1"), model.head):
        m.bwd_temp = 100 * MiB
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch(model, opt)
    handle = memprof_agent.trace_modules(model, opt) if traced else None
    peaks = []
    for _ in range(3):
        step(model, opt, fake)
        peaks.append(memprof_agent._agent.build("sample")["devices"][0]["peakAllocatedBytes"])
    if handle is not None:
        handle.remove()
    return memprof_agent.last_breakdown()["activationsPeakBytes"], peaks


def test_its_peak_resets_shorten_neither_watch_nor_the_pushes(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    alone = run_watched(fake, traced=False)
    assert run_watched(fake, traced=True) == alone
    assert alone[0] > 0


def test_pushes_leave_the_peaks_alone_while_it_traces(fake):
    model = Net()
    handle = memprof_agent.trace_modules(model)
    model(None)  # finds the device
    assert memprof_agent._torchread.PEAKS.held == 1
    handle.remove()
    assert memprof_agent._torchread.PEAKS.held == 0


def test_backward_false_hooks_forwards_only(fake):
    model = Net()
    with memprof_agent.trace_modules(model, backward=False) as handle:
        assert all(not m._bpre and not m._bpost for _, m in handle.modules)
        model(None)
        ft.run_backward()
        assert handle.phases()[1]["forwardBytes"] == 10 * MiB and handle.phases()[1]["backwardNetBytes"] is None


# --- the read it uses ---------------------------------------------------------


def test_each_read_is_torch_C_memory_stats_with_the_public_call_as_fallback(fake):
    model = Net()
    with memprof_agent.trace_modules(model):
        model(None)
        ft.run_backward()
        fake.calls.clear()
        model(None)
        ft.run_backward()
    assert set(fake.calls) == {"_cuda_memoryStats", "_cuda_resetPeakMemoryStats"}
    assert fake.calls.count("_cuda_memoryStats") == 4 * 4 and fake.calls.count("_cuda_resetPeakMemoryStats") == 4
    assert memprof_agent._torchread.fast_reads(ft.sys.modules["torch"]).name() == "torch._C._cuda_memoryStats"
    # A torch whose private call takes other arguments (or has none): the
    # public one, for good.
    torch = ft.sys.modules["torch"]
    torch._C._cuda_memoryStats = lambda device, extra: {}
    torch._C._cuda_resetPeakMemoryStats = lambda: None
    memprof_agent._torchread._FAST[0] = None
    with memprof_agent.trace_modules(model) as handle:
        model(None)
        ft.run_backward()
        fake.calls.clear()
        model(None)
        ft.run_backward()
    assert set(fake.calls) == {"memory_stats_as_nested_dict", "reset_peak_memory_stats"}
    assert handle.phases()[1]["backwardBytes"] == 3 * MiB
    assert memprof_agent._torchread.fast_reads(torch).name() == "torch.cuda.memory_stats_as_nested_dict"


def test_a_checkpointed_module_recomputing_its_forward_inside_backward_keeps_its_window(fake):
    """Activation checkpointing runs the module's forward again inside its
    backward (on the engine's thread): that forward is no new step."""
    model = Net()
    first, second = getattr(model.blocks, "0"), getattr(model.blocks, "1")
    for m in (first, second):
        m.recompute, m.bwd_temp = True, 20 * MiB
    first.inputs_need_grad = False  # and its window is still open when it recomputes
    with memprof_agent.trace_modules(model) as handle:
        model(None)
        ft.run_backward()
        phases = {p["module"]: p for p in handle.phases()}
    # start, +10 MiB recomputed activations, +20 MiB gradient buffers at the peak
    assert phases["blocks.1"]["backwardBytes"] == phases["blocks.0"]["backwardBytes"] == 30 * MiB
    assert phases["blocks.1"]["backwardNetBytes"] == 10 * MiB + 3 * MiB
