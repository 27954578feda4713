#!/usr/bin/env python3
"""A logging proxy between the in-process agent and the sidecar, for
bench/gpu/record.sh: every request body is appended, with its receive time,
to a JSON-lines file, and forwarded to the sidecar's real endpoint, whose
answer (status and body) goes back to the agent unchanged. So a recording
keeps every agent push and the sidecar still gives its live verdicts.

    push_log_proxy.py --log NAME.pushes.jsonl --port-file P --upstream-file U

It listens on 127.0.0.1 (port 0: the OS picks; the port is written to
--port-file once it listens): the agent reaches it through MEMPROF_AGENT_URL,
the opt-in kept for tests and tools like this one. The upstream is read from
--upstream-file, which record.sh writes once the sidecar answers: the path
of the sidecar's agent socket (the only place it takes pushes), or
`HOST:PORT` of an old sidecar.
Before that file exists (the trainer was started ahead of its turn and only
imports torch: the agent pushes, but CUDA is not up, so its pushes carry no
device), a push is logged with `"forwarded": false` and answered 204, so
the agent does not back off; once the upstream is known, every push is
forwarded and the sidecar's own answer is relayed, failures included
(a sidecar that is down gives the agent a 502, as a refused connection
would). Standard library only.

Each line: {"t": receive time (Unix s), "path", "forwarded", "status",
"ms": forwarding time, "error"?, "bytes", "push": the body as JSON (or
"raw": its text when it is not JSON)}.
"""
import argparse
import http.client
import http.server
import json
import os
import signal
import sys
import threading
import time

from uds_http import UnixHTTPConnection

MAX_BODY = 1 << 20  # above the sidecar's own cap (256 KiB): its 413 is relayed


class Proxy:
    def __init__(self, log_path, upstream_file, timeout):
        self.log = open(log_path, "a")
        self.lock = threading.Lock()
        self.upstream_file = upstream_file
        self.upstream = None
        self.timeout = timeout

    def target(self):
        """The sidecar's socket path (or HOST:PORT), once record.sh has written it."""
        if self.upstream is None and os.path.exists(self.upstream_file):
            text = open(self.upstream_file).read().strip()
            if text.startswith("/"):
                self.upstream = text
            elif text:
                host, _, port = text.rpartition(":")
                self.upstream = (host or "127.0.0.1", int(port))
        return self.upstream

    def forward(self, path, body, ctype):
        """(status, body bytes, error) of the sidecar's answer."""
        up = self.upstream
        if isinstance(up, str):
            conn, where = UnixHTTPConnection(up, self.timeout), up
        else:
            conn, where = http.client.HTTPConnection(up[0], up[1], timeout=self.timeout), "%s:%d" % up
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": ctype})
            resp = conn.getresponse()
            return resp.status, resp.read(), None
        except Exception as exc:  # the sidecar is down or slow: the agent hears it
            return 502, ("proxy: sidecar at %s: %s\n" % (where, exc)).encode(), str(exc)[:300]
        finally:
            conn.close()

    def write(self, line):
        with self.lock:
            self.log.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.log.flush()


def handler_for(proxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the JSON lines are the log
            pass

        def reply(self, status, body=b""):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if body:
                self.wfile.write(body)

        def do_GET(self):
            self.reply(200 if self.path == "/healthz" else 404, b"push_log_proxy\n")

        def do_POST(self):
            t = time.time()
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                self.reply(413, b"proxy: body over 1 MiB\n")
                proxy.write({"t": t, "path": self.path, "forwarded": False, "status": 413, "bytes": n})
                return
            body = self.rfile.read(n)
            line = {"t": t, "path": self.path, "bytes": n}
            if proxy.target() is None:
                status, answer = 204, b""
                line.update(forwarded=False, status=status)
            else:
                t0 = time.perf_counter()
                ctype = self.headers.get("Content-Type") or "application/json"
                status, answer, err = proxy.forward(self.path, body, ctype)
                line.update(forwarded=err is None, status=status, ms=round((time.perf_counter() - t0) * 1e3, 2))
                if err:
                    line["error"] = err
            try:
                line["push"] = json.loads(body)
            except ValueError:
                line["raw"] = body.decode("utf-8", "replace")
            self.reply(status, answer)
            proxy.write(line)

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--upstream-file", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--timeout", type=float, default=2.5, help="seconds for the sidecar's answer")
    a = p.parse_args()
    proxy = Proxy(a.log, a.upstream_file, a.timeout)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), handler_for(proxy))
    server.daemon_threads = True
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.replace(tmp, a.port_file)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    server.server_close()
    proxy.log.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
