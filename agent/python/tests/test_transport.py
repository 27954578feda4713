"""Contract A (where pushes go: the sidecar's Unix socket; a loopback URL
only as an explicit opt-in; never a proxy) and contract B's parsing (the
answer read bounded in size and time; anything malformed is no verdict),
against a stand-in sidecar on an AF_UNIX socket (conftest.UnixSidecar)."""

import json
import logging
import socket
import threading
import time

import pytest

from conftest import memprof_agent, wait_until

_reply = memprof_agent._reply
_transport = memprof_agent._transport


def agent():
    return memprof_agent._agent


def test_pushes_go_over_the_socket_that_MEMPROF_AGENT_SOCKET_names(fake, unix_sidecar, monkeypatch):
    server = unix_sidecar()
    monkeypatch.setenv("MEMPROF_AGENT_SOCKET", server.path)
    assert memprof_agent.start(interval=0.05)
    memprof_agent.step(7)
    pushes = server.wait_pushes(1)
    path, host, _ = server.raw[0]
    assert (path, host) == ("/v1/agent", "localhost")
    assert pushes[-1]["version"] == 1 and pushes[-1]["devices"][0]["allocatedBytes"] == 3 << 30
    assert agent().transport.target.kind == "unix" and agent().transport.failures == 0


def test_the_socket_wins_over_a_url_in_the_environment(fake, unix_sidecar, misbehaving, monkeypatch):
    """The webhook may set both during an upgrade (old agents read the URL):
    a new agent never uses the unauthenticated one then."""
    server, tcp = unix_sidecar(), misbehaving("status:500")
    monkeypatch.setenv("MEMPROF_AGENT_SOCKET", server.path)
    monkeypatch.setenv("MEMPROF_AGENT_URL", tcp.url)
    assert memprof_agent.start(interval=0.05)
    server.wait_pushes(3)
    assert tcp.hits == 0


def test_start_arguments_take_precedence_over_the_environment(fake, unix_sidecar, monkeypatch):
    env_server, arg_server = unix_sidecar("env.sock"), unix_sidecar("arg.sock")
    monkeypatch.setenv("MEMPROF_AGENT_SOCKET", env_server.path)
    assert memprof_agent.start(interval=0.05, socket=arg_server.path)
    arg_server.wait_pushes(2)
    assert env_server.pushes == []


def test_the_default_socket_is_used_once_it_exists_and_its_absence_is_not_an_error(fake, unix_sidecar, workdir, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="memprof_agent")
    path = workdir / "default.sock"
    monkeypatch.setattr(_transport, "DEFAULT_SOCKET", str(path))
    assert memprof_agent.start(interval=0.02)
    t = agent().transport
    assert wait_until(lambda: t.dropped >= 5)
    assert t.attempts == 0 and t.failures == 0, "no sidecar in this pod: nothing tried, nothing backed off"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    server = unix_sidecar("default.sock")  # the sidecar starts later
    server.wait_pushes(2)
    assert t.failures == 0


def test_a_named_socket_without_a_sidecar_backs_off_and_says_so_once(fake, workdir, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="memprof_agent")
    monkeypatch.setenv("MEMPROF_AGENT_SOCKET", str(workdir / "nobody.sock"))
    memprof_agent.start(interval=0.02)
    t = agent().transport
    assert wait_until(lambda: t.dropped >= 25, timeout=10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no sidecar at unix:" in warnings[0], warnings
    assert t.attempts <= 8, t.attempts


@pytest.mark.parametrize("url,why", [
    ("https://127.0.0.1:9464/v1/agent", "is not an http:// URL"),
    ("http://sidecar.invalid:9464/v1/agent", "is not on a loopback address"),
    ("unix:///var/run/memprof/agent.sock", "is not an http:// URL"),
])
def test_a_url_that_is_not_loopback_http_is_refused_before_any_connection(fake, url, why, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    connects = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: connects.append(a))
    memprof_agent.start(interval=0.02, url=url)
    t = agent().transport
    assert wait_until(lambda: t.dropped >= 5)
    assert t.attempts == 0 and connects == []
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and why in warnings[0], warnings


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "localhost", "[::1]"])
def test_loopback_urls_are_accepted(host):
    t = _transport.resolve_target(url="http://%s:9464/v1/agent" % host)
    assert t.kind == "http"


def test_a_url_push_never_goes_through_a_proxy(fake, misbehaving, unix_sidecar, monkeypatch):
    proxy = misbehaving("status:500")
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url.replace("/v1/agent", ""))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    target = misbehaving("status:400")
    memprof_agent.start(interval=0.02, url=target.url)
    assert wait_until(lambda: target.hits >= 1)
    assert proxy.hits == 0


# --- the answer (contract B) ---------------------------------------------

GOOD = {"accepted": True,
        "verdict": {"risk": "high", "ttoSeconds": 140.5, "leak": True, "source": "agent", "at": 1795000000.0},
        "directives": [{"id": "d-1", "kind": "notifyTrainer", "level": "critical", "reason": "policy p"}],
        "history": True, "futureField": {"x": 1}}


def test_a_contract_b_answer_parses_and_unknown_fields_are_ignored():
    r = _reply.parse(json.dumps(GOOD).encode())
    assert r.verdict.as_dict() == {"risk": "high", "ttoSeconds": 140.5, "leak": True, "source": "agent", "at": 1795000000.0}
    assert [(d.id, d.kind, d.level, d.reason) for d in r.directives] == [("d-1", "notifyTrainer", "critical", "policy p")]
    assert r.history is True


@pytest.mark.parametrize("body", [
    None, b"", b"not json", b"[1, 2]", b"\xff\xfe", b'"critical"',
    json.dumps({"verdict": {"risk": "doomed"}}).encode(),
    json.dumps({"verdict": {"risk": "high", "ttoSeconds": -5}}).encode(),
    json.dumps({"verdict": {"risk": "high", "ttoSeconds": "soon"}}).encode(),
    json.dumps({"verdict": {"risk": "high", "ttoSeconds": True}}).encode(),
    b'{"verdict": {"risk": "high", "ttoSeconds": NaN}}',
    json.dumps({"verdict": "critical"}).encode(),
])
def test_a_missing_or_malformed_answer_is_no_verdict(body):
    r = _reply.parse(body)
    assert r.verdict is None and r.directives == [] and r.history is False
    assert bool(r), "the push itself was accepted"


def test_directives_are_bounded_and_each_checked():
    items = [{"id": "x" * 65, "kind": "notifyTrainer", "level": "high"},   # id too long
             {"id": "", "kind": "notifyTrainer", "level": "high"},         # empty id
             {"id": 7, "kind": "notifyTrainer", "level": "high"},          # not a string
             "nope",
             {"id": "ok", "kind": "notifyTrainer", "level": "medium", "reason": "r" * 1000},
             {"id": "ok", "kind": "notifyTrainer", "level": "high"}]       # a duplicate id
    items += [{"id": "n%d" % i, "kind": "notifyTrainer", "level": "high"} for i in range(40)]
    r = _reply.parse(json.dumps({"directives": items}).encode())
    assert r.directives[0].id == "ok" and r.directives[0].level is None  # kept: acked as invalid
    assert len(r.directives[0].reason) == 256
    # The first 16 entries are looked at (bounded work): "ok" and n0..n9.
    assert [d.id for d in r.directives] == ["ok"] + ["n%d" % i for i in range(10)]


class Raw:
    """An AF_UNIX server that answers every request with fixed raw bytes,
    optionally dribbled, for answers no well-behaved server sends."""

    def __init__(self, path, head, body=b"", dribble=0.0, repeat=1):
        self.path, self.head, self.body, self.dribble, self.repeat = str(path), head, body, dribble, repeat
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            with conn:
                try:
                    conn.settimeout(5)
                    conn.recv(1 << 20)
                    conn.sendall(self.head)
                    for _ in range(self.repeat):
                        if self._stop.is_set():
                            break
                        conn.sendall(self.body)
                        if self.dribble:
                            time.sleep(self.dribble)
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def raw_server(workdir):
    made = []

    def make(*args, **kw):
        s = Raw(workdir / ("raw%d.sock" % len(made)), *args, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_an_oversized_answer_is_not_read_past_the_cap(raw_server):
    big = b"x" * (1 << 20)
    server = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big), big)
    t = _transport.Transport(_transport.Target("unix", server.path), 1.0)
    started = time.monotonic()
    reply = t.send(b"{}", timeout=1.0)
    assert reply and reply.verdict is None
    assert time.monotonic() - started < 1.0
    # Without a Content-Length (read until close): at most the cap + 1 byte.
    server2 = raw_server(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", big)
    reads = []
    real_read = _transport.read_bounded

    def counting(resp, cap, deadline):
        out = real_read(resp, cap, deadline)
        reads.append(out)
        return out

    t2 = _transport.Transport(_transport.Target("unix", server2.path), 1.0)
    _transport.read_bounded = counting
    try:
        reply = t2.send(b"{}", timeout=1.0)
    finally:
        _transport.read_bounded = real_read
    assert reply and reply.verdict is None and reads == [None]


def test_an_answer_that_dribbles_is_cut_at_the_push_timeout(raw_server):
    body = json.dumps(GOOD).encode()
    server = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) * 100), body[:10], dribble=0.2, repeat=100)
    t = _transport.Transport(_transport.Target("unix", server.path), 1.0)
    started = time.monotonic()
    reply = t.send(b"{}", timeout=0.5)
    took = time.monotonic() - started
    assert reply is not None and reply.verdict is None
    assert took < 1.5, took


def test_an_old_sidecars_empty_204_is_no_verdict_and_no_error(fake, unix_sidecar, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    server = unix_sidecar()
    memprof_agent.start(interval=0.02, socket=server.path)
    server.wait_pushes(3)
    assert memprof_agent.risk() is None and agent().transport.failures == 0
    assert caplog.records == []


def test_a_verdict_in_the_answer_becomes_the_agents(fake, unix_sidecar):
    server = unix_sidecar()
    server.verdict("medium", tto=900.0)
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: memprof_agent.risk() is not None)
    assert memprof_agent.risk()["risk"] == "medium" and memprof_agent.risk()["ttoSeconds"] == 900.0
    assert memprof_agent.report()["risk"]["verdict"]["risk"] == "medium"
