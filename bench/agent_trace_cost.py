#!/usr/bin/env python3
"""What memprof_agent costs the training thread on the CPU, per step, with
the fake torch of agent/python/tests (no GPU, no torch needed):

  - trace_modules(): a step of a model of 1 embedding + N blocks + head
    (forward hooks, full backward hooks, optimizer step hooks), A/B/A
    against the same step without them;
  - watch() after it has measured (steps 4+): must be nothing;
  - step(n, tokens=, samples=): one call, against a bare field write.

The fake model's step is Python only, so each number here is the agent's
own Python work plus the fake allocator read (a Python function). On a GPU
each allocator read is torch._C._cuda_memoryStats (a C++ call; what
torch.cuda.memory_stats_as_nested_dict calls, falling back to it):
bench/gpu/breakdown_lora.py measures its cost and the real step overhead.
The script prints the reads per step so the two can be combined.

    python3 bench/agent_trace_cost.py [REPEATS]
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "agent", "python", "tests")
sys.path[:0] = [os.path.join(HERE, "..", "agent", "python"), TESTS]

import fake_torch as ft  # noqa: E402

fake = ft.install()
import memprof_agent  # noqa: E402

STEPS = 200


class Block(ft.Module):
    def __init__(self):
        super().__init__()
        self.ln = ft.LayerNorm(64)
        self.fc1, self.fc2 = ft.Linear(64, 256), ft.Linear(256, 64)
        self.fwd_bytes = self.bwd_bytes = 1 << 20


class Net(ft.Module):
    def __init__(self, blocks):
        super().__init__()
        self.emb = ft.Embedding(1000, 64)
        self.blocks = ft.ModuleList(Block() for _ in range(blocks))
        self.head = ft.Linear(64, 1000)


def run(model, opt, steps):
    """Median seconds per step over `steps` steps."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        model(None)
        ft.run_backward(on_thread=False)
        opt.step()
        fake.allocated = 3 << 30
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def trace_cost(blocks, repeats):
    model = Net(blocks)
    opt = ft.AdamW(model.parameters())
    run(model, opt, 20)  # warm
    a, b = [], []
    reads = None
    for _ in range(repeats):
        a.append(run(model, opt, STEPS))
        handle = memprof_agent.trace_modules(model, opt)
        run(model, opt, 1)  # the first step finds the device
        fake.calls.clear()
        run(model, opt, 1)
        reads = "%d allocator reads + %d peak resets" % (
            fake.calls.count("_cuda_memoryStats"), fake.calls.count("_cuda_resetPeakMemoryStats"))
        others = set(fake.calls) - {"_cuda_memoryStats", "_cuda_resetPeakMemoryStats"}
        assert not others, others
        b.append(run(model, opt, STEPS))
        handle.remove()
    a.append(run(model, opt, STEPS))
    without, with_ = statistics.median(a), statistics.median(b)
    print("trace_modules, %2d modules (%2d blocks): without %7.1f us/step, with %7.1f us/step: "
          "+%6.1f us/step (%4.1f us per module), %s per step" % (
              blocks + 2, blocks, without * 1e6, with_ * 1e6, (with_ - without) * 1e6,
              (with_ - without) * 1e6 / (blocks + 2), reads))


def watch_cost(repeats):
    model = Net(8)
    opt = ft.AdamW(model.parameters())
    a, b = [], []
    for _ in range(repeats):
        a.append(run(model, opt, STEPS))
        memprof_agent.watch(model, opt)
        run(model, opt, 4)  # breakdown at 2, activations over 3: done
        fake.calls.clear()
        b.append(run(model, opt, STEPS))
        assert fake.calls == [], fake.calls
    print("watch(), after step 3: without %7.1f us/step, with %7.1f us/step (no torch call per step)" % (
        statistics.median(a) * 1e6, statistics.median(b) * 1e6))


def step_cost(repeats):
    class Bare:
        step = None

    bare = Bare()
    n = 100000
    a, b = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            bare.step = i
        a.append((time.perf_counter() - t) / n)
        memprof_agent._core.MARKERS.__init__()
        t = time.perf_counter()
        for i in range(n):
            memprof_agent.step(i, tokens=4096, samples=8)
        b.append((time.perf_counter() - t) / n)
    print("step(n, tokens=, samples=): %5.0f ns per call (a bare field write in a loop: %3.0f ns)" % (
        statistics.median(b) * 1e9, statistics.median(a) * 1e9))


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print("python %s, fake torch, %d repeats x %d steps, medians, A/B alternating" % (
        sys.version.split()[0], repeats, STEPS))
    for blocks in (6, 14, 30):
        trace_cost(blocks, repeats)
    watch_cost(repeats)
    step_cost(repeats)


if __name__ == "__main__":
    main()
