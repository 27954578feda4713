#!/usr/bin/env python3
"""The causes of a CUDA OOM other than a leak, for scenarios.py:
each one a real memory pattern on a real GPU, with the time it began.

  DemandRamp    growing demand, no leak: the sequence length ramps so the
                peak demand rises at a set pace (curricula, packed batches);
  Neighbour     a second process on the same GPU grows until the card is
                full, while the trainer is steady (MPS, time-slicing);
  Fragmenter    reserved-but-unallocated memory that no later request can
                use: each tick a fresh CUDA stream carves one segment into
                large blocks it frees and small ones it keeps (a block freed
                on one stream is reused only on that stream: a new CUDA
                stream each tick, through cupy; and a segment
                with a block in use is never released), so the allocator's
                cache grows until cudaMalloc fails with most of the card
                reserved and little allocated; no expandable_segments;
  Spikes        sudden large rises: at given seconds, a share of the free
                memory taken at once and held.

`python3 causes.py neighbour` is the second process (started by Neighbour):
it imports torch, opens its CUDA context, says `ready`, then waits for one
line on stdin (`BYTES MBPS`): it takes BYTES at once and grows MBPS from
there, 10 times a second, until CUDA refuses (the card is full); then it
holds what it has until it is stopped. Its times go to the JSON file named
by its last argument.
"""
import json
import os
import random
import subprocess
import sys
import time

MB = 1_000_000
MIB = 1 << 20


class DemandRamp:
    """The sequence length at each moment: `seq0` until the ramp starts,
    then `tokens_per_s` more per second, in steps of `round_to` (each new
    length is a new set of block sizes for the caching allocator)."""

    def __init__(self, seq0, max_seq, round_to=128):
        self.seq0, self.max_seq, self.round_to = seq0, max_seq, round_to
        self.t0 = None
        self.tokens_per_s = 0.0

    def start(self, t0, bytes_per_token, mbps):
        """From t0, demand rises `mbps` MB/s given what one more token of
        the micro-batch costs at the peak."""
        self.t0 = t0
        self.tokens_per_s = mbps * MB / max(bytes_per_token, 1.0)

    def seq_at(self, now):
        if self.t0 is None:
            return self.seq0
        seq = self.seq0 + self.tokens_per_s * (now - self.t0)
        seq = int(seq) // self.round_to * self.round_to
        return max(self.seq0, min(seq, self.max_seq))


class VarLen:
    """A sequence length per step, uniform in [lo x seq, hi x seq], rounded
    to 64 (variable-length batches: the cache sees many sizes)."""

    def __init__(self, seq, spec, seed):
        lo, _, hi = spec.partition(":")
        self.lo, self.hi = max(64, int(float(lo) * seq)), int(float(hi) * seq)
        self.rng = random.Random(seed)

    def next(self):
        return max(64, self.rng.randint(self.lo, self.hi) // 64 * 64)


class Neighbour:
    """The second process: started at once (its torch import and CUDA
    context take seconds), told when to begin."""

    def __init__(self, record_path):
        self.path = record_path
        # Without the agent: a neighbour on a shared GPU is another pod's
        # process, which cannot push to this pod's sidecar (the sets recorded
        # before this line had it pushing, and the verdict followed it).
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "neighbour", record_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, MEMPROF_AGENT_DISABLE="1"))
        self.started = False

    def ready(self):
        line = self.proc.stdout.readline()
        return line.startswith("ready")

    def begin(self, initial_bytes, mbps):
        self.proc.stdin.write("%d %f\n" % (initial_bytes, mbps))
        self.proc.stdin.flush()
        self.started = True

    def stop(self):
        """Its record: pid, when it began, its first allocation, when the card was full."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {"pid": self.proc.pid}


class Fragmenter:
    """From `t0`, `mbps` MB/s of reserved-but-unallocated memory: per tick a
    fresh stream, one segment carved into `piece` blocks (freed) between
    `keeper` blocks (kept). With `one_keeper`, each segment is pinned by a
    single block instead (the smallest the large pool serves), so the kept
    bytes are 1 MiB a tick: with ticks of 10 s, under the analysis's
    `leakBytesPerSecond` (10 MB a minute), a fragmentation that leaks
    nothing by memprof's own definition (the per-piece keepers leak 4 % of
    the pace: a true leak beside the fragmentation)."""

    PIECE = 48 * MIB + 7 * 4096
    KEEPER = 2_100_000
    # Blocks of 1 MiB or less come from the small pool's own 2 MiB
    # segments and would pin nothing here; 512 B is the allocator's rounding.
    LEAN_KEEPER = MIB + 512

    def __init__(self, torch, device, t0, mbps, tick=0.5, one_keeper=False):
        self.torch, self.dev, self.t0, self.mbps, self.tick = torch, device, t0, mbps, tick
        self.one_keeper = one_keeper
        self.streams, self.keepers = [], []
        self.made = 0
        self.kept = 0  # bytes of the keepers, the fragmenter's own leak
        self.next_tick = t0

    def due(self, now):
        return now >= self.next_tick

    def step(self, now):
        """Carves the segments the pace asks for up to `now`; returns the
        bytes reserved this time."""
        want = self.mbps * MB * (now - self.t0 + self.tick)
        made = 0
        while self.made < want:
            made += self.carve()
        self.next_tick = now + self.tick
        return made

    def fresh_stream(self):
        """A CUDA stream never used before: torch.cuda.Stream() hands out 32
        pooled streams round-robin, whose old holes would serve the next
        ticks (as seen on the H200: reserved stopped at 93 GB). cupy creates
        real new ones; without it, the pool (and the plateau)."""
        t = self.torch
        try:
            import cupy

            raw = cupy.cuda.Stream(non_blocking=True)
            self.streams.append(raw)  # alive as long as its blocks
            return t.cuda.ExternalStream(raw.ptr, device=self.dev)
        except Exception:  # noqa: BLE001 (no cupy, or it cannot make one: the pool)
            s = t.cuda.Stream(device=self.dev)
            self.streams.append(s)
            return s

    def carve(self):
        if self.one_keeper:
            return self.carve_pinned()
        t = self.torch
        n = max(1, int(self.mbps * MB * self.tick // (self.PIECE + self.KEEPER)))
        size = n * (self.PIECE + self.KEEPER)
        s = self.fresh_stream()
        with t.cuda.stream(s):
            whole = t.empty(size, dtype=t.uint8, device=self.dev)
            del whole  # cached on stream s, one segment, nothing in use
            freed = []
            for _ in range(n):
                freed.append(t.empty(self.PIECE, dtype=t.uint8, device=self.dev))
                self.keepers.append(t.empty(self.KEEPER, dtype=t.uint8, device=self.dev))
            del freed
        self.made += size
        self.kept += n * self.KEEPER
        return size

    def carve_pinned(self):
        """One segment of a tick's bytes, pinned by one small block at its
        start; the rest stays free on a stream nothing else uses."""
        t = self.torch
        size = max(int(self.mbps * MB * self.tick) // 512 * 512, 2 * self.LEAN_KEEPER)
        s = self.fresh_stream()
        with t.cuda.stream(s):
            whole = t.empty(size, dtype=t.uint8, device=self.dev)
            del whole  # cached on stream s: the keeper below splits it
            self.keepers.append(t.empty(self.LEAN_KEEPER, dtype=t.uint8, device=self.dev))
        self.made += size
        self.kept += self.LEAN_KEEPER
        return size


class Spikes:
    """`15:0.6,40:1.5`: at 15 s after the start take 60 % of the free memory
    at once, at 40 s 150 % (an OOM); each rise held."""

    def __init__(self, spec):
        self.todo = sorted((float(t), float(f)) for t, _, f in (p.partition(":") for p in spec.split(",") if p))
        self.held = []

    def first(self):
        return self.todo[0][0] if self.todo else None

    def due(self, el):
        return bool(self.todo) and el >= self.todo[0][0]

    def take(self, torch, device):
        _, frac = self.todo.pop(0)
        free, _ = torch.cuda.mem_get_info()
        n = int(free * frac)
        self.held.append(torch.empty(n, dtype=torch.uint8, device=device))
        self.held[-1].fill_(1)
        return n


def neighbour_main(path):
    """The second process (see the module's docstring)."""
    import torch

    rec = {"pid": os.getpid(), "readyAt": None, "from": None, "initialBytes": 0, "fullAt": None, "heldBytes": 0}

    def save():
        with open(path + ".tmp", "w") as f:
            json.dump(rec, f)
        os.replace(path + ".tmp", path)

    torch.cuda.init()
    torch.empty(1, device="cuda")
    rec["readyAt"] = time.time()
    save()
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2:
        return
    initial, mbps = int(line[0]), float(line[1])
    held = [torch.empty(max(initial, 1), dtype=torch.uint8, device="cuda")]
    rec["from"], rec["initialBytes"], rec["heldBytes"] = time.time(), initial, initial
    save()
    grow(torch, held, rec, mbps, save)
    while True:  # the card is full: hold it until stopped
        time.sleep(1)


def grow(torch, held, rec, mbps, save):
    t0, made = rec["from"], 0
    while True:
        want = int(mbps * MB * (time.time() - t0))
        if want - made >= MIB:
            try:
                held.append(torch.empty(want - made, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                rec["fullAt"] = time.time()
                save()
                return
            made = want
            rec["heldBytes"] = rec["initialBytes"] + made
        time.sleep(0.1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "neighbour":
        neighbour_main(sys.argv[2])
    else:
        raise SystemExit("usage: causes.py neighbour RECORD.json (started by scenarios.py)")
