#!/usr/bin/env python3
"""The trainer `bench/gpu/sweep_lora.sh` sweeps: a decoder-only transformer
(Llama-shaped: RMSNorm, SwiGLU MLP, causal scaled_dot_product_attention;
random weights, nothing downloaded) in bf16 with peft LoRA adapters on every
projection, AdamW on the adapters, random tokens.

Environment: BATCH_SIZE (default 8), SEQ_LEN (2048), LORA_R (16), and the
model's size MODEL_D (2048), MODEL_LAYERS (16), MODEL_HEADS (16),
MODEL_FFN (5632), MODEL_VOCAB (32000); STEPS (1000: `memprof sweep --steps`
ends it earlier through the agent's MEMPROF_AGENT_MAX_STEPS).

It calls memprof_agent.watch(model, opt) (the automatic breakdown) and
memprof_agent.step(n, tokens=, samples=) at the start of every step (the
summary's step time and throughput, and the step budget). The agent is
started by its startup hook (memprof sweep puts it on PYTHONPATH). A CUDA
OOM propagates (the agent writes its summary with oom=true first).
Without peft, a built-in LoRA of the same shape is used, and said so.
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def env_int(name, default):
    return int(os.environ.get(name, default))


BATCH = env_int("BATCH_SIZE", 8)
SEQ = env_int("SEQ_LEN", 2048)
RANK = env_int("LORA_R", 16)
D = env_int("MODEL_D", 2048)
LAYERS = env_int("MODEL_LAYERS", 16)
HEADS = env_int("MODEL_HEADS", 16)
FFN = env_int("MODEL_FFN", 5632)
VOCAB = env_int("MODEL_VOCAB", 32000)
# The agent ends the run at the (N+1)-th step() call under a budget of N;
# the loop stops there too, should the agent not be running.
STEPS = env_int("MEMPROF_AGENT_MAX_STEPS", env_int("STEPS", 1000) - 1) + 1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        shape = (b, s, HEADS, D // HEADS)
        q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, D))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(D, FFN, bias=False)
        self.up_proj = nn.Linear(D, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_norm = RMSNorm(D)
        self.self_attn = Attention()
        self.post_norm = RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class LoRALinear(nn.Module):
    """Used only without peft: base(x) + B(A(x)) * alpha / r, base frozen."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False, device=base.weight.device, dtype=base.weight.dtype)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, device=base.weight.device, dtype=base.weight.dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


def with_lora(model):
    """peft's LoRA on every projection; the built-in one without peft."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        print("sweep_trainer: peft not importable (%r): built-in LoRA" % (exc,), file=sys.stderr)
        for p in model.parameters():
            p.requires_grad_(False)
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if name in TARGETS and isinstance(child, nn.Linear):
                    setattr(module, name, LoRALinear(child, RANK, 2 * RANK))
        return model, "builtin"
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=TARGETS)
    return get_peft_model(model, config), "peft"


def main():
    import memprof_agent  # on PYTHONPATH through memprof sweep / memprof profile

    torch.manual_seed(0)
    device = torch.device("cuda")
    # Built in bf16 on the GPU directly: no fp32 copy passes through the
    # allocator's cache to inflate every run's reserved peak.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        base = Decoder()
        model, lora = with_lora(base)
    torch.set_default_dtype(torch.float32)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in trainable)
    print("sweep_trainer: batch %d seq %d lora r=%d (%s): %.0fM parameters, %.2fM trainable"
          % (BATCH, SEQ, RANK, lora, n_all / 1e6, n_train / 1e6), flush=True)
    memprof_agent.watch(model, opt)
    t0 = time.monotonic()
    for step in range(1, STEPS + 1):
        # At the start of the step: the agent ends the run here once the
        # budget (MEMPROF_AGENT_MAX_STEPS) is spent.
        memprof_agent.step(step, tokens=BATCH * SEQ, samples=BATCH)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=device)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step <= 3 or step % 10 == 0:
            torch.cuda.synchronize()
            print("sweep_trainer: step %d loss %.3f, %.1f s, max allocated %.2f GiB"
                  % (step, loss.item(), time.monotonic() - t0, torch.cuda.max_memory_allocated() / 2**30),
                  flush=True)


if __name__ == "__main__":
    main()
