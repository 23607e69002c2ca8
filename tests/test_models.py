"""Discovery on HF transformers layers built from configs (random weights, no download).

transformers is a test-only dependency (the `dev` extra); without it these tests skip.
"""
import pytest

pytest.importorskip("transformers")

from fact_db.discovery.discover import discover_problem  # noqa: E402

P = "benchmarks/problems/"
pytestmark = pytest.mark.slow


def _rules(report):
    return [r.rule for r in report.regions]


def test_llama_decoder():
    # transformers before 5.2x ran the rotary embedding under torch.autocast(enabled=False),
    # which torch.export wraps in a higher-order op (discovery walks into it: tests/test_discover.py)
    r = discover_problem(P + "hf_llama_decoder.py")
    assert _rules(r) == ["rmsnorm", "gemm-horizontal", "sdpa-attention", "gemm-residual", "rmsnorm",
                         "dual-gemm-swiglu", "gemm-residual"]
    # q, k and v projections (GQA: 4 KV heads of 64) as one GEMM over their concatenated weights
    qkv = r.regions[1]
    assert qkv.shape == "1024x2560x2048 (2048 + 256 + 256)" and qkv.epilogue == ["none"] and qkv.composable == ""
    assert [m["b"] for m in qkv.attrs["members"]] == ["p_layer_self_attn_q_proj_weight", "p_layer_self_attn_k_proj_weight",
                                                      "p_layer_self_attn_v_proj_weight"]
    assert r.uncovered == []


def test_mistral_decoder():
    r = discover_problem(P + "hf_mistral_decoder.py")
    assert "dual-gemm-swiglu" in _rules(r) and _rules(r).count("rmsnorm") == 2
    assert next(x for x in r.regions if x.rule == "gemm-horizontal").shape == "1024x1536x1024 (1024 + 256 + 256)"
    assert r.uncovered == []


def test_gpt2_block_conv1d_projections():
    r = discover_problem(P + "hf_gpt2_block.py")
    assert _rules(r) == ["layernorm", "gemm-bias", "sdpa-attention", "gemm-residual", "layernorm",
                         "gemm-bias-gelu-tanh", "gemm-residual"]
    assert r.regions[1].shape == "2048x2304x768"  # c_attn: q, k and v in one Conv1D
    # Conv1D holds its weight K x N; the float32 kernels read it K-major, held transposed once
    from fact_db.realization.realize import plan
    gemms = [p.workload for p in plan(r, "fp32") if p.workload is not None and p.region.rule.startswith("gemm")]
    assert len(gemms) == 4 and {w.layout_b for w in gemms} == {"col"}


def test_bert_layer():
    r = discover_problem(P + "hf_bert_layer.py")
    assert _rules(r)[:2] == ["gemm-horizontal", "sdpa-attention"]
    qkv = r.regions[0]  # query, key and value Linears with biases: one GEMM with a bias epilogue
    assert qkv.shape == "3072x2304x768 (768 + 768 + 768)" and qkv.epilogue == ["bias"]
    assert all(m["bias"] for m in qkv.attrs["members"])
    assert "gemm-bias-gelu" in _rules(r)
    assert _rules(r).count("layernorm") == 2


def test_vit_layer():
    r = discover_problem(P + "hf_vit_layer.py")
    assert "gemm-bias-gelu" in _rules(r) and "sdpa-attention" in _rules(r)
    assert any(x.shape == "3152x3072x768" for x in r.regions)
    assert next(x for x in r.regions if x.rule == "gemm-horizontal").shape == "3152x2304x768 (768 + 768 + 768)"


def test_opt_decoder():
    r = discover_problem(P + "hf_opt_decoder.py")
    assert "gemm-bias-relu" in _rules(r) and "sdpa-attention" in _rules(r)
    # the query projection scaled by head_dim ** -0.5: the scale is the GEMM's alpha
    q = next(x for x in r.regions if x.rule == "gemm-bias-scale")
    assert q.composable == "" and q.attrs["alpha"] == pytest.approx(64 ** -0.5)
    # the key and value projections, unscaled, share the input: one GEMM; the scaled query stays out
    kv = next(x for x in r.regions if x.rule == "gemm-horizontal")
    assert kv.shape == "2048x2048x1024 (1024 + 1024)" and q.output not in kv.nodes


def test_unfollowed_higher_order_op_is_uncovered_not_a_crash():
    import torch

    from fact_db.discovery.discover import discover

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda y: self.l(y), lambda y: y * 2, (x,))

    r = discover(M(), (torch.randn(8, 64),))
    assert any(u.op.startswith("hop.") and "higher-order op" in u.reason and u.share is None for u in r.uncovered)


def _composed_with_stand_ins(model, x):
    """The model composed with a stand-in GEMM op (tests/standins.py) for its gemm-horizontal
    region only; returns (composed output, eager output, stand-in calls)."""
    import torch

    import fact_db
    import standins
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.impl import Impl
    from fact_db.realization.realize import plan
    rep = fact_db.discover(model, (x,))
    [(i, w)] = [(i, p.workload) for i, (r, p) in enumerate(zip(rep.regions, plan(rep, "fp32")))
                if r.rule == "gemm-horizontal"]
    gm, notes = rewrite(rep.graph.program, rep.regions, {i: Impl("gemm", "stand-in", standins.gemm_op(w.epilogue),
                                                                 {"spec": {"epilogue": w.epilogue}})})
    assert notes == []
    before = standins.CALLS.copy()
    with torch.no_grad():
        got, want = gm(x), model(x)
    return got, want, standins.CALLS - before


def test_llama_qkv_composed_as_one_gemm_computes_the_layer():
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, max_position_embeddings=64, attn_implementation="sdpa")

    class Layer(torch.nn.Module):  # as benchmarks/problems/hf_llama_decoder.py, at test sizes
        def __init__(self):
            super().__init__()
            self.rotary, self.layer = LlamaRotaryEmbedding(cfg), LlamaDecoderLayer(cfg, layer_idx=0)

        def forward(self, x):
            pos = torch.arange(x.shape[1]).unsqueeze(0)
            out = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=self.rotary(x, pos))
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)
    got, want, calls = _composed_with_stand_ins(Layer().eval(), torch.randn(2, 16, 128))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == {"gemm_none": 1}


def test_bert_qkv_with_biases_composed_as_one_gemm_computes_the_layer():
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa")

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BertLayer(cfg)

        def forward(self, x):
            out = self.layer(x)
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)
    got, want, calls = _composed_with_stand_ins(Layer().eval(), torch.randn(2, 16, 64))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == {"gemm_bias": 1}

