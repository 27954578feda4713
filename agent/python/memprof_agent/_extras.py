"""The push fields of issue 19 (contract C): `host`, `grads`, `sizes`,
`tracking`, each from its module, each optional and bounded
(docs/agent.md). Called once per push by _core.Agent.build; a failing
part is left out of the push and said once, the others still go."""

from . import _grads, _host, _sizes, _tracking
from ._transport import log

PARTS = (
    ("host", lambda push, torch, kind: _host.host_field(push)),
    ("grads", _grads.push_field),
    ("sizes", _sizes.push_field),
    ("tracking", _tracking.push_field),
)

_said = set()


def extend(push, torch, kind):
    """Adds the fields that have something to say to `push`. Never raises."""
    for name, part in PARTS:
        try:
            value = part(push, torch, kind)
            if value is not None:
                push[name] = value
        except Exception as exc:
            if name not in _said:
                _said.add(name)
                log.warning("memprof-agent: the push's %s failed (%r); pushes go without it", name, exc)
