"""Reference tracking (seed 000's --enable-tracking),
opt-in: what kinds of objects grow between two points of a run.

A sample walks gc.get_objects() once: Python objects counted by type, and
the live tensors among them grouped by (device, dtype, shape, allocating
site) with their count and bytes (each memory region once: device,
data_ptr, numel, dtype, as the breakdown counts). Samples are taken at
step() boundaries (every N-th call: the same point of every step, so
activations in flight do not read as growth), or by tracking_sample().
The comparison of the last two samples (top growers, bounded) rides in
every push as `tracking` and is printed by tracking_report().

What it cannot see: objects the garbage collector does not track (str,
bytes, int, containers of only those: a list that grows counts once),
tensors held only by C++ (autograd's saved tensors). The allocating site
comes from the allocator's history (torch.cuda.memory._snapshot() blocks'
frames: CUDA tensors allocated while history recording was on); otherwise
it is unknown, and the report says so.

Cost: the walk is on the training thread, inside the step() call that
takes the sample: ~O(objects) at C speed for the type counts plus a few
microseconds per tensor (bench/gpu/tracking_cost.py measures it). The
samples are kept as dicts of str -> int, which the garbage collector does
not track, so a sample never counts the previous one."""

import bisect
import collections
import gc
import os
import sys
import time

from . import _config
from . import _torchread as tr

DEFAULT_EVERY = _config.DEFAULT_TRACKING_EVERY
MAX_GROUPS = 4096
MAX_TOP = 32
MAX_SITE = 128
MAX_TYPE = 64
MAX_DIMS = 8
MAX_SNAPSHOT_SECONDS = 1.0
SEP = "\x1f"


def type_name(t):
    module = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", "?")
    return name if module in (None, "builtins") else "%s.%s" % (module, name)


def _shape_text(shape):
    dims = [int(d) for d in shape]
    text = "x".join(map(str, dims[:MAX_DIMS]))
    return text + ("x..." if len(dims) > MAX_DIMS else "")


def site_map(torch):
    """A lookup from a CUDA address to the allocating site of the live
    block holding it, from the allocator's snapshot (blocks with frames
    exist only for allocations made while history recording was on).
    Returns (lookup or None, seconds the snapshot took)."""
    t0 = time.perf_counter()
    snap = torch.cuda.memory._snapshot()
    cost = time.perf_counter() - t0
    starts, ends, sites = [], [], []
    blocks = []
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            frames = b.get("frames") or []
            if frames and str(b.get("state", "")).startswith("active") and "address" in b:
                blocks.append((int(b["address"]), int(b.get("size", 0)), frames))
    blocks.sort(key=lambda x: x[0])
    for address, size, frames in blocks:
        f = tr._user_frames(frames)[0]
        starts.append(address)
        ends.append(address + size)
        sites.append(tr.truncate("%s:%d %s" % (f["filename"], f["line"], f["name"]), MAX_SITE, keep_end=True))
    if not starts:
        return None, cost

    def lookup(ptr):
        i = bisect.bisect_right(starts, ptr) - 1
        return sites[i] if i >= 0 and ptr < ends[i] else None

    return lookup, cost


def _describe(t, lookup):
    """(group key, bytes, region) of one tensor."""
    device = str(t.device)
    dtype = str(t.dtype).replace("torch.", "")
    numel, size = int(t.numel()), int(t.element_size())
    ptr = int(t.data_ptr()) if numel else 0
    site = lookup(ptr) if lookup is not None and ptr and device.startswith("cuda") else None
    key = SEP.join((device, dtype, _shape_text(t.shape), site or ""))
    return key, numel * size, (device, ptr, numel, dtype) if ptr else None


class Sample:
    """One walk: counts and bytes per tensor group, counts per type."""

    def __init__(self, step, label):
        self.step, self.label = step, label
        self.t = time.time()
        self.mono = time.monotonic()
        self.counts, self.bytes, self.types = {}, {}, {}
        self.objects = self.tensors = self.tensor_bytes = 0
        self.seconds = 0.0
        self.sites = False


def own_objects(roots):
    """The containers reachable from `roots` through dicts and lists: the
    tracker's own previous results, which a walk must not count."""
    out, stack = [], list(roots)
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            out.append(o)
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, collections.deque)):
            out.append(o)
            stack.extend(o)
        elif isinstance(o, Sample):
            out.append(o)
    return out


def take(torch, step=None, label=None, lookup=None, exclude=(), collect=True):
    """Walks the live objects once (leaving out `exclude`: the tracker's
    own state); returns a Sample."""
    t0 = time.perf_counter()
    s = Sample(step, label)
    if collect:
        gc.collect()  # garbage in reference cycles is not live: it must not read as growth
    objs = gc.get_objects()
    by_type = collections.Counter(map(type, objs))
    ours = [o for o in own_objects(exclude) if gc.is_tracked(o)]
    by_type.subtract(collections.Counter(map(type, ours)))
    s.objects = len(objs) - len(ours)
    del ours
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    tensor_types = set()
    for t, n in by_type.items():
        if n <= 0:
            continue
        name = type_name(t)
        s.types[name] = s.types.get(name, 0) + n
        if tensor_type is not None and isinstance(t, type) and issubclass(t, tensor_type):
            tensor_types.add(t)
    tensors = [o for o in objs if type(o) in tensor_types] if tensor_types else []
    del objs, by_type
    regions = set()
    for t in tensors:
        try:
            key, nbytes, region = _describe(t, lookup)
        except Exception:
            continue  # sparse, fake or meta tensors without storage
        if key not in s.counts and len(s.counts) >= MAX_GROUPS:
            key = SEP.join(key.split(SEP)[:2] + ["*", ""])  # over the cap: one group per device and dtype
        if region is not None:
            if region in regions:
                nbytes = 0
            regions.add(region)
        s.counts[key] = s.counts.get(key, 0) + 1
        s.bytes[key] = s.bytes.get(key, 0) + nbytes
        s.tensors += 1
        s.tensor_bytes += nbytes
    s.seconds = time.perf_counter() - t0
    return s


def _group(key):
    device, dtype, shape, site = key.split(SEP)
    return {"device": tr.truncate(device, tr.MAX_NAME), "dtype": tr.truncate(dtype, tr.MAX_NAME),
            "shape": None if shape == "*" else [int(d) for d in shape.split("x") if d.isdigit()][:MAX_DIMS],
            "site": tr.truncate(site, MAX_SITE, keep_end=True) or None}


def compare(prev, cur, top=MAX_TOP):
    """The push's `tracking`: the top growers from prev to cur."""
    growth = []
    for key, count in cur.counts.items():
        dc, db = count - prev.counts.get(key, 0), cur.bytes[key] - prev.bytes.get(key, 0)
        if dc > 0 or db > 0:
            growth.append((db, dc, key))
    growth.sort(key=lambda x: (-x[0], -x[1], x[2]))
    tensors = [dict(_group(key), count=dc, bytes=db, liveCount=cur.counts[key], liveBytes=cur.bytes[key])
               for db, dc, key in growth[:top]]
    types = sorted(((n - prev.types.get(name, 0), name) for name, n in cur.types.items()), key=lambda x: (-x[0], x[1]))
    objects = [{"type": tr.truncate(name, MAX_TYPE, keep_end=True), "count": d, "live": cur.types[name]}
               for d, name in types[:top] if d > 0]
    return {
        "fromStep": prev.step, "toStep": cur.step, "seconds": round(cur.mono - prev.mono, 3), "at": cur.t,
        "siteSource": "history" if cur.sites else "none", "scannedObjects": cur.objects,
        "liveTensors": cur.tensors, "liveTensorBytes": cur.tensor_bytes, "sampleSeconds": round(cur.seconds, 6),
        "tensors": tensors, "objects": objects,
    }


class Tracker:
    """The opt-in state: every (0: off), the last two samples, the latest
    comparison, whether to look up sites."""

    def __init__(self):
        self.every = 0
        self.samples = collections.deque(maxlen=2)
        self.result = None
        self.history_on = lambda: False
        self.sites = None  # None: when the agent records history; True/False: forced
        self._say = _config.Once()

    def configure(self, enabled, every=DEFAULT_EVERY, sites=None):
        self.every = max(1, int(every)) if enabled else 0
        self.sites = sites
        if not enabled:
            self.result = None

    def _lookup(self, torch):
        want = self.sites if self.sites is not None else self.history_on()
        if not want or torch is None or not tr.cuda_ready(torch):
            return None
        lookup, cost = site_map(torch)
        if cost > MAX_SNAPSHOT_SECONDS:
            self.sites = False
            self._say("slow", "memprof-agent: tracking: the allocator snapshot took %.1f s; allocating sites are no longer looked up", cost)
        return lookup

    def sample(self, step=None, label=None):
        """Takes a sample now; returns the comparison with the previous one
        (None after the first). Never raises."""
        try:
            torch = tr.loaded_torch()
            lookup = None
            try:
                lookup = self._lookup(torch)
            except Exception as exc:
                self._say("sites", "memprof-agent: tracking: no allocator snapshot for the allocating sites (%r)", exc)
            s = take(torch, step=step, label=label, lookup=lookup, exclude=(self.result, self.samples))
            s.sites = lookup is not None
            self.samples.append(s)
            if len(self.samples) == 2:
                self.result = compare(self.samples[0], self.samples[1])
            return self.result if len(self.samples) == 2 else None
        except Exception as exc:
            self._say("sample", "memprof-agent: tracking sample failed (%r)", exc)
            return None

    def at_step(self, calls, step):
        if self.every and calls % self.every == 0:
            self.sample(step=step)


TRACKER = Tracker()


def push_field(push, torch, kind):
    return TRACKER.result if TRACKER.every else None


def report(tracker=None):
    """The text tracking_report() returns."""
    t = tracker or TRACKER
    if len(t.samples) < 2 or t.result is None:
        n = len(t.samples)
        return ("memprof tracking: %d sample(s) so far; growth needs two (memprof_agent.track(every=N) samples "
                "every N steps, memprof_agent.tracking_sample() now)" % n)
    r = t.result
    span = "step %s to step %s" % (r["fromStep"], r["toStep"]) if r["toStep"] is not None else "the last two samples"
    lines = ["memprof tracking: what grew from %s (%.1f s apart; a sample took %.0f ms over %d objects)"
             % (span, r["seconds"], r["sampleSeconds"] * 1e3, r["scannedObjects"])]
    site_note = ("allocating site from the allocator's history" if r["siteSource"] == "history" else
                 "allocating site unknown: allocation history recording is off (MEMPROF_AGENT_RECORD_HISTORY=1 or start(record_history=True))")
    lines.append("Tensors: %d live, %s (%s)" % (r["liveTensors"], _mib(r["liveTensorBytes"]), site_note))
    if r["tensors"]:
        lines.append("  %8s %12s  %-8s %-9s %-16s %s" % ("+count", "+bytes", "device", "dtype", "shape", "site"))
        for g in r["tensors"]:
            shape = "(over %d groups)" % MAX_GROUPS if g["shape"] is None else ("x".join(map(str, g["shape"])) or "scalar")
            lines.append("  %+8d %12s  %-8s %-9s %-16s %s" % (g["count"], "+" + _mib(g["bytes"]), g["device"], g["dtype"], shape, g["site"] or "?"))
    else:
        lines.append("  no tensor group grew")
    lines.append("Python objects by type (tracked by the garbage collector; str/int/bytes are not):")
    if r["objects"]:
        lines.extend("  %+8d  %8d live  %s" % (o["count"], o["live"], o["type"]) for o in r["objects"][:16])
    else:
        lines.append("  no type grew")
    return "\n".join(lines)


def _mib(n):
    return "%.1f MiB" % (n / float(1 << 20))


def configure_from_env(env):
    """MEMPROF_AGENT_TRACKING=1 (and MEMPROF_AGENT_TRACKING_EVERY=N); the
    report goes to stderr at exit when asked through the environment."""
    if not _config.get("MEMPROF_AGENT_TRACKING", env):
        return False
    TRACKER.configure(True, _config.get("MEMPROF_AGENT_TRACKING_EVERY", env))
    return True


def print_at_exit(pid=os.getpid()):
    try:
        if TRACKER.every and os.getpid() == pid and TRACKER.samples:
            sys.stderr.write(report() + "\n")
    except Exception:
        pass
