#!/usr/bin/env python3
"""In-process remediation on a real GPU: a trainer whose
configured micro-batch would hit a CUDA OOM when its sequences grow survives
through memprof's in-process path (verdict in the push's answer -> on_risk
-> MicroBatchLoop: checkpoint on high, split on critical) with the same
global batch, and its loss after N steps matches an unremediated run.

    python3 bench/gpu/inprocess_remediation.py [--steps 60] [--out DIR]
    python3 bench/gpu/inprocess_remediation.py --sidecar-socket /path/agent.sock

Phases, each a fresh process (clean allocator):
  reference   configured micro-batch x accumulation, no memory limit, no agent
  noise       the same with every micro-batch split from the start: the
              floating-point noise of a split (summation order only)
  halved      half the micro-batch, same accumulation: a changed global
              batch, for scale (what a restart with BATCH_SIZE/2 would do)
  control     configured, beside a ballast process that leaves a ceiling
              below its peak, no agent: must end in a CUDA OOM
  remediated  the same with the agent; the verdict comes from the sidecar
              stand-in below (or --sidecar-socket: a real sidecar that
              answers pushes per contract B; its trend needs >= 60 s of
              samples before critical, so give it --steps to match)

The stand-in (this script's parent process, an HTTP server on a Unix
socket) answers each push with a verdict from the agent's own numbers, with
the sidecar's default thresholds: ceiling = reservedBytes + freeBytes; risk
by fraction of the ceiling (0.90 medium, 0.95 high, 0.98 critical) or by
time to OOM from a least-squares fit of the pushed peak over the last 8
pushes (<= 1800 s medium, <= 600 s high, <= 120 s critical). It is not the
sidecar's envelope analysis (shorter trust span: 4 pushes instead of 60 s).

PASS when: control OOMs; remediated finishes all steps, split at least once,
every optimizer step saw micro x accumulation samples, checkpointed once
(file written, `checkpoint` event pushed); |eval loss(remediated) -
eval loss(reference)| <= max(3 x noise, 2e-3 x reference); and the halved
run differs more than the remediated one (the comparison can tell a changed
optimisation). Needs torch with CUDA and the repo's agent; no network.
--cpu-check runs the flow on CPU with a tiny model (stand-in says critical
at the 3rd push; no OOM phases) to check the script itself.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GIB = 1 << 30
LEVELS = ("none", "low", "medium", "high", "critical")


# --- the trainer (child process) -----------------------------------------------------

def trainer(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    cuda = not args.cpu_check
    dev = torch.device("cuda" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sys.path.insert(0, os.path.join(ROOT, "agent", "python"))
    import memprof_agent  # noqa: E402  (the repo's agent; MicroBatchLoop is used by every phase)

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
            self.heads = heads

        def forward(self, x):  # eager attention: memory grows with L^2
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
            s = s.masked_fill(torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1), float("-inf"))
            y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab, d, layers, heads, max_len):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    def walk(seed, batch, length):
        """Random walks mod vocab with steps in {1, 2, 3}: learnable."""
        g = torch.Generator(device=dev).manual_seed(seed)
        start = torch.randint(0, args.vocab, (batch, 1), generator=g, device=dev)
        steps = torch.randint(1, 4, (batch, length), generator=g, device=dev)
        return (start + steps.cumsum(1)) % args.vocab

    torch.manual_seed(0)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq_end + 1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckdir = tempfile.mkdtemp(prefix="memprof-inproc-")
    saved = []

    def checkpoint(step):
        path = os.path.join(ckdir, "step%d.pt" % step)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
        saved.append(path)

    loop = memprof_agent.MicroBatchLoop(accumulation=args.accum, checkpoint=checkpoint, register=bool(args.agent))
    if args.split_from_start:
        loop.request_split()
    if args.agent:
        assert memprof_agent.start(interval=args.interval), "agent did not start"
    out = {"phase": args.phase, "losses": [], "samples_per_step": [], "factor_at": [], "oom": None}
    t0 = time.time()
    try:
        for step in range(args.steps):
            length = args.seq_start + (args.seq_end - args.seq_start) * step // max(1, args.steps - 1)
            length -= length % 16
            memprof_agent.step(step)
            samples = 0
            for j in range(args.accum):
                batch = walk(1_000_003 * step + j, args.micro, length + 1)[: args.micro_used]
                for part in loop.parts(batch):
                    logits = model(part.data[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, args.vocab), part.data[:, 1:].reshape(-1))
                    part.backward(loss)
                    samples += part.data.shape[0]
                    del logits, loss
            out["losses"].append(float(loop.last_loss))
            assert loop.step_due()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["samples_per_step"].append(samples)
            out["factor_at"].append(loop.factor)
    except torch.OutOfMemoryError as exc:
        out["oom"] = {"step": step, "length": length, "message": str(exc)[:200]}
    out["seconds"] = time.time() - t0
    out["steps_done"] = len(out["losses"])
    if out["oom"] is None:
        model.eval()
        with torch.no_grad():
            ev = walk(999, 16, args.seq_start + 1)
            out["eval_loss"] = float(F.cross_entropy(model(ev[:, :-1]).reshape(-1, args.vocab), ev[:, 1:].reshape(-1)))
    if cuda:
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        out["free_at_end"], out["total"] = free, total
    out["checkpoints"] = saved
    out["checkpoint_bytes"] = [os.path.getsize(p) for p in saved]  # written, not just named
    shutil.rmtree(ckdir, ignore_errors=True)  # nothing left behind
    out["checkpoint_events"] = [e[2] for e in memprof_agent._core.MARKERS.kept if e[1] == "checkpoint"]
    out["remedy"] = memprof_agent.report()["risk"] if args.agent else None
    if args.agent:
        memprof_agent.stop()
    with open(args.result, "w") as f:
        json.dump(out, f)


# --- the sidecar stand-in (parent process) ---------------------------------------------

class StandIn:
    """Contract B over AF_UNIX: answers each push with a verdict from its numbers."""

    def __init__(self, path, cpu_check):
        import http.server
        import socketserver

        self.path, self.cpu_check = path, cpu_check
        self.pushes, self.points, self.verdicts = [], [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                push = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = json.dumps(outer.answer(push)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

            def address_string(self):
                return "unix"

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(path, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, push):
        self.pushes.append(push)
        risk, tto = self.risk(push)
        self.verdicts.append((push.get("step"), risk, tto))
        return {"accepted": True, "verdict": {"risk": risk, "ttoSeconds": tto, "leak": False, "source": "agent", "at": time.time()},
                "directives": [], "history": False}

    def risk(self, push):
        if self.cpu_check:
            return ("critical" if len(self.pushes) >= 3 else "low"), None
        d = (push.get("devices") or [None])[0]
        if not d or "freeBytes" not in d:
            return "none", None
        ceiling = d["reservedBytes"] + d["freeBytes"]
        peak = max(d.get("peakReservedBytes", 0), d.get("peakAllocatedBytes", 0))
        self.points = (self.points + [(push["time"], d.get("peakAllocatedBytes", d["allocatedBytes"]))])[-8:]
        by_fraction = 4 if peak >= 0.98 * ceiling else 3 if peak >= 0.95 * ceiling else 2 if peak >= 0.90 * ceiling else 1
        tto, by_trend = None, 0
        if len(self.points) >= 4:
            ts, ys = zip(*self.points)
            mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
            var = sum((t - mt) ** 2 for t in ts)
            slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var > 0 else 0.0
            if slope > 0:
                tto = max(0.0, (ceiling - ys[-1]) / slope)
                by_trend = 4 if tto <= 120 else 3 if tto <= 600 else 2 if tto <= 1800 else 0
        return LEVELS[max(by_fraction, by_trend)], tto

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# --- orchestration --------------------------------------------------------------------

def run_phase(args, phase, out_dir, env_extra=None, **flags):
    result = os.path.join(out_dir, phase + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--phase", phase, "--result", result]
    for k, v in vars(args).items():
        if k in ("child", "phase", "result", "out", "sidecar_socket") or v is None or v is False:
            continue
        cmd += ["--" + k.replace("_", "-")] + ([] if v is True else [str(v)])
    for k, v in flags.items():
        cmd += ["--" + k.replace("_", "-")] + ([] if v is True else [str(v)])
    env = dict(os.environ, **(env_extra or {}))
    started = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    with open(os.path.join(out_dir, phase + ".log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if not os.path.exists(result):
        raise SystemExit("FAIL: phase %s crashed (exit %d): %s" % (phase, proc.returncode, proc.stderr[-2000:]))
    with open(result) as f:
        r = json.load(f)
    r["wall"] = time.time() - started
    return r


def ballast(args, ceiling):
    """A process holding GPU memory so that `ceiling` bytes (plus 1 GiB for
    the trainer's CUDA context) stay free; returns it once it holds it."""
    code = ("import sys, torch; free, _ = torch.cuda.mem_get_info(); n = free - %d - %d; "
            "x = torch.empty(max(n, 0), dtype=torch.uint8, device='cuda'); print('held', n, flush=True); "
            "sys.stdin.read()") % (ceiling, GIB)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("held"):
        p.kill()
        raise SystemExit("FAIL: the ballast process did not start: %r" % line)
    return p, int(line.split()[1])


def control_ceiling(res):
    """Bytes the control and remediated runs may use: halfway between what
    the split run and the configured run allocated at their peaks. Not from
    the reserved peaks: with sequences of growing length the caching
    allocator reserves far more than it hands out (on the H100, 78 GiB
    reserved for a 7.9 GiB allocated peak) and frees that cache and retries
    before it raises, so a run OOMs only when its allocated peak (plus
    fragmentation) does not fit."""
    lo = res["noise"]["peak_allocated"]
    hi = res["reference"]["peak_allocated"]
    # The ballast leaves the ceiling plus 1 GiB free and the CUDA context
    # takes about half of that: keep the configured run's peak at least
    # 1 GiB over the ceiling.
    if hi - lo < 2 * GIB:
        raise SystemExit("FAIL: no room for a ceiling: the split run allocated %.2f GiB at its peak and the "
                         "configured run %.2f GiB; raise --seq-end or --micro" % (lo / GIB, hi / GIB))
    return (lo + hi) // 2


def parent(args):
    out_dir = args.out or tempfile.mkdtemp(prefix="memprof-inproc-bench-")
    os.makedirs(out_dir, exist_ok=True)
    res = {"reference": run_phase(args, "reference", out_dir)}
    res["noise"] = run_phase(args, "noise", out_dir, split_from_start=True)
    res["halved"] = run_phase(args, "halved", out_dir, micro_used=args.micro // 2)
    held, standin, sock = None, None, args.sidecar_socket
    if not args.cpu_check:
        ceiling = control_ceiling(res)
        held = ballast(args, ceiling)
        res["ceiling"] = ceiling
    try:
        if not args.cpu_check:
            res["control"] = run_phase(args, "control", out_dir)
        if sock is None:
            sock_dir = tempfile.mkdtemp(prefix="memprof-inproc-sock-")
            sock = os.path.join(sock_dir, "agent.sock")
            standin = StandIn(sock, args.cpu_check)
        res["remediated"] = run_phase(args, "remediated", out_dir, {"MEMPROF_AGENT_SOCKET": sock}, agent=True)
    finally:
        if held is not None:
            held[0].kill()
            held[0].wait()
        if standin is not None:
            standin.close()
            shutil.rmtree(os.path.dirname(sock), ignore_errors=True)
    if standin is not None:
        res["standin"] = {"pushes": len(standin.pushes), "verdicts": standin.verdicts[:400],
                          "checkpoint_pushed": any(e.get("name") == "checkpoint" for p in standin.pushes for e in p.get("events", []))}
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(res, f, indent=1)
    return verdict(args, res, out_dir)


def verdict(args, res, out_dir):
    ref, noise, halved, rem = res["reference"], res["noise"], res["halved"], res["remediated"]
    checks = []

    def check(name, ok, detail):
        checks.append(ok)
        print("%-4s %-34s %s" % ("ok" if ok else "FAIL", name, detail))

    print("phase        steps  eval_loss   peak_reserved  peak_allocated  seconds  (results in %s)" % out_dir)
    for k in ("reference", "noise", "halved", "control", "remediated"):
        r = res.get(k)
        if r:
            print("%-11s %6d  %-10s %9.2f GiB  %10.2f GiB  %7.1f" % (
                k, r["steps_done"], "%.6f" % r["eval_loss"] if "eval_loss" in r else "OOM",
                r.get("peak_reserved", 0) / GIB, r.get("peak_allocated", 0) / GIB, r["seconds"]))
    if not args.cpu_check:
        c = res["control"]
        check("control hits a CUDA OOM", c["oom"] is not None, "at step %s, seq %s; ceiling %.2f GiB" % (
            (c["oom"] or {}).get("step"), (c["oom"] or {}).get("length"), res["ceiling"] / GIB))
    check("remediated runs every step", rem["oom"] is None and rem["steps_done"] == args.steps, "%d/%d steps, oom=%s" % (rem["steps_done"], args.steps, rem["oom"]))
    split_at = next((i for i, f in enumerate(rem["factor_at"]) if f > 1), None)
    check("it split the micro-batch", split_at is not None, "factor %s from step %s" % (rem["factor_at"][-1] if rem["factor_at"] else None, split_at))
    want = args.micro * args.accum
    check("global batch kept every step", set(rem["samples_per_step"]) == {want}, "%s samples/step (want %d)" % (sorted(set(rem["samples_per_step"])), want))
    pushed = res.get("standin", {}).get("checkpoint_pushed", True)  # a real sidecar: see its report
    check("checkpoint on high", len(rem["checkpoints"]) == 1 and all(rem.get("checkpoint_bytes", [0])) and len(rem["checkpoint_events"]) == 1 and pushed,
          "files %d, events %s, pushed to the sidecar %s" % (len(rem["checkpoints"]), rem["checkpoint_events"], pushed))
    e_ref = ref["eval_loss"]
    floor = abs(noise["eval_loss"] - e_ref)
    diff = abs(rem["eval_loss"] - e_ref) if "eval_loss" in rem else float("inf")
    bound = max(3 * floor, 2e-3 * e_ref)
    check("loss matches the reference", diff <= bound, "|%.6f - %.6f| = %.2e <= max(3 x noise %.2e, 2e-3 x ref) = %.2e" % (
        rem.get("eval_loss", float("nan")), e_ref, diff, floor, bound))
    dh = abs(halved["eval_loss"] - e_ref)
    check("a changed global batch differs more", dh > diff, "halved micro-batch: |diff| = %.2e vs remediated %.2e" % (dh, diff))
    ok = all(checks)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--seq-start", type=int, default=256)
    ap.add_argument("--seq-end", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--interval", type=float, default=0.25, help="agent push interval, seconds")
    ap.add_argument("--out")
    ap.add_argument("--sidecar-socket")
    ap.add_argument("--cpu-check", action="store_true")
    # child-only
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--phase")
    ap.add_argument("--result")
    ap.add_argument("--agent", action="store_true")
    ap.add_argument("--split-from-start", action="store_true")
    ap.add_argument("--micro-used", type=int)
    args = ap.parse_args()
    if args.cpu_check and not args.child:
        args.steps, args.seq_start, args.seq_end = min(args.steps, 12), 32, 64
        args.vocab, args.dim, args.layers, args.heads, args.micro = 64, 32, 2, 2, 8
        args.interval = 0.05
    if args.child:
        args.micro_used = args.micro_used or args.micro
        trainer(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
