"""Checkpoint events are never bounded away; allocation history turns on at
high and a snapshot of allocation sites goes out at critical; an OOM push
carries the allocator's state from before the exception unwound (preOom)."""

import json
import time

import pytest

from conftest import fake_torch, memprof_agent, wait_until

GiB = 1 << 30
_core = memprof_agent._core
_history = memprof_agent._history


def agent():
    return memprof_agent._agent


# --- checkpoint events -------------------------------------------------

def test_a_checkpoint_is_never_crowded_out_by_other_events(fake, misbehaving):
    server = misbehaving("status:500")
    memprof_agent.start(interval=60, url=server.url)
    for i in range(20):
        memprof_agent.record("noise", note=str(i))
    memprof_agent.record("checkpoint", note="step=1200")
    for i in range(100):
        memprof_agent.record("noise", note=str(i))
    push = agent().build("sample")
    names = [e["name"] for e in push["events"]]
    assert names.count("checkpoint") == 1 and len(names) == _core.MAX_EVENTS_PER_PUSH
    cp = next(e for e in push["events"] if e["name"] == "checkpoint")
    assert cp["note"] == "step=1200"
    # 120 others: the queue kept the newest 32, 31 went with the checkpoint,
    # 1 waits for the next push, 88 were dropped (and counted).
    assert push["droppedEvents"] == 88
    nxt = agent().build("sample")
    # (the checkpoint again: no push carrying it was accepted yet)
    assert [e["note"] for e in nxt["events"]] == ["step=1200", "99"] and "droppedEvents" not in nxt


def test_checkpoints_are_sent_again_until_a_push_is_accepted(fake, unix_sidecar):
    server = unix_sidecar()
    refuse = {"n": 3}

    def answer(push):
        if refuse["n"] > 0:
            refuse["n"] -= 1
            return 503, None
        return 204, None

    server.answer = answer
    memprof_agent.record("checkpoint", note="step=10")
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: len(server.pushes) >= 6)
    carried = [p for p in server.pushes if any(e["name"] == "checkpoint" for e in p["events"])]
    assert len(carried) == 4, "three refused pushes carried it, then the accepted one"
    assert not _core.MARKERS.checkpoints


def test_the_size_cap_sheds_other_events_before_a_checkpoint():
    push = {"version": 1, "time": 1.0, "devices": [], "events": [{"t": 1.0, "name": "n", "note": "x" * 256} for _ in range(31)]}
    push["events"].insert(7, {"t": 1.0, "name": "checkpoint", "note": "step=5"})
    body = json.loads(memprof_agent._transport.encode(push, 2048))
    assert body["events"] == [{"t": 1.0, "name": "checkpoint", "note": "step=5"}]
    assert body["droppedEvents"] == 31


def test_more_checkpoints_than_the_queue_keeps_the_newest_and_counts_the_rest(fake, misbehaving):
    memprof_agent.start(interval=60, url=misbehaving("status:500").url)
    for i in range(20):
        memprof_agent.record("checkpoint", note="step=%d" % i)
    push = agent().build("sample")
    notes = [e["note"] for e in push["events"]]
    assert notes == ["step=%d" % i for i in range(4, 20)] and push["droppedEvents"] == 4


# --- allocation history at high, sites at critical ---------------------

def sites_snapshot(fake):
    """Live blocks: 3 GiB of weights allocated before recording (no
    frames), and what the run allocates since, with frames."""
    def frames(line, name):
        return [{"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"},
                {"filename": "train.py", "line": line, "name": name}]

    fake.snapshot = {"segments": [{"device": 0, "blocks": (
        [{"size": GiB, "state": "active_allocated", "frames": []} for _ in range(3)]
        + [{"size": 64 << 20, "state": "active_allocated", "frames": frames(88, "keep_val_loss")} for _ in range(40)]
        + [{"size": 256 << 20, "state": "active_allocated", "frames": frames(51, "forward")}]
        + [{"size": 512 << 20, "state": "inactive", "frames": frames(51, "forward")}]
        + [{"size": 1 << 20, "state": "active_allocated", "frames": frames(1000 + i, "small")} for i in range(30)]
    )}]}


def test_history_turns_on_at_high_not_before_and_sites_go_out_at_critical(fake, unix_sidecar, workdir):
    sites_snapshot(fake)
    server = unix_sidecar()
    out = workdir / "report.json"
    memprof_agent.start(interval=0.02, socket=server.path, output=str(out))
    server.verdict("medium")
    server.wait_pushes(len(server.pushes) + 3)
    assert fake.history is None, "no recording below high"
    server.verdict("high", tto=400.0)
    assert wait_until(lambda: fake.history is not None)
    assert fake.history == {"max_entries": _history.DEFAULT_ENTRIES_AT_HIGH, "stacks": "python"}
    server.verdict("critical", tto=100.0)
    assert wait_until(lambda: any("sites" in p for p in server.pushes))
    with_sites = [p for p in server.pushes if "sites" in p]
    server.wait_pushes(len(server.pushes) + 3)
    assert len([p for p in server.pushes if "sites" in p]) == 1, "once per escalation"
    sites = with_sites[0]["sites"]
    assert sites["level"] == "critical" and sites["source"] == "history"
    assert sites["blocks"][0] == {"sizeBytes": 40 * (64 << 20), "count": 40, "state": "active_allocated",
                                  "frames": [{"filename": "train.py", "line": 88, "name": "keep_val_loss"}]}
    assert sites["blocks"][1]["frames"][0]["line"] == 51 and sites["blocks"][1]["sizeBytes"] == 256 << 20
    assert len(sites["blocks"]) == _history.MAX_SITES
    assert sites["unattributedBytes"] == 3 * GiB
    assert sites["history"] == {"on": True, "entries": _history.DEFAULT_ENTRIES_AT_HIGH, "why": "risk high (sidecar)"}
    assert memprof_agent.report()["sites"]["blocks"] == sites["blocks"], "the standalone report keeps them too"


def test_the_answers_history_flag_turns_recording_on(fake, unix_sidecar):
    server = unix_sidecar()
    server.verdict("low", history=True)
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: fake.history is not None)


def test_history_at_high_can_be_turned_off(fake, unix_sidecar, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_HISTORY_AT_HIGH", "0")
    server = unix_sidecar()
    server.verdict("critical")
    memprof_agent.start(interval=0.02, socket=server.path)
    server.wait_pushes(5)
    assert fake.history is None


def test_sites_wait_for_frames_when_recording_just_started(fake, unix_sidecar):
    """Straight to critical: recording starts now (the high callback runs
    first and turns it on), and the snapshot is taken two intervals (at
    least 1 s) later, when what the run allocates since carries frames."""
    sites_snapshot(fake)
    server = unix_sidecar()
    server.verdict("critical")
    memprof_agent.start(interval=0.3, socket=server.path)
    assert wait_until(lambda: fake.history is not None, timeout=3)
    on_at = time.time()
    # Not by counting _snapshot calls: the size histogram takes its own.
    assert agent().summary.sites is None and not any("sites" in p for p in server.pushes)
    assert wait_until(lambda: any("sites" in p for p in server.pushes), timeout=5)
    first = next(p for p in server.pushes if "sites" in p)
    assert first["time"] - on_at >= max(2 * 0.3, 1.0) - 0.1, "taken before recording had run for two intervals"
    assert memprof_agent.report()["sites"]["source"] == "history"


def test_sites_go_out_at_once_when_recording_ran_long_enough(fake, unix_sidecar):
    sites_snapshot(fake)
    server = unix_sidecar()
    memprof_agent.start(interval=0.05, socket=server.path, record_history=True)
    assert wait_until(lambda: agent().history.on)
    agent().history.since -= 10.0  # as if recording had run for 10 s
    server.verdict("critical")
    at = time.time()
    assert wait_until(lambda: any("sites" in p for p in server.pushes), timeout=5)
    first = next(p for p in server.pushes if "sites" in p)
    assert first["time"] - at < 0.5, "no wait: frames were there already"


# --- preOom: the state before the exception unwound ----------------------

def test_the_oom_push_carries_what_the_observer_read_before_the_unwinding(fake, unix_sidecar):
    server = unix_sidecar()
    memprof_agent.start(interval=60, socket=server.path)
    fake.allocated, fake.reserved = 70 * GiB, 76 * GiB
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            err = fake.oom()          # the observer runs here, before the exception exists
            fake.free(69 * GiB)      # what unwinding the failing step frees
            raise err
    (p,) = [p for p in server.pushes if p["kind"] == "oom"]
    assert p["preOom"]["source"] == "observer"
    assert p["preOom"]["devices"][0]["allocatedBytes"] == 70 * GiB
    assert p["devices"][0]["allocatedBytes"] == 70 * GiB


def test_without_the_observer_the_oom_push_takes_the_peaks_not_the_freed_state(fake, unix_sidecar):
    del fake_torch.sys.modules["torch._C"]._cuda_attach_out_of_memory_observer
    server = unix_sidecar()
    memprof_agent.start(interval=60, socket=server.path)
    fake.alloc(67 * GiB)                       # the leak: 70 GiB allocated
    fake.reserved = fake.peak_reserved = 76 * GiB
    fake.free(69 * GiB)                        # the exception unwound: 1 GiB left
    fake.reserved = 8 * GiB                    # and the allocator released its cache
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake_torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    (p,) = [p for p in server.pushes if p["kind"] == "oom"]
    pre = p["preOom"]
    assert pre["source"] == "peaks"
    d = pre["devices"][0]
    assert d["allocatedBytes"] == 70 * GiB and d["uuid"].startswith("GPU-370fbfe4")
    assert p["devices"][0]["allocatedBytes"] == 70 * GiB, "no post-exception numbers in an OOM push"
    assert "activeBytes" not in p["devices"][0] and "freeBytes" not in p["devices"][0]


def test_a_periodic_push_between_the_oom_and_the_guard_does_not_hide_the_peak(fake, unix_sidecar):
    del fake_torch.sys.modules["torch._C"]._cuda_attach_out_of_memory_observer
    server = unix_sidecar()
    memprof_agent.start(interval=60, socket=server.path)
    fake.alloc(67 * GiB)
    fake.reserved = fake.peak_reserved = 76 * GiB
    fake.free(69 * GiB)
    fake.reserved = 8 * GiB
    agent().tick()                             # reads the 70 GiB peak, then resets it
    assert fake.peak_allocated == GiB
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake_torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    (p,) = [p for p in server.pushes if p["kind"] == "oom"]
    d = p["preOom"]["devices"][0]
    assert (d["allocatedBytes"], d["reservedBytes"]) == (70 * GiB, 76 * GiB)
