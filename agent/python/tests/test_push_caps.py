"""Every push at its bounds, with the fields of both halves of the agent
full at once (the seed tools' host/grads/sizes/tracking and event extras;
the acks, checkpoint events and sites; the OOM push's oom and
preOom): what each push takes, what encode() sheds to keep it within the
cap docs/agent-wire.md states for it, and that a real sidecar takes the
largest."""

import json
import types

from conftest import closed_port, fake_torch as ft, memprof_agent
from memprof_agent import _core, _history, _reply, _risk, _watch
from memprof_agent._transport import OOM_CAP, SAMPLE_CAP, _dumps, encode
from test_seed_push import at_bounds

GiB = 1 << 30
BIG = 10 ** 15  # byte counts with as many digits as a real run can reach


def long_devices(fake):
    """16 devices, each with its name and uuid at their longest."""
    fake.device_count = lambda: 16
    fake.get_device_properties = lambda i: types.SimpleNamespace(name="N" * 300, uuid="u" * 300, total_memory=BIG)
    ft.sys.modules["torch"].cuda.device_count = fake.device_count
    ft.sys.modules["torch"].cuda.get_device_properties = fake.get_device_properties
    fake.total, fake.reserved, fake.allocated, fake.peak_allocated = BIG + 2 * GiB, BIG - 1, BIG - 2, BIG - 2


def full_breakdown():
    bd = memprof_agent._breakdown
    b = {k: BIG for k in ("totalParameters", "trainableParameters", "parametersBytes", "gradientsBytes",
                          "optimizerBytes", "perSampleGradientsBytes", "staticBytes", "activationsPeakBytes",
                          "batchSize", "optimizerStepPeakBytes", "step")}
    b["byModuleType"] = [{"type": t, "parameters": BIG, "parametersBytes": BIG, "gradientsBytes": BIG, "optimizerBytes": BIG}
                         for t in sorted(bd.TYPES)]
    b["flags"] = [{"kind": "large", "parameter": "p" * bd.MAX_PARAMETER_NAME, "note": "n" * 256} for _ in range(bd.MAX_FLAGS)]
    b["phases"] = [{"module": "m" * 300, "forwardBytes": BIG, "backwardBytes": BIG} for _ in range(40)]
    rows = memprof_agent._rows
    b["parameterRows"] = [{"name": "p" * rows.MAX_NAME, "shape": [BIG] * rows.MAX_SHAPE_DIMS, "dtype": "d" * rows.MAX_DTYPE,
                           "bytes": BIG, "trainable": True} for _ in range(rows.MAX_ROWS)]
    b["layerRows"] = [{"name": "l" * rows.MAX_NAME, "parameters": BIG, "trainableParameters": BIG, "bytes": BIG}
                      for _ in range(rows.MAX_ROWS)]
    b["parametersLeftOut"] = b["layersLeftOut"] = {"rows": BIG, "parameters": BIG, "bytes": BIG}
    b["dpSgd"] = {"samples": BIG, "parameters": BIG, "normsBytes": BIG, "normsSource": "modelled",
                  "tempMatricesBytes": BIG, "sequenceLength": BIG}
    _watch.CARRIED.breakdown = b


def long_snapshot(fake):
    """More live blocks than any list takes, each from its own site, every
    frame's text at its longest."""
    def frames(i):
        return [{"filename": "f" * 400, "line": 10 ** 9 + i, "name": "g" * 400} for _ in range(12)]

    blocks = [{"size": BIG - i, "requested_size": BIG, "state": "active_allocated", "frames": frames(i)} for i in range(40)]
    fake.snapshot = {"segments": [{"device": 0, "blocks": blocks}]}


def full_acks():
    for i in range(_risk.MAX_ACKS + 4):
        _core.RISK._queue_ack({"id": ("d%02d" % i).ljust(_reply.MAX_ID, "i"), "action": _risk._cut("a" * 400), "ok": False})


def checkpoints(n):
    long = "n" * 300
    for _ in range(n):
        memprof_agent.record_detailed("checkpoint", note=long, tensors=[ft.Tensor(2, 2)],
                                      model={"total_params": BIG, "trainable_params": BIG})


def everything(fake, sites):
    with memprof_agent.phase("p" * 300):  # events carry it too
        at_bounds(fake)  # grads, sizes, tracking, 40 long events (32 pushed)
        checkpoints(_core.MAX_CHECKPOINTS_UNSENT)
    long_devices(fake)
    full_breakdown()
    full_acks()
    long_snapshot(fake)
    agent = memprof_agent._agent
    if sites:
        agent.sites_outbox = _history.allocation_sites(ft.sys.modules["torch"], "critical", agent.history)
    return agent


def sent_bodies(agent, monkeypatch):
    """What the agent sends (still sent), and each push's size before
    encode() shed anything."""
    bodies, raw = [], []
    send = agent.transport.send

    def measure(push, cap):
        raw.append(len(_dumps(push)))
        return encode(push, cap)

    def keep(body, timeout):
        bodies.append(body)
        return send(body, timeout)

    monkeypatch.setattr(_core, "encode", measure)
    monkeypatch.setattr(agent.transport, "send", keep)
    return bodies, raw


def sizes_of(doc):
    return sorted(((k, len(_dumps(v))) for k, v in doc.items()), key=lambda kv: -kv[1])[:8]


def test_a_periodic_push_with_every_field_full_sheds_other_events_to_stay_under_64k(fake, monkeypatch):
    """All lists full and 16 devices exceed 64 KiB by a few KiB: encode()
    sheds the events that are not checkpoints (counted), and everything
    else goes."""
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    agent = everything(fake, sites=False)
    bodies, raw = sent_bodies(agent, monkeypatch)
    with memprof_agent.phase("p" * 300):
        agent.tick()
    (body,) = bodies
    doc = json.loads(body)
    print("sample: %d bytes before shedding, %d sent" % (raw[0], len(body)), sizes_of(doc))
    assert raw[0] > SAMPLE_CAP, "at the bounds the events do not all fit (docs/agent-wire.md says so)"
    assert len(body) <= SAMPLE_CAP
    assert len(doc["devices"]) == 16 and len(doc["acks"]) == _risk.MAX_ACKS
    assert [e["name"] for e in doc["events"]] == ["checkpoint"] * _core.MAX_CHECKPOINTS_UNSENT
    assert all("detail" in e and "maxAllocatedBytes" in e for e in doc["events"]), "the extras go with them"
    assert doc["droppedEvents"] == 8 + 16  # 8 over the queue's bound, 16 shed for size
    for key in ("host", "grads", "sizes", "tracking", "breakdown"):
        assert doc[key], key
    assert len(doc["tracking"]["tensors"]) == 32 and len(doc["grads"]["nonFinite"]) == 16


def test_a_push_with_sites_and_every_field_full_fits_the_larger_cap_whole(fake, monkeypatch):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    agent = everything(fake, sites=True)
    bodies, raw = sent_bodies(agent, monkeypatch)
    with memprof_agent.phase("p" * 300):
        agent.tick()
    (body,) = bodies
    doc = json.loads(body)
    print("sites: %d bytes" % len(body), sizes_of(doc))
    assert raw[0] == len(body) <= OOM_CAP, "nothing shed"
    assert len(doc["sites"]["blocks"]) == 16 and all(len(b["frames"]) == 8 for b in doc["sites"]["blocks"])
    assert len(doc["events"]) == 32


def test_an_oom_push_with_every_field_full_fits_the_sidecars_cap_and_a_real_sidecar_takes_it(sidecar, fake, monkeypatch):
    memprof_agent.start(interval=60, socket=sidecar.socket)
    agent = everything(fake, sites=True)
    bodies, raw = sent_bodies(agent, monkeypatch)
    before = sidecar.agent_pushes()
    with memprof_agent.phase("p" * 300):
        agent.on_oom(0, BIG, "m" * 5000, from_observer=True)
    (body,) = bodies
    doc = json.loads(body)
    print("oom: %d bytes" % len(body), sizes_of(doc))
    assert raw[0] == len(body) <= OOM_CAP, "nothing shed"
    assert len(doc["oom"]["blocks"]) == len(doc["sites"]["blocks"]) == 16
    assert len(doc["preOom"]["devices"]) == 16 and len(doc["events"]) == 32 and len(doc["acks"]) == 16
    # The per-field figures of docs/agent-wire.md's Fields table.
    KiB = 1024
    documented = {"devices": 9 * KiB, "events": 22 * KiB, "oom": 73 * KiB, "breakdown": 19 * KiB, "acks": 4 * KiB,
                  "sites": 72 * KiB, "preOom": 9 * KiB}
    assert all(len(_dumps(doc[k])) <= v for k, v in documented.items()), sizes_of(doc)
    t = agent.transport
    assert t.failures == 0 and t.sent == 1, "the sidecar refused the push: %s" % sidecar.log_path.read_text()[-3000:]
    assert sidecar.agent_pushes() == before + 1


def escaped(x):
    """Every string at the same UTF-8 length in control characters: JSON
    writes each as six bytes (\\u0001), the most any byte-bounded string
    can grow."""
    if isinstance(x, dict):
        return {k: escaped(v) for k, v in x.items()}
    if isinstance(x, list):
        return [escaped(v) for v in x]
    if isinstance(x, str):
        return "\x01" * len(x.encode("utf-8"))
    return x


def test_strings_that_json_escapes_can_pass_64k_but_never_the_sidecars_cap(fake, monkeypatch, wire_contract):
    """The bounds are in bytes of UTF-8; JSON escapes control characters
    to six bytes each (and non-ASCII to \\u escapes). Even with every
    string so, encode() brings every push under the 256 KiB the sidecar
    takes (docs/agent-wire.md "Transport")."""
    wire_contract.exempt_because("every string, enum values too, is replaced by control characters")
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    agent = everything(fake, sites=False)
    built = []
    monkeypatch.setattr(_core, "encode", lambda push, cap: built.append((push, cap)) or b"{}")
    monkeypatch.setattr(agent.transport, "send", lambda body, timeout: None)  # refused: sites stay for the next
    with memprof_agent.phase("p" * 300):
        agent.tick()
        agent.sites_outbox = _history.allocation_sites(ft.sys.modules["torch"], "critical", agent.history)
        agent.tick()
        agent.on_oom(0, BIG, "m" * 5000, from_observer=True)
    assert [(p["kind"], "sites" in p) for p, _ in built] == [("sample", False), ("sample", True), ("oom", True)]
    for push, cap in built:
        body = encode(escaped(push), cap)
        print("%s%s: %d bytes escaped, %d after encode()" % (push["kind"], " with sites" if "sites" in push else "",
                                                            len(_dumps(escaped(push))), len(body)))
        assert len(body) <= OOM_CAP
        assert len(json.loads(body)["devices"]) == 16, "the numbers always go"
