#!/usr/bin/env python3
"""Polls a sidecar's GET /v1/report (on its agent socket) once a second and
writes one compact JSON line per poll (time, the first GPU's risk/TTO/leak,
the allocator section's verdicts), until STOPFILE exists. For
bench/gpu/agent.sh.

    agent_poll.py SOCKET OUT.jsonl STOPFILE
"""
import json
import os
import sys
import time

from uds_http import request

sock, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
with open(out, "w") as f:
    while not os.path.exists(stop):
        t = time.time()
        try:
            status, body = request(sock, "GET", "/v1/report")
            if status != 200:
                raise RuntimeError("HTTP %d: %s" % (status, body[:100]))
            rep = json.loads(body)
            g = (rep.get("gpus") or [{}])[0]
            a = rep.get("allocator") or {}
            line = {
                "t": t, "risk": g.get("risk"), "tto": g.get("timeToOomSeconds"), "leak": g.get("leakSuspected"),
                "source": g.get("source"), "assessedFrom": g.get("assessedFrom"), "used": g.get("usedBytes"),
                "growth": a.get("growth"), "allocated": a.get("allocatedBytes"), "reserved": a.get("reservedBytes"),
                "limit": a.get("limitBytes"), "fragmentation": a.get("fragmentation"),
                "split": a.get("inactiveSplitFraction"), "retries": a.get("allocRetries"),
                "recentRetries": a.get("recentAllocRetries"), "advice": a.get("advice"),
                "stepsPerSecond": a.get("stepsPerSecond"), "numOoms": a.get("numOoms"), "oom": a.get("oom"),
            }
        except Exception as exc:  # no report yet, or the sidecar is gone
            line = {"t": t, "error": str(exc)[:200]}
        f.write(json.dumps(line) + "\n")
        f.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - t)))
