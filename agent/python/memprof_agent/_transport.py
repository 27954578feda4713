"""Sending pushes to the sidecar: one HTTP/1.1 POST over the sidecar's Unix
socket (docs/agent-wire.md "Transport"), with a short timeout, no retry (the next
push carries newer numbers), back-off while the sidecar is absent, and each
kind of trouble said once. The answer's body (the sidecar's verdict, its
directives) is read bounded in size and time and parsed by _reply.

Where pushes go, first match wins: start(socket=) / start(url=);
MEMPROF_AGENT_SOCKET; MEMPROF_AGENT_URL (an explicit, unauthenticated
opt-in for old sidecars and tests: http:// on a loopback address only);
/var/run/memprof/agent.sock when it exists; else nowhere (the agent only
writes its report).

http.client, not urllib: urllib honours HTTP(S)_PROXY, and a push must
never go through a proxy."""

import http.client
import ipaddress
import json
import os
import socket
import time
import urllib.parse

from . import _config, _reply
from ._config import Once, log

# Body caps (docs/agent-wire.md): a periodic push stays under 64 KiB; the
# sidecar takes up to 256 KiB, which only an OOM push may need.
SAMPLE_CAP = 64 * 1024
OOM_CAP = 256 * 1024
MAX_BACKOFF = 60.0
# The answer: at most this many bytes are read, within the push's timeout.
MAX_REPLY_BYTES = 64 * 1024
DEFAULT_SOCKET = "/var/run/memprof/agent.sock"
_LOOPBACK_NAMES = ("localhost", "localhost.")


class Target:
    """Where pushes go: kind 'unix' (a socket path), 'http' (a loopback
    URL) or 'none'. `optional`: the default socket, used only once it
    exists (no warning while it does not)."""

    def __init__(self, kind, address, optional=False, why=None):
        self.kind, self.address, self.optional, self.why = kind, address, optional, why

    def describe(self):
        if self.kind == "unix":
            return "unix:" + self.address
        return self.address or "nowhere"


def resolve_target(socket_path=None, url=None, env=None):
    """The push target from start()'s arguments, then the environment
    (module docstring)."""
    env = os.environ if env is None else env
    if socket_path:
        return Target("unix", str(socket_path))
    if url:
        return _url_target(str(url))
    env_socket = _config.get("MEMPROF_AGENT_SOCKET", env)
    if env_socket:
        return Target("unix", env_socket)
    env_url = _config.get("MEMPROF_AGENT_URL", env)
    if env_url:
        return _url_target(env_url)
    return Target("unix", DEFAULT_SOCKET, optional=True)


def _url_target(url):
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http":
        return Target("none", url, why="is not an http:// URL")
    if not _is_loopback(parsed.hostname):
        return Target("none", url, why="is not on a loopback address (pushes carry the trainer's data, answers steer it)")
    return Target("http", url)


def _is_loopback(host):
    if not host:
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over an AF_UNIX stream socket (the Host header says localhost)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._socket_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Transport:
    """Posts JSON bodies to the sidecar and parses its answer; never raises."""

    def __init__(self, target, interval):
        if isinstance(target, str):  # a URL (older callers, tests)
            target = _url_target(target)
        self.target = target
        self.url = target.describe()
        self.interval = interval
        if target.kind == "http":
            parsed = urllib.parse.urlsplit(target.address)
            self._host = parsed.hostname
            self._port = parsed.port or 80
            self._path = parsed.path or "/v1/agent"
        else:
            self._path = "/v1/agent"
        # say_once(key, message, *args): each kind of trouble once per transport.
        self.say_once = Once()
        self.failures = 0
        self.sent = 0
        self.attempts = 0
        self.dropped = 0
        self._next_try = 0.0

    def ready(self, now=None):
        """Whether a push may go now (not backing off)."""
        return (now if now is not None else time.monotonic()) >= self._next_try

    def backoff_seconds(self):
        """Seconds to wait after the current run of failures."""
        if self.failures == 0:
            return 0.0
        return min(self.interval * (2 ** min(self.failures, 16)), MAX_BACKOFF)

    def _connection(self, timeout):
        if self.target.kind == "unix":
            return UnixHTTPConnection(self.target.address, timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def send(self, body, timeout):
        """POSTs one body. Returns the sidecar's Reply (truthy) when it took
        the push, whatever its body said; None when it did not."""
        t = self.target
        if t.kind == "none":
            self.say_once("target", "memprof-agent: MEMPROF_AGENT_URL %r %s; pushes are dropped", t.address, t.why)
            self.dropped += 1
            return None
        if t.optional and not os.path.exists(t.address):
            self.dropped += 1  # no sidecar in this pod: the report only
            return None
        self.attempts += 1
        deadline = time.monotonic() + timeout
        try:
            conn = self._connection(timeout)
            try:
                conn.request("POST", self._path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                status = resp.status
                text = read_bounded(resp, MAX_REPLY_BYTES, deadline)
            finally:
                conn.close()
        except Exception as exc:
            return self._failed(
                "absent",
                "memprof-agent: no sidecar at %s (%s); dropping pushes and backing off until one answers",
                self.url, exc,
            )
        if 200 <= status < 300:
            return self._accepted(status, text)
        reason = (text or b"").decode("utf-8", "replace").strip()[:300]
        return self._failed(
            "status-%d" % status,
            "memprof-agent: the sidecar at %s refused a push (HTTP %d: %s); dropping pushes",
            self.url, status, reason,
        )

    def _accepted(self, status, text):
        if self.failures:
            log.info("memprof-agent: sidecar at %s answers again", self.url)
        self.failures = 0
        self._next_try = 0.0
        self.sent += 1
        return _reply.parse(text if status == 200 else None)

    def _failed(self, key, message, *args):
        self.failures += 1
        self.dropped += 1
        self._next_try = time.monotonic() + self.backoff_seconds()
        self.say_once(key, message, *args)
        return None


def read_bounded(resp, cap, deadline):
    """The response body, or None when it is larger than `cap` bytes (an
    answer that size is not one the agent understands) or does not arrive
    before `deadline`. Reads at most cap + 1 bytes."""
    length = resp.getheader("Content-Length")
    try:
        if length is not None and int(length) > cap:
            return None
    except ValueError:
        return None
    chunks, size = [], 0
    try:
        while size <= cap:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
            if sock is not None:
                sock.settimeout(left)
            # read1: at most one read from the socket, so a slow sender meets
            # the deadline between reads instead of filling a 4 KiB buffer.
            chunk = resp.read1(min(4096, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except (OSError, http.client.HTTPException):
        return None  # the push was taken (its status said so); the answer is lost
    if size > cap:
        return None
    return b"".join(chunks)


def encode(push, cap):
    """JSON of a push within `cap` bytes: frames, then events other than
    checkpoints, then the checkpoints too, then blocks' frames are shed until
    it fits (the numbers always go)."""
    body = _dumps(push)
    if len(body) <= cap:
        return body
    for snap in (push.get("oom"), push.get("sites")):
        for block in (snap or {}).get("blocks", []):
            block["frames"] = block.get("frames", [])[:2]
    body = _dumps(push)
    if len(body) > cap:
        events = push.get("events", [])
        kept = [e for e in events if e.get("name") == "checkpoint"]
        push["droppedEvents"] = push.get("droppedEvents", 0) + len(events) - len(kept)
        push["events"] = kept
        for snap in (push.get("oom"), push.get("sites")):
            for block in (snap or {}).get("blocks", []):
                block["frames"] = []
        body = _dumps(push)
    return body


def _dumps(push):
    return json.dumps(push, separators=(",", ":")).encode("utf-8")
