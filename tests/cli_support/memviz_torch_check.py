"""On a machine with PyTorch and a GPU: the `--oom-snapshot` pickles
(argv) against a snapshot PyTorch itself takes (the same keys, the same
Python types), then through memory_viz's own Python tools (segsum,
segment_plot, trace_plot; the HTML goes to $OUT). docs/cli.md shows a run."""
import os, pickle, sys
import torch
from torch.cuda import _memory_viz as mv

out = os.environ.get("OUT", "/tmp")
torch.cuda.memory._record_memory_history(max_entries=1000)
keep = [torch.empty(n, device="cuda", dtype=torch.uint8) for n in (512, 1 << 20, 3 << 20, 300 << 20)]
real = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
rs = max(real["segments"], key=lambda s: s["total_size"])
rb = next(b for b in rs["blocks"] if b["state"] == "active_allocated")
print("torch", torch.__version__)
print("real top-level keys:", sorted(real))
print("real segment keys:", sorted(rs))
print("real block keys:", sorted(rb))
print("real frame keys:", sorted(rb["frames"][0]) if rb["frames"] else None)
print("real device_traces:", type(real["device_traces"]).__name__, len(real["device_traces"]))
for path in sys.argv[1:]:
    name = os.path.basename(path).rsplit(".", 1)[0]
    ours = pickle.load(open(path, "rb"))
    s, b = ours["segments"][0], ours["segments"][0]["blocks"][0]
    bad = [(k, type(v).__name__, type(rs.get(k)).__name__) for k, v in s.items() if k != "blocks" and (k not in rs or type(rs[k]) is not type(v))]
    bad += [(k, type(v).__name__, type(rb.get(k)).__name__) for k, v in b.items() if k not in rb or type(rb[k]) is not type(v)]
    if b["frames"] and rb["frames"]:
        bad += [(k, type(v).__name__) for k, v in b["frames"][0].items() if k not in rb["frames"][0] or type(rb["frames"][0][k]) is not type(v)]
    print(name, "fields unlike a real snapshot's:", bad, "missing vs real segment:", sorted(set(rs) - set(s)), "block:", sorted(set(rb) - set(b)))
    print(mv.segsum(ours))
    html = mv.segment_plot(ours)
    open(f"{out}/{name}-segment_plot.html", "w").write(html)
    html = mv.trace_plot(ours)
    open(f"{out}/{name}-trace_plot.html", "w").write(html)
    print(name, "segment_plot/trace_plot html:", len(html), "bytes")
    mv.segsum(ours)
    print(name, "segsum ok")
