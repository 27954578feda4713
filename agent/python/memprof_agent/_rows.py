"""The breakdown's per-parameter and per-layer rows (seed 001's model
analysis: name, shape, dtype, bytes, trainable), the largest MAX_ROWS of
each, and what the rest adds up to, so nothing is silently lost.

Why at most MAX_ROWS rows and MAX_PARAMETER_JSON / MAX_LAYER_JSON bytes of
each list: the breakdown rides on every push (64 KiB each, every second,
with every other field; test_push_caps fills them all), and the sidecar
keeps it in a MemoryReport and a MemoryProfile, objects the API server
stores whole. Real rows are about 100 bytes (a 40-character name, 2
dimensions): 16 of each fit the byte bounds, and show the embeddings, the
head and the largest matrices, which decide the memory; rows at their
longest (128-byte names, 8 dimensions) stop at the byte bound first. The
left-out totals carry the rest.

A layer is a parameter's owning module cut after its first numbered
element (`model.layers.3`: a block of a ModuleList or Sequential), or the
owning module itself outside the blocks (`lm_head`); the model's own
parameters form the layer `(model)`. Pure: no GPU work."""

import json
import re

from . import _torchread as tr

MAX_ROWS = 16
MAX_PARAMETER_JSON = 2560
MAX_LAYER_JSON = 1792
MAX_NAME = 128
MAX_SHAPE_DIMS = 8
MAX_DTYPE = 32
U64_MAX = (1 << 64) - 1
_NUMBERED = re.compile(r"^\d+$")


def layer_of(path):
    """The layer a module path belongs to (the module docstring's rule)."""
    if not path:
        return "(model)"
    parts = path.split(".")
    for i, part in enumerate(parts):
        if _NUMBERED.match(part):
            return ".".join(parts[: i + 1])
    return path


def dtype_name(t):
    """`float32` for torch.float32; bounded."""
    name = str(getattr(t, "dtype", "") or "")
    return tr.truncate(name[len("torch."):] if name.startswith("torch.") else name, MAX_DTYPE)


def rows(params):
    """{"parameterRows", "parametersLeftOut", "layerRows", "layersLeftOut"}
    of the parameters [(name, p, owning module path)], each once."""
    per_param, layers = [], {}
    for name, p, path in params:
        n, b = int(p.numel()), int(p.numel()) * int(p.element_size())
        trainable = bool(getattr(p, "requires_grad", False))
        per_param.append((b, name, n, {
            "name": tr.truncate(name, MAX_NAME, keep_end=True),
            "shape": [int(d) for d in tuple(p.shape)[:MAX_SHAPE_DIMS]],
            "dtype": dtype_name(p), "bytes": b, "trainable": trainable,
        }))
        layer = layer_of(path)
        row = layers.setdefault(layer, {"name": tr.truncate(layer, MAX_NAME, keep_end=True),
                                        "parameters": 0, "trainableParameters": 0, "bytes": 0})
        row["parameters"] += n
        row["trainableParameters"] += n if trainable else 0
        row["bytes"] += b
    out = {}
    per_param.sort(key=lambda e: (-e[0], e[1]))
    out["parameterRows"], out["parametersLeftOut"] = fit([e[3] for e in per_param], None, MAX_PARAMETER_JSON)
    layer_rows = sorted(layers.values(), key=lambda r: (-r["bytes"], r["name"]))
    out["layerRows"], out["layersLeftOut"] = fit(layer_rows, None, MAX_LAYER_JSON)
    return out


def parameters_of(row):
    """A row's parameters: a layer's count, or a parameter's shape's product."""
    if "parameters" in row:
        return int(row["parameters"])
    n = 1
    for d in row.get("shape", []):
        n *= int(d)
    return n


def fit(rows, left, max_json):
    """The first rows, at most MAX_ROWS and max_json bytes of JSON, and
    `left` (the totals of rows already left out) with the others added
    (None when none is left out)."""
    kept, size = 0, 0
    for r in rows[:MAX_ROWS]:
        size += len(json.dumps(r, separators=(",", ":"))) + 1
        if size > max_json:
            break
        kept += 1
    rest = rows[kept:]
    if rest:
        left = dict(left or {"rows": 0, "parameters": 0, "bytes": 0})
        left["rows"] += len(rest)
        left["parameters"] += sum(parameters_of(r) for r in rest)
        left["bytes"] += sum(int(r["bytes"]) for r in rest)
        left = {k: min(int(v), U64_MAX) for k, v in left.items()}  # the wire's numbers are u64
    return list(rows[:kept]), left


def for_push(b):
    """The rows of a breakdown dict within their bounds (count and bytes),
    whatever set them: what does not fit moves into the left-out totals."""
    out = {}
    out["parameterRows"], out["parametersLeftOut"] = fit(list(b.get("parameterRows") or []),
                                                         b.get("parametersLeftOut"), MAX_PARAMETER_JSON)
    out["layerRows"], out["layersLeftOut"] = fit(list(b.get("layerRows") or []), b.get("layersLeftOut"), MAX_LAYER_JSON)
    return out
