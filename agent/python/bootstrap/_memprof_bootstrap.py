"""The part of memprof's startup hook that runs on the import of torch
(sitecustomize.py hands over to torch_spec): wrap torch's loader so that,
right after torch's own code has run, the agent starts; or, where it cannot
run, say why once on stderr. Nothing here may raise into the trainer.

Parseable by Python 3.4+ (no f-strings): an old Python that imports torch
must get the reason, not a SyntaxError.
"""

import os
import sys

MIN_PYTHON = (3, 9)
PREFIX = "memprof-agent: "
# torch's launchers import torch but never train; their workers (new
# interpreters, with this same hook) start their own agents.
LAUNCHER_SCRIPTS = (
    os.path.join("torch", "distributed", "run.py"),
    os.path.join("torch", "distributed", "launch.py"),
)

_said = [False]


def say_once(why):
    """One line on stderr, the first time only; never raises."""
    if _said[0]:
        return
    _said[0] = True
    try:
        sys.stderr.write(PREFIX + why + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def describe(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def too_old(version_info):
    """Why this Python cannot run the agent, or None when it can."""
    if tuple(version_info[:2]) >= MIN_PYTHON:
        return None
    return ("not started: Python %d.%d.%d is older than %d.%d, which "
            "memprof_agent needs; training runs without it"
            % (tuple(version_info[:3]) + MIN_PYTHON))


def is_launcher(argv):
    """True in the process of torchrun or python -m torch.distributed.run/launch."""
    if not argv or not argv[0]:
        return False
    arg0 = os.path.normpath(argv[0])
    if os.path.basename(arg0) == "torchrun":
        return True
    return any(arg0.endswith(os.sep + tail) for tail in LAUNCHER_SCRIPTS)


def start_agent():
    """What runs once torch has been imported."""
    why = too_old(sys.version_info)
    if why is not None:
        say_once(why)
        return
    if is_launcher(getattr(sys, "argv", None)):
        return
    step = "cannot import memprof_agent"
    try:
        import memprof_agent
        step = "memprof_agent.start() failed"
        memprof_agent.start()
    except BaseException as exc:  # SystemExit included: never into the trainer
        if isinstance(exc, KeyboardInterrupt):
            raise
        say_once("not started: %s (%s); training runs without it"
                 % (step, describe(exc)))


class RunAfter(object):
    """torch's own loader, plus `after` once torch's code has run."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # torch sees its own loader (importlib.resources and pkgutil read it).
        try:
            module.__loader__ = self._loader
            module.__spec__.loader = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        try:
            self._after()
        except BaseException as exc:  # never into the trainer's import
            if isinstance(exc, KeyboardInterrupt):
                raise
            say_once("not started: %s; training runs without it" % describe(exc))

    def __getattr__(self, name):
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)


def torch_spec(watcher, name, path=None, target=None, after=start_agent):
    """torch's spec from the meta-path finders other than `watcher`, its
    loader wrapped so that, once torch's code has run, `watcher` leaves
    sys.meta_path and `after` runs; None (the import goes on as if we were
    not there) when it cannot be found or wrapped."""
    def done():
        if watcher in sys.meta_path:
            sys.meta_path.remove(watcher)
        after()

    try:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is watcher or find is None:
                continue
            spec = find(name, path, target)
            if spec is None:
                continue
            if not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = RunAfter(spec.loader, done)
            return spec
        return None
    except Exception as exc:
        say_once("not started: could not watch the import of torch (%s); "
                 "training runs without it" % describe(exc))
        return None
