"""Discovery on HF transformers layers built from configs (random weights, no download).

transformers is a test-only dependency (the `dev` extra); without it these tests skip.
"""
import pytest

pytest.importorskip("transformers")

from fact_db.discover import discover_problem  # noqa: E402

P = "benchmarks/problems/"
pytestmark = pytest.mark.slow


def _rules(report):
    return [r.rule for r in report.regions]


def test_llama_decoder():
    # transformers before 5.2x ran the rotary embedding under torch.autocast(enabled=False),
    # which torch.export wraps in a higher-order op (discovery walks into it: tests/test_discover.py)
    r = discover_problem(P + "hf_llama_decoder.py")
    assert _rules(r) == ["rmsnorm", "gemm", "gemm", "gemm", "sdpa-attention", "gemm-residual", "rmsnorm",
                         "dual-gemm-swiglu", "gemm-residual"]
    assert r.regions[1].shape == "1024x2048x2048" and r.regions[2].shape == "1024x256x2048"
    assert r.uncovered == []


def test_mistral_decoder():
    r = discover_problem(P + "hf_mistral_decoder.py")
    assert "dual-gemm-swiglu" in _rules(r) and _rules(r).count("rmsnorm") == 2
    assert r.uncovered == []


def test_gpt2_block_conv1d_projections():
    r = discover_problem(P + "hf_gpt2_block.py")
    assert _rules(r) == ["layernorm", "gemm-bias", "sdpa-attention", "gemm-residual", "layernorm",
                         "gemm-bias-gelu-tanh", "gemm-residual"]
    assert r.regions[1].shape == "2048x2304x768"  # c_attn: q, k and v in one Conv1D


def test_bert_layer():
    r = discover_problem(P + "hf_bert_layer.py")
    assert _rules(r).count("gemm-bias") >= 3 and "gemm-bias-gelu" in _rules(r) and "sdpa-attention" in _rules(r)
    assert _rules(r).count("layernorm") == 2


def test_vit_layer():
    r = discover_problem(P + "hf_vit_layer.py")
    assert "gemm-bias-gelu" in _rules(r) and "sdpa-attention" in _rules(r)
    assert any(x.shape == "3152x3072x768" for x in r.regions)


def test_opt_decoder():
    r = discover_problem(P + "hf_opt_decoder.py")
    assert "gemm-bias-relu" in _rules(r) and "sdpa-attention" in _rules(r)
    # the query projection scaled by head_dim ** -0.5: the scale is the GEMM's alpha
    q = next(x for x in r.regions if x.rule == "gemm-bias-scale")
    assert q.composable == "" and q.attrs["alpha"] == pytest.approx(64 ** -0.5)


def test_unfollowed_higher_order_op_is_uncovered_not_a_crash():
    import torch

    from fact_db.discover import discover

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda y: self.l(y), lambda y: y * 2, (x,))

    r = discover(M(), (torch.randn(8, 64),))
    assert any(op.startswith("hop.") and "higher-order op" in why for _, op, why in r.uncovered)
