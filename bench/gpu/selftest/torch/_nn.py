"""torch.nn, torch.nn.functional and torch.optim of the stand-in (see __init__)."""
import torch as _t
from torch import Parameter, Tensor, _graph_op, _module, float32

nn = _module("nn")
F = _module("nn.functional")
nn.functional = F
optim = _module("optim")


class Module:
    training = True

    def __call__(self, *a, **k):
        return self.forward(*a, **k)

    def children(self):
        for v in vars(self).values():
            if isinstance(v, Module):
                yield v

    def parameters(self):
        for v in vars(self).values():
            if isinstance(v, Parameter):
                yield v
        for c in self.children():
            yield from c.parameters()

    def to(self, *a, **k):
        return self

    def train(self, mode=True):
        self.training = mode
        for c in self.children():
            c.train(mode)
        return self

    def eval(self):
        return self.train(False)


class ModuleList(Module):
    def __init__(self, mods):
        self._list = list(mods)
        for i, m in enumerate(self._list):
            setattr(self, "m%d" % i, m)

    def __iter__(self):
        return iter(self._list)


class Linear(Module):
    def __init__(self, n_in, n_out, bias=True):
        self.weight = Parameter(Tensor((n_out, n_in)))
        self.n_out = n_out

    def forward(self, x):
        return _graph_op(x.shape[:-1] + (self.n_out,), None, x, self.weight)


class LayerNorm(Module):
    def __init__(self, d):
        self.weight = Parameter(Tensor((d,)))

    def forward(self, x):
        return _graph_op(x.shape, float32, x, self.weight)


class Embedding(Module):
    def __init__(self, n, d):
        self.weight = Parameter(Tensor((n, d)))
        self.d = d

    def forward(self, idx):
        return _graph_op(idx.shape + (self.d,), float32, self.weight)


def scaled_dot_product_attention(q, k, v, is_causal=False):
    return _graph_op(q.shape[:-1] + (v.shape[-1],), q.dtype, q, k, v)


def gelu(x):
    return _graph_op(x.shape, x.dtype, x)


def cross_entropy(logits, target):
    # what log_softmax saves for backward: a float32 copy of the logits
    saved = _graph_op(logits.shape, float32, logits)
    return _graph_op((), float32, saved)


class AdamW:
    def __init__(self, params, lr=1e-3, fused=None):
        self.params = list(params)
        self.state = []

    def step(self):
        if not self.state:
            self.state = [Tensor(p.shape, float32) for p in self.params for _ in range(2)]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


for _name, _obj in (("Module", Module), ("ModuleList", ModuleList), ("Linear", Linear),
                    ("LayerNorm", LayerNorm), ("Embedding", Embedding), ("Parameter", Parameter)):
    setattr(nn, _name, _obj)
F.scaled_dot_product_attention, F.gelu, F.cross_entropy = scaled_dot_product_attention, gelu, cross_entropy
optim.AdamW = AdamW
_t.Module = Module
