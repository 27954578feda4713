"""The agent's environment: every MEMPROF_AGENT_* variable it reads, read
and checked here only (VARS), and the one say-once helper (Once).

get(name, env) returns a variable's value typed, or its default when it is
unset or empty (a flag set to empty is off), or when its value cannot be
used: then one warning per variable and value (a typo never stops the run,
and is never silent).
Each variable is read when its part starts (VARS says when), from the
environment of that moment: a test or a launcher may set it before.

docs/agent.md's and README.md's tables of the variables are generated from
VARS (`python3 agent/python/memprof_agent/_config.py --write`; a test fails
when they are stale). The bootstrap (bootstrap/sitecustomize.py) reads
MEMPROF_AGENT_DISABLE itself, with the same rule as `truthy` here: it runs in
every Python process and must not import this package.

Standard library only; imports nothing of the package (every module may
import it)."""

import logging
import os

log = logging.getLogger("memprof_agent")


class Once:
    """Says each kind of trouble once: the first warning under a key is
    logged, later ones under the same key are not. Each owner keeps its own
    (a new transport says its troubles again)."""

    def __init__(self):
        self._said = set()

    def __call__(self, key, message, *args):
        """Logs `message % args` as a warning unless `key` was said; True when it logged."""
        if key in self._said:
            return False
        self._said.add(key)
        log.warning(message, *args)
        return True

    def clear(self):
        self._said.clear()


# The environment's warnings: one per variable and value.
SAY = Once()

FALSE_WORDS = ("", "0", "false", "no", "off")
DEFAULT_INTERVAL = 1.0
DEFAULT_HISTORY_ENTRIES = 100000
# The ring of allocation/free events torch keeps while recording from high.
# Block frames do not depend on it (a live block keeps its own); it bounds
# the host memory of the trace and the time of a snapshot (which converts
# every entry to Python). Chosen with bench/gpu/history_cost.py (docs/agent.md).
DEFAULT_HISTORY_ENTRIES_AT_HIGH = 20000
DEFAULT_TRACKING_EVERY = 100
SIZES_MODES = ("auto", "snapshot", "stats", "off")


def truthy(value):
    """False for unset, empty, 0, false, no, off (any case, spaces around); else True."""
    return str(value or "").strip().lower() not in FALSE_WORDS


def parse_interval(text, default=DEFAULT_INTERVAL):
    """Seconds from '1', '0.5', '1s' or '500ms'; between 10 ms and 60 s."""
    if text is None or str(text).strip() == "":
        return default
    raw = str(text).strip().lower()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    value = float(raw) * scale
    if not (0.01 <= value <= 60.0):
        raise ValueError("interval %r is outside 10ms..60s" % text)
    return value


class _Unset(Exception):
    """The value says nothing (empty): the default, without a warning."""


def _flag(text):
    return truthy(text)


def _text(text):
    if not text:
        raise _Unset
    return text


def _whole(text):
    raw = text.strip()
    if not raw:
        raise _Unset
    n = int(raw)
    if n < 1:
        raise ValueError(raw)
    return n


def _interval(text):
    if not text.strip():
        raise _Unset
    return parse_interval(text)


def _sizes(text):
    raw = text.strip().lower()
    if not raw:
        raise _Unset
    if raw not in SIZES_MODES:
        raise ValueError(raw)
    return raw


ESTIMATE_TRACKERS = ("auto", "dispatch")


def _tracker(text):
    raw = text.strip().lower()
    if not raw:
        raise _Unset
    if raw not in ESTIMATE_TRACKERS:
        raise ValueError(raw)
    return raw


class Var:
    """One variable: its name, default, parser (text -> value; ValueError:
    unusable), what a good value looks like (`accepts`, said in the
    warning), when it is read, and what it does (the docs' tables)."""

    __slots__ = ("name", "default", "parse", "accepts", "default_text", "read_at", "doc")

    def __init__(self, name, default, parse, accepts, default_text, read_at, doc):
        self.name, self.default, self.parse, self.accepts = name, default, parse, accepts
        self.default_text, self.read_at, self.doc = default_text, read_at, doc


_FLAG = "a flag: unset, empty, `0`, `false`, `no`, `off` are off, anything else on"
VARS = (
    Var("MEMPROF_AGENT_SOCKET", None, _text, "a path", "`/var/run/memprof/agent.sock` if it exists", "`start()`",
        "the sidecar's Unix socket (the injection sets it)"),
    Var("MEMPROF_AGENT_URL", None, _text, "a URL", "unset", "`start()`",
        "opt-in for old sidecars and tests: an `http://` loopback URL, unauthenticated; the socket wins when both are set"),
    Var("MEMPROF_AGENT_INTERVAL", DEFAULT_INTERVAL, _interval, "seconds between 10ms and 60s (`1`, `0.5`, `500ms`, `2s`)",
        "`1`", "`start()`", "seconds between pushes: `1`, `0.5`, `500ms`, `2s` (10 ms to 60 s)"),
    Var("MEMPROF_AGENT_DISABLE", False, _flag, _FLAG, "unset", "`start()`, the bootstrap",
        "`1`/`true`: `start()` does nothing (and the bootstrap does not start the agent)"),
    Var("MEMPROF_AGENT_RECORD_HISTORY", False, _flag, _FLAG, "unset", "`start()`",
        "`1`: record allocation stack frames for the OOM snapshot"),
    Var("MEMPROF_AGENT_HISTORY_ENTRIES", DEFAULT_HISTORY_ENTRIES, _whole, "a whole number >= 1", "`100000`", "`start()`",
        "history ring size when recording from the start"),
    Var("MEMPROF_AGENT_HISTORY_AT_HIGH", True, _flag, _FLAG, "`1`", "`start()`",
        "`0`: do not turn history recording on when the risk reaches high"),
    Var("MEMPROF_AGENT_HISTORY_ENTRIES_AT_HIGH", DEFAULT_HISTORY_ENTRIES_AT_HIGH, _whole, "a whole number >= 1",
        "`20000`", "`start()`", "history ring size when turned on at high"),
    Var("MEMPROF_AGENT_OUTPUT", None, _text, "a path", "unset", "`start()`",
        "write the standalone JSON report here at exit and after an OOM"),
    Var("MEMPROF_AGENT_SUMMARY", None, _text, "a path", "unset", "import, `start()`",
        "write the run's summary (peaks, step time, throughput, breakdown) here at exit, at the step budget and "
        "before an OOM propagates"),
    Var("MEMPROF_AGENT_AUTO_STEP", True, _flag, _FLAG, "`1`", "`start()`",
        "`0`: pushes carry `step` only from `step()`; else, until the first `step()` call, the optimizer steps "
        "taken so far (torch >= 2.0's global optimizer step hook)"),
    Var("MEMPROF_AGENT_MAX_STEPS", None, _whole, "a whole number >= 1", "unset", "import, `start()`",
        "step budget: the (N+1)-th `step()` call pushes, writes the summary and raises `SystemExit(0)`"),
    Var("MEMPROF_AGENT_TIMELINE", False, _flag, _FLAG, "unset", "import",
        "`1`: print the event timeline on stderr at exit"),
    Var("MEMPROF_AGENT_LOG_DIR", None, _text, "a directory", "unset", "the first `record()`",
        "write a timestamped timeline log file in this directory"),
    Var("MEMPROF_AGENT_TRACKING", False, _flag, _FLAG, "unset", "`start()`",
        "`1`: reference tracking from `start()` (report on stderr at exit)"),
    Var("MEMPROF_AGENT_TRACKING_EVERY", DEFAULT_TRACKING_EVERY, _whole, "a whole number >= 1", "`100`", "`start()`",
        "tracking: a sample every N `step()` calls"),
    Var("MEMPROF_AGENT_OOM_SNAPSHOT", None, _text, "a path", "unset", "a CUDA OOM",
        "write the allocator's snapshot (`torch.cuda.memory._snapshot()` pickled, for PyTorch's memory_viz) to this "
        "file at the first CUDA OOM; `{pid}`, `{rank}`, `{device}`, `{host}` are filled in; at most one file per "
        "process and 256 MiB (allocation traces dropped first)"),
    Var("MEMPROF_ESTIMATE_TRACKER", "auto", _tracker, "one of %s" % ", ".join(ESTIMATE_TRACKERS), "`auto`",
        "`memprof estimate`'s fake run",
        "the fake run's tracker: `auto` (PyTorch's MemTracker where torch has it, else the dispatch tracker), "
        "`dispatch` (the dispatch tracker: a way round a MemTracker that fails on some script)"),
    Var("MEMPROF_AGENT_SIZES", "auto", _sizes, "one of %s" % ", ".join(SIZES_MODES), "`auto`", "`start()`",
        "allocation-size histogram: `auto` (allocator snapshot, else pool counts), `snapshot` (the same), "
        "`stats` (pool counts only), `off`"),
)
BY_NAME = {v.name: v for v in VARS}


def get(name, env=None):
    """The value of variable `name` in `env` (default: os.environ now):
    typed; its default when unset, empty (a flag: off) or unusable (said
    once per value)."""
    var = BY_NAME[name]
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return var.default
    try:
        return var.parse(str(raw))
    except _Unset:
        return var.default
    except (TypeError, ValueError):
        fallback = "ignored" if var.default is None else "using " + var.default_text.replace("`", "")
        SAY((name, raw), "memprof-agent: %s=%r is not %s; %s", name, raw, var.accepts.replace("`", ""), fallback)
        return var.default


# --- the docs' tables ------------------------------------------------------

BEGIN = "<!-- env-vars: generated from agent/python/memprof_agent/_config.py by its --write; do not edit -->"
END = "<!-- end env-vars -->"
DOCS = ("docs/agent.md", "agent/python/README.md")


def markdown():
    """The table of every variable, as the docs show it."""
    rows = ["| variable | default | read at | what it does |", "|---|---|---|---|"]
    for v in VARS:
        rows.append("| `%s` | %s | %s | %s |" % (v.name, v.default_text, v.read_at, v.doc))
    return "\n".join(rows) + "\n"


def spliced(text):
    """`text` with the table between BEGIN and END replaced by markdown();
    None when it has no such place."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[:start] + BEGIN + "\n" + markdown() + text[end:]


def _write(root):
    for rel in DOCS:
        path = os.path.join(root, rel)
        with open(path) as f:
            text = f.read()
        new = spliced(text)
        if new is None:
            raise SystemExit("%s has no %r ... %r block" % (rel, BEGIN, END))
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            print("wrote %s" % rel)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        _write(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))
    else:
        sys.stdout.write(markdown())
