"""On the GPU machine (PyTorch, one CUDA device), from the repository root:
1. a real CUDA OOM under the agent with MEMPROF_AGENT_OOM_SNAPSHOT set and
   allocation history on (its 100000-entry ring filled first): the file the
   agent writes, its size and the OOM's time, then PyTorch's own loaders
   on it (pickle, _memory_viz segsum/segment_plot/trace_plot, and the
   `python -m torch.cuda._memory_viz stats` command), and a second OOM that
   writes no second file;
2. the breakdown's rows on a real bf16 model (dtype names, layers);
3. DP-SGD with a stand-in for Opacus (torch.func vmap per-sample
   gradients; Opacus is not installed there): the agent's modelled norms
   against what Opacus' clipping code allocates, and ghost clipping's
   ggT/aaT model against their measured peak.
Prints numbers; docs/agent.md shows a run. OUT: where the log goes."""
import glob, json, os, pickle, socket, subprocess, sys, time

sys.path.insert(0, "agent/python")
OUT = os.environ.get("OUT", "/tmp")
SNAPS = "/tmp/memprof-snaps"
os.environ["MEMPROF_AGENT_OOM_SNAPSHOT"] = SNAPS + "/oom-{pid}-gpu{device}.pickle"
import shutil

shutil.rmtree(SNAPS, ignore_errors=True)  # a warm machine keeps /tmp between runs
import torch
from torch.cuda import _memory_viz as mv
import memprof_agent
from memprof_agent import _breakdown

GiB = 1 << 30


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def churn(n):
    for _ in range(n):
        x = torch.empty(4096, device="cuda")
        del x


def leak():
    return [torch.empty(4 * GiB, dtype=torch.uint8, device="cuda") for _ in range(8)]


def oom_once():
    t = time.perf_counter()
    try:
        with memprof_agent.oom_guard():  # pushes only if the observer did not
            torch.empty(400 * GiB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pass
    return time.perf_counter() - t


def check_oom_file():
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    torch.zeros(1, device="cuda")  # CUDA up before start(): the OOM observer attaches
    assert memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port(), record_history=True)
    churn(60000)  # 120000 alloc/free events: the 100000-entry ring is full
    held = leak()
    t = time.perf_counter()
    torch.cuda.memory._snapshot()
    print("_snapshot() alone, ring full: %.2f s" % (time.perf_counter() - t))
    took = oom_once()
    (path,) = glob.glob(SNAPS + "/*.pickle")
    size = os.path.getsize(path)
    print("first OOM: %.2f s in torch.empty (observer: push to a closed port, then the snapshot), file %s, %.1f MiB"
          % (took, os.path.basename(path), size / 2 ** 20))
    t = time.perf_counter()
    snap = pickle.load(open(path, "rb"))
    print("pickle.load: %.2f s; keys %s; segments %d; device_traces %s"
          % (time.perf_counter() - t, sorted(snap), len(snap["segments"]), [len(x) for x in snap["device_traces"]]))
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    mine = [b for b in blocks if any(f["name"] == "leak" and f["filename"].endswith("oom_snapshot_check.py") for f in b["frames"])]
    print("live blocks %d; allocated by leak() in this file: %d of %.1f GiB each" % (len(blocks), len(mine), mine[0]["size"] / GiB if mine else 0))
    print(mv.segsum(snap).splitlines()[0])
    print("segment_plot html %d bytes, trace_plot html %d bytes" % (len(mv.segment_plot(snap)), len(mv.trace_plot(snap))))
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path], capture_output=True, text=True)
    print("python -m torch.cuda._memory_viz stats: rc %d, %s" % (r.returncode, r.stdout.strip().splitlines()[:1]))
    t = time.perf_counter()
    pickle.dumps(torch.cuda.memory._snapshot())
    print("_snapshot() + pickle.dumps now, ring full: %.2f s" % (time.perf_counter() - t))
    oom_once()
    print("after a second OOM: %d file(s)" % len(glob.glob(SNAPS + "/*")))
    del held
    memprof_agent.stop()
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()


def check_rows():
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.Sequential()
    model.add_module("embed", torch.nn.Embedding(32000, 512))
    model.add_module("layers", torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False))
    model.add_module("head", torch.nn.Linear(512, 32000, bias=False))
    model = model.to("cuda", torch.bfloat16)
    model.embed.weight.requires_grad_(False)
    b = memprof_agent.breakdown(model)
    print("rows:", json.dumps(b["parameterRows"][:3]))
    print("left out:", b["parametersLeftOut"], "layers:", [(r["name"], r["parameters"]) for r in b["layerRows"]])
    print("params bytes %d = rows %d + left out %d" % (b["parametersBytes"], sum(r["bytes"] for r in b["parameterRows"]),
                                                        (b["parametersLeftOut"] or {}).get("bytes", 0)))


def per_sample_grads(model, x, y):
    from torch.func import functional_call, grad, vmap
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def check_dp():
    B = 64
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    x, y = torch.randn(B, 512, device="cuda"), torch.randint(0, 10, (B,), device="cuda")
    for name, g in per_sample_grads(model, x, y).items():
        model.get_parameter(name).grad_sample = g
    b = memprof_agent.breakdown(model, batch_size=B)
    d = b["dpSgd"]
    grads = [p.grad_sample for p in model.parameters()]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    # Opacus' DPOptimizer.clip_and_accumulate, its norm part.
    per_param = [g.reshape(len(g), -1).norm(2, dim=-1) for g in grads]
    norms = torch.stack(per_param, dim=1).norm(2, dim=1)
    factor = (1.0 / (norms + 1e-6)).clamp(max=1.0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    print("vmap stand-in: per-sample gradients %d bytes (agent) vs %d (sum of grad_sample)"
          % (b["perSampleGradientsBytes"], sum(g.numel() * g.element_size() for g in grads)))
    print("norms: agent %s %d bytes; measured peak of the clipping's norm code %d bytes" % (d["normsSource"], d["normsBytes"], peak))
    del per_param, norms, factor
    T, dim, out_dim = 1024, 1024, 1024
    acts = torch.randn(8, T, dim, device="cuda")
    backs = torch.randn(8, T, out_dim, device="cuda")
    lin = torch.nn.Linear(dim, out_dim, bias=False).cuda()
    lin.weight._norm_sample = torch.zeros(8, device="cuda")
    d = memprof_agent.breakdown(lin, sequence_length=T)["dpSgd"]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    # Opacus' ghost clipping for a Linear on 3-D input.
    ggT = torch.einsum("nik,njk->nij", backs, backs)
    aaT = torch.einsum("nik,njk->nij", acts, acts)
    ga = torch.einsum("n...i,n...i->n", ggT, aaT).clamp(min=0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    print("ghost clipping, B 8, T %d: agent modelled temp matrices %d bytes; measured peak %d bytes (%.2fx)"
          % (T, d["tempMatricesBytes"], peak, peak / d["tempMatricesBytes"]))
    del ggT, aaT, ga


if __name__ == "__main__":
    check_oom_file()
    check_rows()
    check_dp()
