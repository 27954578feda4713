"""Sending pushes to the sidecar: one HTTP POST with a short timeout, no
retry (the next push carries newer numbers), back-off while the sidecar is
absent, and each kind of trouble said once.

http.client, not urllib: urllib honours HTTP(S)_PROXY, and a push to the
pod's own loopback must never go through a proxy."""

import http.client
import json
import logging
import time
import urllib.parse

log = logging.getLogger("memprof_agent")

# Body caps (docs/agent.md): a periodic push stays under 64 KiB; the
# sidecar takes up to 256 KiB, which only an OOM push may need.
SAMPLE_CAP = 64 * 1024
OOM_CAP = 256 * 1024
MAX_BACKOFF = 60.0


class Transport:
    """Posts JSON bodies to the sidecar; never raises."""

    def __init__(self, url, interval):
        self.url = url
        self.interval = interval
        parsed = urllib.parse.urlsplit(url)
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 80
        self._path = parsed.path or "/v1/agent"
        self._ok_scheme = parsed.scheme == "http"
        self._said = set()
        self.failures = 0
        self.sent = 0
        self.attempts = 0
        self.dropped = 0
        self._next_try = 0.0

    def say_once(self, key, message, *args):
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)

    def ready(self, now=None):
        """Whether a push may go now (not backing off)."""
        return (now if now is not None else time.monotonic()) >= self._next_try

    def backoff_seconds(self):
        """Seconds to wait after the current run of failures."""
        if self.failures == 0:
            return 0.0
        return min(self.interval * (2 ** min(self.failures, 16)), MAX_BACKOFF)

    def send(self, body, timeout):
        """POSTs one body; True when the sidecar took it."""
        if not self._ok_scheme:
            self.say_once("scheme", "memprof-agent: MEMPROF_AGENT_URL %r is not an http:// URL; pushes are dropped", self.url)
            self.dropped += 1
            return False
        self.attempts += 1
        try:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            try:
                conn.request("POST", self._path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                status, text = resp.status, resp.read(4096)
            finally:
                conn.close()
        except Exception as exc:
            return self._failed(
                "absent",
                "memprof-agent: no sidecar at %s (%s); dropping pushes and backing off until one answers",
                self.url, exc,
            )
        if 200 <= status < 300:
            if self.failures:
                log.info("memprof-agent: sidecar at %s answers again", self.url)
            self.failures = 0
            self._next_try = 0.0
            self.sent += 1
            return True
        reason = text.decode("utf-8", "replace").strip()[:300]
        return self._failed(
            "status-%d" % status,
            "memprof-agent: the sidecar at %s refused a push (HTTP %d: %s); dropping pushes",
            self.url, status, reason,
        )

    def _failed(self, key, message, *args):
        self.failures += 1
        self.dropped += 1
        self._next_try = time.monotonic() + self.backoff_seconds()
        self.say_once(key, message, *args)
        return False


def encode(push, cap):
    """JSON of a push within `cap` bytes: frames, then events, then blocks
    are shed until it fits (the numbers always go)."""
    body = json.dumps(push, separators=(",", ":")).encode("utf-8")
    if len(body) <= cap:
        return body
    oom = push.get("oom")
    if oom:
        for block in oom.get("blocks", []):
            block["frames"] = block["frames"][:2]
        body = json.dumps(push, separators=(",", ":")).encode("utf-8")
    if len(body) > cap:
        push["droppedEvents"] = push.get("droppedEvents", 0) + len(push.get("events", []))
        push["events"] = []
        if oom:
            for block in oom.get("blocks", []):
                block["frames"] = []
        body = json.dumps(push, separators=(",", ":")).encode("utf-8")
    return body
