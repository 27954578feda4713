#!/usr/bin/env python3
"""What the agent's startup hook (agent/python/bootstrap/sitecustomize.py)
costs a Python process that never imports torch: wall time of an
interpreter start, bare and importing a few dozen standard modules (each
first import passes the hook's finder), without and with the hook on
PYTHONPATH. A/B runs alternate; prints medians in milliseconds.

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


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
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


if __name__ == "__main__":
    main()
