"""Allocation history: on from the start when asked (record_history), or
turned on when the verdict reaches high (or the sidecar's answer says
`history: true`), with a bounded ring; at critical, a snapshot of where
the live memory was allocated (file and line, top sites by bytes), pushed
once as `sites` so that it reaches the report before any OOM.

Why not on from the start by default: recording a Python stack for every
allocation costs time on every training step (bench/gpu/history_cost.py
measures it); at high the run has minutes left, and what it allocates from
then on is what grows. Blocks allocated before recording began have no
frames: their bytes are summed as `unattributedBytes`."""

import time

from . import _config
from . import _torchread as tr

# The ring of allocation/free events torch keeps while recording at high
# (MEMPROF_AGENT_HISTORY_ENTRIES_AT_HIGH; _config says why that size).
DEFAULT_ENTRIES_AT_HIGH = _config.DEFAULT_HISTORY_ENTRIES_AT_HIGH
MAX_SITES = 16


class History:
    """Whether recording is on, and why; turns it on at most once."""

    def __init__(self, explicit, explicit_entries, at_high, entries_at_high, say_once):
        self.explicit = explicit
        self.explicit_entries = explicit_entries
        self.at_high = at_high
        self.entries_at_high = entries_at_high
        self.say_once = say_once
        self.on = False
        self.since = None  # monotonic time recording began
        self.entries = None
        self.why = None
        self.failed = False

    def start_if_asked(self):
        """record_history=True: on as soon as CUDA is up."""
        if self.explicit:
            self.turn_on(self.explicit_entries, "asked")

    def turn_on(self, entries, why):
        """Turns recording on (Python frames). Only once CUDA is up:
        turning it on might initialize CUDA from the agent's thread."""
        if self.on or self.failed:
            return self.on
        torch = tr.loaded_torch()
        if torch is None or not tr.cuda_ready(torch):
            return False
        try:
            self.on = tr.record_history(torch, entries)
            self.entries, self.why = entries, why
            self.since = time.monotonic() if self.on else None
        except Exception as exc:
            self.failed = True
            self.say_once("history", "memprof-agent: cannot record allocator history (%r); OOM snapshots will have no stack frames", exc)
        return self.on

    def at_risk(self, why):
        """The verdict reached high (or the sidecar asked)."""
        if self.at_high:
            self.turn_on(self.entries_at_high, why)

    def state(self):
        return {"on": self.on, "entries": self.entries, "why": self.why}


def allocation_sites(torch, level, history, max_sites=MAX_SITES):
    """Where the live memory was allocated: active blocks grouped by their
    first user frame (file, line, function), largest first, at most
    `max_sites`; bytes of blocks without frames in `unattributedBytes`."""
    out = {"time": time.time(), "level": level, "source": "none", "blocks": [], "unattributedBytes": 0,
           "history": history.state()}
    try:
        raw = torch.cuda.memory._snapshot()
    except Exception as exc:
        out["error"] = tr.truncate(repr(exc), tr.MAX_MESSAGE)
        return out
    framed, unattributed = [], 0
    for seg in raw.get("segments", []):
        for b in seg.get("blocks", []):
            if not str(b.get("state", "")).startswith("active"):
                continue
            frames = tr._user_frames(b.get("frames") or [])
            if frames:
                framed.append((int(b.get("size", 0)), b, frames))
            else:
                unattributed += int(b.get("size", 0))
    out["source"] = "history" if framed else "segments"
    out["blocks"] = tr._largest(framed, by_site=True)[:max_sites]
    out["unattributedBytes"] = unattributed
    return out
