"""What holds a trainer's memory: bytes of parameters, gradients, optimizer
state and per-sample gradients, by module type recognised from the model's
structure (docs/agent.md, "Breakdown", states the rules), plus flags for
parameters holding NaN/Inf or unusually large for their kind of layer.

Runs on the caller's thread, once (breakdown() or watch()'s step 2), never
per step. Pure walks over the module tree are separate from the one place
that launches GPU work (_norms). Nothing here raises into the trainer."""

import math
import re

from . import _dpsgd, _rows
from . import _torchread as tr
from ._config import Once

TYPES = ("attention", "mlp", "embedding", "norm", "lora", "other")
MAX_FLAGS = 16
MAX_PARAMETER_NAME = 128
MAX_FLAG_NOTE = 256
# "large": a parameter's RMS above LARGE_FACTOR x the median RMS of the
# parameters of its module type and rank (1-D vs 2-D+), in a group of at
# least LARGE_MIN_GROUP parameters (fewer give no meaningful median).
LARGE_FACTOR = 10.0
LARGE_MIN_GROUP = 3

# peft's attribute names for LoRA adapters (older peft versions subclass
# nn.Linear and keep the adapters beside their own weight).
LORA_NAMES = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"}
_Q = {"q", "query", "wq", "xq"}
_K = {"k", "key", "wk", "xk"}
_V = {"v", "value", "wv", "xv"}
_FUSED = {"qkv", "wqkv", "attn"}
_KV = {"kv", "wkv"}
_OUT = {"o", "out", "wo", "proj", "dense"}
_CONTAINERS = {"ModuleList", "Sequential", "ModuleDict"}
_NORM_CLASS = re.compile(r"Norm(\d+d)?$")
_say_once = Once()


# --- the module tree: pure walks ------------------------------------------


def _mro_names(module):
    return [c.__name__ for c in type(module).__mro__]


def _own_params(module):
    try:
        return [(n, p) for n, p in module.named_parameters(recurse=False) if p is not None]
    except Exception:
        return [(n, p) for n, p in getattr(module, "_parameters", {}).items() if p is not None]


def _children(module):
    try:
        return list(module.named_children())
    except Exception:
        return []


def _tokens(name):
    return set(t for t in re.split(r"[^a-z]+", name.lower()) if t)


def is_embedding(module):
    return any(n in ("Embedding", "EmbeddingBag") for n in _mro_names(module))


def is_norm(module):
    """A *Norm class (LayerNorm, RMSNorm, BatchNorm1d, GroupNorm, ...), or a
    leaf whose parameters are only weight[/bias], 1-D, of one length (a
    hand-written RMSNorm)."""
    if any(_NORM_CLASS.search(n) for n in _mro_names(module)):
        return True
    if _children(module):
        return False
    params = _own_params(module)
    if not params or any(n not in ("weight", "bias") for n, _ in params):
        return False
    shapes = [tuple(p.shape) for _, p in params]
    return all(len(s) == 1 for s in shapes) and len(set(shapes)) == 1


def weight_shape(module):
    """The 2-D weight of a Linear-like module (nn.Linear, HF Conv1D, a
    quantized Linear, or a peft wrapper through its base_layer), else None."""
    if is_embedding(module):
        return None
    w = getattr(module, "weight", None)
    shape = tuple(getattr(w, "shape", ()) or ())
    if len(shape) == 2:
        return shape
    base = getattr(module, "base_layer", None)
    if base is not None and base is not module and _is_module(base):
        return weight_shape(base)
    return None


def _is_module(obj):
    return hasattr(obj, "named_children") and hasattr(obj, "named_parameters")


def _attention_children(module):
    """(names of the children of `module` that are its attention
    projections, whether they are all of its Linear-like children), or None
    when `module` is no attention module. An attention module has q, k and
    v projections among its Linear-like children: separate (q/query/wq, ...),
    q beside a fused kv, or one fused projection (a qkv-like name, or a
    3d x d weight beside a d x d one); its output projection is a d x d
    Linear-like child. A module that also has other Linear-like children
    (attention and MLP in one block) gets only the projections counted as
    attention."""
    linears = {n: s for n, c in _children(module) for s in [weight_shape(c)] if s is not None}
    if not linears:
        return None
    names = {n: _tokens(n) for n in linears}
    q = [n for n, t in names.items() if t & _Q and not t & (_K | _V | _KV)]
    k = [n for n, t in names.items() if t & (_K | _KV) and not t & _Q]
    v = [n for n, t in names.items() if t & (_V | _KV) and not t & _Q]
    fused = [n for n, t in names.items() if (t & _FUSED and max(linears[n]) >= 2 * min(linears[n]))
             or (t & _Q and t & _K and t & _V)]
    square = [n for n, s in linears.items() if s[0] == s[1]]
    if not fused and not (q and k and v):
        fused = [n for n, s in linears.items() if max(s) == 3 * min(s) and any(x != n for x in square)]
    if not fused and not (q and k and v):
        return None
    proj = set(q + k + v + fused)
    outs = [n for n in square if n not in proj]
    if len(proj) + len(outs) == len(linears):
        return set(linears), True
    named_outs = [n for n in outs if names[n] & _OUT]
    proj.update(named_outs[:1] or outs[:1])
    return proj, False


def _is_attention_class(module):
    """MultiheadAttention, LlamaAttention, BertSelfAttention, ...: a class in
    its hierarchy named *Attention*."""
    return any("attention" in n.lower() for n in _mro_names(module)[:-2])


def classify(model):
    """{module path: type} for every module of `model` that owns parameters
    (docs/agent.md: the rules, in this order: lora, embedding, norm,
    attention, mlp, other)."""
    modules = dict(model.named_modules())
    attention = set()  # paths of modules inside attention
    in_block = set()  # paths inside an element of a ModuleList/Sequential/ModuleDict
    lora = set()
    stack = [("", model, False, False, False)]
    while stack:
        path, module, att, block, adapter = stack.pop()
        whole, picked = False, set()
        if not att:
            if _is_attention_class(module):
                att = True
            else:
                found = _attention_children(module)
                if found is not None:
                    picked, whole = found
        for flag_set, on in ((attention, att or whole), (in_block, block), (lora, adapter)):
            if on:
                flag_set.add(path)
        is_container = bool(set(_mro_names(module)) & _CONTAINERS)
        base = getattr(module, "base_layer", None)
        base = base if base is not None and _is_module(base) else None
        for name, child in _children(module):
            child_path = "%s.%s" % (path, name) if path else name
            child_adapter = adapter or name in LORA_NAMES or (base is not None and child is not base)
            stack.append((child_path, child, att or name in picked, block or is_container, child_adapter))
    vocab = _embedding_shapes(modules.values())
    out = {}
    for path, module in modules.items():
        if _own_params(module):
            out[path] = _type_of(path, module, modules, attention, in_block, lora, vocab)
    return out


def _embedding_shapes(modules):
    """The weight shapes (num_embeddings x dim) of the model's embeddings."""
    out = set()
    for m in modules:
        if is_embedding(m):
            shape = tuple(getattr(getattr(m, "weight", None), "shape", ()) or ())
            if len(shape) == 2:
                out.add(shape)
    return out


def _type_of(path, module, modules, attention, in_block, lora, vocab):
    if path in lora:
        return "lora"
    if is_embedding(module):
        return "embedding"
    if is_norm(module):
        return "norm"
    if path in attention:
        return "attention"
    node = path
    if path.endswith("base_layer") and "." in path:
        node = path.rsplit(".", 1)[0]  # a peft wrapper stands where the layer stood
    shape = weight_shape(module)
    if shape is not None:
        if node not in in_block and (shape in vocab or shape[::-1] in vocab):
            return "embedding"  # the output head: an embedding's shape, outside the blocks
        if node in in_block:
            return "mlp"
        parent = modules.get(node.rsplit(".", 1)[0] if "." in node else "")
        if parent is not None:
            stack = [n for n, c in _children(parent) if weight_shape(c) is not None]
            if len(stack) >= 2:
                return "mlp"
    return "other"


# --- counting ---------------------------------------------------------------


def _tensor_bytes(t):
    return int(t.numel()) * int(t.element_size())


def _region(t):
    """One key per memory region, so a tensor reachable twice is counted
    once (tied weights, a state tensor shared between parameters); views
    of one flat buffer at different offsets stay distinct."""
    device = getattr(t, "device", None)
    if getattr(device, "type", None) == "meta":
        return ("meta", id(t))  # no memory, and every meta tensor's data_ptr is 0
    return (str(device), int(t.data_ptr()), int(t.numel()), str(getattr(t, "dtype", "")))


class _Counter:
    def __init__(self):
        self.seen = set()

    def add(self, t):
        """Bytes of t not counted before (0 when already counted)."""
        key = _region(t)
        if key in self.seen:
            return 0
        self.seen.add(key)
        return _tensor_bytes(t)


def _is_tensor(torch, x):
    try:
        return bool(torch.is_tensor(x))
    except Exception:
        return hasattr(x, "numel") and hasattr(x, "element_size") and hasattr(x, "data_ptr")


def _per_sample(p):
    """Opacus keeps per-sample gradients in p.grad_sample: a tensor, or a
    list of tensors when the module ran more than once."""
    g = getattr(p, "grad_sample", None)
    if g is None:
        return []
    return list(g) if isinstance(g, (list, tuple)) else [g]


def empty(step=None, batch_size=None):
    return {
        "step": step, "totalParameters": 0, "trainableParameters": 0,
        "parametersBytes": 0, "gradientsBytes": 0, "optimizerBytes": 0,
        "perSampleGradientsBytes": None, "staticBytes": 0, "activationsPeakBytes": None,
        "batchSize": batch_size, "byModuleType": [], "flags": [], "phases": None,
        "optimizerStepPeakBytes": None, "parameterRows": [], "parametersLeftOut": None,
        "layerRows": [], "layersLeftOut": None, "dpSgd": None, "notes": [],
    }


def _count(torch, params, types, optimizer, out):
    """Fills the byte counts of `out` from the parameters [(name, p, path)]."""
    by_type = {t: {"type": t, "parameters": 0, "parametersBytes": 0, "gradientsBytes": 0, "optimizerBytes": 0} for t in TYPES}
    kind_of = {}
    pc, gc, sc = _Counter(), _Counter(), _Counter()
    per_sample = None
    for name, p, path in params:
        kind = types.get(path, "other")
        kind_of[id(p)] = kind
        n = int(p.numel())
        out["totalParameters"] += n
        if getattr(p, "requires_grad", False):
            out["trainableParameters"] += n
        entry = by_type[kind]
        entry["parameters"] += n
        b = pc.add(p)
        entry["parametersBytes"] += b
        out["parametersBytes"] += b
        g = getattr(p, "grad", None)
        if g is not None:
            b = gc.add(g)
            entry["gradientsBytes"] += b
            out["gradientsBytes"] += b
        for s in _per_sample(p):
            per_sample = (per_sample or 0) + sc.add(s)
    out["perSampleGradientsBytes"] = per_sample
    if optimizer is not None:
        try:
            _count_optimizer(torch, optimizer, kind_of, by_type, out, params)
        except Exception as exc:
            _note(out, "optimizer state", exc)
    out["byModuleType"] = [by_type[t] for t in TYPES if by_type[t]["parameters"] > 0 or by_type[t]["optimizerBytes"] > 0]
    out["staticBytes"] = out["parametersBytes"] + out["gradientsBytes"] + out["optimizerBytes"] + (per_sample or 0)


def _count_optimizer(torch, optimizer, kind_of, by_type, out, params):
    """Every tensor in optimizer.state, each region once. CPU tensors are
    left out when the parameters live on an accelerator (Adam's `step`
    counters, an offloaded state): they hold no device memory."""
    on_device = any(getattr(getattr(p, "device", None), "type", "cpu") != "cpu" for _, p, _ in params)
    counter = _Counter()
    for p, state in list(getattr(optimizer, "state", {}).items()):
        kind = kind_of.get(id(p), "other")
        values = state.values() if isinstance(state, dict) else []
        for v in values:
            if not _is_tensor(torch, v):
                continue
            if on_device and getattr(getattr(v, "device", None), "type", "cpu") == "cpu":
                continue
            b = counter.add(v)
            by_type[kind]["optimizerBytes"] += b
            out["optimizerBytes"] += b


def unique_parameters(model):
    """[(name, parameter, owning module path)], each parameter once (a tied
    weight belongs to the first module that holds it)."""
    seen, out = set(), []
    for path, module in model.named_modules():
        for name, p in _own_params(module):
            if id(p) in seen:
                continue
            seen.add(id(p))
            out.append(("%s.%s" % (path, name) if path else name, p, path))
    return out


# --- flags --------------------------------------------------------------------


def _norms(torch, params):
    """One float per parameter: its L2 norm. One reduction per parameter, no
    temporary of the parameter's size, and one device-to-host copy per
    device (not one sync per parameter)."""
    groups = {}
    for i, (_, p, _) in enumerate(params):
        groups.setdefault(str(getattr(p, "device", "cpu")), []).append(i)
    out = [0.0] * len(params)
    with torch.no_grad():
        for idx in groups.values():
            norms = [torch.linalg.vector_norm(params[i][1].detach()).float() for i in idx]
            for i, v in zip(idx, torch.stack(norms).tolist()):
                out[i] = float(v)
    return out


def flag(torch, params, types):
    """NaN/Inf, then "large" (the rule in LARGE_FACTOR's comment), at most
    MAX_FLAGS, the worst first."""
    params = [x for x in params if int(x[1].numel()) > 0 and x[1].is_floating_point()]
    norms = _norms(torch, params)
    bad, rms, overflow = [], {}, []
    for (name, p, path), norm in zip(params, norms):
        if math.isnan(norm) or math.isinf(norm):
            with torch.no_grad():
                if bool(torch.isnan(p.detach()).any().item()):
                    bad.append(_flag("nan", name, "holds NaN"))
                elif bool(torch.isinf(p.detach()).any().item()):
                    bad.append(_flag("inf", name, "holds an infinity"))
                else:
                    overflow.append(_flag("large", name, "its L2 norm overflows %s" % getattr(p, "dtype", "its dtype")))
            continue
        group = (types.get(path, "other"), min(int(p.dim()), 2))
        rms.setdefault(group, []).append((norm / math.sqrt(int(p.numel())), name))
    large = []
    for (kind, dims), values in rms.items():
        if len(values) < LARGE_MIN_GROUP:
            continue
        median = _median([v for v, _ in values])
        if median <= 0:
            continue
        for v, name in values:
            if v > LARGE_FACTOR * median:
                note = "RMS %.3g is %.0fx the median RMS %.3g of the %d %s %s parameters" % (
                    v, v / median, median, len(values), "1-D" if dims == 1 else "2-D+", kind)
                large.append((v / median, _flag("large", name, note)))
    large.sort(key=lambda x: -x[0])
    return (bad + overflow + [f for _, f in large])[:MAX_FLAGS]


def _flag(kind, name, note):
    return {"kind": kind, "parameter": tr.truncate(name, MAX_PARAMETER_NAME, keep_end=True),
            "note": tr.truncate(note, MAX_FLAG_NOTE)}


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0


# --- the entry point ------------------------------------------------------------


def compute(torch, model, optimizer=None, batch_size=None, step=None, flags=True, sequence_length=None):
    """The breakdown dict (C-2 shape plus `notes`). Each stage that fails
    leaves what the others computed and a note; the failure is logged once.
    `sequence_length` lets _dpsgd model ghost clipping's matrices."""
    out = empty(step=step, batch_size=batch_size)
    params, types = [], {}
    stages = (
        ("parameters", lambda: params.extend(unique_parameters(model))),
        ("module types", lambda: types.update(classify(model))),
        ("bytes", lambda: _count(torch, params, types, optimizer, out)),
        ("rows", lambda: out.update(_rows.rows(params))),
        ("dp-sgd", lambda: out.update(dpSgd=_dpsgd.dp_sgd(params, _Counter(), sequence_length))),
    )
    for name, run in stages:
        try:
            run()
        except Exception as exc:
            _note(out, name, exc)
    if flags and params:
        try:
            out["flags"] = flag(torch, params, types)
        except Exception as exc:
            _note(out, "flags", exc)
    if params and out["gradientsBytes"] == 0 and out["trainableParameters"] > 0:
        out["notes"].append("no parameter had a .grad (zero_grad(set_to_none=True) frees them): gradients counted 0")
    return out


def _note(out, stage, exc):
    out["notes"].append("%s: %r" % (stage, exc))
    _say_once((stage, repr(exc)[:80]), "memprof-agent: breakdown: %s failed (%r); the breakdown has what else could be computed", stage, exc)


PUSH_FIELDS = (
    "step", "totalParameters", "trainableParameters", "parametersBytes", "gradientsBytes",
    "optimizerBytes", "perSampleGradientsBytes", "staticBytes", "activationsPeakBytes", "batchSize",
    "byModuleType", "flags", "phases", "optimizerStepPeakBytes",
    "parameterRows", "parametersLeftOut", "layerRows", "layersLeftOut", "dpSgd",
)


def for_push(b):
    """The C-2 object of a breakdown dict: its fields only, non-negative,
    bounded and consistent. The sidecar refuses a push whose breakdown is
    not, and with it the allocator's numbers: a partial breakdown (a stage
    failed) must still pass."""
    out = {k: b.get(k) for k in PUSH_FIELDS}
    for k in ("totalParameters", "trainableParameters", "parametersBytes", "gradientsBytes", "optimizerBytes", "staticBytes"):
        v = out[k]
        out[k] = max(0, v) if isinstance(v, int) and not isinstance(v, bool) else 0
    out["trainableParameters"] = min(out["trainableParameters"], out["totalParameters"])
    for k in ("step", "perSampleGradientsBytes", "activationsPeakBytes", "batchSize", "optimizerStepPeakBytes"):
        v = out[k]
        out[k] = None if not isinstance(v, int) or isinstance(v, bool) else max(0, v)
    parts = out["parametersBytes"] + out["gradientsBytes"] + out["optimizerBytes"] + (out["perSampleGradientsBytes"] or 0)
    out["staticBytes"] = max(out["staticBytes"], parts)
    seen = set()
    out["byModuleType"] = [e for e in (out["byModuleType"] or []) if e.get("type") in TYPES and not (e["type"] in seen or seen.add(e["type"]))]
    out["flags"] = [f for f in (out["flags"] or []) if f.get("kind") in ("nan", "inf", "large")][:MAX_FLAGS]
    if out["phases"] is not None:
        out["phases"] = [
            {"module": tr.truncate(p["module"], MAX_PARAMETER_NAME, keep_end=True),
             "forwardBytes": max(0, int(p["forwardBytes"])), "backwardBytes": max(0, int(p["backwardBytes"]))}
            for p in out["phases"][:32]
        ]
    out.update(_rows.for_push(out))
    out["parameterRows"], out["layerRows"] = out["parameterRows"] or None, out["layerRows"] or None
    return {k: v for k, v in out.items() if v is not None}
