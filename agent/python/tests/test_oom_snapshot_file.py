"""MEMPROF_AGENT_OOM_SNAPSHOT: on a CUDA OOM the agent writes the
allocator's own snapshot (torch.cuda.memory._snapshot(), pickled as
_dump_snapshot does) to a file, filled in from a template, at most one per
process and MAX_BYTES, never failing the trainer (each trouble said once).
The fake torch's snapshot stands for the allocator's; bench/gpu/
oom_snapshot_check.py loads a real one with PyTorch's memory_viz."""

import logging
import os
import pickle

import pytest

from conftest import fake_torch, memprof_agent
from memprof_agent import _snapfile

GiB = 1 << 30


@pytest.fixture(autouse=True)
def fresh():
    """Each test its own process as far as the bound is concerned."""
    _snapfile._written.clear()
    _snapfile._say.clear()
    yield
    _snapfile._written.clear()


def oom_under_guard(fake):
    with pytest.raises(fake_torch.OutOfMemoryError):
        with memprof_agent.oom_guard():
            raise fake.oom()


def test_the_template_is_filled_in():
    assert _snapfile.path_for("/d/{host}-r{rank}-{pid}-gpu{device}.pickle", 42, 3, 1, host="n1") == "/d/n1-r3-42-gpu1.pickle"
    assert _snapfile.path_for("{pid}-{rank}-{device}.pickle", 7, host="h") == "7-na-na.pickle"


def test_an_oom_writes_the_allocators_snapshot_once_per_process(fake, misbehaving, workdir, monkeypatch, caplog):
    fake_torch.leak_snapshot(fake)
    monkeypatch.setenv("MEMPROF_AGENT_OOM_SNAPSHOT", str(workdir / "snaps" / "oom-{pid}-gpu{device}.pickle"))
    server = misbehaving("status:500")
    memprof_agent.start(interval=60, url=server.url)
    with caplog.at_level(logging.WARNING, logger="memprof_agent"):
        oom_under_guard(fake)
    path = workdir / "snaps" / ("oom-%d-gpu0.pickle" % os.getpid())
    with open(path, "rb") as f:
        assert pickle.load(f) == fake.snapshot, "the allocator's snapshot, whole"
    assert "_snapshot" in fake.calls
    assert any(str(path) in r.getMessage() and "memory_viz" in r.getMessage() for r in caplog.records)
    assert os.listdir(workdir / "snaps") == [path.name], "no temporary file left"
    # A second OOM (a trainer that retries) writes nothing more.
    memprof_agent._agent.last_oom_push = None
    oom_under_guard(fake)
    assert os.listdir(workdir / "snaps") == [path.name]
    assert len(_snapfile._written) == _snapfile.MAX_FILES == 1


def test_without_the_variable_nothing_is_written_or_taken_for_it(fake, misbehaving, workdir, monkeypatch):
    monkeypatch.delenv("MEMPROF_AGENT_OOM_SNAPSHOT", raising=False)
    memprof_agent.start(interval=60, url=misbehaving("status:500").url)
    oom_under_guard(fake)
    assert _snapfile._written == []


def test_past_the_bound_the_traces_go_then_the_file(monkeypatch):
    snap = {"segments": [{"blocks": [{"size": 1}]}], "device_traces": [[{"action": "alloc", "frames": ["x" * 5000]}] * 50]}
    small = len(pickle.dumps({"segments": snap["segments"], "device_traces": [[]]}))
    data, dropped = _snapfile.encoded(snap, max_bytes=small + 10)
    assert dropped and pickle.loads(data) == {"segments": snap["segments"], "device_traces": [[]]}
    assert _snapfile.encoded(snap, max_bytes=small - 1) == (None, True)
    data, dropped = _snapfile.encoded(snap, max_bytes=10 ** 9)
    assert not dropped and pickle.loads(data) == snap


def test_a_file_that_cannot_be_written_never_fails_the_trainer_and_is_said_once(fake, misbehaving, workdir, monkeypatch, caplog):
    blocker = workdir / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MEMPROF_AGENT_OOM_SNAPSHOT", str(blocker / "oom.pickle"))
    memprof_agent.start(interval=60, url=misbehaving("status:500").url)
    with caplog.at_level(logging.WARNING, logger="memprof_agent"):
        oom_under_guard(fake)  # the OOM itself propagates, nothing else
        memprof_agent._agent.last_oom_push = None
        oom_under_guard(fake)
    said = [r.getMessage() for r in caplog.records if "cannot write the OOM snapshot" in r.getMessage()]
    assert len(said) == 1 and "training goes on" in said[0]
    assert _snapfile._written == []


def test_a_snapshot_torch_cannot_take_is_said_and_nothing_raised(workdir):
    class Broken:
        class cuda:
            class memory:
                @staticmethod
                def _snapshot():
                    raise RuntimeError("no CUDA")

    env = {"MEMPROF_AGENT_OOM_SNAPSHOT": str(workdir / "x.pickle")}
    assert _snapfile.write(Broken, 1, env=env) is None
    assert not (workdir / "x.pickle").exists()
