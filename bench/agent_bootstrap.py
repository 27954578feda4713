#!/usr/bin/env python3
"""What the agent's startup hook (agent/python/bootstrap/sitecustomize.py)
costs a Python process that never imports torch: wall time of an
interpreter start, bare and importing a few dozen standard modules (each
first import passes the hook's finder), without and with the hook on
PYTHONPATH, with no bytecode cache (as on the trainers' read-only mount).
A/B runs alternate; prints medians in milliseconds. Then, less noisy, the
hook's own import time and one call of its finder.

    python3 bench/agent_bootstrap.py [RUNS]
"""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BOOTSTRAP = Path(__file__).resolve().parent.parent / "agent" / "python" / "bootstrap"
MODULES = (
    "json, csv, email.message, http.client, urllib.request, xml.etree.ElementTree, "
    "argparse, logging, decimal, fractions, statistics, sqlite3, uuid, tarfile, "
    "zipfile, asyncio, concurrent.futures, subprocess, tempfile, shutil, pathlib, "
    "dataclasses, typing, inspect, ast, difflib, textwrap, pprint, pickle, copy"
)
PROGRAMS = {"bare start": "pass", "30 stdlib imports": f"import {MODULES}"}


def run_once(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return (time.perf_counter() - t0) * 1000


def main(runs: int) -> None:
    # No bytecode cache: the trainers' mount is read-only, so the hook is
    # compiled at every interpreter start there too.
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    hooked = dict(base, PYTHONPATH=str(BOOTSTRAP))
    print(f"python {sys.version.split()[0]}, {runs} runs each, A/B alternating")
    for name, code in PROGRAMS.items():
        a, b = [], []
        run_once(code, base), run_once(code, hooked)  # warm the page cache
        for _ in range(runs):
            a.append(run_once(code, base))
            b.append(run_once(code, hooked))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name:>18}: without {ma:6.2f} ms  with hook {mb:6.2f} ms  "
              f"difference {mb - ma:+5.2f} ms ({(mb / ma - 1) * 100:+.1f} %)")


def hook_import_us(env: dict) -> float:
    """The hook's own import, from `python -X importtime` (cumulative µs)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env,
                         capture_output=True, text=True, check=True).stderr
    lines = [l for l in err.splitlines() if l.split("|")[-1].strip() == "sitecustomize"]
    # The outermost sitecustomize line is ours (the inner one: the chained search).
    return float(lines[-1].split("|")[1])


def finder_call_ns() -> float:
    """One call of the hook's finder for a module that is not torch."""
    import timeit
    sys.path.insert(0, str(BOOTSTRAP))
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("hook_under_bench", BOOTSTRAP / "sitecustomize.py")
        hook = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hook)  # __name__ is not "sitecustomize": installs nothing
    finally:
        sys.path.remove(str(BOOTSTRAP))
    watcher = hook._TorchWatcher()
    n = 1_000_000
    return min(timeit.repeat(lambda: watcher.find_spec("numpy.core", None, None),
                             number=n, repeat=5)) / n * 1e9


def main_parts(runs: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(BOOTSTRAP))
    imports = [hook_import_us(env) for _ in range(runs)]
    print(f"{'hook import':>18}: {statistics.median(imports):6.0f} µs median "
          f"(python -X importtime, {runs} runs)")
    print(f"{'finder per import':>18}: {finder_call_ns():6.0f} ns "
          f"(best of 5 x 1e6 calls; once per module's first import)")


if __name__ == "__main__":
    RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    main(RUNS)
    main_parts(RUNS)
