"""A trainer on the fake torch (agent/python/tests/fake_torch.py) at a
steady peak: 11 GiB allocated at most, 12 GiB reserved, for argv[2]
seconds. What `memprof profile --points` measures and adds beside an
estimate of the same command (tests/estimate_points.rs).
argv[1]: the folder of fake_torch.py."""
import sys, time

sys.path.insert(0, sys.argv[1])
import fake_torch

fake = fake_torch.install()
import memprof_agent

assert memprof_agent.start(interval=0.2)
GiB = 1 << 30
fake.allocated = 10 * GiB
fake.peak_allocated = 11 * GiB
fake.reserved = 12 * GiB
for n in range(int(float(sys.argv[2]) * 10)):
    memprof_agent.step(n)
    time.sleep(0.1)
