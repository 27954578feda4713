"""Reading the trainer's torch: allocator statistics, device identity, rank,
OOM snapshots. Everything here runs on the agent's daemon thread (or once,
synchronously, at an OOM) and never on a training step.

torch is taken from sys.modules, never imported: the agent must not import
torch into a process that does not use it, nor initialize CUDA in one that
has not (a CUDA context is ~500 MB of every GPU it touches)."""

import os
import sys

# Bounds of the push format (docs/agent-wire.md); the sidecar refuses more.
MAX_DEVICES = 16
MAX_BLOCKS = 16
MAX_FRAMES = 8
MAX_NAME = 64
MAX_FRAME_TEXT = 256
MAX_MESSAGE = 1024
MAX_UUID = 96

# memory_stats() keys -> push fields (docs/agent-wire.md).
_CURRENT = (
    ("allocatedBytes", "allocated_bytes.all.current"),
    ("reservedBytes", "reserved_bytes.all.current"),
    ("activeBytes", "active_bytes.all.current"),
    ("inactiveSplitBytes", "inactive_split_bytes.all.current"),
    ("requestedBytes", "requested_bytes.all.current"),
    ("peakAllocatedBytes", "allocated_bytes.all.peak"),
    ("peakReservedBytes", "reserved_bytes.all.peak"),
    ("peakInactiveSplitBytes", "inactive_split_bytes.all.peak"),
    ("segments", "segment.all.current"),
    ("allocRetries", "num_alloc_retries"),
    ("numOoms", "num_ooms"),
)


def truncate(text, max_bytes, keep_end=False):
    """Cuts text to at most max_bytes of UTF-8 (file paths keep their end,
    which is the informative part)."""
    if text is None:
        return None
    text = str(text)
    raw = text.encode("utf-8", "ignore")
    if len(raw) <= max_bytes:
        return text
    cut = raw[-max_bytes:] if keep_end else raw[:max_bytes]
    return cut.decode("utf-8", "ignore")


def loaded_torch():
    """The torch module if the trainer imported it, else None."""
    return sys.modules.get("torch")


def cuda_ready(torch):
    """Whether CUDA is initialized in this process (reading earlier would
    initialize it from our thread)."""
    try:
        cuda = torch.cuda
        return bool(cuda.is_available() and cuda.is_initialized())
    except Exception:
        return False


class DeviceCache:
    """Per-device facts that never change (UUID, name), read once."""

    def __init__(self):
        self._known = {}

    def identity(self, torch, index):
        if index not in self._known:
            uuid = name = None
            try:
                props = torch.cuda.get_device_properties(index)
                name = truncate(getattr(props, "name", None), MAX_NAME)
                raw = getattr(props, "uuid", None)
                if raw is not None:
                    raw = str(raw)
                    uuid = raw if raw.startswith("GPU-") else "GPU-" + raw
                    uuid = truncate(uuid, MAX_UUID)
            except Exception:
                pass
            self._known[index] = (uuid, name)
        return self._known[index]


def devices_in_use(torch):
    """CUDA ordinals this process trains on: the devices where its allocator
    holds memory, and of those only its local rank's when it is a rank of a
    distributed run that holds memory there (one owner per GPU).

    Not the current device by itself: a torchrun rank that puts its tensors
    on cuda:LOCAL_RANK without set_device keeps current_device() == 0, and
    reporting device 0 would speak for rank 0's GPU (mem_get_info there
    would even create a CUDA context on it). Not every visible device
    either: torchrun ranks often see all 8 GPUs and use one. A rank that
    also holds memory on another rank's device (a stray tensor on cuda:0)
    reports only its own; that memory shows on the other GPU's NVML
    numbers, where the owner's sidecar sees it as another process."""
    cuda = torch.cuda
    count = min(int(cuda.device_count()), MAX_DEVICES)
    used = []
    for i in range(count):
        stats = cuda.memory_stats(i)
        if stats.get("reserved_bytes.all.current", 0) > 0:
            used.append((i, stats))
    _, local_rank, world = ranks(torch)
    own = [d for d in used if d[0] == local_rank]
    if world is not None and world > 1 and own:
        return own
    return used


def read_devices(torch, cache, reset_peaks=True):
    """One entry per device in use: memory_stats() read once, then the
    peaks reset so the next push's peaks cover exactly the interval."""
    out = []
    for index, stats in devices_in_use(torch):
        entry = {"index": index}
        uuid, name = cache.identity(torch, index)
        if uuid:
            entry["uuid"] = uuid
        if name:
            entry["name"] = name
        for field, key in _CURRENT:
            value = stats.get(key)
            if value is not None:
                entry[field] = int(value)
        entry.setdefault("allocatedBytes", 0)
        entry.setdefault("reservedBytes", 0)
        PEAKS.merge_into(index, entry)
        if reset_peaks and not PEAKS.held:
            _hand_to_windows(index, entry.get("peakAllocatedBytes", 0))
            try:
                torch.cuda.reset_peak_memory_stats(index)
            except Exception:
                # No reset: the peak covers more than the interval, never less.
                pass
        try:
            free, total = torch.cuda.mem_get_info(index)
            if total > 0:
                entry["freeBytes"], entry["totalBytes"] = int(free), int(total)
        except Exception:
            pass
        _make_consistent(entry)
        out.append(entry)
    return out


class PeakCarry:
    """Peaks the training thread read just before it reset the allocator's
    peak statistics itself (watch() and trace_modules() measure a step or
    the optimizer step that way). The next push takes the larger of its own
    peak and the carried one, so those resets never hide a peak from the
    sidecar. While `held` > 0 a measurement is running and pushes do not
    reset the peaks (their peaks then cover more than the interval, never
    less)."""

    def __init__(self):
        self.allocated = {}
        self.reserved = {}
        self.split = {}
        self.held = 0

    def carry(self, index, allocated, reserved, split=None):
        self.allocated[index] = max(self.allocated.get(index, 0), int(allocated))
        self.reserved[index] = max(self.reserved.get(index, 0), int(reserved))
        if split is not None:
            self.split[index] = max(self.split.get(index, 0), int(split))

    def merge_into(self, index, entry):
        for field, kept in (("peakAllocatedBytes", self.allocated), ("peakReservedBytes", self.reserved),
                            ("peakInactiveSplitBytes", self.split)):
            peak = kept.pop(index, None)
            if peak is not None:
                entry[field] = max(entry.get(field, 0), peak)


PEAKS = PeakCarry()


def nested_stats(torch, index):
    """The allocator's statistics as torch keeps them (nested dicts), by the
    cheapest call there is (fast_reads): cheaper than memory_stats(), which
    flattens them in Python, and than memory_allocated(), which calls
    memory_stats()."""
    return fast_reads(torch).stats(index)


class FastReads:
    """torch._C._cuda_memoryStats / _cuda_resetPeakMemoryStats: what
    torch.cuda.memory_stats_as_nested_dict / reset_peak_memory_stats call,
    without their Python argument handling (trace_modules reads at every
    module boundary). Private API: used only if the first call returns the
    expected shape; otherwise the public functions, for good."""

    def __init__(self, torch):
        self.torch = torch
        c = getattr(torch, "_C", None)
        self.private_stats = getattr(c, "_cuda_memoryStats", None)
        self.private_reset = getattr(c, "_cuda_resetPeakMemoryStats", None)
        self.stats_checked = self.reset_checked = False

    def stats(self, index):
        if self.private_stats is not None:
            try:
                s = self.private_stats(index)
                if not self.stats_checked:
                    _check_shape(s)
                    self.stats_checked = True
                return s
            except Exception:
                if self.stats_checked:
                    raise  # it worked before: a real failure (a CUDA error)
                self.private_stats = None
        return _public_nested_stats(self.torch, index)

    def reset(self, index):
        if self.private_reset is not None:
            try:
                self.private_reset(index)
                self.reset_checked = True
                return
            except Exception:
                if self.reset_checked:
                    raise
                self.private_reset = None
        self.torch.cuda.reset_peak_memory_stats(index)

    def name(self):
        """Which call stats() uses now (bench/gpu/breakdown_lora.py prints it)."""
        if self.private_stats is not None:
            return "torch._C._cuda_memoryStats"
        if getattr(self.torch.cuda, "memory_stats_as_nested_dict", None) is not None:
            return "torch.cuda.memory_stats_as_nested_dict"
        return "torch.cuda.memory_stats"


def _check_shape(s):
    for key in ("allocated_bytes", "reserved_bytes"):
        int(s[key]["all"]["current"])
        int(s[key]["all"]["peak"])


_FAST = [None]


def fast_reads(torch):
    """The FastReads of this torch module (made once)."""
    f = _FAST[0]
    if f is None or f.torch is not torch:
        f = _FAST[0] = FastReads(torch)
    return f


def _public_nested_stats(torch, index):
    read = getattr(torch.cuda, "memory_stats_as_nested_dict", None)
    if read is not None:
        return read(index)
    flat = torch.cuda.memory_stats(index)
    return {
        "allocated_bytes": {"all": {"current": flat.get("allocated_bytes.all.current", 0),
                                    "peak": flat.get("allocated_bytes.all.peak", 0)}},
        "reserved_bytes": {"all": {"current": flat.get("reserved_bytes.all.current", 0),
                                   "peak": flat.get("reserved_bytes.all.peak", 0)}},
    }


def allocated_now(torch, index):
    """Bytes allocated on device `index` now (one allocator read)."""
    return int(nested_stats(torch, index)["allocated_bytes"]["all"]["current"])


def allocated_now_and_peak(torch, index):
    """(allocated now, allocated peak since the last reset): one read."""
    a = nested_stats(torch, index)["allocated_bytes"]["all"]
    return int(a["current"]), int(a["peak"])


class PeakWindow:
    """One measurement's view of the allocator's peak: every reset of the
    peak statistics by anyone (peak_and_reset) first hands the peak it read
    to every open window, so measurements that reset the peaks inside
    another's interval (trace_modules inside watch()'s step window) never
    shorten it."""

    def __init__(self):
        self.seen = {}

    def observe(self, index, peak):
        self.seen[index] = max(self.seen.get(index, 0), int(peak))


OPEN_WINDOWS = []


def open_window():
    w = PeakWindow()
    OPEN_WINDOWS.append(w)
    return w


def close_window(w):
    try:
        OPEN_WINDOWS.remove(w)
    except ValueError:
        pass


def _hand_to_windows(index, peak):
    for w in list(OPEN_WINDOWS):
        w.observe(index, peak)


def peak_and_reset(torch, index, window=None):
    """(allocated now, allocated peak) since the last reset, then a reset of
    the peaks, the peaks handed to the next push (PeakCarry) and to every
    open window. With `window`: the peak is the largest since that
    window's previous peak_and_reset, whoever reset in between."""
    fast = fast_reads(torch)
    stats = fast.stats(index)
    allocated = stats["allocated_bytes"]["all"]
    reserved = stats["reserved_bytes"]["all"]
    split = stats.get("inactive_split_bytes", {}).get("all", {}).get("peak")
    peak = int(allocated["peak"])
    PEAKS.carry(index, peak, reserved["peak"], split)
    _hand_to_windows(index, peak)
    fast.reset(index)
    if window is not None:
        peak = max(peak, window.seen.pop(index, 0))
    return int(allocated["current"]), peak


def cuda_indices(tensors):
    """CUDA ordinals the given tensors live on (a model's parameters)."""
    out = set()
    for t in tensors:
        device = getattr(t, "device", None)
        if getattr(device, "type", None) == "cuda" and getattr(device, "index", None) is not None:
            out.add(int(device.index))
    return sorted(out)


def _make_consistent(entry):
    """The allocator's numbers are read without its lock held across keys;
    keep the invariants the sidecar checks (docs/agent-wire.md) true."""
    reserved = entry["reservedBytes"]
    if entry["allocatedBytes"] > reserved:
        entry["allocatedBytes"] = reserved
    for field in ("activeBytes", "inactiveSplitBytes"):
        if field in entry and entry[field] > reserved:
            entry[field] = reserved
    if "peakAllocatedBytes" in entry:
        entry["peakAllocatedBytes"] = max(entry["peakAllocatedBytes"], entry["allocatedBytes"])
    if "peakReservedBytes" in entry:
        entry["peakReservedBytes"] = max(entry["peakReservedBytes"], reserved)
    if "peakInactiveSplitBytes" in entry:
        split = max(entry["peakInactiveSplitBytes"], entry.get("inactiveSplitBytes", 0))
        entry["peakInactiveSplitBytes"] = min(split, entry.get("peakReservedBytes", split))
    total = entry.get("totalBytes")
    if total is not None:
        entry["freeBytes"] = min(entry["freeBytes"], total)
        if reserved > total:
            entry.pop("freeBytes")
            entry.pop("totalBytes")


def ranks(torch):
    """(rank, local_rank, world_size): torch.distributed when initialized,
    else the launcher's environment."""

    def env_int(name):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    try:
        dist = torch.distributed if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return rank, env_int("LOCAL_RANK"), world


def record_history(torch, max_entries):
    """Turns on the allocator's history recording (stack frames of every
    allocation from now on), Python frames only: they name the training
    code, and C++ frames cost more. Returns whether it is on."""
    memory = torch.cuda.memory
    try:
        memory._record_memory_history(max_entries=max_entries, stacks="python")
    except TypeError:
        memory._record_memory_history(max_entries=max_entries)
    return True


def _user_frames(frames):
    """The frames that name the trainer's code, innermost first: torch's
    and our own frames say nothing about who allocated."""
    def ours(f):
        name = str(f.get("filename", ""))
        return (
            name.startswith("??")
            or "/torch/" in name
            or "memprof_agent" in name
        )

    picked = [f for f in frames if not ours(f)] or list(frames)
    return [
        {
            "filename": truncate(f.get("filename", ""), MAX_FRAME_TEXT, keep_end=True),
            "line": max(0, int(f.get("line", 0) or 0)),
            "name": truncate(f.get("name", ""), MAX_FRAME_TEXT),
        }
        for f in picked[:MAX_FRAMES]
    ]


def oom_snapshot(torch, device, requested, message):
    """What held the memory: the largest live blocks of `device` (all
    devices when None) from the allocator's own snapshot, with frames when
    history recording is on."""
    snap = {"message": truncate(message or "", MAX_MESSAGE), "source": "none", "blocks": []}
    if device is not None:
        snap["device"] = int(device)
    if requested is not None:
        snap["requestedBytes"] = int(requested)
    try:
        raw = torch.cuda.memory._snapshot()
    except Exception:
        return snap
    blocks, with_frames = [], False
    for seg in raw.get("segments", []):
        if device is not None and seg.get("device", device) != device:
            continue
        for b in seg.get("blocks", []):
            if not str(b.get("state", "")).startswith("active"):
                continue
            frames = _user_frames(b.get("frames") or [])
            with_frames = with_frames or bool(frames)
            blocks.append((int(b.get("size", 0)), b, frames))
    snap["source"] = "history" if with_frames else "segments"
    snap["blocks"] = _largest(blocks, by_site=with_frames)
    return snap


def _largest(blocks, by_site):
    """The top blocks, largest first. With stack frames, blocks allocated at
    the same place are summed: a leak is usually thousands of small tensors
    from one line, which no single block would show."""
    groups = {}
    for size, b, frames in blocks:
        key = (frames[0]["filename"], frames[0]["line"], frames[0]["name"]) if (by_site and frames) else id(b)
        g = groups.get(key)
        if g is None:
            groups[key] = g = {"sizeBytes": 0, "count": 0, "largest": -1}
        g["sizeBytes"] += size
        g["count"] += 1
        if size > g["largest"]:
            g["largest"] = size
            g["state"] = tr_state(b)
            g["frames"] = frames
            g["requested"] = b.get("requested_size")
    out = []
    for g in sorted(groups.values(), key=lambda g: -g["sizeBytes"])[:MAX_BLOCKS]:
        entry = {"sizeBytes": g["sizeBytes"], "state": g["state"], "frames": g["frames"]}
        if g["count"] > 1:
            entry["count"] = g["count"]
        elif g["requested"] is not None:
            entry["requestedBytes"] = int(g["requested"])
        out.append(entry)
    return out


def tr_state(b):
    return truncate(b.get("state", ""), MAX_NAME)


def is_cuda_oom(exc):
    """Whether exc (or what caused it) is a CUDA out-of-memory error."""
    seen = 0
    while exc is not None and seen < 8:
        torch = loaded_torch()
        oom_type = getattr(torch, "OutOfMemoryError", None) if torch else None
        if oom_type is not None and isinstance(exc, oom_type):
            return True
        if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower() and "cuda" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def requested_from_message(message):
    """Bytes a CUDA OOM message says were asked for ('Tried to allocate 2.00 GiB')."""
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    marker = "Tried to allocate "
    at = message.find(marker)
    if at < 0:
        return None
    parts = message[at + len(marker):].split()
    try:
        return int(float(parts[0]) * units[parts[1].rstrip(".;,")])
    except (IndexError, KeyError, ValueError):
        return None
