"""The allocation-size pattern (seed 000's `fragment`):
a histogram of the live allocations' request sizes, and how many requests
each pool took since the previous reading, pushed as `sizes` at most every
MIN_INTERVAL seconds.

Two sources:
- "snapshot": torch.cuda.memory._snapshot(): every block of the current
  device; the live ones (state active_*) by their requested_size, the free
  ones (inactive: the fragments a request may not fit in) by size, in
  power-of-two buckets. The call holds the allocator's lock while it
  copies the block table and the GIL while it builds the dicts, so its
  cost is measured at each reading: the next reading waits
  COST_FACTOR x that long (at least MIN_INTERVAL), and a snapshot slower
  than MAX_SNAPSHOT_SECONDS (a huge block table, or allocation history
  recorded with a long trace ring, which the snapshot copies too) ends
  snapshots for good.
- "stats": memory_stats(), which knows only pools: live allocations of at
  most 1 MiB (small pool) and above (large pool; above max_split_size,
  when set, "oversize"). Used when snapshots are off or unavailable.

Both carry `requests`: the allocations each pool served since the
previous reading (from the cumulative allocation.*.allocated counters):
the churn by size class. MEMPROF_AGENT_SIZES=auto (default: snapshot,
else stats) | snapshot | stats | off."""

import time

from . import _torchread as tr
from . import _config

MIN_INTERVAL = 10.0
COST_FACTOR = 100.0  # a reading costs at most 1 % of the daemon thread's time
MAX_SNAPSHOT_SECONDS = 0.25
MIN_LOG2 = 9  # 512 B: the allocator's smallest block
MAX_LOG2 = 40  # 1 TiB: 32 buckets in all, more than any GPU holds
MAX_BUCKETS = MAX_LOG2 - MIN_LOG2 + 1
SMALL = 1 << 20
TOP = 1 << MAX_LOG2


def bucket(size):
    """The smallest power of two >= size, within 2^9 .. 2^40."""
    k = max(MIN_LOG2, (max(1, int(size)) - 1).bit_length())
    return 1 << min(k, MAX_LOG2)


def histogram(sizes):
    """[[upper, count]] ascending, empty buckets left out."""
    counts = {}
    for s in sizes:
        b = bucket(s)
        counts[b] = counts.get(b, 0) + 1
    return [[b, counts[b]] for b in sorted(counts)][:MAX_BUCKETS]


def from_snapshot(snap, device):
    """(live request sizes histogram, free block histogram, live blocks)
    of one device's segments."""
    live, free = [], []
    for seg in snap.get("segments", []):
        if seg.get("device", device) != device:
            continue
        for b in seg.get("blocks", []):
            state = str(b.get("state", ""))
            size = int(b.get("size", 0) or 0)
            if state.startswith("active"):
                live.append(int(b.get("requested_size") or size))
            elif state == "inactive":
                free.append(size)
    return histogram(live), histogram(free), len(live)


def _stat(stats, key):
    try:
        return max(0, int(stats.get(key, 0) or 0))
    except (TypeError, ValueError):
        return 0


def pool_buckets(stats, suffix):
    """Pool counts as buckets: small (<= 1 MiB), large up to max_split_size
    (when set), oversize (above it)."""
    small = _stat(stats, "allocation.small_pool." + suffix)
    large = _stat(stats, "allocation.large_pool." + suffix)
    oversize = _stat(stats, "oversize_allocations." + suffix)
    split = stats.get("max_split_size")
    out = [[SMALL, small]]
    if isinstance(split, int) and SMALL < split < TOP:
        out += [[int(split), max(0, large - oversize)], [TOP, oversize]]
    else:
        out.append([TOP, large])
    return out


class Sizes:
    """The latest `sizes` object and when to read the next."""

    def __init__(self, mode="auto"):
        self.mode = mode if mode in ("auto", "snapshot", "stats", "off") else "auto"
        self.snapshots = self.mode in ("auto", "snapshot")
        self.next_at = 0.0
        self.last = None
        self.prev = None  # (monotonic time, cumulative request counts per pool)
        self._say = _config.Once()

    def field(self, torch, kind, now=None, devices=None):
        """The `sizes` of the push: a new reading when one is due (never in
        an OOM push: the OOM path takes its own snapshot), else the latest."""
        if self.mode == "off" or torch is None or not tr.cuda_ready(torch):
            return self.last
        now = time.monotonic() if now is None else now
        if kind != "oom" and now >= self.next_at:
            self.read(torch, now, devices)
        return self.last

    def read(self, torch, now, devices=None):
        """One reading of the device holding the most memory among the
        push's devices: the daemon thread's current CUDA device is its own
        (0), not necessarily the trainer's."""
        held = [d for d in devices or () if isinstance(d.get("index"), int)]
        if held:
            index = max(held, key=lambda d: (d.get("reservedBytes", 0), -d["index"]))["index"]
        else:
            index = int(torch.cuda.current_device())
        stats = torch.cuda.memory_stats(index)
        out = {"device": index, "at": time.time(), "source": "stats", "buckets": pool_buckets(stats, "current"),
               "inactiveSplits": _stat(stats, "inactive_split.all.current")}
        self._requests(out, stats, now)
        cost = 0.0
        if self.snapshots:
            cost = self._snapshot(torch, index, out)
        self.next_at = now + max(MIN_INTERVAL, COST_FACTOR * cost)
        self.last = out

    def _requests(self, out, stats, now):
        counts = tuple(_stat(stats, k) for k in ("allocation.small_pool.allocated", "allocation.large_pool.allocated"))
        prev, self.prev = self.prev, (now, counts)
        if prev is None or any(c < p for c, p in zip(counts, prev[1])):
            return  # the first reading, or the trainer reset the counters
        out["requests"] = [[SMALL, counts[0] - prev[1][0]], [TOP, counts[1] - prev[1][1]]]
        out["seconds"] = round(now - prev[0], 3)

    def _snapshot(self, torch, index, out):
        t0 = time.perf_counter()
        try:
            snap = torch.cuda.memory._snapshot()
        except Exception as exc:
            self._stop("memprof-agent: no allocator snapshot for the size histogram (%r); pool counts only" % (exc,))
            return 0.0
        cost = time.perf_counter() - t0
        live, free, blocks = from_snapshot(snap, index)
        out.update(source="snapshot", buckets=live, freeBuckets=free, blocks=blocks,
                   snapshotSeconds=round(cost, 6))
        if cost > MAX_SNAPSHOT_SECONDS:
            self._stop("memprof-agent: an allocator snapshot took %.0f ms (over %.0f ms); the size histogram uses pool counts from now on"
                       % (cost * 1e3, MAX_SNAPSHOT_SECONDS * 1e3))
        return cost

    def _stop(self, message):
        self.snapshots = False
        self._say("stop", message)


SIZES = [Sizes()]


def configure(env):
    SIZES[0] = Sizes(_config.get("MEMPROF_AGENT_SIZES", env))


def push_field(push, torch, kind):
    return SIZES[0].field(torch, kind, devices=push.get("devices"))
