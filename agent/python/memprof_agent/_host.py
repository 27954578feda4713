"""Host memory of the trainer's container: the process
RSS the push already carries, and the cgroup's memory limit and usage, so
a host-memory leak (a growing list of CPU tensors, a DataLoader that
hoards) can be measured against the limit the kernel will OOM-kill at.

Files only, no subprocess, nothing imported: /proc/self/cgroup and
/proc/self/mountinfo once, to find the cgroup directory (v2: the unified
hierarchy; v1: the memory controller's), then per push the usage file and
memory.stat; the limits of the cgroup and its ancestors (a pod's limit can
sit one level above the container's) at most every LIMIT_REFRESH seconds.
Every path starts at `root`, so tests use a fake tree."""

import os
import time

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX rounded to a page
# (9223372036854771712 on x86-64): anything this large is no limit.
UNLIMITED_V1 = 1 << 62
LIMIT_REFRESH = 10.0
MAX_DEPTH = 16


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text):
    try:
        return int(text.strip())
    except (AttributeError, ValueError):
        return None


def parse_cgroup(text):
    """(v2 path or None, v1 memory path or None) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def parse_mounts(text):
    """{"cgroup2": (root, mount point)} and/or {"memory": ...} from
    /proc/self/mountinfo (fields: id parent dev root mountpoint opts ...
    - fstype source superopts)."""
    out = {}
    for line in (text or "").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            out.setdefault("cgroup2", (root, mount))
        elif tail[0] == "cgroup" and len(tail) >= 3 and "memory" in tail[2].split(","):
            out.setdefault("memory", (root, mount))
    return out


def _unescape(field):
    # mountinfo escapes space, tab, newline and backslash as octal.
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def _join(mount, root, path):
    """The directory of cgroup `path` under a mount of hierarchy `root`
    (a container without a cgroup namespace sees its own cgroup mounted as
    the root: the part of the path above it is not in the mount)."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")):]
    joined = os.path.normpath(os.path.join(mount, path.lstrip("/")))
    # A path from another cgroup namespace ("/../..") must not leave the mount.
    return joined if joined == mount or joined.startswith(mount.rstrip("/") + "/") else mount


class HostReader:
    """Finds the cgroup once; read() gives the `host` object of a push."""

    def __init__(self, root="/"):
        self.root = root
        self.kind = None  # "v2" | "v1" | "none" once resolved
        self.dir = None
        self.mount = None
        self._limit = None
        self._limit_at = None

    def _path(self, absolute):
        return os.path.join(self.root, absolute.lstrip("/"))

    def resolve(self):
        v2, v1 = parse_cgroup(_read(self._path("/proc/self/cgroup")))
        mounts = parse_mounts(_read(self._path("/proc/self/mountinfo")))
        for kind, path, key, probe in (("v2", v2, "cgroup2", "memory.current"), ("v1", v1, "memory", "memory.usage_in_bytes")):
            if path is None or key not in mounts:
                continue
            root, mount = mounts[key]
            candidates = [_join(mount, root, path), mount]
            for d in candidates:
                if os.path.exists(self._path(os.path.join(d, probe))):
                    self.kind, self.dir, self.mount = kind, d, mount
                    return
        self.kind = "none"

    def _ancestors(self):
        d, out = self.dir, []
        while len(out) < MAX_DEPTH:
            out.append(d)
            if d == self.mount or d in ("/", ""):
                break
            d = os.path.dirname(d)
        return out

    def limit(self, now):
        """The smallest limit of the cgroup and its ancestors, or None."""
        if self._limit_at is not None and now - self._limit_at < LIMIT_REFRESH:
            return self._limit
        name = "memory.max" if self.kind == "v2" else "memory.limit_in_bytes"
        found = None
        for d in self._ancestors():
            value = _int(_read(self._path(os.path.join(d, name))))  # "max" (v2) parses to None
            if value is not None and value > 0 and not (self.kind == "v1" and value >= UNLIMITED_V1):
                found = value if found is None else min(found, value)
        self._limit, self._limit_at = found, now
        return found

    def usage(self):
        """(usage, working set): usage counts page cache the kernel can
        reclaim before an OOM kill; the working set (usage minus inactive
        file pages, as the kubelet computes it) is what must fit."""
        name = "memory.current" if self.kind == "v2" else "memory.usage_in_bytes"
        usage = _int(_read(self._path(os.path.join(self.dir, name))))
        if usage is None:
            return None, None
        key = "inactive_file" if self.kind == "v2" else "total_inactive_file"
        inactive = None
        for line in (_read(self._path(os.path.join(self.dir, "memory.stat"))) or "").splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                inactive = _int(v)
                break
        working = max(0, usage - inactive) if inactive is not None else None
        return usage, working

    def read(self, rss, now=None):
        """{"rssBytes", "limitBytes", "cgroupUsageBytes", "workingSetBytes",
        "cgroup"}: the cgroup numbers null when there is no cgroup (or no
        limit); never raises."""
        out = {"rssBytes": rss, "limitBytes": None, "cgroupUsageBytes": None}
        try:
            if self.kind is None:
                self.resolve()
            if self.kind in ("v1", "v2"):
                out["cgroup"] = self.kind
                out["limitBytes"] = self.limit(time.monotonic() if now is None else now)
                usage, working = self.usage()
                out["cgroupUsageBytes"] = usage
                if working is not None:
                    out["workingSetBytes"] = working
        except Exception:
            pass
        return out


READER = [HostReader()]


def host_field(push):
    """The push's `host`, from its rssBytes and the cgroup."""
    rss = push.get("rssBytes")
    return READER[0].read(rss if isinstance(rss, int) else None)
