"""The agent's wire contract in the tests: the JSON Schemas of agent/schema/
(generated from crates/api/src/agent/ by `make schema`), made strict, and a
recorder of what crosses the wire in a test (conftest's `wire_contract`).

Strict, beyond the generated files:
- No field the Rust type lacks (`additionalProperties: false` on every
  object). The sidecar ignores unknown fields, so that a newer agent still
  talks to an older sidecar; but a field this agent sends that the sidecar's
  type does not have is data that never arrives, so the agent's own tests
  refuse it.
- An integer is a JSON integer: serde reads a u64 from `3`, never from
  `3.0`, which JSON Schema would call an integer."""

import collections
import copy
import functools
import json
import threading
from pathlib import Path

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema"
# The Unix sockets of real memprof-sidecar processes (conftest's Sidecar):
# their answers are checked against the reply schema; stand-ins' are not
# (tests make them answer badly on purpose).
REAL_SIDECARS = set()
# Bodies kept per test: the first ones and the newest ones.
KEEP = 200


def load(name):
    """agent/schema/<name>.json as generated."""
    with open(SCHEMA_DIR / (name + ".json")) as f:
        return json.load(f)


def strict(schema):
    """A copy of `schema` with `additionalProperties: false` on every object
    that lists its properties (module docstring)."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _is_integer(checker, instance):
    return isinstance(instance, int) and not isinstance(instance, bool)


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@functools.lru_cache(maxsize=None)
def validator(name):
    schema = strict(load(name))
    Validator.check_schema(schema)
    return Validator(schema)


def errors(name, doc):
    """What is wrong with `doc` (a decoded push or answer) against schema
    `name`, one line per error: where, then what; [] when nothing is."""
    out = []
    for e in validator(name).iter_errors(doc):
        for leaf in _leaves(e):
            line = "%s: %s" % ("/".join(map(str, leaf.absolute_path)) or "(top)", leaf.message[:200])
            if line not in out:
                out.append(line)
    return sorted(out)


def _leaves(error):
    """The innermost errors under `error`, leaving out the `null` branch of
    an optional field (an object that is wrong is not wrong for not being
    null)."""
    if not error.context:
        return [error]
    inner = [e for e in error.context if not (e.validator == "type" and e.validator_value == "null")]
    return [leaf for e in inner for leaf in _leaves(e)] or [error]


class Recorder:
    """What a test's agent put on the wire: every encoded push body, and
    every answer a real sidecar gave (bounded: the first KEEP and the
    newest KEEP of each)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.exempt = None
        self.pushes = ([], collections.deque(maxlen=KEEP))
        self.replies = ([], collections.deque(maxlen=KEEP))

    def install(self, monkeypatch, transport):
        """Wraps `transport`'s JSON encoder and its accepted-answer path."""
        recorder = self
        dumps = transport._dumps
        accepted = transport.Transport._accepted

        def recording_dumps(push):
            body = dumps(push)
            recorder._keep(recorder.pushes, body)
            return body

        def recording_accepted(t, status, text):
            if status == 200 and t.target.kind == "unix" and t.target.address in REAL_SIDECARS:
                recorder._keep(recorder.replies, text or b"")
            return accepted(t, status, text)

        monkeypatch.setattr(transport, "_dumps", recording_dumps)
        monkeypatch.setattr(transport.Transport, "_accepted", recording_accepted)

    def _keep(self, kept, body):
        with self._lock:
            first, newest = kept
            (first if len(first) < KEEP else newest).append(body)

    def bodies(self, kept):
        with self._lock:
            first, newest = kept
            return list(first) + list(newest)

    def exempt_because(self, why):
        """Checks nothing in this test: it encodes bodies it broke on purpose."""
        self.exempt = why

    def problems(self):
        """Every push and answer that breaks its schema, at most 20 lines."""
        out = []
        if self.exempt:
            return out
        for name, kept in (("push", self.pushes), ("reply", self.replies)):
            for i, body in enumerate(dict.fromkeys(self.bodies(kept))):
                try:
                    doc = json.loads(body)
                except ValueError as exc:
                    out.append("%s %d is not JSON (%s): %r" % (name, i, exc, body[:200]))
                    continue
                out.extend("%s %d: %s" % (name, i, e) for e in errors(name, doc))
        return out[:20]
