# memprof startup hook: starts the in-process agent (memprof_agent) in a
# process once that process imports torch, with no change to its code.
#
# The webhook puts this directory first on PYTHONPATH of the trainer
# containers of Jobs annotated memprof.dev/agent: "python", so every Python
# interpreter of the container imports this file at start-up (site.py imports
# the first `sitecustomize` on sys.path). Hence the rules it keeps:
#
# - Cheap when torch is never imported: this file is all that runs (it is
#   compiled at each start: the shared volume is read-only, so keep it
#   short); it adds one meta-path finder that compares a module's name with
#   "torch" on the first import of each module, imports nothing, prints
#   nothing. The rest (_memprof_bootstrap.py) loads on the import of torch.
# - Never raises and never changes how the program runs: a failure of ours
#   is one line on stderr ("memprof-agent: ..."), once per process.
# - The sitecustomize this file shadows (the image's or the user's, further
#   along sys.path) still runs, after the finder is in place, and its errors
#   are reported by site.py exactly as they would have been without us.
# - Parseable by every Python (2.7 included): the container may run old
#   interpreters for other tools. Python 2 gets nothing but the chaining.
#
# The OpenTelemetry operator's Python auto-instrumentation works the same way
# (a sitecustomize on PYTHONPATH, copied in by an init container), except that
# the agent starts on the import of torch instead of at start-up, and that
# PYTHONPATH stays set for child processes: torchrun's workers and
# torch.multiprocessing.spawn's ranks are the processes that train.

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _TorchWatcher(object):
    """A meta-path finder that finds nothing itself: on the import of torch
    it lets _memprof_bootstrap wrap torch's loader; it leaves sys.meta_path
    once torch has been imported (a failed import of torch is watched again)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            return _load_impl().torch_spec(self, name, path, target)
        except Exception as exc:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _say("not started: cannot load the startup hook (%s: %s); "
                 "training runs without it" % (type(exc).__name__, exc))
            return None


def _say(line):
    try:
        sys.stderr.write("memprof-agent: " + line + "\n")
    except Exception:
        pass


def _load_impl():
    # This directory has left sys.path (see _chain_shadowed): put it back
    # for this one import.
    sys.path.insert(0, _HERE)
    try:
        import _memprof_bootstrap
    finally:
        sys.path.remove(_HERE)
    return _memprof_bootstrap


def _disabled():
    value = os.environ.get("MEMPROF_AGENT_DISABLE", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _chain_shadowed():
    """Imports the `sitecustomize` this one shadows, if any, as
    `sitecustomize`. Its exceptions propagate: site.py reports them as it
    would have without us. This directory leaves sys.path for good, so the
    program sees the sys.path it would have seen (PYTHONPATH keeps it for
    child processes)."""
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or os.curdir) != _HERE]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")
    except ImportError as exc:
        missing = getattr(exc, "name", None) == "sitecustomize" or (
            str(exc) == "No module named sitecustomize")
        if not missing:
            raise
    finally:
        if "sitecustomize" not in sys.modules and mine is not None:
            sys.modules["sitecustomize"] = mine


if __name__ == "sitecustomize":
    # find_spec exists from Python 3.4; PyTorch left Python 2 with 1.5.
    if sys.version_info >= (3, 4) and not _disabled():
        sys.meta_path.insert(0, _TorchWatcher())
    _chain_shadowed()
