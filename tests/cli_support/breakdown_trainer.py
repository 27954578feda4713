"""A LoRA fine-tune on the fake torch (agent/python/tests/fake_torch.py):
embeddings, attention and MLP frozen, LoRA adapters on q/v trained with
AdamW, then `memprof_agent.breakdown`: what `memprof profile` shows as the
breakdown's module-type rows (docs/cli.md). argv[1]: the folder of fake_torch.py."""
import sys, time

sys.path.insert(0, sys.argv[1])
import fake_torch as ft

fake = ft.install()
import memprof_agent

D, R, V = 256, 8, 4000


class Lora(ft.Module):
    def __init__(self, base):
        super().__init__()
        self.base_layer = base
        base.weight.requires_grad = False
        i, o = base.weight.shape[1], base.weight.shape[0]
        self.lora_A = ft.ModuleDict({"default": ft.Linear(i, R, bias=False)})
        self.lora_B = ft.ModuleDict({"default": ft.Linear(R, o, bias=False, fill=0.0)})


class Attention(ft.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Lora(ft.Linear(D, D, bias=False))
        self.k_proj = ft.Linear(D, D, bias=False)
        self.v_proj = Lora(ft.Linear(D, D, bias=False))
        self.o_proj = ft.Linear(D, D, bias=False)


class Mlp(ft.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = ft.Linear(D, 4 * D, bias=False), ft.Linear(D, 4 * D, bias=False)
        self.down_proj = ft.Linear(4 * D, D, bias=False)


class Layer(ft.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = ft.LayerNorm(D), Attention()
        self.norm2, self.mlp = ft.LayerNorm(D), Mlp()


class Model(ft.Module):
    def __init__(self):
        super().__init__()
        self.embed = ft.Embedding(V, D)
        self.layers = ft.ModuleList(Layer() for _ in range(4))
        self.lm_head = ft.Linear(D, V, bias=False)


model = Model()
for n, p in model.named_parameters():
    p.requires_grad = "lora_" in n
opt = ft.AdamW([p for p in model.parameters() if p.requires_grad])
assert memprof_agent.start(interval=0.2)
ft.make_grads(model)
opt.step()
memprof_agent.step(1)
memprof_agent.breakdown(model, opt, batch_size=16)
time.sleep(2.0)
