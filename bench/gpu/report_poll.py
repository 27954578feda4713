#!/usr/bin/env python3
"""Polls a sidecar's GET /v1/report (on its agent socket) once a second (as agent_poll.py does) and
writes one JSON line per poll: {"t": poll time, "report": the whole report
less each GPU's downsampled timeline (`packedTimeline`) (the NVML trace has every sample)},
or {"t", "error"} while there is no report. Stops when STOPFILE exists or
on SIGTERM. For bench/gpu/record.sh.

    report_poll.py SOCKET OUT.jsonl STOPFILE
"""
import json
import os
import signal
import sys
import time

from uds_http import request

stopped = False


def stop(*_):
    global stopped
    stopped = True


def main():
    sock, out, stopfile = sys.argv[1], sys.argv[2], sys.argv[3]
    signal.signal(signal.SIGTERM, stop)
    with open(out, "w") as f:
        while not stopped and not os.path.exists(stopfile):
            t = time.time()
            try:
                status, body = request(sock, "GET", "/v1/report")
                if status != 200:
                    raise RuntimeError("HTTP %d: %s" % (status, body[:100]))
                rep = json.loads(body)
                for g in rep.get("gpus") or []:
                    g.pop("packedTimeline", None)
                    g.pop("timeline", None)
                line = {"t": round(t, 3), "report": rep}
            except Exception as exc:  # no report yet, or the sidecar is gone
                line = {"t": round(t, 3), "error": str(exc)[:200]}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
            f.flush()
            time.sleep(max(0.0, 1.0 - (time.time() - t)))


if __name__ == "__main__":
    main()
