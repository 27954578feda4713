"""watch_gradients (seed 001): every N optimizer steps (or
backward passes), NaN/Inf, unusually large and vanishing gradients and the
global norm, with one device-to-host copy per device per check and nothing
on the other steps; flags in the push (`grads`)."""

import json
import logging
import math

from conftest import closed_port, fake_torch as ft, memprof_agent


class Net(ft.Module):
    def __init__(self):
        super().__init__()
        self.emb = ft.Embedding(100, 8)
        self.fc1 = ft.Linear(8, 8)
        self.fc2 = ft.Linear(8, 4)


def train(model, opt, steps, fill=0.02, special=None):
    for _ in range(steps):
        ft.make_grads(model, fill=fill, special=special)
        opt.step()


def test_checks_every_n_optimizer_steps_with_one_copy_per_device_and_nothing_between(fake):
    model = Net()
    opt = ft.AdamW(model.parameters())
    assert memprof_agent.watch_gradients(model, opt, every=5)
    fake.calls.clear()
    train(model, opt, 4)
    assert fake.calls == [] and memprof_agent.last_gradients() is None
    train(model, opt, 1)
    g = memprof_agent.last_gradients()
    assert g["checks"] == 1 and g["step"] == 5 and g["checked"] == 5 and g["every"] == 5
    assert fake.calls.count("tolist") == 1 and g["copies"] == 1  # one sync: one device
    assert fake.calls.count("_foreach_norm") == 1  # one fused norm: one device, one dtype
    expected = math.sqrt(sum(0.02 ** 2 * p.numel() for p in model.parameters()))
    assert abs(g["globalNorm"] - expected) < 1e-9
    assert g["nonFinite"] == g["large"] == g["vanishing"] == [] and g["globalNormMedian"] is None
    memprof_agent.step(77)
    train(model, opt, 5)
    assert memprof_agent.last_gradients()["step"] == 77  # the trainer's step when it calls step()


def test_one_copy_per_device_and_one_norm_per_dtype(fake):
    model = Net()
    model.fc2.weight = ft.param(4, 8, device=ft.Device("cuda", 1))
    model.emb.weight = ft.param(100, 8, dtype=ft.bfloat16)
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1)
    fake.calls.clear()
    train(model, opt, 1)
    assert fake.calls.count("tolist") == 2 and fake.calls.count("_foreach_norm") == 3


def test_a_blowup_is_large_then_nan_is_non_finite_and_said_once(fake, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    model = Net()
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1, factor=10.0)
    train(model, opt, 3)
    # Three checks of history: a 50x larger gradient in fc1.weight is "large".
    train(model, opt, 1, special={"fc1.weight": 0.02 * 50 * 8})
    g = memprof_agent.last_gradients()
    assert g["large"] == ["fc1.weight"] and g["largeCount"] == 1 and g["nonFinite"] == []
    assert g["largeRatios"]["fc1.weight"] > 10 and g["globalNormMedian"] > 0
    # Below the factor: not large.
    train(model, opt, 1, special={"fc1.weight": 0.02 * 3})
    assert memprof_agent.last_gradients()["large"] == []
    memprof_agent.step(40)
    train(model, opt, 2, special={"fc2.bias": float("nan"), "emb.weight": float("inf")})
    g = memprof_agent.last_gradients()
    assert sorted(g["nonFinite"]) == ["emb.weight", "fc2.bias"] and g["globalNorm"] is None
    assert g["firstNonFiniteStep"] == 40
    warnings = [r.getMessage() for r in caplog.records if "NaN/Inf gradients" in r.getMessage()]
    assert len(warnings) == 1 and "step 40" in warnings[0]


def test_vanishing_gradients_of_trainable_parameters(fake):
    model = Net()
    model.fc1.bias.requires_grad = False  # frozen: never checked
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1, eps=1e-10)
    ft.make_grads(model)
    model.fc2.weight.grad = ft.Tensor(4, 8, fill=0.0)
    model.fc1.bias.grad = ft.Tensor(8, fill=0.0)
    opt.step()
    g = memprof_agent.last_gradients()
    assert g["vanishing"] == ["fc2.weight"] and g["checked"] == 4


def test_an_fp16_norm_beyond_its_range_is_large_not_non_finite(fake):
    """Without a float32 norm (an older torch: no dtype in _foreach_norm,
    vector_norm in the gradient's dtype), a finite fp16 gradient's norm can
    overflow: the elements are checked before calling it NaN/Inf."""
    del ft.sys.modules["torch"]._foreach_norm
    real_norm = ft.vector_norm
    ft.sys.modules["torch"].linalg.vector_norm = lambda t, dtype=None: real_norm(t)  # ignores dtype
    model = Net()
    model.fc1.weight = ft.param(8, 8, dtype=ft.float16)
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1)
    train(model, opt, 1, fill=10000.0)  # 64 elements of 1e4: a norm of 8e4 > 65504, every element finite
    g = memprof_agent.last_gradients()
    assert g["nonFinite"] == [] and g["large"] == ["fc1.weight"]


def test_without_an_optimizer_the_check_runs_at_the_end_of_every_nth_backward(fake):
    model = Net()
    assert memprof_agent.watch_gradients(model, every=2)
    hooked = [p for p in model.parameters() if p._post_accumulate]
    assert len(hooked) == 1  # one Python call per backward, not one per parameter
    ft.backward_grads(model)
    assert memprof_agent.last_gradients() is None
    ft.backward_grads(model, special={"fc2.weight": float("nan")})
    g = memprof_agent.last_gradients()
    assert g["checks"] == 1 and g["nonFinite"] == ["fc2.weight"] and g["checked"] == 5


def test_the_push_carries_the_latest_check_as_valid_json(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    assert "grads" not in memprof_agent._agent.build("sample")
    model = ft.Module()
    for i in range(40):
        setattr(model, "layer_with_a_long_name_%02d_%s" % (i, "x" * 150), ft.Linear(2, 2))
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1)
    train(model, opt, 1, fill=float("nan"))
    push = memprof_agent._agent.build("sample")
    body = memprof_agent._transport.encode(push, memprof_agent._transport.SAMPLE_CAP)
    grads = json.loads(body)["grads"]  # strict JSON: no NaN literal anywhere
    assert grads["nonFiniteCount"] == 80 and len(grads["nonFinite"]) == 16
    assert all(len(n.encode()) == 128 and n.endswith((".weight", ".bias")) for n in grads["nonFinite"])  # the end kept
    assert grads["globalNorm"] is None and "norms" not in grads
    assert set(grads) == {"step", "every", "checks", "checked", "at", "nonFinite", "large", "vanishing", "nonFiniteCount",
                          "largeCount", "vanishingCount", "globalNorm", "globalNormMedian", "firstNonFiniteStep"}


def test_a_new_watch_replaces_the_old_and_failures_never_reach_the_trainer(fake):
    model, other = Net(), Net()
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch_gradients(model, opt, every=1)
    memprof_agent.watch_gradients(other, ft.AdamW(other.parameters()), every=1)
    assert len(opt._pre) == 0
    ft.sys.modules["torch"]._foreach_norm = lambda *a, **k: 1 / 0
    ft.sys.modules["torch"].linalg.vector_norm = lambda *a, **k: 1 / 0
    other_opt = memprof_agent._grads.WATCHED[0]
    train(other, ft.AdamW(other.parameters()), 1)  # an optimizer without the hook: nothing
    other_opt.check()  # by hand: the failure is logged, not raised
    assert memprof_agent.last_gradients() is None
    frozen = ft.Module()
    frozen.w = ft.param(2, requires_grad=False)
    assert memprof_agent.watch_gradients(frozen) is False  # no trainable parameter to hook
