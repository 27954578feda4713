"""`python -m memprof_agent.estimate [flags] -- script ARGS`: one fake run,
or with --vary NAME=v1,v2,... a bisection for the largest value whose
reserved peak fits in --budget-bytes; prints contract.result() as JSON on
stdout. The script's own output goes to stderr. Exit 0 on an answer, 2 on
bad flags, 3 when the script failed under fake tensors (the error on
stderr and in the JSON's "error")."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from . import contract, search
from .child import split_command

FLAGS_PASSED_ON = ("steps", "world_size", "gpu_name", "total_bytes", "workspace_bytes")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m memprof_agent.estimate")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps to run (0: the whole script)")
    p.add_argument("--world-size", type=int, default=1, help="ranks of the fake process group")
    p.add_argument("--gpu-name", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--total-bytes", type=int, default=80 << 30, help="what torch.cuda reports")
    p.add_argument("--budget-bytes", type=int, default=None, help="reserved bytes a run may take to fit")
    p.add_argument("--workspace-bytes", type=int, default=0, help="cuBLAS workspace (measured)")
    p.add_argument("--vary", default=None, help="NAME=v1,v2,...: an environment variable to bisect")
    own, command = split_command(argv)
    args = p.parse_args(own)
    if not command:
        p.error("no script: put it after --, e.g. -- train.py --lr 1e-4")
    args.command = command[1:] if os.path.basename(command[0]).startswith("python") else command
    if args.vary and args.budget_bytes is None:
        p.error("--vary needs --budget-bytes (the bytes a run may reserve)")
    return args


def one_run(args, env_name=None, value=None):
    """One fake run in its own interpreter; its record, or one with "error"."""
    flags = []
    for name in FLAGS_PASSED_ON:
        flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    env = dict(os.environ)
    if env_name is not None:
        env[env_name] = value
        flags += ["--value", value]
    with tempfile.TemporaryDirectory(prefix="memprof-estimate-") as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "memprof_agent.estimate.child", "--out", out, *flags, "--", *args.command]
        subprocess.run(cmd, stdout=sys.stderr, env=env, check=False)
        if not os.path.exists(out):
            return {"error": "the fake run ended without an answer (killed?)", "value": value}
        with open(out) as f:
            return json.load(f)


def fits(record, budget):
    return "error" not in record and record["reservedPeakBytes"] <= budget


def bisect_vary(args):
    """(the record to report, the vary record): the largest fitting value's run."""
    name, values = search.parse_vary(args.vary)
    values = search.ordered(values)
    runs = {}

    def probe(value):
        runs[value] = one_run(args, name, value)
        return fits(runs[value], args.budget_bytes)

    largest, tried = search.largest_fitting(values, probe)
    shown = runs[largest] if largest is not None else runs[tried[-1][0]]
    tried_records = [_tried(runs[v], v, ok) for v, ok in tried]
    return shown, contract.vary_record(name, args.budget_bytes, tried_records, largest)


def _tried(record, value, ok):
    keys = ("allocatedPeakBytes", "reservedPeakBytes", "error")
    return {"value": value, "fits": ok, **{k: record[k] for k in keys if k in record}}


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    if args.vary:
        record, vary = bisect_vary(args)
    else:
        record, vary = one_run(args), None
    answer = contract.result(record.get("torch"), record.get("tracker"), args.world_size,
                             args.steps, record, vary, time.monotonic() - started)
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    if "error" in record and vary is None:
        print(f"error: the script failed under fake tensors: {record['error']}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
