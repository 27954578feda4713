"""The zero-code-change startup hook (agent/python/bootstrap) in real Python
subprocesses, set up as the webhook sets up a trainer container:
PYTHONPATH=<bootstrap>:<the user's entries>:<the agent's package>.

No torch and no GPU: `torch` is a fake package written by the test, and
`memprof_agent` a stand-in that records calls to start(), so these tests pin
the hook, not the agent (the agent's own tests cover the agent).
"""

import ast
import glob
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP = ROOT / "bootstrap"
sys.path.insert(0, str(BOOTSTRAP))
import _memprof_bootstrap as impl  # noqa: E402  (the pure parts, in-process)

sys.path.remove(str(BOOTSTRAP))

PREFIX = "memprof-agent: "


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def fake_torch(tmp_path):
    """A `torch` package whose last statement marks it initialised."""
    d = tmp_path / "site-torch"
    write(d / "torch" / "__init__.py", "from torch import nn\nREADY = True\n")
    write(d / "torch" / "nn.py", "")
    return d


AGENT_RECORDER = """
    import os, sys
    def start(interval=1.0):
        torch = sys.modules.get("torch")
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write("start %s\\n" % getattr(torch, "READY", False))
"""


def agent(tmp_path, body=AGENT_RECORDER):
    """A stand-in memprof_agent package; returns its directory."""
    d = tmp_path / "agent-lib"
    write(d / "memprof_agent" / "__init__.py", body)
    return d


def python(code, pythonpath, tmp_path, exe=None, script=None, env=None):
    """Runs `code` (or `script` with `code` as its content) in a new
    interpreter; returns (returncode, stdout, stderr, agent starts)."""
    log = tmp_path / "starts.log"
    log.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PYTHON") and not k.startswith("MEMPROF_")}
    # No __pycache__ in the repository's bootstrap directory.
    base.update(PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
                PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath),
                STANDIN_LOG=str(log))
    base.update(env or {})
    if script is not None:
        script.write_text(textwrap.dedent(code))
        argv = [exe or sys.executable, str(script)]
    else:
        argv = [exe or sys.executable, "-c", textwrap.dedent(code)]
    p = subprocess.run(argv, env=base, capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=60)
    return p.returncode, p.stdout, p.stderr, log.read_text().splitlines()


def other_python(version):
    """An interpreter of `version` ("3.8", "2.7") if this machine has one."""
    pattern = os.path.expanduser("~/.pyenv/versions/%s.*/bin/python" % version)
    found = sorted(glob.glob(pattern))
    if found:
        return found[-1]
    found = shutil.which("python" + version)
    # A pyenv shim without that version selected only fails.
    return found if found and "shims" not in found else None


def test_without_torch_nothing_is_imported_started_or_printed(tmp_path):
    code = """
        import json, sys
        print("trainer", json.dumps(sorted(
            m for m in sys.modules if m in ("memprof_agent", "_memprof_bootstrap"))))
    """
    rc, out, err, starts = python(code, [BOOTSTRAP, agent(tmp_path)], tmp_path)
    assert (rc, out, err, starts) == (0, "trainer []\n", "", [])


def test_importing_torch_starts_the_agent_once_after_torch_is_ready(tmp_path, fake_torch):
    code = """
        import importlib, sys
        import torch
        print(type(torch.__loader__).__name__, type(torch.__spec__.loader).__name__)
        import torch.nn
        importlib.reload(torch)
        import torch
        print(any("Watcher" in type(f).__name__ for f in sys.meta_path))
    """
    rc, out, err, starts = python(code, [BOOTSTRAP, agent(tmp_path), fake_torch], tmp_path)
    assert (rc, err) == (0, "")
    # torch keeps its own loader; the finder is gone once it has fired.
    assert out == "SourceFileLoader SourceFileLoader\nFalse\n"
    assert starts == ["start True"]


def test_output_and_exit_code_are_those_of_the_trainer(tmp_path, fake_torch):
    code = """
        import sys
        import torch
        print("step 1"); sys.stderr.write("warn\\n")
        sys.exit(7)
    """
    quiet = agent(tmp_path, "def start(interval=1.0):\n    pass\n")
    without = python(code, [quiet, fake_torch], tmp_path, script=tmp_path / "train.py")
    hooked = python(code, [BOOTSTRAP, quiet, fake_torch], tmp_path, script=tmp_path / "train.py")
    assert without[:3] == hooked[:3] == (7, "step 1\n", "warn\n")


def test_the_program_sees_the_sys_path_it_would_have_seen(tmp_path):
    code = "import sys; print(sys.path)"
    lib = agent(tmp_path)
    without = python(code, [lib], tmp_path)
    hooked = python(code, [BOOTSTRAP, lib], tmp_path)
    assert hooked == without
    assert str(BOOTSTRAP) not in hooked[1]


@pytest.mark.parametrize("body, says", [
    ("raise RuntimeError('broken package')",
     "not started: cannot import memprof_agent (RuntimeError: broken package)"),
    ("def start(interval=1.0):\n    raise ValueError('bad interval')",
     "not started: memprof_agent.start() failed (ValueError: bad interval)"),
    ("def start(interval=1.0):\n    raise SystemExit(2)",
     "not started: memprof_agent.start() failed (SystemExit: 2)"),
])
def test_a_broken_agent_leaves_the_trainer_running_and_says_why_once(
        tmp_path, fake_torch, body, says):
    code = """
        import sys
        import torch
        import torch
        print("trained", torch.READY)
        sys.exit(3)
    """
    rc, out, err, _ = python(code, [BOOTSTRAP, agent(tmp_path, body), fake_torch], tmp_path)
    assert (rc, out) == (3, "trained True\n")
    assert err.startswith(PREFIX + says), err
    assert err.count("\n") == 1, err


def test_a_missing_agent_says_so_once(tmp_path, fake_torch):
    rc, out, err, _ = python("import torch; print('ok')", [BOOTSTRAP, fake_torch], tmp_path)
    assert (rc, out) == (0, "ok\n")
    assert err.startswith(PREFIX + "not started: cannot import memprof_agent ("), err
    assert err.count("\n") == 1


def test_a_failing_torch_import_fails_as_before_and_is_watched_again(tmp_path):
    flaky = tmp_path / "flaky"
    write(flaky / "torch" / "__init__.py", """
        import os
        if not os.path.exists("ok"):
            raise ImportError("libcudart.so.12: cannot open shared object file")
        READY = True
    """)
    code = """
        try:
            import torch
        except ImportError as e:
            print("first:", e)
        open("ok", "w").close()
        import torch
        print("second:", torch.READY)
    """
    rc, out, err, starts = python(code, [BOOTSTRAP, agent(tmp_path), flaky], tmp_path)
    assert (rc, err) == (0, "")
    assert out == ("first: libcudart.so.12: cannot open shared object file\n"
                   "second: True\n")
    assert starts == ["start True"]


def test_the_shadowed_sitecustomize_still_runs_after_the_hook_is_in(tmp_path, fake_torch):
    # The user's sitecustomize imports torch itself: the hook must already be in place.
    user = tmp_path / "user"
    write(user / "sitecustomize.py", """
        import torch
        print("user sitecustomize", torch.READY)
    """)
    code = "import sitecustomize; print(sitecustomize.__file__)"
    rc, out, err, starts = python(
        code, [BOOTSTRAP, user, agent(tmp_path), fake_torch], tmp_path)
    assert (rc, err) == (0, "")
    assert out == "user sitecustomize True\n%s\n" % (user / "sitecustomize.py")
    assert starts == ["start True"]


def test_errors_of_the_shadowed_sitecustomize_are_reported_as_before(tmp_path):
    user = tmp_path / "user"
    write(user / "sitecustomize.py", "import os\n1 / 0\n")
    code = "print('trainer runs')"
    without = python(code, [user], tmp_path)
    hooked = python(code, [BOOTSTRAP, user, agent(tmp_path)], tmp_path)
    assert hooked[:3] == without[:3]
    assert "ZeroDivisionError" in hooked[2] and "trainer runs" in hooked[1]


def test_disabled_by_env_installs_nothing(tmp_path, fake_torch):
    code = "import sys, torch; print(any('Watcher' in type(f).__name__ for f in sys.meta_path))"
    for value in ("1", "true"):
        rc, out, err, starts = python(code, [BOOTSTRAP, agent(tmp_path), fake_torch], tmp_path,
                                      env={"MEMPROF_AGENT_DISABLE": value})
        assert (rc, out, err, starts) == (0, "False\n", "", [])
    rc, out, err, starts = python(code, [BOOTSTRAP, agent(tmp_path), fake_torch], tmp_path,
                                  env={"MEMPROF_AGENT_DISABLE": "0"})
    assert starts == ["start True"]


def test_torchrun_itself_starts_no_agent(tmp_path, fake_torch):
    rc, out, err, starts = python("import torch\nprint('launching')\n",
                                  [BOOTSTRAP, agent(tmp_path), fake_torch], tmp_path,
                                  script=tmp_path / "torchrun")
    assert (rc, out, err, starts) == (0, "launching\n", "", [])


def test_launcher_detection():
    sep = os.sep
    assert impl.is_launcher(["/usr/local/bin/torchrun", "--nproc-per-node=8", "train.py"])
    assert impl.is_launcher([sep.join(["", "venv", "lib", "site-packages", "torch",
                                       "distributed", "run.py"])])
    assert impl.is_launcher([sep.join(["x", "torch", "distributed", "launch.py"])])
    assert not impl.is_launcher(["train.py"])
    assert not impl.is_launcher(["/app/run.py"])
    assert not impl.is_launcher(["-c"])
    assert not impl.is_launcher([])
    assert not impl.is_launcher(None)


def test_python_version_gate():
    assert impl.too_old((3, 9, 0)) is None
    assert impl.too_old((3, 13, 1, "final", 0)) is None
    assert impl.too_old((3, 8, 18)) == (
        "not started: Python 3.8.18 is older than 3.9, which memprof_agent "
        "needs; training runs without it")


def test_sources_parse_on_old_python_3():
    # sitecustomize.py runs in every interpreter of the container and
    # _memprof_bootstrap.py in every one that imports torch: a SyntaxError
    # there would be ours, printed into the user's programs.
    for name in ("sitecustomize.py", "_memprof_bootstrap.py"):
        ast.parse((BOOTSTRAP / name).read_text(), feature_version=(3, 4))


def test_an_old_python_3_says_why_once_and_trains(tmp_path, fake_torch):
    exe = other_python("3.8")
    if exe is None:
        pytest.skip("no Python 3.8 on this machine (pyenv or python3.8)")
    rc, out, err, starts = python("import torch, torch\nprint('trained')\nraise SystemExit(4)",
                                  [BOOTSTRAP, agent(tmp_path), fake_torch], tmp_path, exe=exe)
    assert (rc, out, starts) == (4, "trained\n", [])
    assert err == PREFIX + impl.too_old((3, 8, int(err.split("3.8.")[1].split()[0]))) + "\n"


def test_python_2_runs_untouched_and_still_chains(tmp_path, fake_torch):
    exe = other_python("2.7")
    if exe is None:
        pytest.skip("no Python 2.7 on this machine (pyenv or python2.7)")
    user = tmp_path / "user"
    write(user / "sitecustomize.py", "print('user sitecustomize')\n")
    rc, out, err, starts = python("import torch\nprint('trained')\n",
                                  [BOOTSTRAP, user, agent(tmp_path), fake_torch], tmp_path, exe=exe)
    assert (rc, out, err, starts) == (0, "user sitecustomize\ntrained\n", "", [])


def test_the_hook_starts_the_real_agent_which_pushes_to_a_real_sidecar(tmp_path, sidecar):
    """End to end, as in a pod: the hook, the real memprof_agent, and a real
    memprof-sidecar (the `sidecar` fixture of conftest.py) on the address the
    webhook sets; torch is the agent tests' fake, behind an on-disk package
    so that `import torch` goes through the hook."""
    if not (ROOT / "memprof_agent" / "__init__.py").exists():
        pytest.skip("agent/python/memprof_agent is not there yet")
    write(tmp_path / "site-torch" / "torch" / "__init__.py", """
        import sys
        import fake_torch
        fake_torch.install()  # sys.modules["torch"] is now the fake: what `import torch` returns
    """)
    code = """
        import sys, time
        import torch
        time.sleep(1.5)
        print("trained", torch.__version__)
        sys.exit(6)
    """
    rc, out, err, _ = python(
        code, [BOOTSTRAP, tmp_path / "site-torch", Path(__file__).parent, ROOT], tmp_path,
        env={"MEMPROF_AGENT_SOCKET": sidecar.socket, "MEMPROF_AGENT_INTERVAL": "100ms"})
    assert (rc, out) == (6, "trained 2.11.0+fake\n"), err
    assert PREFIX + "not started" not in err, err
    assert sidecar.agent_pushes() >= 3


def test_with_the_real_agent_package_and_no_sidecar_the_trainer_is_unchanged(tmp_path, fake_torch):
    if not (ROOT / "memprof_agent" / "__init__.py").exists():
        pytest.skip("agent/python/memprof_agent is not there yet")
    code = "import sys, torch\nprint('trained')\nsys.exit(5)\n"
    # Port 9 on loopback: nothing listens; the agent must cope.
    rc, out, _, _ = python(code, [BOOTSTRAP, fake_torch, ROOT], tmp_path,
                           env={"MEMPROF_AGENT_URL": "http://127.0.0.1:9/v1/agent"})
    assert (rc, out) == (5, "trained\n")
