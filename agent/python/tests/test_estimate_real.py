"""`python -m memprof_agent.estimate` on real PyTorch (CPU only, fake
tensors): skipped where torch, or its MemTracker (torch >= 2.5), is not
installed, as in CI. The numbers that can be known exactly are checked
exactly: a Linear's parameters and AdamW's two moments."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._tools.mem_tracker")

AGENT = str(Path(__file__).resolve().parents[1])

TRAIN = """
import os, torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
{setup}
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
for step in range(10):
    x = torch.randn(int(os.environ.get("BATCH", 8)), 256, device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    if torch.isnan(loss):
        raise SystemExit("nan")
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(step, loss.item(), torch.cuda.max_memory_allocated())
{tail}
"""


def estimate(tmp_path, *flags, setup="", tail="", env=None):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(setup=textwrap.dedent(setup), tail=tail))
    cmd = [sys.executable, "-m", "memprof_agent.estimate", *flags, "--", "python", str(script)]
    e = {**os.environ, "PYTHONPATH": AGENT, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)
    return r.returncode, json.loads(r.stdout), r.stderr


def test_parameters_and_adam_state_are_exact(tmp_path):
    code, answer, err = estimate(tmp_path)
    assert code == 0, err
    rank = answer["rank"]
    params = 2 * (256 * 256 * 4 + 256 * 4)  # two Linear(256, 256), fp32, 512 B multiples
    assert rank["parametersBytes"] == params
    assert rank["optimizerBytes"] >= 2 * params  # exp_avg, exp_avg_sq (+ step scalars)
    assert rank["stepsRun"] == 2
    assert answer["tracker"] == "MemTracker"
    assert rank["allocatedPeakBytes"] >= rank["trackedPeakBytes"]
    assert rank["reservedPeakBytes"] >= rank["allocatedPeakBytes"]


def test_frozen_parameters_run_and_get_no_optimizer_state(tmp_path):
    # MemTracker counts the step's own temporaries as optimizer memory too,
    # so the check is relative: the frozen layer has no moments (2 x its size).
    code, plain, err = estimate(tmp_path)
    code, frozen, err = estimate(tmp_path, setup="model[0].requires_grad_(False)")
    assert code == 0, err
    one = 256 * 256 * 4 + 256 * 4
    assert 2 * one <= frozen["rank"]["optimizerBytes"] <= plain["rank"]["optimizerBytes"] - 2 * one


def test_ddp_adds_its_gradient_buckets(tmp_path):
    setup = """
    torch.distributed.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    """
    code, plain, err = estimate(tmp_path)
    code, ddp, err = estimate(tmp_path, "--world-size", "2", setup=setup)
    assert code == 0, err
    params = 2 * (256 * 256 * 4 + 256 * 4)
    assert ddp["rank"]["trackedPeakBytes"] - plain["rank"]["trackedPeakBytes"] >= params
    assert ddp["worldSize"] == 2


def test_a_script_error_names_the_line(tmp_path):
    code, answer, err = estimate(tmp_path, setup="raise ValueError('bad config')")
    assert code == 3
    assert answer["rank"]["error"] == "ValueError: bad config"
    assert answer["rank"]["at"].endswith("train.py:5")


def test_vary_bisects_real_fake_runs(tmp_path):
    code, answer, err = estimate(tmp_path, "--budget-bytes", str(64 << 20),
                                 "--vary", "BATCH=8,1024,65536,1048576")
    assert code == 0, err
    assert answer["vary"]["largest"] in ("1024", "65536")
    assert all("reservedPeakBytes" in t for t in answer["vary"]["tried"])


def test_the_fallback_tracker_finds_the_same_peaks(tmp_path):
    code, tracked, err = estimate(tmp_path)
    code, fallback, err = estimate(tmp_path, env={"MEMPROF_ESTIMATE_TRACKER": "dispatch"})
    assert code == 0, err
    assert fallback["tracker"] == "dispatch"
    assert fallback["rank"]["otherBytes"] == fallback["rank"]["trackedPeakBytes"] > 0
    for key in ("allocatedPeakBytes", "reservedPeakBytes"):
        assert abs(fallback["rank"][key] - tracked["rank"][key]) <= 0.02 * tracked["rank"][key], key


FSDP2 = """
import os, torch
from torch.distributed.fsdp import fully_shard
torch.distributed.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = torch.distributed.init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to("cuda")
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_fsdp2_ranks_hold_their_shard(tmp_path):
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2's torch.distributed.fsdp.fully_shard needs torch >= 2.6")
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP2)
    e = {**os.environ, "PYTHONPATH": AGENT, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "memprof_agent.estimate", "--world-size", "2", "--", str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    rank = json.loads(r.stdout)["rank"]
    full = 4 * (1024 * 1024 * 4 + 1024 * 4)
    assert rank["parametersBytes"] == full // 2
    assert rank["gradientsBytes"] == full // 2
