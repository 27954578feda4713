"""memprof_agent.breakdown and watch on the fake torch's module tree:
module types recognised from structure (not from one model's names), bytes
equal to an independent count, each memory region once, flags, failures
that leave a partial dict, the automatic breakdown of watch() and its
place in the push."""

import logging

from conftest import closed_port, fake_torch as ft, memprof_agent, wait_until

GiB = 1 << 30
D, R, V = 64, 8, 1000


# --- models, built like real ones --------------------------------------------


class Mixer(ft.Module):
    """Attention by structure only: q/k/v/o projections, no "Attention" in its name."""

    def __init__(self, d=D):
        super().__init__()
        self.q_proj, self.k_proj = ft.Linear(d, d, bias=False), ft.Linear(d, d // 2, bias=False)  # GQA: k, v narrower
        self.v_proj, self.o_proj = ft.Linear(d, d // 2, bias=False), ft.Linear(d, d, bias=False)


class FeedForward(ft.Module):
    def __init__(self, d=D):
        super().__init__()
        self.gate_proj, self.up_proj = ft.Linear(d, 3 * d, bias=False), ft.Linear(d, 3 * d, bias=False)
        self.down_proj = ft.Linear(3 * d, d, bias=False)


class Scale(ft.Module):
    """A hand-written RMSNorm: one 1-D weight, no Norm in its class name."""

    def __init__(self, d=D):
        super().__init__()
        self.weight = ft.param(d, fill=1.0)


class TokenEmbedding(ft.Embedding):
    pass


class Layer(ft.Module):
    def __init__(self):
        super().__init__()
        self.input_norm, self.mixer = Scale(), Mixer()
        self.post_norm, self.ff = Scale(), FeedForward()


class LlamaLike(ft.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = TokenEmbedding(V, D)
        self.layers = ft.ModuleList(Layer() for _ in range(layers))
        self.norm = Scale()
        self.lm_head = ft.Linear(D, V, bias=False)


class FusedBlock(ft.Module):
    """bench/gpu/train.py's Block: attention and MLP in one module."""

    def __init__(self, d=D):
        super().__init__()
        self.ln1, self.ln2 = ft.LayerNorm(d), ft.LayerNorm(d)
        self.qkv, self.proj = ft.Linear(d, 3 * d, bias=False), ft.Linear(d, d, bias=False)
        self.fc1, self.fc2 = ft.Linear(d, 4 * d, bias=False), ft.Linear(4 * d, d, bias=False)


class GPTLike(ft.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.tok, self.pos = ft.Embedding(V, D), ft.Embedding(128, D)
        self.blocks = ft.ModuleList(FusedBlock() for _ in range(layers))
        self.ln = ft.LayerNorm(D)
        self.head = ft.Linear(D, V, bias=False)


class EncoderLayer(ft.Module):
    """nn.TransformerEncoderLayer's structure."""

    def __init__(self, d=D):
        super().__init__()
        self.self_attn = ft.MultiheadAttention(d)
        self.linear1, self.linear2 = ft.Linear(d, 4 * d), ft.Linear(4 * d, d)
        self.norm1, self.norm2 = ft.LayerNorm(d), ft.LayerNorm(d)


class LoraLinear(ft.Module):
    """peft's lora.Linear: base_layer, lora_A/lora_B ModuleDicts per adapter."""

    def __init__(self, base, r=R):
        super().__init__()
        self.base_layer = base
        base.weight.requires_grad = False
        i, o = base.weight.shape[1], base.weight.shape[0]
        self.lora_A = ft.ModuleDict({"default": ft.Linear(i, r, bias=False)})
        self.lora_B = ft.ModuleDict({"default": ft.Linear(r, o, bias=False, fill=0.0)})


class LowRankAdapter(ft.Module):
    """Another library's adapter: a low-rank pair beside base_layer, other names."""

    def __init__(self, base, r=R):
        super().__init__()
        self.base_layer = base
        base.weight.requires_grad = False
        self.down, self.up = ft.Linear(base.weight.shape[1], r, bias=False), ft.Linear(r, base.weight.shape[0], bias=False)


def peft_wrap(model, targets=("q_proj", "v_proj"), adapter=LoraLinear):
    for p in model.parameters():
        p.requires_grad = False
    for path, m in model.named_modules():
        for name, child in list(m.named_children()):
            if name in targets:
                setattr(m, name, adapter(child))
    return model


def types_of(model):
    return memprof_agent._breakdown.classify(model)


def exact(model, optimizer=None):
    """An independent count: numel * element_size of each unique tensor."""
    params = {id(p): p for p in model.parameters()}.values()
    pb = sum(p.numel() * p.element_size() for p in params)
    gb = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    ob = 0
    if optimizer is not None:
        seen = set()
        for st in optimizer.state.values():
            for t in st.values():
                if t.device.type != "cpu" and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    ob += t.numel() * t.element_size()
    return pb, gb, ob


# --- module types --------------------------------------------------------------


def test_module_types_are_recognised_from_structure_not_names(fake):
    t = types_of(LlamaLike())
    assert t["embed"] == "embedding"  # an nn.Embedding subclass
    assert {t["layers.0.mixer.%s" % n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")} == {"attention"}
    assert {t["layers.1.ff.%s" % n] for n in ("gate_proj", "up_proj", "down_proj")} == {"mlp"}
    assert t["layers.0.input_norm"] == t["norm"] == "norm"  # weight-only 1-D leaves
    assert t["lm_head"] == "embedding"  # the output head: an embedding's shape (vocab x dim), outside the blocks
    # Outside any ModuleList: an attention module's own parameters (sinks)
    # are attention; a stack of Linears is an MLP.
    root = ft.Module()
    root.mixer, root.ff = Mixer(), FeedForward()
    root.mixer.sinks = ft.param(8)
    t = types_of(root)
    assert t["mixer"] == t["mixer.q_proj"] == "attention" and t["ff.up_proj"] == "mlp"


def test_a_block_with_attention_and_mlp_in_one_module_is_split(fake):
    t = types_of(GPTLike())
    assert t["blocks.0.qkv"] == t["blocks.0.proj"] == "attention"  # fused 3d x d beside its d x d output
    assert t["blocks.0.fc1"] == t["blocks.1.fc2"] == "mlp"
    assert t["blocks.0.ln1"] == t["ln"] == "norm"
    assert t["tok"] == t["pos"] == t["head"] == "embedding"


def test_an_output_head_counts_as_embedding_only_when_shaped_like_one_outside_the_blocks(fake):
    model = LlamaLike()
    model.extra = ft.Module()
    model.extra.classifier = ft.Linear(D, 10)  # a head of another width: a lone Linear
    conv1d = ft.Module()
    conv1d.weight = ft.param(D, V)  # HF Conv1D keeps (in, out): dim x vocab
    model.lm_head = conv1d
    layer = getattr(model.layers, "0")
    layer.vocab_proj = ft.Linear(D, V, bias=False)  # vocab-shaped but inside a block
    t = types_of(model)
    assert t["lm_head"] == "embedding" and t["extra.classifier"] == "other"
    assert t["layers.0.vocab_proj"] == "mlp"
    tied = LlamaLike()
    tied.lm_head.weight = tied.embed.weight  # tied: one parameter, counted once, under the embedding
    b = memprof_agent.breakdown(tied)
    assert [e["type"] for e in b["byModuleType"] if e["type"] == "other"] == []
    assert b["parametersBytes"] == exact(tied)[0]


def test_multihead_attention_and_its_out_proj_are_attention(fake):
    model = ft.Sequential([EncoderLayer(), EncoderLayer()])
    t = types_of(model)
    assert t["0.self_attn"] == t["0.self_attn.out_proj"] == "attention"
    assert t["1.linear1"] == t["1.linear2"] == "mlp" and t["0.norm2"] == "norm"


def test_lora_adapters_are_lora_and_their_base_layer_keeps_its_type(fake):
    t = types_of(peft_wrap(LlamaLike()))
    assert t["layers.0.mixer.q_proj.lora_A.default"] == t["layers.1.mixer.v_proj.lora_B.default"] == "lora"
    assert t["layers.0.mixer.q_proj.base_layer"] == "attention"
    assert t["layers.0.mixer.k_proj"] == "attention"
    t = types_of(peft_wrap(LlamaLike(), targets=("q_proj", "down_proj"), adapter=LowRankAdapter))
    assert t["layers.0.mixer.q_proj.down"] == t["layers.0.ff.down_proj.up"] == "lora"
    assert t["layers.0.ff.down_proj.base_layer"] == "mlp"


# --- bytes -------------------------------------------------------------------------


def test_bytes_match_an_independent_count_and_every_parameter_has_one_type(fake):
    model = peft_wrap(LlamaLike())
    opt = ft.AdamW([p for p in model.parameters() if p.requires_grad])
    ft.make_grads(model)
    opt.step()
    b = memprof_agent.breakdown(model, opt)
    pb, gb, ob = exact(model, opt)
    assert (b["parametersBytes"], b["gradientsBytes"], b["optimizerBytes"]) == (pb, gb, ob)
    assert ob == 2 * gb > 0  # Adam's two moments; the CPU step counters hold no device memory
    assert b["staticBytes"] == pb + gb + ob
    assert b["totalParameters"] == sum(p.numel() for p in model.parameters())
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert b["trainableParameters"] == sum(p.numel() for p in lora) > 0
    by = {e["type"]: e for e in b["byModuleType"]}
    assert set(by) == {"attention", "mlp", "embedding", "norm", "lora"}  # lm_head: embedding
    for key in ("parameters", "parametersBytes", "gradientsBytes", "optimizerBytes"):
        assert sum(e[key] for e in by.values()) == {"parameters": b["totalParameters"], "parametersBytes": pb,
                                                      "gradientsBytes": gb, "optimizerBytes": ob}[key]
    assert by["lora"]["gradientsBytes"] == gb and by["attention"]["gradientsBytes"] == 0
    assert b["perSampleGradientsBytes"] is None and b["flags"] == [] and b["notes"] == []


def test_each_memory_region_is_counted_once(fake):
    model = GPTLike()
    model.head.weight = model.tok.weight  # tied weights: one Parameter, two modules
    opt = ft.AdamW(model.parameters())
    ft.make_grads(model)
    opt.step()
    p0, p1 = opt.param_groups[0]["params"][:2]
    opt.state[p1]["shared"] = opt.state[p0]["exp_avg"]  # one state tensor reachable twice
    b = memprof_agent.breakdown(model, opt)
    assert (b["parametersBytes"], b["gradientsBytes"], b["optimizerBytes"]) == exact(model, opt)
    assert b["totalParameters"] == sum(p.numel() for p in model.parameters())
    # A second tensor object on the same memory (a view) is not counted again.
    model.ln.bias.grad = model.ln.weight.grad.view_as_same()
    again = memprof_agent.breakdown(model, opt)
    assert again["gradientsBytes"] == b["gradientsBytes"] - model.ln.bias.numel() * 4


def test_per_sample_gradients_count_when_opacus_left_them(fake):
    model = GPTLike()
    b0 = memprof_agent.breakdown(model)
    p, q = model.head.weight, model.tok.weight
    p.grad_sample = ft.Tensor(32, *p.shape)
    q.grad_sample = [ft.Tensor(32, *q.shape), ft.Tensor(32, *q.shape)]  # a module that ran twice
    b = memprof_agent.breakdown(model, batch_size=32)
    expected = 32 * p.numel() * 4 + 2 * 32 * q.numel() * 4
    assert b["perSampleGradientsBytes"] == expected
    assert b["staticBytes"] == b0["staticBytes"] + expected and b["batchSize"] == 32


# --- flags -------------------------------------------------------------------------


def test_nan_inf_and_unusually_large_parameters_are_flagged(fake):
    model = LlamaLike(layers=4)
    layers = model.layers
    getattr(layers, "0").mixer.q_proj.weight.special = float("nan")
    getattr(layers, "1").ff.up_proj.weight.special = float("inf")
    getattr(layers, "2").mixer.o_proj.weight.fill = 0.02 * 50  # 50x its kind's median RMS
    getattr(layers, "3").ff.down_proj.weight.fill = 0.02 * 5  # 5x: not flagged
    model.norm.weight = ft.param(D, fill=1e4, dtype=ft.float16)  # finite, but its L2 norm overflows float16
    flags = memprof_agent.breakdown(model)["flags"]
    kinds = {(f["kind"], f["parameter"]) for f in flags}
    assert ("nan", "layers.0.mixer.q_proj.weight") in kinds
    assert ("inf", "layers.1.ff.up_proj.weight") in kinds
    assert ("large", "layers.2.mixer.o_proj.weight") in kinds
    assert ("large", "norm.weight") in kinds
    assert len(flags) == 4, flags
    big = [f for f in flags if f["parameter"] == "layers.2.mixer.o_proj.weight"][0]
    assert "50x the median RMS" in big["note"] and "attention" in big["note"]
    assert "overflows" in [f for f in flags if f["parameter"] == "norm.weight"][0]["note"]


def test_flags_are_bounded_and_names_keep_their_end(fake):
    model = ft.ModuleList(ft.Linear(D, D, bias=False, special=float("nan")) for _ in range(40))
    model.deep = ft.Linear(D, D, bias=False, special=float("inf"))
    flags = memprof_agent.breakdown(model)["flags"]
    assert len(flags) == 16
    long = ft.Module()
    node = long
    for i in range(30):
        child = ft.Module()
        setattr(node, "a_rather_long_module_name_%d" % i, child)
        node = child
    node.weight = ft.param(D, D, special=float("nan"))
    name = memprof_agent.breakdown(long)["flags"][0]["parameter"]
    assert len(name.encode()) <= 128 and name.endswith("_29.weight")


# --- never raising ---------------------------------------------------------------


class BrokenState(dict):
    def items(self):
        raise RuntimeError("state went away")


def test_a_failure_leaves_what_could_be_computed_and_a_note_logged_once(fake, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    model = GPTLike()
    opt = ft.AdamW(model.parameters())
    opt.state = BrokenState()
    for _ in range(2):
        b = memprof_agent.breakdown(model, opt)
    assert b["parametersBytes"] == exact(model)[0] > 0 and b["optimizerBytes"] == 0
    assert b["staticBytes"] == b["parametersBytes"] and len(b["byModuleType"]) == 4
    assert any("state went away" in n for n in b["notes"])
    said = [r for r in caplog.records if "state went away" in r.getMessage()]
    assert len(said) == 1
    # Not even a model that is no model raises.
    out = memprof_agent.breakdown(object())
    assert out["totalParameters"] == 0 and out["notes"]
    assert memprof_agent.watch(object(), object()) is False


# --- watch(): automatic, then nothing per step -------------------------------------


def train(model, opt, fake, steps, fwd=GiB, step_from=0):
    """Steps as a trainer runs them: markers, forward (activations held),
    backward (gradients), optimizer step, activations freed."""
    for n in range(step_from, step_from + steps):
        memprof_agent.step(n, samples=16)
        model.fwd_bytes = fwd
        model(None)
        ft.run_backward()
        fake.free(fwd)  # backward frees the activations
        ft.make_grads(model)
        opt.step()


def test_watch_takes_the_breakdown_at_step_2_and_the_activations_over_step_3(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    model = GPTLike()
    opt = ft.AdamW(model.parameters(), step_bytes=256 << 20)
    assert memprof_agent.watch(model, opt)
    theirs = []
    opt.register_step_post_hook(lambda o, args, kwargs: theirs.append(1))  # the trainer's own, after ours
    train(model, opt, fake, 1)
    assert memprof_agent.last_breakdown() is None
    train(model, opt, fake, 1, step_from=1)
    b = memprof_agent.last_breakdown()
    assert b["step"] == 1 and b["activationsPeakBytes"] is None
    assert (b["parametersBytes"], b["gradientsBytes"], b["optimizerBytes"]) == exact(model, opt)
    # The allocator holds the static part and the trainer's other 3 GiB;
    # step 3's forward adds 1 GiB on top.
    fake.allocated = fake.peak_allocated = b["staticBytes"] + 3 * GiB
    train(model, opt, fake, 1, step_from=2)
    b = memprof_agent.last_breakdown()
    assert b["activationsPeakBytes"] == 3 * GiB + GiB
    assert b["optimizerStepPeakBytes"] == 256 << 20 and b["batchSize"] == 16
    # Done: the pushes reset the peaks again; the hooks go at the next
    # forward (torch iterates the optimizer's hook dicts live: removing one
    # from inside a hook would make opt.step() raise); then steps call nothing.
    assert memprof_agent._torchread.PEAKS.held == 0
    train(model, opt, fake, 1, step_from=3)
    assert len(opt._pre) == 0 and len(opt._post) == 1 and model._fpre == []
    fake.calls.clear()
    train(model, opt, fake, 5, step_from=4)
    assert fake.calls == [] and len(theirs) == 9
    push = memprof_agent._agent.build("sample")
    assert push["breakdown"]["activationsPeakBytes"] == 4 * GiB and "notes" not in push["breakdown"]


def test_measuring_never_hides_a_peak_from_the_pushes(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    model = GPTLike()
    opt = ft.AdamW(model.parameters())
    memprof_agent.watch(model, opt)
    train(model, opt, fake, 2, fwd=20 * GiB)  # the meter resets the peaks around each step
    push = memprof_agent._agent.build("sample")
    assert push["devices"][0]["peakAllocatedBytes"] >= 3 * GiB + 20 * GiB
    assert "_cuda_resetPeakMemoryStats" in fake.calls


def test_watch_without_an_optimizer_uses_the_forward_calls(fake):
    model = GPTLike()
    assert memprof_agent.watch(model)
    for n in range(5):
        model.fwd_bytes = 2 * GiB
        if n == 2:
            fake.allocated = fake.peak_allocated = 10 * GiB
        model(None)
        fake.free(2 * GiB)
    b = memprof_agent.last_breakdown()
    assert b["optimizerBytes"] == 0 and b["activationsPeakBytes"] == 12 * GiB - b["staticBytes"]
    assert model._fpre == []


def test_the_breakdown_rides_in_pushes_the_sidecar_accepts(sidecar, fake):
    assert memprof_agent.start(interval=0.05, socket=sidecar.socket)
    model = peft_wrap(LlamaLike())
    opt = ft.AdamW([p for p in model.parameters() if p.requires_grad])
    memprof_agent.watch(model, opt)
    train(model, opt, fake, 4)
    before = sidecar.agent_pushes()
    a = memprof_agent._agent
    assert "breakdown" in a.build("sample")
    assert wait_until(lambda: sidecar.agent_pushes() >= before + 3, timeout=10)
    assert a.transport.failures == 0


def test_a_partial_breakdown_still_makes_a_push_the_sidecar_accepts(sidecar, fake):
    """A stage that failed must not cost the push: the sidecar refuses a
    push whose breakdown is inconsistent, and the allocator's numbers with it."""
    from memprof_agent import _breakdown, _watch

    partial = dict(_breakdown.empty(step=-3), totalParameters=10, trainableParameters=99, parametersBytes=4000,
                   gradientsBytes=-1, activationsPeakBytes=-5,
                   byModuleType=[{"type": "mlp", "parameters": 1, "parametersBytes": 4, "gradientsBytes": 0, "optimizerBytes": 0}] * 2,
                   flags=[{"kind": "odd", "parameter": "x", "note": ""}])
    b = _breakdown.for_push(partial)
    assert b["trainableParameters"] == 10 and b["staticBytes"] == 4000 and b["gradientsBytes"] == 0
    assert len(b["byModuleType"]) == 1 and b["flags"] == [] and b["activationsPeakBytes"] == 0 and b["step"] == 0
    _watch.CARRIED.breakdown = partial
    assert memprof_agent.start(interval=0.05, socket=sidecar.socket)
    before = sidecar.agent_pushes()
    assert wait_until(lambda: sidecar.agent_pushes() >= before + 3, timeout=10)
    assert memprof_agent._agent.transport.failures == 0
