"""`memprof profile -- COMMAND` on one box: the real memprof CLI and
sidecar (sim backend), a Python command with the fake torch whose agent
pushes to the sidecar the CLI started; the command's exit status comes back
and --output holds the agent's numbers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HERE, ROOT


def memprof_binary():
    path = os.environ.get("MEMPROF_BIN") or str(ROOT / "target" / "debug" / "memprof")
    if not os.access(path, os.X_OK):
        pytest.fail("no memprof binary at %s: run `cargo build -p memprof --bin memprof` or set MEMPROF_BIN" % path)
    return path


def test_profile_runs_the_command_next_to_a_sidecar_that_takes_its_pushes(workdir):
    scenario = workdir / "scenario.yaml"
    scenario.write_text("default: { baseGiB: 10, amplitudeGiB: 0, noiseGiB: 0 }\n")
    out = workdir / "report.json"
    script = workdir / "train.py"
    script.write_text(textwrap.dedent(
        """
        import sys, time
        sys.path.insert(0, %r)
        # The startup hook is first on PYTHONPATH, as the webhook puts it in a pod.
        print("hook:", getattr(sys.modules.get("sitecustomize"), "__file__", None))
        import fake_torch
        fake_torch.install()
        import memprof_agent
        assert memprof_agent.start(interval=0.1)
        for n in range(15):
            memprof_agent.step(n)
            with memprof_agent.phase("forward"):
                time.sleep(0.1)
        sys.exit(3)
        """ % str(HERE)
    ))
    # The sidecar binary is found next to memprof; MEMPROF_SIDECAR_BIN is the same build.
    proc = subprocess.run(
        [memprof_binary(), "profile", "--agent-path", str(HERE.parent),
         "--backend", "sim", "--scenario", str(scenario), "--interval", "200ms", "--output", str(out),
         "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_AGENT")},
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "hook: " + str(HERE.parent / "bootstrap" / "sitecustomize.py") in proc.stdout, proc.stdout
    report = json.loads(out.read_text())
    a = report["allocator"]
    assert a["allocatedBytes"] == 3 << 30 and a["step"] == 14
    assert a["phasePeaks"][0]["phase"] == "forward"
    sources = sorted(g["source"] for g in report["gpus"])
    assert sources == ["agent", "sim"], sources
