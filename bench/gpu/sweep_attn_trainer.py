#!/usr/bin/env python3
"""The trainer `bench/gpu/sweep_seqlen.sh` sweeps: a decoder-only
transformer whose attention is written out, softmax(Q Kᵀ / √d) V, with no
flash or memory-efficient kernel, so each layer keeps its (batch, heads,
seq, seq) probability matrix for the backward pass: memory grows with
SEQ_LEN². Random weights in bf16, full fine-tune with
AdamW, random tokens; nothing downloaded.

Environment: SEQ_LEN (default 2048), BATCH_SIZE (2), and the model's size
MODEL_D (640), MODEL_LAYERS (24), MODEL_HEADS (20), MODEL_FFN (2560),
MODEL_VOCAB (8192); TRACE_MODULES (1: memprof_agent.trace_modules, the
per-module forward/backward numbers of the sweep's step chart; 0 off);
STEPS (1000: `memprof sweep --steps` ends it earlier through the agent's
MEMPROF_AGENT_MAX_STEPS).

At the defaults the probabilities cost 2 B × batch × heads × (layers + ~3
in flight) = about 2.1 KB per SEQ_LEN² (36 GB at 4096, 82 GB at 6144), the
rest grows linearly (about 1.5 MB per token) plus ~1 GB of weights,
gradients and optimizer state: on an 80 GB H100 the grid 1024..4096 runs,
5120 should fit under a 10 % headroom (~61 GiB) and 6144 should not. The
sweep script checks what actually happened, not these estimates.

It calls memprof_agent.watch(model, opt) and memprof_agent.step(n,
tokens=, samples=) at the start of every step, and marks its phases
(forward, backward, optimizer) so the summary's timeline carries them. A
CUDA OOM propagates (the agent writes its summary with oom=true first).
"""
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def env_int(name, default):
    return int(os.environ.get(name, default))


BATCH = env_int("BATCH_SIZE", 2)
SEQ = env_int("SEQ_LEN", 2048)
D = env_int("MODEL_D", 640)
LAYERS = env_int("MODEL_LAYERS", 24)
HEADS = env_int("MODEL_HEADS", 20)
FFN = env_int("MODEL_FFN", 2560)
VOCAB = env_int("MODEL_VOCAB", 8192)
# The agent ends the run at the (N+1)-th step() call under a budget of N;
# the loop stops there too, should the agent not be running.
STEPS = env_int("MEMPROF_AGENT_MAX_STEPS", env_int("STEPS", 1000) - 1) + 1


class EagerAttention(nn.Module):
    """Causal self-attention, every intermediate a real tensor: the
    (B, H, S, S) probabilities are saved by the softmax and by P @ V."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.out = nn.Linear(D, D, bias=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        # The scale goes on q (B·S·D), not on the scores (B·H·S²).
        scores = (q * (1.0 / math.sqrt(D // HEADS))) @ k.transpose(-2, -1)
        scores = scores.masked_fill(mask[:s, :s], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        del scores
        y = probs @ v
        return self.out(y.transpose(1, 2).reshape(b, s, D))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(D)
        self.attn = EagerAttention()
        self.norm2 = nn.LayerNorm(D)
        self.up = nn.Linear(D, FFN, bias=False)
        self.down = nn.Linear(FFN, D, bias=False)

    def forward(self, x, mask):
        x = x + self.attn(self.norm1(x), mask)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids, mask):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.norm(x))


def main():
    import memprof_agent  # on PYTHONPATH through memprof sweep / memprof profile

    torch.manual_seed(0)
    device = torch.device("cuda")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = Decoder()
    torch.set_default_dtype(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # True above the diagonal: the future is masked. S² bytes, once.
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool, device=device).triu(1)
    n_all = sum(p.numel() for p in model.parameters())
    print("sweep_attn_trainer: batch %d seq %d, %d layers x %d heads, eager attention: %.0fM parameters"
          % (BATCH, SEQ, LAYERS, HEADS, n_all / 1e6), flush=True)
    memprof_agent.watch(model, opt)
    if env_int("TRACE_MODULES", 1):
        trace = memprof_agent.trace_modules(model, opt)  # noqa: F841 (kept: the hooks live with it)
    t0 = time.monotonic()
    for step in range(1, STEPS + 1):
        memprof_agent.step(step, tokens=BATCH * SEQ, samples=BATCH)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=device)
        with memprof_agent.phase("forward"):
            logits = model(ids[:, :-1], mask)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), ids[:, 1:].reshape(-1))
        with memprof_agent.phase("backward"):
            loss.backward()
        with memprof_agent.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step <= 3 or step % 10 == 0:
            torch.cuda.synchronize()
            print("sweep_attn_trainer: step %d loss %.3f, %.1f s, max allocated %.2f GiB"
                  % (step, loss.item(), time.monotonic() - t0, torch.cuda.max_memory_allocated() / 2**30),
                  flush=True)


if __name__ == "__main__":
    main()
