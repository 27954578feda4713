"""The event timeline (seed 002): record() with allocated,
reserved, max allocated, max reserved and elapsed; record_detailed();
per-stage deltas; the console table, the JSON export keyed by event, the
log file, the table at exit."""

import json
import os
import re
import subprocess
import sys
import textwrap

from conftest import HERE, closed_port, fake_torch as ft, memprof_agent

GiB = 1 << 30
MiB = 1 << 20


def at(fake, allocated):
    """The allocator with `allocated` bytes live and its peak there."""
    fake.allocated = fake.peak_allocated = allocated


def test_record_gives_allocated_reserved_maxima_elapsed_and_deltas(fake):
    at(fake, 1 * GiB)
    start = memprof_agent.record("start")
    fake.alloc(2 * GiB)
    model = memprof_agent.record("model loaded", note="7B")
    memprof_agent.step(10)
    fake.alloc(1 * GiB)
    ep = memprof_agent.record("epoch 1", since="start")
    assert (start["allocatedBytes"], start["reservedBytes"], start["maxAllocatedBytes"], start["maxReservedBytes"]) == (
        1 * GiB, 4 * GiB, 1 * GiB, 4 * GiB)
    assert model["allocatedBytes"] == 3 * GiB and model["maxAllocatedBytes"] == 3 * GiB and model["note"] == "7B"
    assert 0 <= start["elapsed"] <= model["elapsed"] <= ep["elapsed"] < 600
    assert model["deltaPrevious"]["event"] == "start" and model["deltaPrevious"]["allocatedBytes"] == 2 * GiB
    assert ep["step"] == 10 and ep["deltaPrevious"]["allocatedBytes"] == GiB
    assert ep["deltaSince"]["event"] == "start" and ep["deltaSince"]["allocatedBytes"] == 3 * GiB
    assert ep["deltaSince"]["seconds"] == round(ep["elapsed"] - start["elapsed"], 6)
    missing = memprof_agent.record("x", since="never recorded")
    assert missing["deltaSince"] == {"event": "never recorded", "missing": True}


def test_since_compares_with_the_latest_event_of_that_name(fake):
    at(fake, 1 * GiB)
    memprof_agent.record("checkpoint", note="step=100")
    fake.alloc(GiB)
    memprof_agent.record("checkpoint", note="step=200")
    fake.alloc(512 * MiB)
    r = memprof_agent.record("checkpoint", note="step=300", since="checkpoint")
    assert r["deltaSince"]["allocatedBytes"] == 512 * MiB


def test_the_maximum_is_since_the_start_even_after_pushes_reset_the_peak(fake):
    at(fake, 1 * GiB)
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    memprof_agent.record("before")
    fake.alloc(6 * GiB)
    fake.free(6 * GiB)  # a 7 GiB spike between two records
    memprof_agent._agent.tick()  # a push reads the peak and resets it
    assert fake.peak_allocated == 1 * GiB
    after = memprof_agent.record("after")
    assert after["allocatedBytes"] == 1 * GiB and after["maxAllocatedBytes"] == 7 * GiB
    # A peak a measurement handed to the next push (tr.PEAKS) counts too.
    memprof_agent._torchread.PEAKS.carry(0, 9 * GiB, 4 * GiB)
    assert memprof_agent.record("carried")["maxAllocatedBytes"] == 9 * GiB


def test_the_push_event_carries_the_new_fields(fake):
    at(fake, 2 * GiB)
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    memprof_agent.step(4)
    model = ft.Linear(8, 4)
    model.bias.requires_grad = False
    memprof_agent.record_detailed("loaded", note="n", tensors={"x": ft.Tensor(2, 8), "skip": "not a tensor"}, model=model)
    e = memprof_agent._agent.build("sample")["events"][0]
    assert e["allocatedBytes"] == 2 * GiB and e["maxAllocatedBytes"] == 2 * GiB and e["maxReservedBytes"] == 4 * GiB
    assert e["step"] == 4 and e["elapsed"] >= 0
    assert e["detail"] == {"tensors": 1, "tensorBytes": 2 * 8 * 4, "parameters": 36, "trainableParameters": 32}


def test_record_detailed_lists_tensors_and_counts_parameters(fake):
    model = ft.Sequential([ft.Linear(16, 16), ft.LayerNorm(16)])
    model._modules["0"].weight.requires_grad = False
    tensors = {"input": ft.Tensor(4, 16, dtype=ft.bfloat16), "mask": ft.Tensor(4, dtype=ft.int8, device=ft.CPU)}
    r = memprof_agent.record_detailed("step", tensors=tensors, model=model)
    assert r["tensors"] == [
        {"name": "input", "shape": [4, 16], "dtype": "bfloat16", "device": "cuda:0", "bytes": 4 * 16 * 2},
        {"name": "mask", "shape": [4], "dtype": "int8", "device": "cpu", "bytes": 4},
    ]
    assert r["model"] == {"parameters": 256 + 16 + 32, "trainableParameters": 16 + 32, "parametersBytes": (256 + 16 + 32) * 4}
    # seed 002's form: a dict of counts, and a list of tensors
    r = memprof_agent.record_detailed("lora", tensors=[ft.Tensor(8, 64)] * 70, model={"total_params": 1000, "trainable_params": 10})
    assert r["model"] == {"parameters": 1000, "trainableParameters": 10}
    assert len(r["tensors"]) == 64 and r["tensorsLeftOut"] == 6 and r["tensors"][0]["name"] == "0"


def test_without_cuda_nothing_is_read_and_nothing_raises(fake):
    fake.initialized = False
    r = memprof_agent.record("early")
    assert "allocatedBytes" not in r and "maxAllocatedBytes" not in r and r["elapsed"] >= 0
    assert not {"memory_stats", "_cuda_memoryStats"} & set(fake.calls)
    fake.initialized = True
    fake.raise_in_stats = RuntimeError("CUDA error")
    assert memprof_agent.record("broken") is None  # the caller never sees the error
    assert memprof_agent.record_detailed("odd", tensors=object(), model=object()) is None
    fake.raise_in_stats = None
    fake.calls.clear()
    memprof_agent.record("no memory", memory=False)
    assert fake.calls == []


def test_print_timeline_and_export_keyed_by_event(fake, tmp_path, capsys):
    at(fake, 1 * GiB)
    memprof_agent.record("start")
    for epoch in range(2):
        fake.alloc(GiB)
        memprof_agent.record("epoch", note="e%d" % epoch, since="start")
    memprof_agent.record_detailed("batch", tensors={"x": ft.Tensor(4, 16)})
    text = memprof_agent.print_timeline()
    assert capsys.readouterr().out.strip() == text.strip()
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["elapsed", "event", "step"]
    epoch_rows = [line for line in lines if re.search(r"s  epoch ", line)]
    assert len(epoch_rows) == 2 and "2048.0 MiB" in epoch_rows[0] and "+1024.0 MiB" in epoch_rows[0]
    assert "vs start: +2048.0 MiB" in epoch_rows[1] and "e1" in epoch_rows[1]
    assert any("x 4x16 float32 cuda:0" in line for line in lines)
    assert "4 events" in lines[-1] and "largest increase +1024.0 MiB at epoch (after start)" in lines[-1]

    path = memprof_agent.export_timeline(str(tmp_path / "t.json"))
    doc = json.loads(open(path).read())
    assert list(doc["events"]) == ["start", "epoch", "batch"]
    assert [e["note"] for e in doc["events"]["epoch"]] == ["e0", "e1"]
    first = doc["events"]["epoch"][0]
    assert first["allocatedBytes"] == 2 * GiB and first["maxAllocatedBytes"] == 2 * GiB and "timestamp" in first
    assert doc["summary"]["events"] == 4 and doc["summary"]["maxAllocatedBytes"] == 3 * GiB
    assert memprof_agent.export_timeline(str(tmp_path / "missing-dir" / "t.json")) is None


def test_the_log_file_is_timestamped_and_has_a_line_per_event(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPROF_AGENT_LOG_DIR", str(tmp_path / "logs"))
    at(fake, 1 * GiB)
    memprof_agent.record("start")
    fake.alloc(GiB)
    memprof_agent.record_detailed("model", note="loaded 'ok'", model={"total_params": 5, "trainable_params": 2}, since="start")
    files = os.listdir(tmp_path / "logs")
    assert len(files) == 1 and re.fullmatch(r"memprof-timeline-\d{8}-\d{6}-pid%d\.log" % os.getpid(), files[0])
    lines = (tmp_path / "logs" / files[0]).read_text().splitlines()
    assert len(lines) == 3 and "started" in lines[0]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \| event=start \| allocated=1024.0MiB \| reserved=4096.0MiB"
                    r" \| maxAllocated=1024.0MiB \| maxReserved=4096.0MiB \| elapsed=\d+\.\d\ds", lines[1]), lines[1]
    assert "event=model" in lines[2] and "dAllocated=+1024.0MiB(vs start)" in lines[2] and "dSince=+1024.0MiB(vs start)" in lines[2]
    assert "parameters=5 trainable=2" in lines[2] and 'note="loaded \'ok\'"' in lines[2]


def test_the_timeline_is_printed_at_exit_when_asked(workdir):
    script = textwrap.dedent(
        """
        import sys
        sys.path[:0] = [%r, %r]
        import fake_torch
        fake = fake_torch.install()
        import memprof_agent
        memprof_agent.record("start")
        fake.alloc(1 << 30)
        memprof_agent.record("loaded", note="done")
        """
    ) % (str(HERE.parent), str(HERE))
    env = dict(os.environ, MEMPROF_AGENT_TIMELINE="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "memprof timeline" in proc.stderr and " loaded " in proc.stderr and "2 events" in proc.stderr
    env.pop("MEMPROF_AGENT_TIMELINE")
    quiet = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and "memprof timeline" not in quiet.stderr
