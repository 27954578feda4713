"""Fixtures: a real memprof-sidecar process (sim backend, --standalone; the
agent pushes to its Unix socket in the test's private directory, contract
A; /metrics on an OS-chosen loopback port), the fake torch, and small HTTP
servers that misbehave. Every process and temporary directory is removed at
teardown.

And the wire contract (agent/schema/, generated from the Rust types): every
push the agent encodes, in every test, is checked against the push schema
made strict (wire.py), and every answer of a real sidecar against the reply
schema; a test whose agent sent a field the sidecar's type does not have
fails at teardown."""

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # the package, without installing it
sys.path.insert(0, str(HERE))

import fake_torch  # noqa: E402
import memprof_agent  # noqa: E402
import wire  # noqa: E402


def sidecar_binary():
    path = os.environ.get("MEMPROF_SIDECAR_BIN") or str(ROOT / "target" / "debug" / "memprof-sidecar")
    if not os.access(path, os.X_OK):
        pytest.fail("no memprof-sidecar binary at %s: run `cargo build -p memprof-sidecar` or set MEMPROF_SIDECAR_BIN" % path)
    return path


class Sidecar:
    """A memprof-sidecar process; stopped by PID at teardown. Pushes and its
    report go over `socket` (the test's private directory, mode 0700, as the
    pod's emptyDir); `/metrics` is on `port` (loopback)."""

    def __init__(self, workdir, extra_args=()):
        scenario = Path(workdir) / "scenario.yaml"
        scenario.write_text("totalGiB: 80\ndefault: { baseGiB: 10, amplitudeGiB: 0, noiseGiB: 0 }\n")
        self.log_path = Path(workdir) / "sidecar.log"
        self._log = open(self.log_path, "w")
        self.socket = str(Path(workdir) / "agent.sock")
        wire.REAL_SIDECARS.add(self.socket)
        args = [sidecar_binary(), "--standalone", "--listen", "127.0.0.1:0", "--interval", "100ms",
                "--agent-socket", self.socket]
        args += list(extra_args) or ["--backend", "sim", "--scenario", str(scenario)]
        env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
        env.pop("MEMPROF_AGENT_SOCKET", None)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log, env=env)
        self.port = self._wait_for_port()
        self._wait_for_socket()

    def _wait_for_port(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            text = self.log_path.read_text()
            m = re.search(r"addr=127\.0\.0\.1:(\d+)", text)
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError("memprof-sidecar exited: %s" % text)
            time.sleep(0.02)
        raise RuntimeError("memprof-sidecar did not say its address: %s" % self.log_path.read_text())

    def _wait_for_socket(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.socket_get("/healthz") is not None:
                return
            if self.proc.poll() is not None:
                raise RuntimeError("memprof-sidecar exited: %s" % self.log_path.read_text())
            time.sleep(0.02)
        raise RuntimeError("memprof-sidecar did not serve %s: %s" % (self.socket, self.log_path.read_text()))

    def get(self, path):
        """GET on the TCP port (/healthz, /metrics)."""
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=5) as r:
            return r.read().decode()

    def socket_get(self, path):
        """GET on the agent socket (/v1/report, /healthz): the body of a 200, else None."""
        conn = memprof_agent._transport.UnixHTTPConnection(self.socket, 5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read().decode()
            return body if resp.status == 200 else None
        except OSError:
            return None
        finally:
            conn.close()

    def report(self):
        try:
            return json.loads(self.socket_get("/v1/report"))
        except Exception:
            return None

    def wait_report(self, predicate, timeout=10.0):
        """The first report satisfying predicate (the sidecar analyses once a second)."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = self.report()
            if last is not None and predicate(last):
                return last
            time.sleep(0.1)
        raise AssertionError("no report matched within %ss; last: %s" % (timeout, json.dumps(last)[:3000]))

    def agent_pushes(self):
        m = re.search(r"memprof_sidecar_agent_pushes_total (\d+)", self.get("/metrics"))
        return int(m.group(1)) if m else 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def workdir():
    with tempfile.TemporaryDirectory(prefix="memprof-agent-test-") as d:
        yield Path(d)


@pytest.fixture
def sidecar(workdir):
    s = Sidecar(workdir)
    yield s
    s.stop()


@pytest.fixture
def fake():
    f = fake_torch.install()
    yield f
    memprof_agent.stop()
    fake_torch.uninstall()


@pytest.fixture
def real_torch():
    """The installed torch (the test is skipped without one), whatever fake
    came and went before (fake_torch.real)."""
    t = fake_torch.real()
    if t is None:
        pytest.skip("torch is not installed")
    return t


@pytest.fixture(autouse=True)
def wire_contract(monkeypatch):
    """Records what crosses the wire during the test; checks it against
    agent/schema/ at teardown (wire.py)."""
    seen = wire.Recorder()
    seen.install(monkeypatch, memprof_agent._transport)
    yield seen
    problems = seen.problems()
    assert not problems, "the wire contract (agent/schema/) is broken:\n" + "\n".join(problems)


@pytest.fixture(autouse=True)
def clean_agent(monkeypatch):
    # No test may find a sidecar it did not start: the environment's, or a
    # default socket on this machine.
    for name in ("MEMPROF_AGENT_SOCKET", "MEMPROF_AGENT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(memprof_agent._transport, "DEFAULT_SOCKET", "/nonexistent/memprof-test/agent.sock")
    memprof_agent.stop()
    memprof_agent._core.MARKERS.__init__()
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    memprof_agent._core.AUTO.__init__(memprof_agent._core.MARKERS)
    memprof_agent._watch.reset()
    memprof_agent._reset_seed_parts()
    contributors = list(memprof_agent._core.PUSH_CONTRIBUTORS)
    yield
    memprof_agent.stop()
    memprof_agent._core.AUTO.stop()
    memprof_agent._core.AUTO.__init__(memprof_agent._core.MARKERS)
    memprof_agent._core.RISK.__init__(memprof_agent._core.MARKERS)
    memprof_agent._watch.reset()
    memprof_agent._reset_seed_parts()
    memprof_agent._core.PUSH_CONTRIBUTORS[:] = contributors


def closed_port():
    """A loopback port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Misbehaving:
    """An HTTP server on loopback that answers every push one bad way:
    'status:500', 'status:400', 'garbage' (bytes that are not HTTP), 'hang'
    (reads, never answers), 'close' (closes at once)."""

    def __init__(self, mode):
        self.mode = mode
        self.hits = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d/v1/agent" % self.port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            with conn:
                conn.settimeout(2)
                try:
                    if self.mode == "close":
                        continue
                    conn.recv(65536)
                    if self.mode.startswith("status:"):
                        code = int(self.mode.split(":")[1])
                        conn.sendall(b"HTTP/1.1 %d Nope\r\nContent-Length: 5\r\n\r\nnope\n" % code)
                    elif self.mode == "garbage":
                        conn.sendall(b"\x00\xffnot http at all\r\n\r\n")
                    elif self.mode == "hang":
                        self._stop.wait(3)
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def misbehaving():
    servers = []

    def make(mode):
        s = Misbehaving(mode)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def wait_until(predicate, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class UnixSidecar:
    """A stand-in for the sidecar's agent endpoint over AF_UNIX, speaking
    contracts A and B (docs/agent-wire.md): it records every push (its JSON)
    and answers with what `answer(push)` returns: (status, body bytes or
    None). Default: 204 without a body (an old sidecar). For answers the
    real sidecar would not give on cue (a chosen verdict, directives);
    the `sidecar` fixture is the real one, over its socket."""

    def __init__(self, path):
        import socketserver

        self.path = str(path)
        self.pushes = []
        self.raw = []
        self.answer = lambda push: (204, None)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                if length > 256 * 1024:
                    self._reply(413, b"too large")
                    return
                body = self.rfile.read(length)
                outer.raw.append((self.path, self.headers.get("Host"), body))
                push = json.loads(body)
                outer.pushes.append(push)
                status, out = outer.answer(push)
                self._reply(status, out)

            def _reply(self, status, out):
                self.send_response(status)
                if out is not None:
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                else:
                    self.send_header("Content-Length", "0")
                self.end_headers()
                if out:
                    self.wfile.write(out)

            def log_message(self, *args):
                pass

            def address_string(self):
                return "unix"

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def verdict(self, risk, tto=None, leak=False, directives=(), history=False):
        """Answers every push with this verdict (contract B)."""
        body = json.dumps({"accepted": True,
                           "verdict": {"risk": risk, "ttoSeconds": tto, "leak": leak, "source": "agent", "at": time.time()},
                           "directives": list(directives), "history": history}).encode()
        self.answer = lambda push: (200, body)

    def wait_pushes(self, n, timeout=10.0):
        assert wait_until(lambda: len(self.pushes) >= n, timeout), "only %d pushes" % len(self.pushes)
        return self.pushes

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


@pytest.fixture
def unix_sidecar(workdir):
    servers = []

    def make(name="agent.sock"):
        s = UnixSidecar(workdir / name)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


__all__ = ["Sidecar", "UnixSidecar", "closed_port", "wait_until", "fake_torch", "memprof_agent", "http"]
