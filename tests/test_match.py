"""The matcher on small modules: forms, layouts, overlap resolution, escapes, reasons."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fact_db.discovery.match import match_all, match_rule, select
from fact_db.discovery.trace import trace_module


def graph(fn, *inputs, params=None):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            for k, v in (params or {}).items():
                setattr(self, k, v)

        def forward(self, *xs):
            return fn(self, *xs)
    return trace_module(M(), inputs)


def chosen(g, ruleset):
    matches, _ = match_all(ruleset, g)
    return sorted(m.rule.id for m in select(matches)[0])


def test_linear_gelu_tanh_decomposed_beats_smaller_fusions(ruleset):
    lin = nn.Linear(32, 64)

    def f(self, x):
        y = self.lin(x)
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))
    g = graph(f, torch.randn(8, 32), params={"lin": lin})
    matches, _ = match_all(ruleset, g)
    raw = {m.rule.id for m in matches}
    assert {"gemm-bias-gelu-tanh", "gemm-bias"} <= raw
    assert chosen(g, ruleset) == ["gemm-bias-gelu-tanh"]
    m = next(m for m in matches if m.rule.id == "gemm-bias-gelu-tanh")
    assert len(m.compute_nodes) == 9
    assert "decomposed" in m.pattern.label


def test_erf_gelu_is_not_tanh_gelu(ruleset):
    g = graph(lambda self, x: F.gelu(self.lin(x)), torch.randn(8, 32), params={"lin": nn.Linear(32, 16)})
    assert chosen(g, ruleset) == ["gemm-bias-gelu"]
    found, miss = match_rule(ruleset.get("gemm-bias-gelu-tanh"), g)
    assert not found and "approximate='none'" in miss.reason and "tanh" in miss.reason


def test_addmm_with_transposed_weight_and_matmul_plus_add(ruleset):
    w, b = torch.randn(16, 32), torch.randn(16)
    g1 = graph(lambda self, x: torch.addmm(self.b, x, self.w.t()), torch.randn(8, 32), params={"w": nn.Parameter(w), "b": nn.Parameter(b)})
    g2 = graph(lambda self, x: torch.relu(x @ self.w.t() + self.b), torch.randn(8, 32), params={"w": nn.Parameter(w), "b": nn.Parameter(b)})
    assert chosen(g1, ruleset) == ["gemm-bias"]
    assert chosen(g2, ruleset) == ["gemm-bias-relu"]
    m = next(m for m in match_all(ruleset, g1)[0] if m.rule.id == "gemm-bias")
    from fact_db.discovery import aten
    dims = aten.gemm_problem(m.output)
    assert (dims["M"], dims["N"], dims["K"]) == (8, 16, 32)
    assert dims["layout_b"] == "col"  # w.t() read in place, not copied


def test_full_matrix_add_is_a_residual_not_a_bias(ruleset):
    g = graph(lambda self, x, r: self.lin(x) + r, torch.randn(8, 32), torch.randn(8, 16), params={"lin": nn.Linear(32, 16)})
    assert chosen(g, ruleset) == ["gemm-residual"]


def test_escaping_intermediate_blocks_the_fusion(ruleset):
    # the linear's output is returned as well as activated: fusing would lose it
    g = graph(lambda self, x: (lambda y: (torch.relu(y), y))(self.lin(x)), torch.randn(8, 32), params={"lin": nn.Linear(32, 16)})
    found, miss = match_rule(ruleset.get("gemm-bias-relu"), g)
    assert not found
    assert "outside the region" in miss.reason


def test_large_k_goes_to_stream_k_and_square_does_not(ruleset):
    g = graph(lambda self, a, b: a @ b, torch.randn(32, 4096), torch.randn(4096, 32))
    assert chosen(g, ruleset) == ["gemm-large-k"]
    g = graph(lambda self, a, b: a @ b, torch.randn(64, 64), torch.randn(64, 64))
    assert chosen(g, ruleset) == ["gemm"]
    found, miss = match_rule(ruleset.get("gemm-large-k"), g)
    assert "K >= 8 * max(M, N)" in miss.reason and "K=64" in miss.reason


def test_causal_attention_needs_a_lower_triangular_mask(ruleset):
    T = 16

    def attn(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v
    qkv = [torch.randn(2, 4, T, 8) for _ in range(3)]

    class A(nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.register_buffer("mask", mask.view(1, 1, 32, 32))

        def forward(self, q, k, v):
            return attn(self, q, k, v)
    good = trace_module(A(torch.tril(torch.ones(32, 32))), qkv)
    assert chosen(good, ruleset) == ["attention-causal"]
    bad = trace_module(A(torch.triu(torch.ones(32, 32))), qkv)
    found, miss = match_rule(ruleset.get("attention-causal"), bad)
    assert not found and "is_tril(tril)" in miss.reason


def test_unknown_mask_values_are_an_explicit_assumption(ruleset):
    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.tril(torch.ones(16, 16, device="meta")))

        def forward(self, q, k, v):
            att = (q @ k.transpose(-2, -1)) * 0.125
            return F.softmax(att.masked_fill(self.mask == 0, float("-inf")), dim=-1) @ v
    qkv = [torch.randn(2, 4, 16, 8, device="meta") for _ in range(3)]
    g = trace_module(A(), qkv)
    m = next(m for m in match_all(ruleset, g)[0] if m.rule.id == "attention-causal")
    assert m.assumptions and "assumed lower-triangular" in m.assumptions[0]


def test_dtype_outside_rule_is_a_reason(ruleset):
    g = graph(lambda self, a, b: a @ b, torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64))
    found, miss = match_rule(ruleset.get("gemm"), g)
    assert not found and "float64" in miss.reason


def test_arch_filter(ruleset):
    g = graph(lambda self, a, b: a @ b, torch.randn(8, 8), torch.randn(8, 8))
    assert match_rule(ruleset.get("gemm"), g, arch="sm90")[0]
    assert match_rule(ruleset.get("gemm"), g, arch="sm80")[0]


def test_nomatch_is_falsy_and_carries_reason(ruleset):
    g = graph(lambda self, a: a + 1, torch.randn(4))
    found, miss = match_rule(ruleset.get("gemm"), g)
    assert found == [] and not miss and "no " in str(miss)
