"""Contract C-1: the summary file (MEMPROF_AGENT_SUMMARY) at exit, at the
step budget and before an OOM propagates; the step budget
(MEMPROF_AGENT_MAX_STEPS) sends the final push before it exits and never
fires when unset; step(n, tokens=, samples=) throughput."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HERE, closed_port, fake_torch, memprof_agent

GiB = 1 << 30

TRAINER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [%r, %r]
    import fake_torch
    fake = fake_torch.install()
    import memprof_agent
    assert memprof_agent.start(interval=0.05)
    try:
        for n in range(100):
            memprof_agent.step(n, tokens=4096, samples=8)
            time.sleep(0.02)
    finally:
        print("finally ran", flush=True)
    print("ran past the budget", flush=True)
    """
) % (str(HERE.parent), str(HERE))


def run_trainer(env, script=TRAINER):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_AGENT")}
    return subprocess.run([sys.executable, "-c", script], env=dict(clean, **env), capture_output=True, text=True, timeout=60)


def test_the_step_budget_ends_the_run_with_a_summary_after_the_final_push(sidecar, workdir):
    out = workdir / "summary.json"
    before = sidecar.agent_pushes()
    proc = run_trainer({"MEMPROF_AGENT_SOCKET": sidecar.socket, "MEMPROF_AGENT_SUMMARY": str(out), "MEMPROF_AGENT_MAX_STEPS": "6"})
    assert proc.returncode == 0, proc.stderr
    assert "finally ran" in proc.stdout and "ran past the budget" not in proc.stdout
    s = json.loads(out.read_text())
    assert s["version"] == 1 and s["steps"] == 6 and s["oom"] is False and s["oomMessage"] is None
    # 7 calls: the intervals begun by calls 3..6 (the first two are warm-up).
    assert s["stepSeconds"]["n"] == 4 and 0.015 < s["stepSeconds"]["median"] < 0.5
    assert s["stepSeconds"]["p90"] >= s["stepSeconds"]["median"]
    assert s["tokensPerSecond"] == pytest.approx(4096 / s["stepSeconds"]["median"], rel=0.5)
    assert s["samplesPerSecond"] == pytest.approx(s["tokensPerSecond"] * 8 / 4096)
    assert s["peakAllocatedBytes"] == 5 * GiB and s["peakReservedBytes"] == 4 * GiB
    assert s["deviceTotalBytes"] == 80 * GiB and s["nvmlPeakUsedBytes"] is None
    assert s["breakdown"] is None and s["pid"] > 0
    assert sidecar.agent_pushes() > before
    assert not list(workdir.glob("summary.json.tmp*"))


def test_the_budget_sends_the_final_push_before_the_summary_then_exits(fake, workdir, monkeypatch):
    order = []
    monkeypatch.setattr(memprof_agent._transport.Transport, "send",
                        lambda self, body, timeout: order.append(("push", json.loads(body)["kind"])) or True)
    real_write = memprof_agent._summary.write
    monkeypatch.setattr(memprof_agent._summary, "write", lambda path, s: order.append(("summary", s["steps"])) or real_write(path, s))
    monkeypatch.setenv("MEMPROF_AGENT_MAX_STEPS", "3")
    monkeypatch.setenv("MEMPROF_AGENT_SUMMARY", str(workdir / "s.json"))
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    for n in range(3):
        memprof_agent.step(n)
    assert order == []
    with pytest.raises(SystemExit) as exit_:
        memprof_agent.step(3)
    assert exit_.value.code == 0
    assert order == [("push", "final"), ("summary", 3)]
    # Exit does not repeat them.
    memprof_agent._agent.at_exit()
    assert order == [("push", "final"), ("summary", 3)]


def test_no_budget_no_exit_and_an_invalid_budget_is_ignored(fake, monkeypatch, caplog):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    for n in range(20000):
        memprof_agent.step(n)
    assert memprof_agent._core.MARKERS.budget is None
    memprof_agent.stop()
    monkeypatch.setenv("MEMPROF_AGENT_MAX_STEPS", "ten")
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    for n in range(50):
        memprof_agent.step(n)
    assert any("MEMPROF_AGENT_MAX_STEPS" in r.getMessage() for r in caplog.records)


def test_the_summary_is_written_at_exit_and_carries_the_breakdown(workdir):
    out = workdir / "summary.json"
    script = TRAINER.replace("for n in range(100):", (
        "model = fake_torch.Linear(64, 64)\n"
        "    opt = fake_torch.AdamW(model.parameters())\n"
        "    memprof_agent.watch(model, opt)\n"
        "    for n in range(5):\n"
        "        fake_torch.make_grads(model); opt.step()\n"))
    proc = run_trainer({"MEMPROF_AGENT_URL": "http://127.0.0.1:%d/v1/agent" % closed_port(), "MEMPROF_AGENT_SUMMARY": str(out)}, script)
    assert proc.returncode == 0, proc.stderr
    assert "ran past the budget" in proc.stdout
    s = json.loads(out.read_text())
    assert s["steps"] == 5 and s["stepSeconds"]["n"] == 2
    b = s["breakdown"]
    assert b["parametersBytes"] == (64 * 64 + 64) * 4 and b["optimizerBytes"] == 2 * b["gradientsBytes"]
    assert "notes" not in b


def test_the_summary_is_written_before_an_oom_propagates(fake, workdir, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_SUMMARY", str(workdir / "s.json"))
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    memprof_agent.step(0)
    exc = fake.oom()  # the allocator's observer runs before the exception exists
    s = json.loads((workdir / "s.json").read_text())
    assert s["oom"] is True and "out of memory" in s["oomMessage"] and s["steps"] == 1
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise exc


def test_step_rates_leave_out_the_warm_up_and_use_the_trainers_counts():
    clock = [(0.0, 1, 100, 2), (5.0, 2, 100, 2), (6.0, 3, 100, 2), (7.0, 4, 300, 2), (9.0, 5, 100, 2), (10.0, 6, None, None)]
    seconds, tokens, samples = memprof_agent._summary.step_rates(clock)
    # Intervals begun by calls 3, 4, 5: 1 s, 2 s, 1 s carrying 100, 300, 100 tokens.
    assert seconds == {"median": 1.0, "p90": pytest.approx(1.8), "n": 3}
    assert tokens == pytest.approx(500 / 4.0) and samples == pytest.approx(6 / 4.0)
    assert memprof_agent._summary.step_rates(clock[:3]) == (None, None, None)
    # A step that did not say its tokens makes tokens/s unknown, not wrong.
    clock[3] = (7.0, 4, None, 2)
    assert memprof_agent._summary.step_rates(clock)[1] is None


def test_without_a_running_agent_the_budget_still_writes_the_summary_and_exits(workdir, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_MAX_STEPS", "2")
    monkeypatch.setenv("MEMPROF_AGENT_SUMMARY", str(workdir / "s.json"))
    memprof_agent._core.MARKERS.configure(os.environ)  # what importing memprof_agent does
    assert not memprof_agent.running()
    memprof_agent.step(0)
    memprof_agent.step(1)
    with pytest.raises(SystemExit):
        memprof_agent.step(2)
    s = json.loads((workdir / "s.json").read_text())
    assert s["steps"] == 2 and s["peakAllocatedBytes"] is None and s["oom"] is False


def test_the_final_push_is_tried_even_while_backing_off(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    t = memprof_agent._agent.transport
    t.send(b"{}", 0.5)  # no sidecar: backing off now
    assert not t.ready() and t.attempts == 1
    memprof_agent._agent.at_exit()
    assert t.attempts == 2
