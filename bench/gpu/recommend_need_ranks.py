"""The need check (recommend_need.py) on data-parallel ranks: DDP and FSDP2
runs of estimate_workloads.py's decoder LM, one process a GPU, under torchrun.

For each configuration:
  1. measure, uncapped: on every rank, recommend_need.py's run (STEPS
     training steps, an evaluation pass, a checkpoint: DDP's rank 0 saves
     the module's and optimizer's state; FSDP2 gathers the full state to
     rank 0's host memory with get_state_dict, as a full checkpoint does),
     reading the allocator's peaks (allocated, reserved, inactive split)
     and the device memory outside the allocator (device used less
     reserved: the CUDA context, cuBLAS' workspace and NCCL's buffers);
  2. the request memprof_analysis::recommend gives the role of all the
     ranks (one role, `worker`, of RANKS ranks): the highest rank's need
     (the smaller of its reserved peak and its allocated + split peaks) +
     the CUDA context + NCCL's buffers (more than one rank) + the margin
     (the larger of 64 MiB, 2 % of the need, the spread across the ranks
     (highest less the median), the reserved cache's late growth), rounded
     up to 128 MiB;
  3. fresh runs with every rank's caching allocator capped with
     torch.cuda.set_per_process_memory_fraction at the request less what
     lay outside that rank's allocator in the measure run (the request as
     the process's whole GPU memory, as HAMi caps it), then at 90 % of the
     request less the same. Each rank completes, raises CUDA OOM, or is
     stopped by torchrun when another rank failed.

    python3 bench/gpu/recommend_need_ranks.py OUTDIR [--until EPOCH] NAME...
    python3 bench/gpu/recommend_need_ranks.py OUTDIR --dry-cpu NAME...   # gloo on the CPU, tiny sizes
    python3 bench/gpu/recommend_need_ranks.py --mirror-fixture FILE      # synthetic rows, for the mirror test

Writes OUTDIR/need-ranks.json after every run and prints one line a
configuration; a configuration that cannot start before EPOCH is skipped.
"""
import io
import json
import math
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import recommend_cap as rc  # noqa: E402
import recommend_need as rn  # noqa: E402

RANKS = 2
# NCCL's buffers outside the allocator (calibration.json `ncclBytes`), as
# memprof_analysis::recommend's NCCL_BYTES.
NCCL_BYTES = 885_063_680
# One torchrun run takes 15 to 71 s on 2 H200s: a configuration (three
# runs) starts only with three times this left before the deadline.
LAUNCH_SECONDS = 45

LM = {"WORKLOAD": "lm"}
CONFIGS = {
    "ddp2-lm-d1024-L8-b8-s2048": dict(LM, DDP="1", DIM="1024", LAYERS="8", BATCH="8", SEQ="2048"),
    "fsdp2-lm-d3072-L16-b2-s2048": dict(LM, FSDP="1", DIM="3072", LAYERS="16", HEADS="24",
                                        BATCH="2", SEQ="2048"),
    "ddp2-lm-d2048-L16-b4-s2048": dict(LM, DDP="1", DIM="2048", LAYERS="16", BATCH="4", SEQ="2048"),
    "fsdp2-lm-d2048-L16-b4-s2048": dict(LM, FSDP="1", DIM="2048", LAYERS="16", BATCH="4", SEQ="2048"),
    "fsdp2-lm-d1024-L8-b8-s2048": dict(LM, FSDP="1", DIM="1024", LAYERS="8", BATCH="8", SEQ="2048"),
    "ddp2-lm-d1024-L8-b8-s1024": dict(LM, DDP="1", DIM="1024", LAYERS="8", BATCH="8", SEQ="1024"),
}
# The dry path: gloo on the CPU, a model of a few MB.
DRY = {"DIM": "64", "LAYERS": "2", "HEADS": "4", "VOCAB": "512", "BATCH": "2", "SEQ": "64"}


# ---- one rank (under torchrun) ----

def allocator(torch):
    return torch.cuda.memory_stats() if torch.cuda.is_available() else {}


def held(torch):
    s = allocator(torch)
    return s.get("active_bytes.all.current", 0) + s.get("inactive_split_bytes.all.current", 0)


def start(torch, mode, rank):
    """The device, its cap (capped runs), the process group."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if mode != "measure" and cuda:
        fraction = float(os.environ["CAP_FRACTIONS"].split(",")[rank])
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    if not cuda:
        # FSDP2's mesh (estimate_workloads.fsdp2 asks for "cuda") on the CPU.
        mesh = torch.distributed.init_device_mesh
        torch.distributed.init_device_mesh = lambda _t, *a, **k: mesh("cpu", *a, **k)
    dist.init_process_group("nccl" if cuda else "gloo")
    return device


def checkpoint(torch, model, opt, rank, fsdp):
    """A full checkpoint to host memory, as a trainer saves one."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        state = {"model": msd, "opt": osd}
    else:
        state = {"model": model.module.state_dict(), "opt": opt.state_dict()}
    buf = io.BytesIO()
    if rank == 0:
        torch.save(state, buf)
    return buf.getbuffer().nbytes


def train(torch, device, rank):
    """STEPS training steps, an evaluation pass, a checkpoint; the need sampled between."""
    import estimate_workloads as w

    torch.manual_seed(0)
    kind, fsdp = os.environ["WORKLOAD"], os.environ.get("FSDP") == "1"
    model, opt = w.build(kind, device, w.fsdp2 if fsdp else None)
    if os.environ.get("DDP") == "1":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
    samples, reserved_after = [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(rc.STEPS):
        x, y = w.batch(kind, device)
        loss = w.loss_of(kind, model, x, y)
        samples.append(held(torch))
        loss.backward()
        samples.append(held(torch))
        opt.step()
        samples.append(held(torch))
        opt.zero_grad(set_to_none=True)
        sync()
        reserved_after.append(torch.cuda.memory_reserved() if device.type == "cuda" else 0)
    model.eval()
    with torch.no_grad():
        x, y = w.batch(kind, device)
        w.loss_of(kind, model, x, y).item()
        samples.append(held(torch))
    saved = checkpoint(torch, model, opt, rank, fsdp)
    samples.append(held(torch))
    sync()
    return {"heldSampledMax": max(samples), "reservedAfterStep": reserved_after, "checkpointBytes": saved}


def processes_on(torch, index):
    """NVML's used memory of each process on this GPU (pid: bytes), None where NVML cannot tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))
        return {str(p.pid): p.usedGpuMemory for p in procs}
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None


def evidence(torch, device, run):
    s = allocator(torch)
    cuda = device.type == "cuda"
    free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
    return dict(run, **{
        "allocated": s.get("allocated_bytes.all.peak", 0), "reserved": s.get("reserved_bytes.all.peak", 0),
        "activePeak": s.get("active_bytes.all.peak", 0),
        "inactiveSplitPeak": s.get("inactive_split_bytes.all.peak", 0),
        "reservedNow": torch.cuda.memory_reserved() if cuda else 0,
        "deviceUsed": total - free, "deviceTotal": total,
        "nvmlProcesses": processes_on(torch, device.index) if cuda else None, "pid": os.getpid(),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
    })


def child(mode, prefix):
    """One rank: its evidence, or the OOM it met, to PREFIX.rankN.json."""
    import torch

    rank = int(os.environ["LOCAL_RANK"])
    path = f"{prefix}.rank{rank}.json"
    try:
        device = start(torch, mode, rank)
        result, code = evidence(torch, device, train(torch, device, rank)), 0
    except Exception as e:  # noqa: BLE001 - every failure is recorded, OOM apart from the rest
        text = str(e)
        # cuBLAS and NCCL report a failed allocation as their own error.
        oom = any(k in text for k in ("out of memory", "ALLOC_FAILED", "OUT_OF_MEMORY"))
        result, code = ({"oom": text[:300]}, 3) if oom else ({"error": traceback.format_exc()[-1500:]}, 1)
    with open(path, "w") as f:
        json.dump(result, f)
    if code == 0:
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    # A failed rank leaves at once: the others wait in a collective until torchrun stops them.
    os._exit(code)


# ---- the driver ----

def launch(outdir, name, env, mode, fractions=None):
    """One torchrun run of RANKS ranks; each rank's result."""
    prefix = os.path.join(outdir, f"{name}.{mode}")
    e = dict(os.environ, **env)
    if fractions:
        e["CAP_FRACTIONS"] = ",".join(repr(f) for f in fractions)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
           __file__, "--child", mode, prefix]
    t = time.time()
    with open(prefix + ".log", "w") as log:
        try:
            rc_ = subprocess.run(cmd, env=e, stdout=log, stderr=subprocess.STDOUT, timeout=150).returncode
        except subprocess.TimeoutExpired:
            rc_ = "timeout"
    ranks = []
    for r in range(RANKS):
        try:
            with open(f"{prefix}.rank{r}.json") as f:
                ranks.append(json.load(f))
        except (OSError, ValueError):
            ranks.append({"stopped": "no result: stopped by torchrun after another rank failed"})
    return {"exit": rc_, "seconds": round(time.time() - t, 1), "fractions": fractions, "ranks": ranks}


def late_of(m):
    trend = m["reservedAfterStep"]
    half = len(trend) // 2
    return max(trend) - max(trend[:half]) if half else 0


def role_request(ranks):
    """memprof_analysis::recommend's request for one role of these ranks' evidence."""
    needs = sorted(min(rn.need_of(m, "least-of"), m["deviceTotal"] or float("inf")) for m in ranks)
    top, median = needs[-1], needs[len(needs) // 2]
    floor = max(rc.MIN_MARGIN_BYTES, math.ceil(top * rc.MIN_MARGIN_FRACTION))
    late = max(late_of(m) for m in ranks)
    margin = max(floor, top - median, late)
    context = rc.CONTEXT_BYTES + (NCCL_BYTES if len(ranks) > 1 else 0)
    request = -(-(top + context + margin) // rc.STEP_BYTES) * rc.STEP_BYTES
    return {"requestBytes": request, "needBytes": top, "needsPerRank": [rn.need_of(m, "least-of") for m in ranks],
            "contextBytes": context, "marginBytes": margin, "spreadBytes": top - median, "lateGrowthBytes": late}


def outside(m):
    """Device memory this rank used beside its allocator, at the end of the measure run."""
    return m["deviceUsed"] - m["reservedNow"]


def caps(ranks, request, share):
    """Each rank's allocator cap: `share` of the request less what lay outside its allocator."""
    return [(share * request - outside(m)) / m["deviceTotal"] if m["deviceTotal"] else 1.0 for m in ranks]


def one(outdir, name, env, until):
    row = {"name": name, "env": env}
    if time.time() + 3 * LAUNCH_SECONDS > until:
        return dict(row, skipped="deadline")
    measured = launch(outdir, name, env, "measure")
    row["measured"] = measured
    ranks = measured["ranks"]
    if measured["exit"] != 0 or any("allocated" not in m for m in ranks):
        return row
    row.update(role_request(ranks))
    row["outsideAllocatorBytes"] = [outside(m) for m in ranks]
    request = row["requestBytes"]
    row["at"] = launch(outdir, name, env, "capped-at", caps(ranks, request, 1.0))
    row["below"] = launch(outdir, name, env, "capped-below", caps(ranks, request, 0.9))
    return row


def verdict(run):
    def of(r):
        return "ok" if "allocated" in r else "OOM" if "oom" in r else "stopped" if "stopped" in r else "error"
    return "/".join(of(r) for r in run["ranks"]) if run else "-"


def line(r):
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    if "requestBytes" not in r:
        return f"{r['name']:30} {r.get('skipped') or 'measure failed: ' + json.dumps(r['measured'])[-600:]}"
    ms = r["measured"]["ranks"]
    per = " ".join(f"r{i}: alloc {mib(m['allocated'])} res {mib(m['reserved'])} split {mib(m['inactiveSplitPeak'])} "
                   f"outside {mib(outside(m))}" for i, m in enumerate(ms))
    return (f"{r['name']:30} {per} | request {mib(r['requestBytes'])} "
            f"at {verdict(r['at'])} 90% {verdict(r['below'])}")


G = 1 << 30


def synthetic(alloc, reserved, split, trend=None, total=150_109_880_320):
    return {"allocated": alloc, "reserved": reserved, "inactiveSplitPeak": split,
            "reservedAfterStep": trend or [reserved] * rc.STEPS, "deviceTotal": total}


# Evidence no GPU measured, each row exercising one term of the role's
# formula, for the mirror test (crates/analysis/src/recommend/tests.rs).
MIRROR = [
    ("two ranks, the need of each its smaller bound",
     [synthetic(20 * G, 24 * G, 2 * G), synthetic(20 * G + (512 << 20), 23 * G, 3 * G)]),
    ("two ranks, late growth on one",
     [synthetic(9 * G, 10 * G, G), synthetic(9 * G, 12 * G, 4 * G, [10 * G] * 5 + [11 * G, 11 * G, 12 * G])]),
    ("three ranks, a spread above the median",
     [synthetic(10 * G, 10 * G, 0), synthetic(12 * G, 12 * G, 0), synthetic(15 * G, 16 * G, 3 * G)]),
    ("a need above the card is the card", [synthetic(18 * G, 20 * G, 4 * G, total=16 * G)] * 2),
    ("one rank: no NCCL", [synthetic(7 * G + 12345, 8 * G + 777, 123_456_789)]),
]


def mirror_fixture(path):
    """MIRROR's rows, each with the request this script's formula gives."""
    rows = [dict(role_request(ranks), name=name, measured={"ranks": ranks}) for name, ranks in MIRROR]
    with open(path, "w") as f:
        json.dump({"generatedBy": "python3 bench/gpu/recommend_need_ranks.py --mirror-fixture FILE",
                   "rows": rows}, f, indent=1)
        f.write("\n")


def main(argv):
    import argparse

    p = argparse.ArgumentParser(description="the need check on DDP and FSDP2 ranks")
    p.add_argument("outdir")
    p.add_argument("names", nargs="+", choices=sorted(CONFIGS), metavar="NAME")
    p.add_argument("--until", type=float, default=float("inf"), help="skip what cannot start before this epoch")
    p.add_argument("--dry-cpu", action="store_true", help="gloo on the CPU, tiny sizes: checks the script")
    args = p.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    rows = []
    for n in args.names:
        env = dict(CONFIGS[n], **DRY) if args.dry_cpu else CONFIGS[n]
        rows.append(one(args.outdir, n, env, args.until))
        with open(os.path.join(args.outdir, "need-ranks.json"), "w") as f:
            json.dump({"contextBytes": rc.CONTEXT_BYTES, "ncclBytes": NCCL_BYTES, "ranks": RANKS,
                       "steps": rc.STEPS, "rows": rows}, f, indent=1)
        print(line(rows[-1]), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--mirror-fixture"]:
        mirror_fixture(sys.argv[2])
    else:
        main(sys.argv[1:])
