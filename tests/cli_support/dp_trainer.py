"""DP-SGD with ghost clipping on the fake torch (agent/python/tests/
fake_torch.py), as Opacus' fast-gradient-clipping module leaves it at the
optimizer step: every trainable parameter holds its per-sample gradient
norms in `_norm_sample` (one [batch] vector each), no per-sample gradients.
Then `memprof_agent.breakdown(..., sequence_length=T)`: what `memprof
profile` shows as the breakdown's rows and its DP-SGD part (docs/cli.md).
argv[1]: the folder of fake_torch.py."""
import sys, time

sys.path.insert(0, sys.argv[1])
import fake_torch as ft

fake = ft.install()
import memprof_agent

D, V, B, T = 256, 4000, 8, 1024


class Block(ft.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = ft.LayerNorm(D), ft.LayerNorm(D)
        self.qkv, self.proj = ft.Linear(D, 3 * D, bias=False), ft.Linear(D, D, bias=False)
        self.fc1, self.fc2 = ft.Linear(D, 4 * D, bias=False), ft.Linear(4 * D, D, bias=False)


class Model(ft.Module):
    def __init__(self):
        super().__init__()
        self.tok = ft.Embedding(V, D)
        self.blocks = ft.ModuleList(Block() for _ in range(6))
        self.ln = ft.LayerNorm(D)
        self.head = ft.Linear(D, V, bias=False)


model = Model()
for p in model.parameters():
    p.requires_grad = True
opt = ft.AdamW(list(model.parameters()))
assert memprof_agent.start(interval=0.2)
ft.make_grads(model)
opt.step()
for p in model.parameters():
    p._norm_sample = ft.Tensor(B)
memprof_agent.step(1)
memprof_agent.breakdown(model, opt, batch_size=B, sequence_length=T)
time.sleep(2.0)
