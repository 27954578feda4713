"""The breakdown's per-parameter and per-layer rows (the largest MAX_ROWS
of each, with what the rest adds up to) and DP-SGD's norms and temporary
matrices (measured from `_norm_sample`, modelled otherwise), on the fake
torch: bounded, exact against an independent count, nothing lost."""

import json

from conftest import fake_torch as ft, memprof_agent
from test_breakdown import GPTLike, LlamaLike, peft_wrap

from memprof_agent import _rows


def test_every_parameter_is_a_row_or_counted_in_what_was_left_out(fake):
    model = peft_wrap(LlamaLike(layers=6))
    b = memprof_agent.breakdown(model)
    params = list(model.named_parameters())
    rows, left = b["parameterRows"], b["parametersLeftOut"]
    assert len(rows) == _rows.MAX_ROWS < len(params)
    assert left["rows"] == len(params) - _rows.MAX_ROWS
    assert sum(r["bytes"] for r in rows) + left["bytes"] == b["parametersBytes"]
    by_name = dict(params)
    kept = sum(by_name[r["name"]].numel() for r in rows)
    assert kept + left["parameters"] == b["totalParameters"]
    # The largest first: the embedding and the head (1000 x 64 each) lead.
    assert [r["name"] for r in rows[:2]] == ["embed.weight", "lm_head.weight"]
    assert [r["bytes"] for r in rows] == sorted((r["bytes"] for r in rows), reverse=True)
    head = rows[1]
    assert (head["shape"], head["dtype"], head["bytes"], head["trainable"]) == ([1000, 64], "float32", 256000, False)
    assert all(r["trainable"] == ("lora_" in r["name"]) for r in rows)


def test_layers_are_the_numbered_blocks_and_the_modules_outside_them(fake):
    model = peft_wrap(LlamaLike(layers=2))
    b = memprof_agent.breakdown(model)
    names = {r["name"] for r in b["layerRows"]}
    assert names == {"embed", "layers.0", "layers.1", "norm", "lm_head"}
    assert b["layersLeftOut"] is None, "5 layers: none left out"
    block = {r["name"]: r for r in b["layerRows"]}["layers.0"]
    in_block = [p for n, p in model.named_parameters() if n.startswith("layers.0.")]
    assert block["parameters"] == sum(p.numel() for p in in_block)
    assert block["trainableParameters"] == sum(p.numel() for p in in_block if p.requires_grad) > 0
    assert block["bytes"] == sum(p.numel() * 4 for p in in_block)
    assert sum(r["bytes"] for r in b["layerRows"]) == b["parametersBytes"]


def test_layer_of_cuts_after_the_first_numbered_element():
    assert _rows.layer_of("model.layers.3.self_attn.q_proj") == "model.layers.3"
    assert _rows.layer_of("transformer.h.11.mlp.c_fc") == "transformer.h.11"
    assert _rows.layer_of("lm_head") == "lm_head"
    assert _rows.layer_of("") == "(model)"


def test_many_layers_keep_the_largest_and_total_the_rest(fake):
    model = GPTLike(layers=20)
    b = memprof_agent.breakdown(model)
    assert len(b["layerRows"]) == _rows.MAX_ROWS
    left = b["layersLeftOut"]
    assert left["rows"] == 20 + 4 - _rows.MAX_ROWS  # tok, pos, ln, head and 20 blocks
    assert sum(r["bytes"] for r in b["layerRows"]) + left["bytes"] == b["parametersBytes"]
    assert sum(r["parameters"] for r in b["layerRows"]) + left["parameters"] == b["totalParameters"]


def test_long_names_keep_their_end_and_rows_go_in_the_push(fake):
    class Deep(ft.Module):
        def __init__(self):
            super().__init__()
            self.weight = ft.param(4, 4, dtype=ft.bfloat16)

    model = ft.Module()
    setattr(model, "x" * 200, Deep())
    b = memprof_agent.breakdown(model)
    (row,) = b["parameterRows"]
    assert len(row["name"]) == _rows.MAX_NAME and row["name"].endswith("x.weight")
    assert row["dtype"] == "bfloat16" and row["bytes"] == 32
    pushed = memprof_agent._breakdown.for_push(b)
    assert pushed["parameterRows"] == [row] and "parametersLeftOut" not in pushed


# --- DP-SGD ----------------------------------------------------------------------


def test_norms_held_in_norm_sample_are_measured_each_region_once(fake):
    model = GPTLike()
    p, q = model.head.weight, model.tok.weight
    p.requires_grad = q.requires_grad = True
    p._norm_sample = ft.Tensor(32)
    q._norm_sample = ft.Tensor(32)
    model.ln.weight._norm_sample = q._norm_sample.view_as_same()  # the same memory: once
    b = memprof_agent.breakdown(model, sequence_length=512)
    d = b["dpSgd"]
    assert (d["normsBytes"], d["normsSource"], d["samples"], d["parameters"]) == (2 * 32 * 4, "measured", 32, 3)
    # Ghost clipping's ggT and aaT for one layer at a time: 2 x B x T^2 x 4 bytes.
    assert (d["tempMatricesBytes"], d["sequenceLength"]) == (2 * 32 * 512 * 512 * 4, 512)


def test_norms_are_modelled_from_grad_sample_and_no_matrices_without_ghost_clipping(fake):
    model = GPTLike()
    for p in (model.head.weight, model.tok.weight):
        p.grad_sample = ft.Tensor(16, *p.shape)
    b = memprof_agent.breakdown(model, sequence_length=512)
    d = b["dpSgd"]
    # DPOptimizer's clipping: a [B] norm per parameter, their [B, 2] stack, norms and factors,
    # each at least one 512-byte block of the caching allocator.
    assert (d["normsBytes"], d["normsSource"], d["samples"]) == ((2 + 2) * 512 + 512, "modelled", 16)
    for p in (model.head.weight, model.tok.weight):
        p.grad_sample = ft.Tensor(1000, *p.shape)  # 4000-byte vectors: rounded up to 4096
    d = memprof_agent.breakdown(model)["dpSgd"]
    assert d["normsBytes"] == (2 + 2) * 4096 + 8192
    assert "tempMatricesBytes" not in d, "vanilla Opacus forms no ggT/aaT"


def test_without_per_sample_state_or_sequence_length_nothing_is_invented(fake):
    model = GPTLike()
    assert memprof_agent.breakdown(model)["dpSgd"] is None
    model.head.weight.requires_grad = True
    model.head.weight._norm_sample = ft.Tensor(8)
    d = memprof_agent.breakdown(model)["dpSgd"]
    assert "tempMatricesBytes" not in d and "sequenceLength" not in d
    assert memprof_agent._breakdown.for_push(memprof_agent.breakdown(model))["dpSgd"] == d


def test_a_failing_rows_stage_leaves_the_rest_and_a_note(fake, monkeypatch):
    model = GPTLike()

    def boom(params):
        raise RuntimeError("rows broke")

    monkeypatch.setattr(_rows, "rows", boom)
    b = memprof_agent.breakdown(model)
    assert b["parameterRows"] == [] and b["totalParameters"] > 0
    assert any("rows broke" in n for n in b["notes"])
    assert "parameterRows" not in memprof_agent._breakdown.for_push(b)


def test_rows_past_the_byte_bound_move_into_the_left_out_totals(fake):
    """Names at their longest stop a list at its JSON bound before MAX_ROWS;
    what is cut is added to the totals, so the sums still hold."""
    long = [{"name": "p" * _rows.MAX_NAME, "shape": [1000, 1000], "dtype": "float32", "bytes": 4_000_000,
             "trainable": True} for _ in range(_rows.MAX_ROWS)]
    b = memprof_agent._breakdown.empty()
    b.update(parameterRows=long, parametersLeftOut={"rows": 3, "parameters": 30, "bytes": 120})
    pushed = memprof_agent._breakdown.for_push(b)
    kept = pushed["parameterRows"]
    assert 0 < len(kept) < _rows.MAX_ROWS
    assert len(json.dumps(kept, separators=(",", ":"))) <= _rows.MAX_PARAMETER_JSON
    cut = _rows.MAX_ROWS - len(kept)
    assert pushed["parametersLeftOut"] == {"rows": 3 + cut, "parameters": 30 + cut * 10 ** 6, "bytes": 120 + cut * 4_000_000}


def test_a_llama_sized_models_rows_all_fit_and_rows_at_their_longest_stop_at_the_byte_bound():
    """Real rows (Llama's names, 20-digit-free numbers) keep all 16 of each;
    rows at their longest (128-byte names, 8 dimensions, u64 numbers) stop
    at the byte bound: docs/agent.md's figures."""
    p = {"name": "model.layers.12.self_attn.q_proj.weight", "shape": [4096, 4096], "dtype": "bfloat16",
         "bytes": 33554432, "trainable": True}
    layer = {"name": "model.layers.12", "parameters": 218112000, "trainableParameters": 218112000, "bytes": 436224000}
    assert len(_rows.fit([p] * 16, None, _rows.MAX_PARAMETER_JSON)[0]) == 16
    assert len(_rows.fit([layer] * 16, None, _rows.MAX_LAYER_JSON)[0]) == 16
    big = _rows.U64_MAX
    p = {"name": "p" * 128, "shape": [big] * 8, "dtype": "d" * 32, "bytes": big, "trainable": True}
    layer = {"name": "l" * 128, "parameters": big, "trainableParameters": big, "bytes": big}
    assert len(_rows.fit([p] * 16, None, _rows.MAX_PARAMETER_JSON)[0]) == 6
    assert len(_rows.fit([layer] * 16, None, _rows.MAX_LAYER_JSON)[0]) == 7
