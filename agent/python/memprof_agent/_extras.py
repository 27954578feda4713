"""The seed tools' push fields (contract C): `host`, `grads`, `sizes`,
`tracking`, each from its module, each optional and bounded
(docs/agent.md). One push contributor (_core.add_push_contributor),
registered when the package is imported; a failing part is left out of
the push and said once, the others still go."""

from . import _core, _grads, _host, _sizes, _tracking
from ._config import Once

PARTS = (
    ("host", lambda push, torch, kind: _host.host_field(push)),
    ("grads", _grads.push_field),
    ("sizes", _sizes.push_field),
    ("tracking", _tracking.push_field),
)

_say = Once()


def contribute(kind, torch, push):
    """The fields that have something to say, as a dict. `push` is the push
    built so far: `host` reads its rssBytes, `sizes` its devices (the daemon
    thread's current device is not the trainer's). Never raises."""
    out = {}
    for name, part in PARTS:
        try:
            value = part(push, torch, kind)
            if value is not None:
                out[name] = value
        except Exception as exc:
            _say(name, "memprof-agent: the push's %s failed (%r); pushes go without it", name, exc)
    return out


_core.add_push_contributor(contribute, with_push=True)
