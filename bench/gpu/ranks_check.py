#!/usr/bin/env python3
"""Checks bench/gpu/ranks_sidecar.sh: with two torchrun ranks pushing to one
sidecar, rank 1 leaking 100 MB/s, the sidecar's report must call the leak
from the allocator's numbers (allocator growth `leak`, the GPU assessed from
the agent) within 90 s of the start, and keep calling it. Prints one line
per binary and PASS/FAIL; exits 1 if the one named first fails.

    ranks_check.py OUTDIR NAME [NAME ...]
"""
import json
import sys

out, names = sys.argv[1], sys.argv[2:]
failed_first = False
for i, name in enumerate(names):
    polls = [json.loads(l) for l in open("%s/%s.polls.jsonl" % (out, name))]
    polls = [p for p in polls if "error" not in p]
    if not polls:
        print("%s: FAIL no report polled" % name)
        failed_first |= i == 0
        continue
    t0 = polls[0]["t"]
    late = [p for p in polls if p["t"] - t0 >= 90]
    leak = [p for p in late if p.get("growth") == "leak"]
    agent = [p for p in late if p.get("assessedFrom") == "agent"]
    first = next((p["t"] - t0 for p in polls if p.get("growth") == "leak"), None)
    tto = [p.get("tto") for p in late if p.get("tto") is not None]
    share = len(leak) / max(1, len(late))
    ok = bool(late) and share >= 0.9
    print("%s: %s allocator growth=leak in %d of %d polls after 90 s (first at %s s), assessed from the agent in %d, "
          "time to OOM in %d (last %s s), allocated at the end %.2f GB"
          % (name, "PASS" if ok else "FAIL", len(leak), len(late), None if first is None else round(first, 1),
             len(agent), len(tto), tto[-1] if tto else None, (polls[-1].get("allocated") or 0) / 1e9))
    failed_first |= i == 0 and not ok
sys.exit(1 if failed_first else 0)
