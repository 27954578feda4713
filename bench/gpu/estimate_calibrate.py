"""Calibrates `memprof estimate` on a real GPU, in one run (about 3 min):

1. the constants: the cuBLAS workspace the allocator holds after the first
   matrix products, and, after each real run below, the device memory used
   outside the allocator (CUDA context, cuBLAS handles, loaded kernels);
2. NCCL: with 2 GPUs, the same LM under DDP over NCCL; its memory outside
   the allocator minus the single-GPU run's is NCCL's buffers;
3. the points: each configuration of estimate_workloads.py runs for real
   (peak allocated/reserved) and under `python -m memprof_agent.estimate`
   with no GPU visible (CUDA_VISIBLE_DEVICES=""), side by side.

Points in CALIBRATION set the constants (the context from the single-GPU
ones, NCCL from the DDP one); HELD_OUT points set nothing and give the
error docs/estimate.md publishes.

    python3 bench/gpu/estimate_calibrate.py --out DIR   # DIR/calibration.json, DIR/*.log
    python3 bench/gpu/estimate_calibrate.py --out DIR --ranks-only   # held out: DIR/ranks-points.json
"""

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOADS = os.path.join(HERE, "estimate_workloads.py")
AGENT = os.path.join(ROOT, "agent", "python")

CALIBRATION = [
    ("lm-d1024-L8-b4-s1024", {"WORKLOAD": "lm", "BATCH": "4", "SEQ": "1024"}),
    ("cnn-b64", {"WORKLOAD": "cnn", "BATCH": "64"}),
]
HELD_OUT = [
    ("lm-d1024-L8-b8-s1024", {"WORKLOAD": "lm", "BATCH": "8", "SEQ": "1024"}),
    ("lm-d1024-L8-b16-s2048", {"WORKLOAD": "lm", "BATCH": "16", "SEQ": "2048"}),
    ("lm-d2048-L16-b4-s2048", {"WORKLOAD": "lm", "DIM": "2048", "LAYERS": "16", "BATCH": "4", "SEQ": "2048"}),
    ("lora-d2048-L16-b8-s1024", {"WORKLOAD": "lora", "DIM": "2048", "LAYERS": "16", "BATCH": "8", "SEQ": "1024"}),
    ("lora-d2048-L16-b16-s2048", {"WORKLOAD": "lora", "DIM": "2048", "LAYERS": "16", "BATCH": "16", "SEQ": "2048"}),
    ("cnn-b128", {"WORKLOAD": "cnn", "BATCH": "128"}),
    ("cnn-b256", {"WORKLOAD": "cnn", "BATCH": "256"}),
]
DDP = ("ddp2-lm-d1024-L8-b8-s1024", {"WORKLOAD": "lm", "BATCH": "8", "SEQ": "1024", "DDP": "1"})
# Held out, with --fsdp2-only (a later run than the calibration): an FSDP2 LM
# on 2 GPUs, compared as every held-out point is.
FSDP2 = ("fsdp2-lm-d2048-L16-b4-s2048",
         {"WORKLOAD": "lm", "DIM": "2048", "LAYERS": "16", "BATCH": "4", "SEQ": "2048", "FSDP": "1"})

# Held out, with --ranks-only (2 GPUs): DDP and FSDP2 LMs at two sizes each,
# rank 0 and rank 1 each estimated (the fake run as that rank) and measured.
# They set nothing: their file is apart from calibration.json.
LM2 = {"WORKLOAD": "lm", "SEQ": "2048"}
RANKS2 = [
    ("ddp2-lm-d1024-L8-b8-s2048", dict(LM2, DDP="1", DIM="1024", LAYERS="8", BATCH="8")),
    ("ddp2-lm-d2048-L16-b4-s2048", dict(LM2, DDP="1", DIM="2048", LAYERS="16", BATCH="4")),
    ("fsdp2-lm-d3072-L16-b2-s2048", dict(LM2, FSDP="1", DIM="3072", LAYERS="16", HEADS="24", BATCH="2")),
    ("fsdp2-lm-d2048-L16-b4-s2048", dict(LM2, FSDP="1", DIM="2048", LAYERS="16", BATCH="4")),
    ("fsdp2-lm-d1024-L8-b8-s2048", dict(LM2, FSDP="1", DIM="1024", LAYERS="8", BATCH="8")),
]
COMMITTED = os.path.join(ROOT, "bench", "estimate", "calibration.json")

CONSTANTS = r"""
import json, torch
torch.empty(1, device="cuda")
a = torch.randn(1024, 1024, device="cuda"); b = torch.randn(1024, 1024, device="cuda")
alive = a.nbytes + b.nbytes
before_ctx = torch.cuda.mem_get_info()
c = a @ b
with torch.autocast("cuda", dtype=torch.bfloat16):
    d = a @ b
torch.cuda.synchronize()
alive += c.nbytes + d.nbytes
free, total = torch.cuda.mem_get_info()
print(json.dumps({"workspaceBytes": torch.cuda.memory_allocated() - alive,
                  "contextAfterMatmulBytes": total - free - torch.cuda.memory_reserved(),
                  "deviceTotalBytes": total, "gpu": torch.cuda.get_device_name(),
                  "torch": torch.__version__}))
"""


def log_path(out, name):
    return os.path.join(out, name + ".log")


def constants(out):
    r = subprocess.run([sys.executable, "-c", CONSTANTS], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def real(out, name, env, steps, nproc=1):
    """Peaks of a real run (rank 0's)."""
    report = os.path.join(out, name + ".real.json")
    e = {**os.environ, **env, "STEPS": str(steps), "MEMPROF_CAL_REPORT": report}
    cmd = [sys.executable, WORKLOADS]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", WORKLOADS]
    with open(log_path(out, name + ".real"), "w") as log:
        try:
            rc = subprocess.run(cmd, env=e, stdout=log, stderr=subprocess.STDOUT, timeout=150).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0 or not os.path.exists(report):
        return {"error": f"exit {rc}"}
    with open(report) as f:
        return json.load(f)


def real_ranks(out, name, env, steps, nproc):
    """Every rank's peaks of a real run (rank N's report beside rank 0's)."""
    ranks = [real(out, name, env, steps, nproc=nproc)]
    for r in range(1, nproc):
        try:
            with open(os.path.join(out, f"{name}.real.json.rank{r}")) as f:
                ranks.append(json.load(f))
        except (OSError, ValueError):
            ranks.append({"error": "no report"})
    return ranks


def fake(out, name, env, steps, workspace, world_size=1, rank=0):
    """The estimator's answer with no GPU visible, as rank `rank` of the fake process group."""
    e = {**os.environ, **env, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": AGENT, "STEPS": str(steps),
         "RANK": str(rank), "LOCAL_RANK": str(rank)}
    name = name if rank == 0 else f"{name}.rank{rank}"
    cmd = [sys.executable, "-m", "memprof_agent.estimate", "--steps", str(steps),
           "--workspace-bytes", str(workspace), "--world-size", str(world_size), "--", WORKLOADS]
    started = time.monotonic()
    with open(log_path(out, name + ".fake"), "w") as log:
        r = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        answer = json.loads(r.stdout)
    except ValueError:
        return {"error": f"exit {r.returncode}, no JSON"}
    answer["rank"]["wallSeconds"] = round(time.monotonic() - started, 2)
    return answer["rank"]


def point(name, split, env, real_peaks, fake_run):
    return {"name": name, "split": split, "env": env, "real": real_peaks, "estimate": fake_run}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fsdp2-only", action="store_true",
                   help="only the held-out FSDP2 point, to DIR/fsdp2-point.json (2 GPUs)")
    p.add_argument("--ranks-only", action="store_true",
                   help="only the held-out DDP and FSDP2 points, every rank, to DIR/ranks-points.json (2 GPUs)")
    p.add_argument("--fake-only", action="store_true", help="with --ranks-only: the estimates alone, no GPU")
    p.add_argument("--until", type=float, default=float("inf"),
                   help="with --ranks-only: no real run starts after this epoch")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.ranks_only:
        return ranks_points(args)
    import torch

    if args.fsdp2_only:
        return fsdp2_point(args)

    gpus = torch.cuda.device_count()
    consts = constants(args.out)
    print("constants", consts, flush=True)
    ws = consts["workspaceBytes"]
    configs = [(n, "calibration", e) for n, e in CALIBRATION] + [(n, "held-out", e) for n, e in HELD_OUT]
    with cf.ThreadPoolExecutor(max_workers=6) as pool:
        fakes = {n: pool.submit(fake, args.out, n, e, args.steps, ws) for n, _, e in configs}
        if gpus >= 2:
            fakes[DDP[0]] = pool.submit(fake, args.out, DDP[0], DDP[1], args.steps, ws, 2)
        reals = {}
        for n, _, e in configs:
            reals[n] = real(args.out, n, e, args.steps)
            print(n, reals[n], flush=True)
        if gpus >= 2:
            reals[DDP[0]] = real(args.out, DDP[0], DDP[1], args.steps, nproc=2)
            print(DDP[0], reals[DDP[0]], flush=True)
        points = [point(n, s, e, reals[n], fakes[n].result()) for n, s, e in configs]
        if gpus >= 2:
            points.append(point(DDP[0], "calibration", DDP[1], reals[DDP[0]], fakes[DDP[0]].result()))
    result = summarize(consts, points, gpus)
    with open(os.path.join(args.out, "calibration.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["constants"]), flush=True)


def fsdp2_point(args):
    """The FSDP2 point alone: its real run on 2 GPUs beside its fake run."""
    ws = constants(args.out)["workspaceBytes"]
    name, env = FSDP2
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        fake_run = pool.submit(fake, args.out, name, env, args.steps, ws, 2)
        real_peaks = real(args.out, name, env, args.steps, nproc=2)
        p = point(name, "held-out", env, real_peaks, fake_run.result())
    with open(os.path.join(args.out, "fsdp2-point.json"), "w") as f:
        json.dump(p, f, indent=1)
    print(json.dumps(p), flush=True)


def ranks_points(args, nproc=2):
    """The held-out DDP and FSDP2 points: each rank's real peaks beside its
    fake run. The estimate uses the committed constants (the workspace
    `memprof estimate` passes), so it is the one a user gets."""
    with open(COMMITTED) as f:
        ws = json.load(f)["constants"]["workspaceBytes"]
    points = []
    with cf.ThreadPoolExecutor(max_workers=2 * len(RANKS2)) as pool:
        fakes = {(n, r): pool.submit(fake, args.out, n, e, args.steps, ws, nproc, r)
                 for n, e in RANKS2 for r in range(nproc)}
        for name, env in RANKS2:
            if args.fake_only or time.time() + 60 > args.until:
                reals = [{"error": "not run" if args.fake_only else "not run: deadline"}] * nproc
            else:
                reals = real_ranks(args.out, name, env, args.steps, nproc)
            points.append({"name": name, "split": "held-out", "env": env, "real": reals,
                           "estimate": [fakes[(name, r)].result() for r in range(nproc)]})
            print(rank_lines(points[-1]), flush=True)
            with open(os.path.join(args.out, "ranks-points.json"), "w") as f:
                json.dump({"kind": "memprofEstimateHeldOut", "workspaceBytes": ws, "steps": args.steps,
                           "points": points}, f, indent=1)


def rank_lines(p):
    """One line a rank: real and estimated peaks, allocated and reserved, and the errors."""
    gib = lambda b: f"{b / 2**30:.2f}GiB"  # noqa: E731
    out = []
    for r, (real_peaks, est) in enumerate(zip(p["real"], p["estimate"])):
        if "error" in real_peaks or "error" in est:
            out.append(f"{p['name']:30} rank {r}: real {real_peaks.get('error', 'ok')} estimate {est.get('error', 'ok')}")
            continue
        err = lambda k, e: f"{(est[e] - real_peaks[k]) / real_peaks[k] * 100:+.1f}%"  # noqa: E731
        out.append(f"{p['name']:30} rank {r}: allocated {gib(real_peaks['allocated'])} est "
                   f"{gib(est['allocatedPeakBytes'])} {err('allocated', 'allocatedPeakBytes')} | reserved "
                   f"{gib(real_peaks['reserved'])} est {gib(est['reservedPeakBytes'])} "
                   f"{err('reserved', 'reservedPeakBytes')}")
    return "\n".join(out)


def one_gpu(p):
    """A single-GPU point: a DDP or FSDP2 run's memory outside the allocator holds NCCL too."""
    return p["env"].get("DDP") != "1" and p["env"].get("FSDP") != "1"


def outside_allocator(real_peaks):
    return real_peaks["deviceUsed"] - real_peaks["reservedNow"]


def summarize(consts, points, gpus):
    """The constants from the calibration points; NCCL from the DDP point."""
    single = [p for p in points if p["split"] == "calibration" and "error" not in p["real"]
              and one_gpu(p)]
    context = max(outside_allocator(p["real"]) for p in single) if single else consts["contextAfterMatmulBytes"]
    nccl = None
    ddp = [p for p in points if p["name"].startswith("ddp2") and "error" not in p["real"]]
    if ddp:
        nccl = outside_allocator(ddp[0]["real"]) - context
    return {
        "kind": "memprofEstimateCalibration", "version": 1,
        "gpu": consts["gpu"], "deviceTotalBytes": consts["deviceTotalBytes"], "torch": consts["torch"],
        "constants": {"contextBytes": context, "workspaceBytes": consts["workspaceBytes"],
                      "ncclBytes": nccl, "contextAfterMatmulBytes": consts["contextAfterMatmulBytes"]},
        "gpus": gpus,
        "points": points,
        "contextSpread": statistics.pstdev([outside_allocator(p["real"]) for p in points
                                            if "error" not in p["real"] and one_gpu(p)] or [0]),
    }


if __name__ == "__main__":
    main()
