"""The sidecar's answer to a push (docs/agent-wire.md "The answer"): its current
verdict, directives for the trainer, and whether to record allocation
history. An answer is input, not proof: anything missing, malformed or
out of range is no verdict / no directive, never an error. Unknown fields
are ignored (a newer sidecar may add some)."""

import json
import math

LEVELS = ("none", "low", "medium", "high", "critical")
RANK = {name: i for i, name in enumerate(LEVELS)}
SOURCES = ("agent", "nvml", "sim", "trace")
DIRECTIVE_LEVELS = ("high", "critical")
MAX_DIRECTIVES = 16
MAX_ID = 64
MAX_REASON = 256


class Verdict:
    """The sidecar's risk for this pod: risk (a LEVELS name), tto (seconds
    to the predicted OOM, or None), leak, source, at (unix seconds)."""

    __slots__ = ("risk", "tto", "leak", "source", "at")

    def __init__(self, risk, tto=None, leak=False, source=None, at=None):
        self.risk, self.tto, self.leak, self.source, self.at = risk, tto, leak, source, at

    def rank(self):
        return RANK[self.risk]

    def as_dict(self):
        return {"risk": self.risk, "ttoSeconds": self.tto, "leak": self.leak, "source": self.source, "at": self.at}


class Directive:
    """An order from the operator's policy, relayed by the sidecar: `id`
    (opaque, acknowledged in a later push), `kind`, `level`, `reason`."""

    __slots__ = ("id", "kind", "level", "reason")

    def __init__(self, id, kind, level, reason):
        self.id, self.kind, self.level, self.reason = id, kind, level, reason


class Reply:
    """What one answer said. `verdict` None: no verdict (an old sidecar's
    empty 204, a body that is not contract B)."""

    __slots__ = ("verdict", "directives", "history")

    def __init__(self, verdict=None, directives=(), history=False):
        self.verdict, self.directives, self.history = verdict, list(directives), history

    def __bool__(self):
        return True  # the push was taken, whatever the body said


def parse(body):
    """A Reply from the answer's bytes (None or b'' for none)."""
    if not body:
        return Reply()
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return Reply()
    if not isinstance(doc, dict):
        return Reply()
    return Reply(
        verdict=_verdict(doc.get("verdict")),
        directives=_directives(doc.get("directives")),
        history=doc.get("history") is True,
    )


def _finite(value, low=None):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or (low is not None and value < low):
        return None
    return value


def _verdict(v):
    if not isinstance(v, dict) or v.get("risk") not in RANK:
        return None
    tto = v.get("ttoSeconds")
    if tto is not None:
        tto = _finite(tto, low=0.0)
        if tto is None:
            return None  # a number that cannot be a time: the whole verdict is suspect
    source = v.get("source")
    return Verdict(
        risk=v["risk"],
        tto=tto,
        leak=v.get("leak") is True,
        source=source if source in SOURCES else None,
        at=_finite(v.get("at"), low=0.0),
    )


def _directives(items):
    if not isinstance(items, list):
        return []
    out, seen = [], set()
    for d in items[:MAX_DIRECTIVES]:
        if not isinstance(d, dict):
            continue
        ident, kind = d.get("id"), d.get("kind")
        if not isinstance(ident, str) or not ident or len(ident.encode("utf-8")) > MAX_ID or ident in seen:
            continue
        if not isinstance(kind, str):
            continue
        seen.add(ident)
        level = d.get("level") if d.get("level") in DIRECTIVE_LEVELS else None
        reason = d.get("reason") if isinstance(d.get("reason"), str) else ""
        out.append(Directive(ident, kind[:MAX_ID], level, _cut(reason, MAX_REASON)))
    return out


def _cut(text, max_bytes):
    raw = text.encode("utf-8", "ignore")
    return text if len(raw) <= max_bytes else raw[:max_bytes].decode("utf-8", "ignore")
