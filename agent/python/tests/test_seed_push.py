"""The seed tools' push fields together at their bounds: the body stays within
the periodic push's cap and a real memprof-sidecar takes it."""

import json
import sys

from conftest import fake_torch as ft, memprof_agent
from memprof_agent import _grads, _sizes, _tracking
from memprof_agent._transport import SAMPLE_CAP, encode

GiB = 1 << 30


def at_bounds(fake):
    """Every list of host/grads/sizes/tracking full, every string at its
    longest, 32 events with notes and details."""
    long = "n" * 300
    w = _grads.GradWatch(sys.modules["torch"], ft.Linear(2, 2), ft.AdamW([]), every=1)
    names = ["p" * 200 + str(i) for i in range(40)]
    w._publish([(n, None) for n in names], names, [(float(i), n) for i, n in enumerate(names)], names, {}, None, 1)
    _grads.WATCHED[0] = w
    s = _sizes.SIZES[0]
    full = [[1 << k, 10 ** 9] for k in range(_sizes.MIN_LOG2, _sizes.MAX_LOG2 + 1)]
    s.last = {"device": 15, "at": 1.8e9, "source": "snapshot", "buckets": full, "freeBuckets": full,
              "requests": [[1 << 20, 10 ** 12], [1 << 40, 10 ** 12]], "seconds": 10.001, "inactiveSplits": 10 ** 6,
              "blocks": 10 ** 6, "snapshotSeconds": 0.123456}
    s.next_at = float("inf")
    prev, cur = _tracking.Sample(1, None), _tracking.Sample(10 ** 9, None)
    for i in range(100):
        key = _tracking.SEP.join(("cuda:15", "float8_e4m3fnuz", "x".join(["65536"] * 9) + "x...",
                                  ("/very/long/path/" * 20)[:_tracking.MAX_SITE] + str(i)))
        cur.counts[key], cur.bytes[key] = 10 ** 9, 10 ** 15
        cur.types["some.very.long.module.path.TypeName%03d%s" % (i, "t" * 80)] = 10 ** 9
    _tracking.TRACKER.every = 1
    _tracking.TRACKER.result = _tracking.compare(prev, cur)
    fake.allocated = 70 * GiB
    memprof_agent.step(10 ** 9)
    for i in range(40):
        memprof_agent.record_detailed(long, note=long, tensors=[ft.Tensor(2, 2)], model={"total_params": 10 ** 12, "trainable_params": 10 ** 12})


def test_the_fields_stay_bounded_and_a_real_sidecar_takes_the_push(sidecar, fake):
    assert memprof_agent.start(interval=60, socket=sidecar.socket)
    at_bounds(fake)
    push = memprof_agent._agent.build("sample")
    body = encode(push, SAMPLE_CAP)
    doc = json.loads(body)
    sizes = {k: len(json.dumps(doc[k], separators=(",", ":"))) for k in ("host", "grads", "sizes", "tracking")}
    events = len(json.dumps(doc["events"], separators=(",", ":")))
    print("bytes at the bounds:", sizes, "events", events, "whole push", len(body))
    assert len(doc["grads"]["nonFinite"]) == len(doc["grads"]["large"]) == len(doc["grads"]["vanishing"]) == 16
    assert len(doc["tracking"]["tensors"]) == len(doc["tracking"]["objects"]) == 32
    assert all(len(g["site"].encode()) <= 128 and len(g["shape"]) == 8 for g in doc["tracking"]["tensors"])
    assert all(len(o["type"].encode()) <= 64 for o in doc["tracking"]["objects"])
    assert len(doc["sizes"]["buckets"]) == len(doc["sizes"]["freeBuckets"]) == 32
    assert len(doc["events"]) == 32 and doc["droppedEvents"] == 8
    # The budget docs/agent-wire.md states for these fields, and the cap with everything at once.
    assert sizes["grads"] <= 7 * 1024 and sizes["tracking"] <= 15 * 1024 and sizes["sizes"] <= 2 * 1024 and sizes["host"] <= 256
    assert len(body) <= SAMPLE_CAP
    before = sidecar.agent_pushes()
    memprof_agent._agent.tick()
    t = memprof_agent._agent.transport
    assert t.failures == 0 and t.sent == 1, "the sidecar refused the push (see its log %s)" % sidecar.log_path
    assert sidecar.agent_pushes() == before + 1
