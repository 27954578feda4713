"""The agent against a real memprof-sidecar (sim backend) and a fake torch:
push format, back-off, no exception ever reaching the trainer, the OOM
push, the markers' cost (no torch call), the standalone report."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conftest import HERE, closed_port, fake_torch, memprof_agent, wait_until

GiB = 1 << 30


def agent():
    return memprof_agent._agent


def test_pushes_reach_the_sidecar_and_its_report(sidecar, fake):
    assert memprof_agent.start(interval=0.05, socket=sidecar.socket)
    memprof_agent.step(5)
    with memprof_agent.phase("forward"):
        report = sidecar.wait_report(lambda r: (r.get("allocator") or {}).get("phase") == "forward")
    a = report["allocator"]
    assert a["allocatedBytes"] == 3 * GiB and a["reservedBytes"] == 4 * GiB
    assert a["inactiveSplitBytes"] == 64 << 20
    assert a["step"] == 5
    assert agent().transport.failures == 0 and agent().transport.sent >= 1
    # Peaks are read, then reset, once per push.
    assert "reset_peak_memory_stats" in fake.calls


def test_a_push_says_what_docs_agent_md_says(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    memprof_agent.step(3)
    memprof_agent.record("eval", note="epoch 1")
    with memprof_agent.phase("backward"):
        push = agent().build("sample")
    assert push["version"] == 1 and push["kind"] == "sample" and push["pid"] == os.getpid()
    assert push["step"] == 3 and push["phase"] == "backward" and push["torchVersion"] == "2.11.0+fake"
    d = push["devices"][0]
    assert d["uuid"] == "GPU-370fbfe4-cafa-4f4c-9b2e-000000000000" and d["name"] == "Fake H100"
    assert (d["allocatedBytes"], d["reservedBytes"], d["peakAllocatedBytes"]) == (3 * GiB, 4 * GiB, 5 * GiB)
    assert d["totalBytes"] == 80 * GiB and d["freeBytes"] == 75 * GiB
    e = push["events"][0]
    assert e == {"t": e["t"], "name": "eval", "note": "epoch 1", "step": 3, "elapsed": e["elapsed"],
                 "allocatedBytes": 3 * GiB, "reservedBytes": 4 * GiB, "maxAllocatedBytes": 5 * GiB, "maxReservedBytes": 4 * GiB}
    assert 0 <= e["elapsed"] < 600
    assert push["rssBytes"] > 0
    # Events are pushed once.
    assert agent().build("sample")["events"] == []


def test_no_cuda_context_is_created_before_the_trainer_makes_one(fake):
    fake.initialized = False
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    push = agent().build("sample")
    assert push["devices"] == []
    assert not {"memory_stats", "mem_get_info", "_cuda_attach_out_of_memory_observer"} & set(fake.calls)


def test_an_absent_sidecar_means_back_off_and_one_warning(fake, caplog):
    caplog.set_level(logging.INFO, logger="memprof_agent")
    memprof_agent.start(interval=0.02, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    t = agent().transport
    assert wait_until(lambda: t.dropped >= 25, timeout=10)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no sidecar" in warnings[0].getMessage()
    # 25 pushes were due; backing off (0.04, 0.08, 0.16 … s) tried only a few.
    assert t.attempts <= 8, t.attempts
    assert t.backoff_seconds() > 0.02


@pytest.mark.parametrize("mode", ["status:500", "status:400", "garbage", "close", "hang"])
def test_no_exception_reaches_the_caller_whatever_the_sidecar_does(fake, misbehaving, mode):
    server = misbehaving(mode)
    errors = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args)
    try:
        assert memprof_agent.start(interval=0.02, url=server.url)
        for n in range(200):
            memprof_agent.step(n)
            with memprof_agent.phase("forward"):
                memprof_agent.record("e", note="x")
        assert wait_until(lambda: server.hits >= 1)
        t = agent().transport
        assert wait_until(lambda: t.failures >= 1, timeout=6)
        assert agent()._thread.is_alive(), "the daemon thread survives"
    finally:
        memprof_agent.stop()
        threading.excepthook = previous
    assert errors == []


def test_torch_raising_never_reaches_the_caller(sidecar, fake, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    fake.raise_in_stats = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert memprof_agent.start(interval=0.02, socket=sidecar.socket)
    assert wait_until(lambda: any("reading the allocator failed" in r.getMessage() for r in caplog.records))
    assert agent()._thread.is_alive()
    # Torch recovers: pushes resume.
    fake.raise_in_stats = None
    sidecar.wait_report(lambda r: (r.get("allocator") or {}).get("allocatedBytes") == 3 * GiB)
    # Odd arguments to the markers are not errors either.
    memprof_agent.step(object())
    memprof_agent.record(object(), note=object(), memory=True)
    with memprof_agent.phase(None):
        pass
    agent().tick()
    assert len([r for r in caplog.records if "reading the allocator failed" in r.getMessage()]) == 1


def test_the_markers_call_no_torch_api(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    fake.calls.clear()

    @memprof_agent.phase("optimizer")
    def optimizer_step():
        memprof_agent.record("opt", memory=False)

    for n in range(1000):
        memprof_agent.step(n)
        with memprof_agent.phase("forward"):
            memprof_agent.record("fwd", note="n=%d" % n, memory=False)
        optimizer_step()
    memprof_agent.step()
    assert fake.calls == []
    assert memprof_agent._core.MARKERS.step == 1000
    assert memprof_agent._core.MARKERS.phases == []
    # record() reads the allocator once (the documented exception; memory=False reads nothing).
    memprof_agent.record("checkpoint")
    reads = [c for c in fake.calls if c in ("memory_stats", "_cuda_memoryStats", "memory_stats_as_nested_dict")]
    assert reads == ["_cuda_memoryStats"]


def test_an_oom_is_pushed_once_with_its_top_blocks_before_it_propagates(sidecar, fake):
    fake_torch.leak_snapshot(fake)
    # No periodic push within the test: every push the sidecar counts is the OOM's.
    assert memprof_agent.start(interval=60, socket=sidecar.socket, record_history=True)
    assert fake.history == {"max_entries": 100000, "stacks": "python"}
    assert fake.observers, "observer attached at start: CUDA is up"

    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake.oom()  # the observer pushes, then the exception unwinds

    summary = agent().summary.oom
    assert summary["source"] == "history" and summary["requestedBytes"] == 2 * GiB
    assert summary["device"] == 0
    top = summary["blocks"][0]
    assert top["sizeBytes"] == 6 * GiB and top["state"] == "active_allocated"
    # torch's own frames are left out: the first frame names the leak.
    assert top["frames"][0] == {"filename": "train.py", "line": 42, "name": "leak"}
    assert len(summary["blocks"]) == 16 and all(len(b["frames"]) <= 8 for b in summary["blocks"])
    assert all(b["state"].startswith("active") for b in summary["blocks"])
    # The sidecar took exactly one push (the guard did not push the same OOM
    # again), and its report says what held the memory.
    report = sidecar.wait_report(lambda r: (r.get("allocator") or {}).get("oom"))
    oom = report["allocator"]["oom"]
    assert oom["source"] == "history" and oom["requestedBytes"] == 2 * GiB
    assert oom["blocks"][0] == {"sizeBytes": 6 * GiB, "frames": ["train.py:42 leak", "train.py:99 main"]}
    assert len(oom["blocks"]) == 8
    assert report["allocator"]["numOoms"] == 1
    assert sidecar.agent_pushes() == 1
    assert agent().transport.failures == 0


def test_without_the_observer_the_guard_pushes_with_the_message(fake, misbehaving):
    del sys.modules["torch._C"]._cuda_attach_out_of_memory_observer
    server = misbehaving("status:500")
    memprof_agent.start(interval=60, url=server.url)
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake.oom()
    oom = agent().summary.oom
    assert oom["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom["requestedBytes"] == 2 * GiB and oom["source"] == "segments"
    assert server.hits == 1


def test_an_uncaught_oom_and_the_standalone_report(sidecar, workdir):
    """A trainer process with the fake torch: an OOM nobody catches goes
    through sys.excepthook (ours, then the previous one: the traceback is
    still printed), one OOM push reaches the sidecar, and MEMPROF_AGENT_OUTPUT
    gets the report at exit."""
    out = workdir / "report.json"
    script = textwrap.dedent(
        """
        import sys
        sys.path[:0] = [%r, %r]
        import fake_torch
        fake = fake_torch.install()
        fake_torch.leak_snapshot(fake)
        del sys.modules["torch._C"]._cuda_attach_out_of_memory_observer
        import memprof_agent
        assert memprof_agent.start(interval=0.05)
        import time
        for n in range(10):
            memprof_agent.step(n)
            with memprof_agent.phase("forward"):
                time.sleep(0.02)
            memprof_agent.record("step-done", note=str(n))
        raise fake.oom()
        """
    ) % (str(HERE.parent), str(HERE))
    env = dict(os.environ, MEMPROF_AGENT_SOCKET=sidecar.socket, MEMPROF_AGENT_OUTPUT=str(out))
    before = sidecar.agent_pushes()
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "OutOfMemoryError: CUDA out of memory" in proc.stderr, proc.stderr
    report = json.loads(out.read_text())
    assert report["version"] == 1 and report["lastStep"] == 9
    assert report["oom"]["blocks"][0]["frames"][0]["name"] == "leak"
    dev = report["devices"][0]
    assert dev["peakAllocatedBytes"] == 5 * GiB and dev["phasePeaks"].get("forward", 0) in (0, 3 * GiB)
    assert [e["name"] for e in report["events"]].count("step-done") == 10
    assert report["stepsPerSecond"] is None or report["stepsPerSecond"] > 0
    assert wait_until(lambda: sidecar.agent_pushes() >= before + 2)


def test_disabled_by_the_environment(fake, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_DISABLE", "1")
    assert memprof_agent.start() is False
    assert not memprof_agent.running()


def test_import_needs_only_the_standard_library():
    # What site-packages' .pth files import at start-up is not ours: only
    # modules new after the import count.
    code = (
        "import sys; before = set(sys.modules); import memprof_agent; "
        "assert 'torch' not in sys.modules; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(HERE.parent)), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    names = eval(proc.stdout)
    assert all(n.startswith("memprof_agent") for n in names), names


def test_an_agent_only_sidecar_reports_risk_and_time_to_oom_from_pushes(workdir):
    """No GPU visible to the sidecar (no NVML here): the agent's numbers are
    the report's. Pushes are posted as the agent would over 200 s of a
    100 MB/s leak, with their own timestamps, so the test takes seconds."""
    from conftest import Sidecar

    s = Sidecar(workdir, extra_args=["--backend", "nvml"])
    try:
        t0 = 1.8e9
        for i in range(201):
            allocated = int(30e9 + 100e6 * i)
            reserved = allocated + 2 * 10**9
            push = {
                "version": 1, "time": t0 + i, "step": 2 * i,
                "devices": [{"index": 0, "uuid": "GPU-agent-only", "allocatedBytes": allocated,
                             "reservedBytes": reserved, "peakAllocatedBytes": allocated,
                             "freeBytes": 80 * 10**9 - reserved - 5 * 10**8, "totalBytes": 80 * 10**9}],
            }
            conn = memprof_agent._transport.UnixHTTPConnection(s.socket, 5)
            try:
                conn.request("POST", "/v1/agent", body=json.dumps(push).encode(),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                assert r.status == 200
            finally:
                conn.close()
        report = s.wait_report(lambda r: r["gpus"] and r["gpus"][0]["risk"] in ("high", "critical"))
        g = report["gpus"][0]
        assert report["summary"]["source"] == "agent" and g["source"] == "agent"
        assert g["uuid"] == "GPU-agent-only" and g["leakSuspected"]
        assert g["timeToOomSeconds"] > 0 and report["summary"]["timeToOom"]
        assert report["allocator"]["growth"] == "leak"
        assert abs(report["allocator"]["stepsPerSecond"] - 2.0) < 1e-6
    finally:
        s.stop()


def test_the_oom_snapshot_sums_the_blocks_of_one_allocation_site(fake, misbehaving):
    """A leak is thousands of small tensors from one line: no single block
    shows it, their sum does."""
    def frames(line, name):
        return [{"filename": "/site-packages/torch/_tensor.py", "line": 1, "name": "ones"},
                {"filename": "train.py", "line": line, "name": name}]

    fake.snapshot = {"segments": [{"device": 0, "blocks": (
        [{"size": 2 * GiB, "state": "active_allocated", "frames": frames(10, "load_weights")}]
        + [{"size": 20 << 20, "state": "active_allocated", "frames": frames(174, "main")} for _ in range(300)]
        + [{"size": 20 << 20, "state": "inactive", "frames": frames(174, "main")} for _ in range(50)]
    )}]}
    server = misbehaving("status:500")
    memprof_agent.start(interval=60, url=server.url)
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake.oom()
    blocks = agent().summary.oom["blocks"]
    assert blocks[0] == {"sizeBytes": 300 * (20 << 20), "count": 300, "state": "active_allocated",
                         "frames": [{"filename": "train.py", "line": 174, "name": "main"}]}
    assert blocks[1]["sizeBytes"] == 2 * GiB and "count" not in blocks[1]
    assert len(blocks) == 2
