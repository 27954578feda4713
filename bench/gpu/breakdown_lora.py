#!/usr/bin/env python3
"""GPU proof of memprof_agent.breakdown / watch / trace_modules.

A small GPT (hand-written blocks, ~130M parameters, fp32 weights, bf16
autocast) with peft LoRA adapters on the attention projections at r=8, 16,
32, and a full fine-tune of an nn.TransformerEncoder model, each trained 6
steps with AdamW under memprof_agent.watch(). The agent's breakdown is
compared with bytes counted here independently (numel * element_size of
every parameter, gradient and optimizer state tensor on the GPU), per item
(relative error; target within 5 %), and its module types with the types
this script knows its own models have (by their names, which the agent does
not use; the output head `head`, shaped like the token embedding, counts as
embedding). Activations: the agent's peak over step 3 minus the static
part, beside this script's own measurement at step 6. Then trace_modules()
on the r=16 model, 10 steps each, median step time: without (A, before and
after), forward hooks only (backward=False), the full trace, and the full
trace with its allocator reads replaced by a constant (the hooks' own cost),
so the overhead is split into hooks and reads; and the cost of one read of
each kind, including the one trace_modules uses. Then trace_modules' table
for the full fine-tune too (3 steps; there every input needs a gradient but
the embedding's). The agent's daemon thread
is not started (no sidecar here): watch() works without it.

    OUT=/some/dir python3 bench/gpu/breakdown_lora.py

Prints tables; writes $OUT/breakdown.json. Every configuration is guarded:
an error is printed and recorded, the next one runs. Under 3 minutes.
"""
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "agent", "python"))
import memprof_agent  # noqa: E402
from memprof_agent import _torchread as tr  # noqa: E402

OUT = os.environ.get("OUT", ".")
DEADLINE = time.time() + 170
MB = 1 << 20
VOCAB, D, LAYERS, HEADS, SEQ, BATCH = 32000, 768, 12, 12, 512, 8


class RMSScale(nn.Module):
    """A hand-written RMSNorm (its class name does not say Norm)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Mixer(nn.Module):
    """Causal self-attention; its class name does not say Attention."""

    def __init__(self, d, heads):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Mixer(d, heads), RMSScale(d), FeedForward(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))  # no in-place ops: full backward hooks forbid them
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block(D, HEADS) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


class Encoder(nn.Module):
    """nn.TransformerEncoder (nn.MultiheadAttention inside), fully trained."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        return self.head(self.encoder(self.emb(idx)))


def expected_type(name):
    """The type of each parameter of this script's models, from the names
    this script gave them (the agent sees only structure)."""
    if "lora_" in name:
        return "lora"
    if ".attn." in name or ".self_attn." in name:
        return "attention"
    if ".mlp." in name or ".linear1." in name or ".linear2." in name:
        return "mlp"
    if name.split(".")[-2] in ("tok", "pos", "emb", "head"):
        return "embedding"
    if ".ln" in name or name.startswith("ln.") or ".norm" in name:
        return "norm"
    return "other"


def exact_bytes(model, opt):
    """Independent: numel * element_size of each parameter, gradient and
    GPU optimizer-state tensor (Adam's CPU `step` counters hold no GPU memory)."""
    params = list(model.parameters())
    p = sum(x.numel() * x.element_size() for x in params)
    g = sum(x.grad.numel() * x.grad.element_size() for x in params if x.grad is not None)
    o = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
            if torch.is_tensor(t) and t.is_cuda)
    o_cpu = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                if torch.is_tensor(t) and not t.is_cuda)
    by = {}
    for n, x in model.named_parameters():
        e = by.setdefault(expected_type(n), {"parameters": 0, "parametersBytes": 0})
        e["parameters"] += x.numel()
        e["parametersBytes"] += x.numel() * x.element_size()
    trainable = sum(x.numel() for x in params if x.requires_grad)
    return {"parametersBytes": p, "gradientsBytes": g, "optimizerBytes": o, "optimizerCpuBytes": o_cpu,
            "staticBytes": p + g + o, "totalParameters": sum(x.numel() for x in params),
            "trainableParameters": trainable, "byType": by}


def rel(a, b):
    if a is None or b is None:
        return None
    return 0.0 if a == b == 0 else abs(a - b) / max(abs(b), 1)


def build(name, r):
    torch.manual_seed(0)
    model = (GPT() if name == "gpt" else Encoder()).cuda()
    if r:
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(model, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def train_step(model, opt, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
    loss.backward()
    return loss


def run_config(label, name, r):
    model, opt = build(name, r)
    x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda")
    memprof_agent.watch(model, opt, batch_size=BATCH)
    t0 = time.time()
    exact = explicit = watched = None
    for step in range(1, 7):
        memprof_agent.step(step, tokens=BATCH * SEQ, samples=BATCH)
        if step == 6:  # this script's own activation peak, the agent's hooks long gone
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        train_step(model, opt, x)
        if step == 6:
            torch.cuda.synchronize()
            peak6 = torch.cuda.max_memory_allocated()
        if step == 4:  # gradients and optimizer state exist: count both ways at one moment
            watched = dict(memprof_agent.last_breakdown() or {})  # watch()'s, from steps 2-3
            exact = exact_bytes(model, opt)
            t = time.perf_counter()
            explicit = memprof_agent.breakdown(model, opt, batch_size=BATCH)
            explicit_ms = (time.perf_counter() - t) * 1e3
        opt.step()
        opt.zero_grad(set_to_none=True)
    # Step 6's peak: gradients are made during its backward (set_to_none
    # freed them), as in the agent's window over step 3.
    act_exact = peak6 - exact["staticBytes"]
    rows = []
    for item in ("parametersBytes", "gradientsBytes", "optimizerBytes", "staticBytes", "totalParameters", "trainableParameters"):
        rows.append({"item": item, "exact": exact[item], "explicit": explicit.get(item), "watch": (watched or {}).get(item),
                     "relErrExplicit": rel(explicit.get(item), exact[item]), "relErrWatch": rel((watched or {}).get(item), exact[item])})
    rows.append({"item": "activationsPeakBytes", "exact": act_exact, "explicit": None, "watch": (watched or {}).get("activationsPeakBytes"),
                 "relErrExplicit": None, "relErrWatch": rel((watched or {}).get("activationsPeakBytes"), act_exact)})
    agent_types = {e["type"]: e for e in explicit["byModuleType"]}
    types = []
    for t in sorted(set(agent_types) | set(exact["byType"])):
        a, e = agent_types.get(t, {}), exact["byType"].get(t, {})
        types.append({"type": t, "agentParameters": a.get("parameters", 0), "expectedParameters": e.get("parameters", 0),
                      "agentParametersBytes": a.get("parametersBytes", 0), "gradientsBytes": a.get("gradientsBytes", 0),
                      "optimizerBytes": a.get("optimizerBytes", 0)})
    result = {"label": label, "model": name, "r": r, "rows": rows, "types": types, "flags": explicit["flags"],
              "notes": explicit["notes"] + (watched or {}).get("notes", []), "watch": watched,
              "explicitBreakdownMs": explicit_ms, "optimizerCpuBytes": exact["optimizerCpuBytes"],
              "optimizerStepPeakBytes": (watched or {}).get("optimizerStepPeakBytes"), "seconds": time.time() - t0}
    return result, model, opt, x


def print_config(res):
    print("\n== %s: %d parameters, %d trainable; breakdown() took %.1f ms" % (
        res["label"], res["rows"][4]["exact"], res["rows"][5]["exact"], res["explicitBreakdownMs"]))
    print("%-22s %16s %16s %16s %9s %9s" % ("item", "exact", "breakdown()", "watch()", "err()", "errWatch"))
    for row in res["rows"]:
        f = lambda v: "-" if v is None else "%.2f%%" % (100 * v)
        print("%-22s %16s %16s %16s %9s %9s" % (row["item"], row["exact"], row["explicit"], row["watch"],
                                                 f(row["relErrExplicit"]), f(row["relErrWatch"])))
    print("%-10s %14s %14s %12s %12s %12s" % ("type", "agent params", "expected", "param MB", "grad MB", "optim MB"))
    for t in res["types"]:
        print("%-10s %14d %14d %12.1f %12.1f %12.1f" % (t["type"], t["agentParameters"], t["expectedParameters"],
                                                        t["agentParametersBytes"] / MB, t["gradientsBytes"] / MB, t["optimizerBytes"] / MB))
    print("optimizer step peak (watch, step 3): %s; Adam's CPU step counters: %d B (not GPU memory, not counted)" % (
        res["optimizerStepPeakBytes"], res["optimizerCpuBytes"]))
    print("flags: %s; notes: %s" % (res["flags"] or "none", res["notes"] or "none"))


def timed_steps(model, opt, x, n):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        train_step(model, opt, x)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


class ConstantReads:
    """Stands in for the agent's allocator reads (tr.FastReads): the hooks
    run, the allocator is not read."""

    def __init__(self, torch_):
        self.torch = torch_
        self.fixed = {"allocated_bytes": {"all": {"current": 0, "peak": 0}},
                      "reserved_bytes": {"all": {"current": 0, "peak": 0}}}

    def stats(self, index):
        return self.fixed

    def reset(self, index):
        pass

    def name(self):
        return "constant"


def traced_steps(model, opt, x, n, **kw):
    handle = memprof_agent.trace_modules(model, opt, **kw)
    try:
        return timed_steps(model, opt, x, n), handle
    finally:
        handle.remove()


def trace_overhead(model, opt, x, read_us):
    timed_steps(model, opt, x, 3)  # warm
    a1 = timed_steps(model, opt, x, 10)
    fwd_only, _ = traced_steps(model, opt, x, 10, backward=False)
    full, handle = traced_steps(model, opt, x, 10)
    phases, opt_peak = handle.phases(), handle.optimizer_step_peak
    real = tr.fast_reads(torch)
    tr._FAST[0] = ConstantReads(torch)
    try:
        hooks_only, _ = traced_steps(model, opt, x, 10)
    finally:
        tr._FAST[0] = real
    a2 = timed_steps(model, opt, x, 10)
    without = statistics.median(a1 + a2)
    ms = lambda v: statistics.median(v) * 1e3
    over = lambda v: ms(v) - without * 1e3
    n = len(handle.modules)
    reads = 4 * n + 2  # per step: 2 per module in forward, 2 in backward (+1 reset), 2 (+2 resets) around the optimizer step
    print("\n== trace_modules: %d modules traced (%d left out); reads through %s" % (n, handle.left_out, real.name()))
    print("median step: without %.2f ms (A %.2f, A' %.2f)" % (without * 1e3, ms(a1), ms(a2)))
    print("  forward hooks only (backward=False): %.2f ms, overhead %.2f ms (%.1f %%)" % (ms(fwd_only), over(fwd_only), 100 * over(fwd_only) / (without * 1e3)))
    print("  full trace:                          %.2f ms, overhead %.2f ms (%.1f %%)" % (ms(full), over(full), 100 * over(full) / (without * 1e3)))
    print("  full trace, reads replaced by a constant (hooks' own cost): %.2f ms, overhead %.2f ms" % (ms(hooks_only), over(hooks_only)))
    print("  reads: ~%d per step x %.1f us = %.2f ms (+ %d peak resets)" % (reads, read_us, reads * read_us / 1e3, n + 2))
    print_phases(phases, opt_peak)
    return {"withoutMs": without * 1e3, "withMs": ms(full), "overheadMs": over(full),
            "forwardOnlyMs": ms(fwd_only), "forwardOnlyOverheadMs": over(fwd_only),
            "hooksOnlyMs": ms(hooks_only), "hooksOnlyOverheadMs": over(hooks_only),
            "readsPerStep": reads, "read": real.name(),
            "stepsEach": 10, "modules": n, "phases": phases, "optimizerStepPeakBytes": opt_peak}


def print_phases(phases, opt_peak):
    print("%-30s %12s %16s %16s" % ("module", "forward MB", "bwd peak+ MB", "bwd net MB"))
    for p in phases:
        net = p.get("backwardNetBytes")
        print("%-30s %12.1f %16.1f %16s" % (p["module"][-30:], p["forwardBytes"] / MB, p["backwardBytes"] / MB,
                                            "-" if net is None else "%.1f" % (net / MB)))
    print("optimizer step peak: %s" % (None if opt_peak is None else "%.1f MB" % (opt_peak / MB)))


def trace_table(label, model, opt, x):
    """trace_modules' numbers for a second model (3 traced steps, no timing)."""
    steps, handle = traced_steps(model, opt, x, 3)
    print("\n== trace_modules on %s: %d modules" % (label, len(handle.modules)))
    print_phases(handle.phases(), handle.optimizer_step_peak)
    return {"label": label, "phases": handle.phases(), "optimizerStepPeakBytes": handle.optimizer_step_peak}


def stats_read_cost():
    """What one allocator read costs (2,000 calls each), trace_modules' own
    read (tr.allocated_now through tr.FastReads) among them."""
    out = {}
    dev = torch.cuda.current_device()
    calls = (("memory_stats_as_nested_dict", lambda: torch.cuda.memory_stats_as_nested_dict(dev)),
             ("memory_allocated", lambda: torch.cuda.memory_allocated(dev)),
             ("_C._cuda_memoryStats", lambda: torch._C._cuda_memoryStats(dev)),
             ("reset_peak_memory_stats", lambda: torch.cuda.reset_peak_memory_stats(dev)),
             ("trace_modules read (tr.allocated_now)", lambda: tr.allocated_now(torch, dev)),
             ("trace_modules backward start (tr.peak_and_reset)", lambda: tr.peak_and_reset(torch, dev)))
    for name, fn in calls:
        try:
            fn()
        except Exception as exc:
            out[name + "Us"] = None
            print("%s: %r" % (name, exc))
            continue
        t = time.perf_counter()
        for _ in range(2000):
            fn()
        out[name + "Us"] = (time.perf_counter() - t) / 2000 * 1e6
    tr.PEAKS.__init__()  # forget the peaks carried by the loop above (no push here)
    out["traceRead"] = tr.fast_reads(torch).name()
    print("\nallocator read, us per call: %s" % ", ".join(
        "%s %s" % (k[:-2], "-" if v is None else "%.1f" % v) for k, v in out.items() if k.endswith("Us")))
    print("trace_modules reads through: %s" % out["traceRead"])
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "configs": [], "errors": []}
    try:
        import peft
        report["peft"] = peft.__version__
    except Exception as exc:
        report["errors"].append("peft: %r" % exc)
    print("torch %s, peft %s, %s" % (torch.__version__, report.get("peft"), report["device"]))
    kept = encoder = None
    for label, name, r in (("gpt lora r=8", "gpt", 8), ("gpt lora r=16", "gpt", 16), ("gpt lora r=32", "gpt", 32),
                           ("encoder full fine-tune", "encoder", 0)):
        if time.time() > DEADLINE:
            report["errors"].append("%s: skipped, out of time" % label)
            continue
        try:
            res, model, opt, x = run_config(label, name, r)
            print_config(res)
            report["configs"].append(res)
            if r == 16:
                kept = (model, opt, x)
            elif name == "encoder":
                encoder = (model, opt, x)
            else:
                del model, opt, x
        except Exception:
            print("\n== %s FAILED:\n%s" % (label, traceback.format_exc()))
            report["errors"].append("%s: %s" % (label, traceback.format_exc()[-2000:]))
        gc.collect()
        torch.cuda.empty_cache()
    try:
        report["statsReadCost"] = cost = stats_read_cost()
        if kept is not None and time.time() < DEADLINE:
            report["trace"] = trace_overhead(*kept, cost.get("trace_modules read (tr.allocated_now)Us") or 0.0)
        if encoder is not None and time.time() < DEADLINE:
            report["traceEncoder"] = trace_table("encoder full fine-tune", *encoder)
    except Exception:
        print("\n== trace_modules FAILED:\n%s" % traceback.format_exc())
        report["errors"].append("trace: %s" % traceback.format_exc()[-2000:])
    worst = max((row["relErrExplicit"] for c in report["configs"] for row in c["rows"][:6]
                 if row["relErrExplicit"] is not None), default=math.nan)
    print("\nworst relative error of breakdown() on parameters/gradients/optimizer/static: %.4f %% (target < 5 %%)" % (100 * worst))
    report["worstRelErr"] = worst
    with open(os.path.join(OUT, "breakdown.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print("wrote %s" % os.path.join(OUT, "breakdown.json"))


if __name__ == "__main__":
    main()
