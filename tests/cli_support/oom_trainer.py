"""A trainer on the fake torch (agent/python/tests/fake_torch.py) whose
cache fragments as it runs and which then runs out of memory: what
`memprof profile --output` keeps for `memprof fragment --plot` and
`memprof rollup --memory-viz` (tests/cli_seed_gaps.rs, docs/cli.md).
argv[1]: the folder of fake_torch.py; argv[2]: seconds to run (the agent's
trend keeps one point per 10 s)."""
import sys, time

sys.path.insert(0, sys.argv[1])
import fake_torch

fake = fake_torch.install()
fake_torch.leak_snapshot(fake)
import memprof_agent

assert memprof_agent.start(interval=0.2)
GiB = 1 << 30
fake.reserved = 20 * GiB
steps = int(float(sys.argv[2]) * 10) if len(sys.argv) > 2 else 40
for n in range(steps):
    memprof_agent.step(n)
    # Allocated memory falls while the cache keeps what it reserved.
    fake.allocated = int((18 - 12 * n / steps) * GiB)
    fake.reserved = int((20 + 4 * n / steps) * GiB)
    time.sleep(0.1)
try:
    raise fake.oom()
except fake_torch.OutOfMemoryError:
    time.sleep(1.0)
