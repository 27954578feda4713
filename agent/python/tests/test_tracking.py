"""Reference tracking: opt-in samples of the live objects
at step() boundaries; what grew between the last two, tensors by device,
dtype, shape and allocating site, Python objects by type; in the push and
on the terminal."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import HERE, closed_port, fake_torch as ft, memprof_agent
from memprof_agent import _tracking

KEPT = []  # what the "trainer" leaks


class Batch:
    pass


def leak(n, shape=(4, 1024), device=ft.CUDA0, dtype=ft.float32):
    for _ in range(n):
        KEPT.append(ft.Tensor(*shape, device=device, dtype=dtype))
        KEPT.append(Batch())


def setup_function():
    del KEPT[:]


def test_the_growing_tensors_and_objects_lead_and_nothing_else_grows(fake):
    memprof_agent.track(every=10)
    stable = [ft.Tensor(8, 8) for _ in range(50)]  # live but not growing
    for n in range(1, 31):
        memprof_agent.step(n)  # samples at calls 10, 20, 30
        leak(3)
    t = memprof_agent._tracking.TRACKER.result
    assert (t["fromStep"], t["toStep"]) == (20, 30)
    top = t["tensors"][0]
    assert top == {"device": "cuda:0", "dtype": "float32", "shape": [4, 1024], "site": None, "count": 30,
                   "bytes": 30 * 4 * 1024 * 4, "liveCount": 87, "liveBytes": 87 * 4 * 1024 * 4}
    assert len(t["tensors"]) == 1  # the 50 stable tensors did not grow
    objects = {o["type"]: o["count"] for o in t["objects"]}
    assert objects["test_tracking.Batch"] == 30 and objects["fake_torch.Tensor"] == 30
    # The tracker's own state (its samples, the previous comparison) is not growth.
    assert "memprof_agent._tracking.Sample" not in objects and objects.get("dict", 0) < 5
    assert t["siteSource"] == "none" and t["liveTensors"] >= 110 and t["scannedObjects"] > 1000
    del stable


def test_a_view_is_counted_but_its_memory_once(fake):
    memprof_agent.track(every=1)
    memprof_agent.step()
    w = ft.Tensor(256, 256)
    KEPT.extend([w, w.view_as_same()])
    memprof_agent.step()
    top = memprof_agent._tracking.TRACKER.result["tensors"][0]
    assert top["count"] == 2 and top["bytes"] == 256 * 256 * 4


def test_sites_come_from_the_allocators_history(fake):
    leak(1)
    memprof_agent.track(every=1, sites=True)
    memprof_agent.step()
    t = ft.Tensor(2, 512)
    other = ft.Tensor(3, 3)
    KEPT.extend([t, other])
    frames = [{"filename": "/site-packages/torch/_tensor.py", "line": 1, "name": "zeros"},
              {"filename": "train.py", "line": 174, "name": "collect"}]
    fake.snapshot = {"segments": [{"device": 0, "blocks": [
        {"address": t.data_ptr() - 64, "size": 64 + 2 * 512 * 4, "state": "active_allocated", "frames": frames},
        {"address": other.data_ptr(), "size": 64, "state": "active_allocated", "frames": []},
    ]}]}
    memprof_agent.step()
    r = memprof_agent._tracking.TRACKER.result
    sites = {tuple(g["shape"]): g["site"] for g in r["tensors"]}
    assert sites == {(2, 512): "train.py:174 collect", (3, 3): None} and r["siteSource"] == "history"
    report = memprof_agent.tracking_report()
    assert "train.py:174 collect" in report and "from the allocator's history" in report


def test_sites_are_looked_up_only_when_history_is_recorded(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    memprof_agent.track(every=1)
    fake.calls.clear()
    memprof_agent.step()
    assert "_snapshot" not in fake.calls
    memprof_agent._agent.history.on = True
    memprof_agent.step()
    assert "_snapshot" in fake.calls


def test_the_push_and_the_report(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    assert "tracking" not in memprof_agent._agent.build("sample")
    assert "1 sample" in memprof_agent.tracking_report() or "0 sample" in memprof_agent.tracking_report()
    memprof_agent.track(every=1)
    memprof_agent.step()
    for i in range(40):  # 40 shapes growing: the push keeps the top 32
        KEPT.extend(ft.Tensor(i + 1, 7) for _ in range(2))
    memprof_agent.step()
    push = memprof_agent._agent.build("sample")
    t = json.loads(memprof_agent._transport.encode(push, memprof_agent._transport.SAMPLE_CAP))["tracking"]
    assert len(t["tensors"]) == 32 and len(t["objects"]) <= 32
    assert t["tensors"][0]["shape"] == [40, 7] and t["tensors"][0]["count"] == 2  # largest growth first
    text = memprof_agent.tracking_report()
    assert "what grew from step 1 to step 2" in text and "40x7" in text
    assert "allocating site unknown: allocation history recording is off" in text
    memprof_agent.track(False)
    assert "tracking" not in memprof_agent._agent.build("sample")


def test_groups_are_bounded(fake, monkeypatch):
    monkeypatch.setattr(_tracking, "MAX_GROUPS", 10)
    s0 = _tracking.take(sys.modules["torch"])
    KEPT.extend(ft.Tensor(i + 1, 3) for i in range(50))
    s1 = _tracking.take(sys.modules["torch"])
    assert len(s1.counts) <= 11
    r = _tracking.compare(s0, s1)
    assert any(g["shape"] is None for g in r["tensors"])


def test_tracking_sample_and_off_by_default(fake):
    fake.calls.clear()
    for n in range(300):
        memprof_agent.step(n)
    assert not memprof_agent._tracking.TRACKER.samples and fake.calls == []
    assert memprof_agent.tracking_sample() is None
    leak(2)
    r = memprof_agent.tracking_sample()
    assert r["tensors"][0]["count"] == 2 and r["toStep"] == 299


def test_the_environment_turns_it_on_and_the_report_prints_at_exit(workdir):
    script = textwrap.dedent(
        """
        import sys
        sys.path[:0] = [%r, %r]
        import fake_torch
        fake = fake_torch.install()
        import memprof_agent
        memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent")
        kept = []
        for n in range(1, 7):
            memprof_agent.step(n)
            kept.append(fake_torch.Tensor(16, 16))
        """
    ) % (str(HERE.parent), str(HERE), closed_port())
    env = dict(os.environ, MEMPROF_AGENT_TRACKING="1", MEMPROF_AGENT_TRACKING_EVERY="2")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "what grew from step 4 to step 6" in proc.stderr and "16x16" in proc.stderr, proc.stderr


def test_garbage_in_reference_cycles_is_not_growth(fake):
    import gc

    memprof_agent.track(every=1)
    gc.disable()  # the collector would otherwise run at its own time: only the sample's collect() may free them
    try:
        memprof_agent.step()
        for _ in range(20):
            b = Batch()
            b.me, b.t = b, ft.Tensor(5, 5)  # unreachable after the loop, but only a collection frees a cycle
        del b
        memprof_agent.step()
    finally:
        gc.enable()
    r = memprof_agent._tracking.TRACKER.result
    assert not any(g["shape"] == [5, 5] for g in r["tensors"])
    assert not any(o["type"] == "test_tracking.Batch" for o in r["objects"])
