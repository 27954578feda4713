"""Training scripts `memprof estimate` is calibrated on: plain PyTorch, as a
user writes them (cuda, autocast, AdamW), one per WORKLOAD:

    lm    a decoder LM (DIM, LAYERS, HEADS, VOCAB), BATCH x SEQ tokens, bf16
          autocast over fp32 weights, AdamW
    lora  the same decoder in bf16, frozen, with rank-RANK adapters on the
          attention projections: only they train
    cnn   a small ResNet-like CNN on BATCH x 3 x 224 x 224, SGD with momentum

DDP=1 wraps the model in DistributedDataParallel, FSDP=1 shards it with
FSDP2's fully_shard (each block, then the model, before the optimizer is
made, as FSDP2 asks); both run under torchrun.
STEPS optimizer steps. With MEMPROF_CAL_REPORT=FILE, rank 0 writes the real
peaks (torch.cuda.max_memory_allocated/reserved) there at the end (rank N
of several to FILE.rankN), and
the device memory used beside the allocator's (the CUDA context, cuBLAS
handles, loaded kernels, NCCL)."""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

E = os.environ


def env(name, default):
    return int(E.get(name, default))


class Block(nn.Module):
    def __init__(self, dim, heads, dtype=None):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim, dtype=dtype)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, dtype=dtype)
        self.proj = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.ln2 = nn.LayerNorm(dim, dtype=dtype)
        self.up = nn.Linear(dim, 4 * dim, bias=False, dtype=dtype)
        self.down = nn.Linear(4 * dim, dim, bias=False, dtype=dtype)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab, dim, layers, heads, dtype=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, dtype=dtype)
        self.blocks = nn.ModuleList(Block(dim, heads, dtype) for _ in range(layers))
        self.ln = nn.LayerNorm(dim, dtype=dtype)
        self.head = nn.Linear(dim, vocab, bias=False, dtype=dtype)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


class LoRA(nn.Module):
    def __init__(self, base, rank):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))

    def forward(self, x):
        return self.base(x) + (x.to(self.a.dtype) @ self.a.t() @ self.b.t()).to(x.dtype)


def cnn():
    def stage(cin, cout, stride):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        stage(64, 64, 1), stage(64, 128, 2), stage(128, 256, 2), stage(256, 512, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


def build(kind, device, shard=None):
    """The model and its optimizer; `shard` (FSDP2) is applied to the model
    before the optimizer sees its parameters."""
    vocab, dim, layers, heads = env("VOCAB", 32000), env("DIM", 1024), env("LAYERS", 8), env("HEADS", 16)
    if kind == "cnn":
        model = cnn().to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if kind == "lora":
        model = Decoder(vocab, dim, layers, heads, dtype=torch.bfloat16).to(device)
        model.requires_grad_(False)
        for b in model.blocks:
            b.qkv, b.proj = LoRA(b.qkv, env("RANK", 16)), LoRA(b.proj, env("RANK", 16))
        if shard:
            shard(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        return model, torch.optim.AdamW(trainable, lr=1e-4)
    model = Decoder(vocab, dim, layers, heads).to(device)
    if shard:
        shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def fsdp2(model):
    """FSDP2 over every rank: each block its own unit, then the rest."""
    from torch.distributed.fsdp import fully_shard

    mesh = torch.distributed.init_device_mesh("cuda", (torch.distributed.get_world_size(),))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)


def batch(kind, device):
    b = env("BATCH", 8)
    if kind == "cnn":
        return torch.randn(b, 3, 224, 224, device=device), torch.randint(0, 1000, (b,), device=device)
    idx = torch.randint(0, env("VOCAB", 32000), (b, env("SEQ", 1024)), device=device)
    return idx, idx


def loss_of(kind, model, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=kind != "lora"):
        out = model(x)
    if kind == "cnn":
        return F.cross_entropy(out.float(), y)
    return F.cross_entropy(out.float().view(-1, out.shape[-1]), y.view(-1))


def main():
    kind = E.get("WORKLOAD", "lm")
    rank = int(E.get("LOCAL_RANK", 0))
    if E.get("DDP") == "1" or E.get("FSDP") == "1":
        torch.distributed.init_process_group("nccl")
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.cuda.set_device(device)
    model, opt = build(kind, device, fsdp2 if E.get("FSDP") == "1" else None)
    if E.get("DDP") == "1":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    for step in range(env("STEPS", 3)):
        x, y = batch(kind, device)
        loss = loss_of(kind, model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    report(rank)


def report(rank):
    path = E.get("MEMPROF_CAL_REPORT")
    if path:
        # Rank 0 at PATH (what the calibration reads), another rank at PATH.rankN.
        path = path if rank == 0 else f"{path}.rank{rank}"
        free, total = torch.cuda.mem_get_info()
        with open(path, "w") as f:
            json.dump({"allocated": torch.cuda.max_memory_allocated(),
                       "reserved": torch.cuda.max_memory_reserved(),
                       "reservedNow": torch.cuda.memory_reserved(),
                       "deviceUsed": total - free, "deviceTotal": total,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f)


if __name__ == "__main__":
    main()
