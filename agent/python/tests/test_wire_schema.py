"""The agent's wire contract, generated from the sidecar's Rust types
(agent/schema/, `make schema`): the files are what the types give, the
pushes the agent builds with every part it has match the push schema, a
field the Rust type lacks does not, and a real sidecar's answers match the
reply schema. Every other test's pushes are checked as well (conftest's
`wire_contract`)."""

import copy
import json
import os
import subprocess

import pytest

import wire
from conftest import ROOT, memprof_agent, wait_until
from memprof_agent._transport import OOM_CAP, encode
from test_push_caps import BIG, everything


def memprof_binary():
    path = os.environ.get("MEMPROF_BIN") or str(ROOT / "target" / "debug" / "memprof")
    if not os.access(path, os.X_OK):
        pytest.fail("no memprof binary at %s: run `cargo build -p memprof --bin memprof` or set MEMPROF_BIN" % path)
    return path


@pytest.mark.parametrize("name", ["push", "reply"])
def test_the_schema_files_are_what_the_rust_types_generate(name):
    out = subprocess.run([memprof_binary(), "agent-schema", name], capture_output=True, check=True).stdout
    assert out == (wire.SCHEMA_DIR / (name + ".json")).read_bytes(), \
        "agent/schema/%s.json is not what the Rust types generate: run `make schema` and commit" % name


def pushes_of_every_kind(fake, monkeypatch):
    """A sample push carrying sites, an OOM push and a final push, each with
    every part of the agent at its bounds, decoded as the sidecar gets them."""
    memprof_agent.start(interval=60, url="http://127.0.0.1:9/v1/agent")
    agent = everything(fake, sites=True)
    bodies = []
    monkeypatch.setattr(agent.transport, "send", lambda body, timeout: bodies.append(body))
    with memprof_agent.phase("forward"):
        agent.tick()
        agent.on_oom(0, BIG, "CUDA out of memory", from_observer=True)
    bodies.append(encode(agent.build("final"), OOM_CAP))
    return [json.loads(b) for b in bodies]


def test_every_push_kind_with_every_part_matches_the_push_schema(fake, monkeypatch):
    docs = pushes_of_every_kind(fake, monkeypatch)
    assert [d["kind"] for d in docs] == ["sample", "oom", "final"]
    parts = set().union(*docs)
    assert {"devices", "events", "breakdown", "host", "grads", "sizes", "tracking", "acks", "sites", "oom",
            "preOom"} <= parts, "a part is missing, so it is not checked: %s" % sorted(parts)
    assert "history" in docs[0]["sites"], "sites.history is part of the contract"
    for doc in docs:
        assert wire.errors("push", doc) == [], doc["kind"]


@pytest.mark.parametrize("where, change", [
    ("(top)", lambda d: d.update(rankk=1)),
    ("devices/0", lambda d: d["devices"][0].update(allocatedByts=1)),
    ("sites/history", lambda d: d["sites"]["history"].update(since=1.0)),
    ("breakdown/byModuleType/0", lambda d: d["breakdown"]["byModuleType"][0].update(buffersBytes=1)),
    ("tracking/tensors/0", lambda d: d["tracking"]["tensors"][0].update(stride=[1])),
    ("devices/0/allocatedBytes", lambda d: d["devices"][0].update(allocatedBytes=1.0)),
    ("(top)", lambda d: d.pop("time")),
    ("kind", lambda d: d.update(kind="periodic")),
    ("breakdown/flags/0/kind", lambda d: d["breakdown"]["flags"][0].update(kind="huge")),
    ("devices", lambda d: d["devices"].append(dict(d["devices"][0], index=99))),  # 17: over MAX_DEVICES
])
def test_a_push_the_sidecars_type_would_not_read_as_sent_fails_the_contract(fake, monkeypatch, where, change):
    """A field the Rust type lacks (the sidecar would drop it), a float where
    serde wants an integer, a missing required field, an unknown kind or
    flag, a list over its bound (the pushes are at their bounds)."""
    doc = copy.deepcopy(pushes_of_every_kind(fake, monkeypatch)[0])
    change(doc)
    found = wire.errors("push", doc)
    assert found and all(line.startswith(where) for line in found), found


def test_a_real_sidecars_answers_match_the_reply_schema(sidecar, fake, wire_contract):
    assert memprof_agent.start(interval=0.05, socket=sidecar.socket)

    def answers():
        return [json.loads(b) for b in wire_contract.bodies(wire_contract.replies)]

    assert wait_until(lambda: any(a.get("verdict") for a in answers()), timeout=15), answers()[-1:]
    for answer in answers():
        assert wire.errors("reply", answer) == [], answer
    answer = dict(answers()[-1], extra=True)
    assert wire.errors("reply", answer) == ["(top): Additional properties are not allowed ('extra' was unexpected)"]
