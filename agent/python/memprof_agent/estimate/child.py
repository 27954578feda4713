"""One fake run of the script, in an interpreter of its own (the patches
and the script's globals never reach the next run): run it under fake
tensors until `steps` optimizer steps have ended, replay the storage trace
through the allocator model, write the record as JSON to `--out`.

    python -m memprof_agent.estimate.child --out F [--steps N] [--world-size W]
        [--gpu-name NAME] [--total-bytes B] [--workspace-bytes B] [--value V] -- script ARGS
"""

import argparse
import json
import runpy
import sys
import traceback

from . import allocator, contract


class StepBudgetReached(BaseException):
    """Ends the script after the last step asked for (a BaseException, so
    the script's own `except Exception` does not swallow it)."""


def split_command(argv):
    """(own flags, the script and its arguments after the first `--`)."""
    if "--" not in argv:
        return list(argv), []
    i = argv.index("--")
    return list(argv[:i]), list(argv[i + 1:])


def parse(argv):
    p = argparse.ArgumentParser(prog="memprof_agent.estimate.child")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--gpu-name", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--total-bytes", type=int, default=80 << 30)
    p.add_argument("--workspace-bytes", type=int, default=0)
    p.add_argument("--value", default=None)
    own, command = split_command(argv)
    args = p.parse_args(own)
    if not command:
        p.error("no script: put it after --, e.g. -- train.py --lr 1e-4")
    args.command = command
    return args


def count_steps(steps, tracker):
    """After each optimizer step: reset MemTracker's per-module stats; stop after `steps`."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    done = {"n": 0}

    def hook(optimizer, args, kwargs):
        done["n"] += 1
        tracker.after_step()
        if steps and done["n"] >= steps:
            raise StepBudgetReached()

    register_optimizer_step_post_hook(hook)
    return done


def run_script(command):
    """The script as `python script ARGS` (or `python -m module ARGS`) would
    run it; SystemExit(0) is an ordinary end."""
    try:
        if command[0] == "-m" and len(command) > 1:
            sys.argv = list(command[1:])
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(command)
            runpy.run_path(command[0], run_name="__main__")
    except StepBudgetReached:
        pass
    except SystemExit as e:
        if e.code not in (None, 0):
            raise


def fake_run(args):
    """The record of one fake run of `args.command`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import fakecuda, tracker as tracking

    devices = fakecuda.install(args.gpu_name, args.total_bytes, args.world_size)
    tracker = tracking.make_tracker()
    done = count_steps(args.steps, tracker)
    with FakeTensorMode(allow_non_fake_inputs=True), devices, tracker:
        run_script(args.command)
    categories, peak = tracker.peak()
    events = [("alloc", "workspace", args.workspace_bytes)] if args.workspace_bytes else []
    replayed = allocator.replay(events + tracker.events)
    record = contract.run_record(categories, peak, replayed, done["n"], args.value)
    record["tracker"] = tracker.name
    record["torch"] = torch.__version__.split("+")[0]
    return record


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        record = fake_run(args)
        code = 0
    except BaseException as e:  # the script's own failure, reported, not raised
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb)
                      if f.filename == args.command[0]), None)
        record = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:400], "at": where}
        traceback.print_exc()
        code = 3
    with open(args.out, "w") as f:
        json.dump(record, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
