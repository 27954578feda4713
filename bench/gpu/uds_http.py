"""HTTP/1.1 over a Unix socket, standard library only: how the bench scripts
talk to a sidecar, whose POST /v1/agent and GET /v1/report are served only
on its agent socket (docs/agent-wire.md "Transport"; /metrics stays on TCP)."""
import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX (the Host header says localhost)."""

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


def request(path, method, target, body=None, headers=None, timeout=2.0):
    """(status, body bytes) of one request on the socket at `path`."""
    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
