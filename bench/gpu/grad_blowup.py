#!/usr/bin/env python3
"""GPU proof of memprof_agent.watch_gradients.

A real trainer (bench/gpu/train.py's GPT, small: d=512, 6 layers, bf16
autocast, AdamW, synthetic tokens) in three runs:

  blowup  watch_gradients(model, opt, every=5): 50 clean steps, then the
          learning rate jumps to 1e3. Checks: no flag at any check up to
          step 50 (no false alarm on a healthy run), and a "large" or
          NaN/Inf flag at a check within 20 steps of the jump; the push the
          agent builds carries it (`grads`).
  inject  watch_gradients(model) without the optimizer (the end of every
          5th backward pass, through the autograd engine's callback): at
          step 30 a gradient hook fills blocks.1.fc1.weight's gradient with
          inf; the trainer skips that optimizer step (as GradScaler does).
          Checks: exactly that parameter flagged at step 30, first
          non-finite step 30, the check at 35 clean again.
  cost    median step time without a watch, with a check every step, and
          every 50 steps; the check's own time (one fused norm and one
          device-to-host copy per device).

    OUT=/some/dir python3 bench/gpu/grad_blowup.py

Prints what it saw; exits 1 when a check fails. Under a minute on an H100.
"""
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "agent", "python"))
sys.path.insert(0, HERE)
import memprof_agent  # noqa: E402
from train import GPT  # noqa: E402

OUT = os.environ.get("OUT", ".")
os.makedirs(OUT, exist_ok=True)
VOCAB, D, LAYERS, HEADS, SEQ, BATCH = 4096, 512, 6, 8, 256, 16
FAILED = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def model_and_opt(seed=0, lr=3e-4):
    torch.manual_seed(seed)
    model = GPT(VOCAB, D, LAYERS, HEADS, SEQ).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def batch(step):
    g = torch.Generator(device="cuda").manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda", generator=g)


def forward_backward(model, step):
    x = batch(step)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), x[:, 1:].reshape(-1))
    loss.backward()
    return loss


def blowup():
    model, opt = model_and_opt()
    memprof_agent.watch_gradients(model, opt, every=5)
    seen = {}
    for step in range(1, 81):
        memprof_agent.step(step)
        if step == 51:
            for g in opt.param_groups:
                g["lr"] = 1e3
        forward_backward(model, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        g = memprof_agent.last_gradients()
        if g is not None and g["step"] == step:
            seen[step] = g
            print("  step %3d  global norm %-12s large %-3d non-finite %-3d vanishing %d" % (
                step, "%.4g" % g["globalNorm"] if g["globalNorm"] is not None else "NaN/Inf",
                g["largeCount"], g["nonFiniteCount"], g["vanishingCount"]), flush=True)
    before = [s for s, g in seen.items() if s <= 50 and (g["largeCount"] or g["nonFiniteCount"] or g["vanishingCount"])]
    check(sorted(seen) == list(range(5, 81, 5)), "a check every 5 optimizer steps (%s)" % sorted(seen))
    check(not before, "no flag on the healthy steps 1-50 (flagged at %s)" % before)
    after = [s for s, g in seen.items() if 50 < s <= 70 and (g["largeCount"] or g["nonFiniteCount"])]
    check(bool(after), "the blow-up flagged within 20 steps of the jump (at %s)" % after)
    push = memprof_agent._agent.build("sample")
    g = push.get("grads") or {}
    check(g.get("step") == 80 and (g.get("largeCount", 0) + g.get("nonFiniteCount", 0)) > 0,
          "the push carries the latest check with its flags: %s" % json.dumps({k: g.get(k) for k in ("step", "largeCount", "nonFiniteCount", "firstNonFiniteStep")}))
    return {str(s): {k: g[k] for k in ("globalNorm", "largeCount", "nonFiniteCount", "large", "nonFinite")} for s, g in seen.items()}


def inject():
    model, opt = model_and_opt(seed=1)
    target = "blocks.1.fc1.weight"
    param = dict(model.named_parameters())[target]
    armed = [False]
    param.register_hook(lambda grad: torch.full_like(grad, float("inf")) if armed[0] else None)
    check(memprof_agent.watch_gradients(model, every=5), "armed without an optimizer (autograd engine callback)")
    results = {}
    for step in range(1, 36):
        memprof_agent.step(step)
        armed[0] = step == 30
        forward_backward(model, step)
        g = memprof_agent.last_gradients()
        if g is not None and g["step"] == step:
            results[step] = g
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        if finite:  # skip the step with non-finite gradients, as torch.amp.GradScaler does
            opt.step()
        opt.zero_grad(set_to_none=True)
    at30, at35 = results.get(30, {}), results.get(35, {})
    check(at30.get("nonFinite") == [target], "step 30 flags exactly %s (%s)" % (target, at30.get("nonFinite")))
    check(at30.get("firstNonFiniteStep") == 30 and at30.get("globalNorm") is None, "first non-finite step 30, no global norm")
    check(at35.get("nonFinite") == [] and at35.get("firstNonFiniteStep") == 30, "the check at 35 is clean again")
    check(sorted(results) == [5, 10, 15, 20, 25, 30, 35], "a check at the end of every 5th backward (%s)" % sorted(results))
    return {"flagged": at30.get("nonFinite"), "checks": sorted(results)}


def timed_steps(model, opt, n):
    times = []
    for step in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        memprof_agent.step(step)
        forward_backward(model, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:]) * 1e3


def cost():
    model, opt = model_and_opt(seed=2)
    out = {"without": timed_steps(model, opt, 40)}
    memprof_agent.watch_gradients(model, opt, every=1)
    out["every step"] = timed_steps(model, opt, 40)
    memprof_agent.watch_gradients(model, opt, every=50)
    out["every 50"] = timed_steps(model, opt, 60)
    memprof_agent._grads.unwatch()
    out["without (again)"] = timed_steps(model, opt, 40)
    # The check alone, after a backward (gradients present).
    forward_backward(model, 0)
    w = memprof_agent._grads.GradWatch(torch, model, opt, every=10 ** 9)
    w.remove()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        w.check()
        times.append(time.perf_counter() - t0)
    out["one check"] = statistics.median(times) * 1e3
    out["parameters"] = sum(1 for _ in model.parameters())
    out["copies per check"] = w.detail["copies"]
    for k, v in out.items():
        print("  %-16s %s" % (k, "%.3f ms" % v if isinstance(v, float) else v))
    check(w.detail["copies"] == 1, "one device-to-host copy per check on one GPU")
    return out


def main():
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    memprof_agent.start(interval=60, url="http://127.0.0.1:9/v1/agent")  # pushes are built, not sent
    report = {}
    for name, run in (("blowup", blowup), ("inject", inject), ("cost", cost)):
        print("== %s" % name, flush=True)
        try:
            report[name] = run()
        except Exception as exc:  # the next run still goes
            import traceback

            traceback.print_exc()
            check(False, "%s raised %r" % (name, exc))
    with open(os.path.join(OUT, "grad_blowup.json"), "w") as f:
        json.dump({"failed": FAILED, **report}, f, indent=1, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else str(x))
    print("FAILED: %s" % FAILED if FAILED else "all checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
