"""The two halves of the agent together (the transport, verdicts,
callbacks and checkpoints; the seed tools' host, timeline, gradients, sizes and
tracking): one push-contributor registration, event extras through the
checkpoint queue, step() doing both halves' work, markers still calling no
torch API with everything armed."""

import logging

from conftest import closed_port, fake_torch as ft, memprof_agent, wait_until

_core = memprof_agent._core
_extras = memprof_agent._extras
_reply = memprof_agent._reply
GiB = 1 << 30
NOWHERE = "http://127.0.0.1:%d/v1/agent"


def start():
    assert memprof_agent.start(interval=60, url=NOWHERE % closed_port())
    return memprof_agent._agent


def test_issue_19s_fields_come_from_one_contributor_given_the_push(fake):
    entries = [(fn, with_push) for fn, with_push in _core.PUSH_CONTRIBUTORS if fn is _extras.contribute]
    assert entries == [(_extras.contribute, True)]
    _core.add_push_contributor(_extras.contribute, with_push=True)
    assert len(_core.PUSH_CONTRIBUTORS) == 1, "registered once"
    agent = start()
    push = agent.build("sample")
    assert push["host"]["rssBytes"] == push["rssBytes"], "host reads the push's own rssBytes"
    assert push["sizes"]["device"] == push["devices"][0]["index"]
    # Without that registration, nothing else adds them.
    _core.PUSH_CONTRIBUTORS[:] = []
    assert not {"host", "sizes"} & set(agent.build("sample"))


def test_a_contributor_gets_kind_and_torch_keeps_what_is_there_and_a_failure_is_said_once(fake, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    seen = []

    def plain(kind, torch):
        seen.append((kind, torch is ft.sys.modules["torch"]))
        return {"extraField": 1, "devices": "not replaced"}

    def broken(kind, torch):
        raise RuntimeError("boom")

    _core.add_push_contributor(plain)
    _core.add_push_contributor(broken)
    agent = start()
    for _ in range(3):
        push = agent.build("sample")
    assert seen[-1] == ("sample", True) and push["extraField"] == 1
    assert isinstance(push["devices"], list), "a contributor never replaces a field already in the push"
    assert "host" in push, "the others still go"
    assert len([r for r in caplog.records if "broken" in r.getMessage()]) == 1


def test_a_checkpoint_keeps_its_timeline_fields_in_every_push_until_one_is_accepted(fake, unix_sidecar):
    server = unix_sidecar()
    refuse = {"n": 2}

    def answer(push):
        if refuse["n"] > 0:
            refuse["n"] -= 1
            return 503, None
        return 204, None

    server.answer = answer
    memprof_agent.step(7)
    fake.alloc(2 * GiB)
    rec = memprof_agent.record_detailed("checkpoint", note="step=7", model={"total_params": 10, "trainable_params": 4})
    assert rec["allocatedBytes"] == 5 * GiB and rec["name"] == "checkpoint", "record() still returns the timeline's dict"
    for i in range(40):  # more than a push takes: the checkpoint is not crowded out
        memprof_agent.record("noise", note=str(i), memory=False)
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: len(server.pushes) >= 5)
    carried = [e for p in server.pushes for e in p["events"] if e["name"] == "checkpoint"]
    assert len(carried) == 3, "two refused pushes carried it, then the accepted one"
    for e in carried:
        assert e["allocatedBytes"] == 5 * GiB and e["maxAllocatedBytes"] >= 5 * GiB and e["step"] == 7
        assert e["detail"] == {"parameters": 10, "trainableParameters": 4} and e["elapsed"] == rec["elapsed"]
    assert not _core.MARKERS.checkpoints
    assert [r["name"] for r in memprof_agent.timeline()][:2] == ["checkpoint", "noise"]


def test_step_runs_the_queued_callbacks_and_takes_the_tracking_sample(fake):
    start()
    ran = []
    memprof_agent.on_risk("high", lambda e: ran.append(e.step))
    memprof_agent.track(every=2)
    _core.RISK.observe(_reply.Verdict("high", tto=None, leak=False, source="agent", at=1.0))
    memprof_agent.step(1)
    assert ran == [1] and len(memprof_agent._tracking.TRACKER.samples) == 0
    memprof_agent.step(2)
    assert len(memprof_agent._tracking.TRACKER.samples) == 1


def test_a_raising_callback_does_not_stop_the_tracking_sample(fake):
    start()
    memprof_agent.track(every=1)
    _core.RISK.run_pending = lambda: 1 / 0  # an instance attribute: conftest re-creates RISK's state, not this
    try:
        _core.RISK.pending.append(None)
        memprof_agent.step(1)
    finally:
        del _core.RISK.run_pending
        _core.RISK.pending.clear()
    assert len(memprof_agent._tracking.TRACKER.samples) == 1


def test_step_and_phase_call_no_torch_api_with_every_part_armed(fake):
    agent = start()
    agent.history.turn_on(1000, "test")  # history on: tracking would look up sites, sizes take snapshots
    model = ft.Linear(4, 4)
    opt = ft.AdamW(list(model.parameters()))
    memprof_agent.watch_gradients(model, opt, every=1)
    memprof_agent.watch(model, opt)
    memprof_agent.on_risk("critical", lambda e: None)
    memprof_agent.track(every=10 ** 6)
    agent.build("sample")  # the contributors have read once
    fake.calls.clear()
    for n in range(1000):
        memprof_agent.step(n)
        with memprof_agent.phase("forward"):
            pass
        with memprof_agent.phase("optimizer"):
            pass
    assert fake.calls == []


def test_with_real_torch_on_cpu_both_halves_fill_one_push(real_torch):
    """Real torch (skipped where it is not installed): the helper's split
    and checkpoint, a gradient check flagging an injected inf, tracking
    seeing what a loop keeps, and the timeline, in the same push."""
    torch = real_torch
    start()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    saved = []
    loop = memprof_agent.MicroBatchLoop(accumulation=1, checkpoint=saved.append)
    assert memprof_agent.watch_gradients(model, opt, every=1)
    memprof_agent.track(every=2)
    batch = {"x": torch.randn(8, 4), "y": torch.randn(8)}
    kept, parts = [], []
    for n in range(6):
        memprof_agent.step(n)
        if n == 3:
            _core.RISK.observe(_reply.Verdict("critical", source="agent", at=1.0))
        for part in loop.parts(batch):
            parts.append(n)
            part.backward(((model(part.data["x"]).squeeze(-1) - part.data["y"]) ** 2).mean())
        if loop.step_due():
            if n == 5:
                model.weight.grad[0, 0] = float("inf")
            opt.step()
            opt.zero_grad()
        kept.append(torch.zeros(257))  # what tracking should find growing
    memprof_agent.record_detailed("done", tensors={"x": batch["x"]}, model=model)
    push = memprof_agent._agent.build("sample")
    assert parts.count(3) == 2 and parts.count(2) == 1, "split from the step the verdict came in"
    assert saved, "the checkpoint on high was taken"
    events = {e["name"]: e for e in push["events"]}
    assert "elapsed" in events["checkpoint"] and events["checkpoint"]["note"].startswith("step=")
    assert events["done"]["detail"] == {"tensors": 1, "tensorBytes": 8 * 4 * 4, "parameters": 5, "trainableParameters": 5}
    assert push["grads"]["nonFinite"] == ["weight"] and push["grads"]["step"] == 5
    grown = [g for g in push["tracking"]["tensors"] if g["shape"] == [257]]
    assert grown and grown[0]["count"] >= 2 and grown[0]["device"] == "cpu"
    assert push["host"]["rssBytes"] == push["rssBytes"] and "sizes" not in push, "no CUDA: no size histogram"
