"""Norm workloads, candidates and the add_norm template on the CPU (no GPU, no nvcc)."""
from __future__ import annotations

import re

import pytest
import torch

from fact_db import norm
from fact_db.norm import NormCandidate, NormError, NormWorkload


def test_reference_matches_eager_in_float64_and_keeps_the_sum_rounding():
    w = NormWorkload("layernorm", rows=16, width=64, residual=True, write_sum=True, dtype="bfloat16", policy="bf16")
    inp = w.make_inputs("randn", device="cpu")
    y, s = w.reference(inp)
    assert y.dtype == torch.float64 and s.dtype == torch.float64
    # the reference normalizes the bf16-rounded sum, as eager does
    assert torch.equal(s, (inp["x"] + inp["r"]).double())
    ey, es = w.eager(inp)
    assert torch.equal(es, inp["x"] + inp["r"])
    assert (ey.double() - y).norm() / y.norm() < 1e-2


def test_rmsnorm_reference_is_the_llama_form():
    w = NormWorkload("rmsnorm", rows=8, width=32, eps=1e-6)
    inp = w.make_inputs("rand", device="cpu")
    y, s = w.reference(inp)
    assert s is None
    x = inp["x"].double()
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * inp["weight"].double()
    torch.testing.assert_close(y, want)
    ey, _ = w.eager(inp)
    assert (ey.double() - y).norm() / y.norm() < 1e-6


def test_workload_refuses_bad_fields():
    with pytest.raises(NormError, match="write_sum needs residual"):
        NormWorkload("layernorm", 4, 8, residual=False, write_sum=True)
    with pytest.raises(NormError, match="kind 'batchnorm'"):
        NormWorkload("batchnorm", 4, 8)
    with pytest.raises(NormError, match="dtype 'float64'"):
        NormWorkload("rmsnorm", 4, 8, dtype="float64")


def test_key_string_names_every_field():
    w = NormWorkload("rmsnorm", 65536, 4096, residual=True, write_sum=True, eps=1e-6, dtype="bfloat16",
                     policy="bf16")
    assert w.key_string() == "rmsnorm:65536x4096:res=1:sum=1:bias=0:eps=1e-06:bfloat16:bf16"
    assert w.key()["has_bias"] is False  # RMSNorm has no bias whatever the field says


@pytest.mark.parametrize("dtype,width", [("float32", 768), ("bfloat16", 768), ("bfloat16", 4096),
                                         ("float32", 4096), ("float16", 100)])
def test_candidates_are_valid_and_distinct(dtype, width):
    w = NormWorkload("layernorm", 1024, width, residual=True, dtype=dtype)
    cands = norm.candidates(w)
    assert cands and len(set(cands)) == len(cands) and len(cands) <= 12
    for c in cands:
        assert norm.valid(w, c)
        assert width % c.vec == 0
        assert 64 <= c.threads * c.rows_per_cta <= 512
    size = 4 if dtype == "float32" else 2
    assert cands[0].vec == max(v for v in (1, 2, 4, 8) if v * size <= 16 and width % v == 0)


def test_valid_refuses_what_the_template_static_asserts():
    w = NormWorkload("layernorm", 64, 768)
    assert not norm.valid(w, NormCandidate(48, 4, 1))    # not a power of two below 32, not a multiple of 32
    assert not norm.valid(w, NormCandidate(32, 8, 1))    # 32-byte fp32 vectors
    assert not norm.valid(w, NormCandidate(512, 4, 4))   # 2048 threads
    assert not norm.valid(w, NormCandidate(1, 1, 1))     # 768 values in one thread's registers
    assert norm.valid(w, NormCandidate(64, 4, 2))


def test_render_sets_the_parameters_and_exports_the_c_abi():
    w = NormWorkload("layernorm", 128, 768, residual=True, write_sum=True, dtype="bfloat16", policy="bf16")
    src = norm.render(w, NormCandidate(32, 8, 4))
    assert 'extern "C"' in src and re.search(r"\bint fact_add_norm_launch\(", src)
    assert "using T = __nv_bfloat16;" in src
    for line in ("kWidth = 768;", "kThreads = 32;", "kVec = 8;", "kRows = 4;", "kResidual = true;",
                 "kWriteSum = true;", "kLayerNorm = true;", "kBias = true;"):
        assert line in src, line
    src2 = norm.render(NormWorkload("rmsnorm", 8, 4096), NormCandidate(256, 4, 1))
    assert "kLayerNorm = false;" in src2 and "kResidual = false;" in src2 and "kBias = false;" in src2


class _SumUsedLater(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x, y):
        s = x + y
        return s + torch.tanh(self.ln(s))


class _ProjThenNorm(torch.nn.Module):
    """x + proj(h) then LayerNorm: gemm-residual and add-layernorm both match the add."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x, h):
        return self.ln(x + self.proj(h))


def _analyse(model, *inputs):
    from fact_db.discover import analyse
    from fact_db.rules import load_rules
    from fact_db.trace import trace_module
    return analyse(trace_module(model, inputs), load_rules(), arch="sm90", policy="fp32")


def test_add_layernorm_region_wins_over_the_plain_norm_and_exposes_the_sum():
    rep = _analyse(_SumUsedLater(), torch.randn(4, 32), torch.randn(4, 32))
    r = next(r for r in rep.regions if r.rule == "add-layernorm")
    assert "layernorm" in r.subsumes
    assert not any(x.rule == "layernorm" for x in rep.regions)
    assert set(r.operands) == {"x", "res", "weight", "bias"}
    assert r.attrs["kind"] == "layernorm" and r.attrs["eps"] == 1e-5
    assert r.attrs["sum"]  # the add node, read again by the final add


def test_gemm_residual_keeps_the_add_where_both_match():
    rep = _analyse(_ProjThenNorm(), torch.randn(4, 32), torch.randn(4, 32))
    rules = [r.rule for r in rep.regions]
    assert "gemm-residual" in rules and "layernorm" in rules and "add-layernorm" not in rules


def test_registry_round_trip_of_a_norm_winner_and_stale_source():
    from fact_db.registry import Registry
    w = NormWorkload("layernorm", 65536, 768, residual=True, write_sum=True, policy="fp32")
    c = NormCandidate(64, 4, 2)
    trials = [norm.NormTrial("t64v4r2", "ok", 0.05, 1e-7, candidate=c),
              norm.NormTrial("eager", "ok", 0.08, 2e-7),
              norm.NormTrial("t32v4r1", "verify_failed", error="y error 1 > bound")]
    with Registry.open("memory") as reg:
        assert norm.from_registry(w, reg, gpu="h100") is None
        best = norm.record(w, trials, reg, gpu="h100", device_name="NVIDIA H100")
        assert best.label == "t64v4r2"
        got = norm.from_registry(w, reg, gpu="h100")
        assert got.candidate == c and got.time_ms == 0.05
        row = reg.norm_get(w, "sm90a", "h100")
        assert row["eager_ms"] == 0.08 and row["template"] == "add_norm"
        # another key (no sum output) is another row
        assert norm.from_registry(NormWorkload("layernorm", 65536, 768, residual=True, policy="fp32"), reg,
                                  gpu="h100") is None
        # eager winning is recorded as eager
        w2 = NormWorkload("rmsnorm", 8, 64)
        norm.record(w2, [norm.NormTrial("eager", "ok", 0.01, 0.0)], reg, gpu="h100")
        assert norm.from_registry(w2, reg, gpu="h100").candidate is None
        # a changed template source makes the kernel row stale
        with reg.db.begin() as conn:
            import sqlalchemy as sa
            conn.execute(sa.text("UPDATE norm_kernels SET source_hash = 'old' WHERE kind = 'layernorm'"))
        assert norm.from_registry(w, reg, gpu="h100") is None


_NORM_CALLS = []


@torch.library.custom_op("factdb_test::add_layernorm", mutates_args=(),
                         schema="(Tensor x, Tensor? r, Tensor weight, Tensor? bias) -> (Tensor, Tensor)")
def _standin_add_layernorm(x, r, weight, bias):
    _NORM_CALLS.append(1)
    s = x + r
    return torch.nn.functional.layer_norm(s, (x.shape[-1],), weight, bias, 1e-5), s.clone()


@_standin_add_layernorm.register_fake
def _(x, r, weight, bias):
    return torch.empty_like(x), torch.empty_like(x)


def test_compose_replaces_the_add_and_norm_and_serves_the_sum_from_the_op():
    from fact_db.compose import Impl, rewrite
    model = _SumUsedLater().eval()
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    rep = _analyse(model, x, y)
    i = next(i for i, r in enumerate(rep.regions) if r.rule == "add-layernorm")
    assert rep.regions[i].composable == ""
    gm, notes = rewrite(rep.graph.program, rep.regions, {i: Impl("norm", "stand-in", torch.ops.factdb_test.add_layernorm)})
    assert notes == []
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.layer_norm.default" not in targets
    assert targets.count("aten.add.Tensor") == 1  # the final residual only: the sum comes from the op
    _NORM_CALLS.clear()
    torch.testing.assert_close(gm(x, y), model(x, y))
    assert _NORM_CALLS == [1]
