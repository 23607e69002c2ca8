"""Weights held in the layout the kernels read, and SwiGLU computed in place, on the CPU
with stand-in kernel ops (tests/standins.py).

A K x N weight (GPT-2's `Conv1D`, any `x @ W`) is planned K-major under the float32
policies, whose kernels read B K-major, and composition transposes it once into a buffer;
SwiGLU's SiLU and product run in place in the gate half of the dual GEMM's output, inside one op.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact_db
from fact_db.composition.compose import rewrite
from fact_db.kernels.impl import Impl
from fact_db.realization.realize import plan
import standins  # tests/ is on sys.path (conftest.py): the one module every test counts calls in


class Conv1D(nn.Module):
    """GPT-2's projection (transformers.pytorch_utils.Conv1D): the weight held K x N."""

    def __init__(self, nx: int, nf: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        out = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(out)


class Gpt2Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(32, 64), Conv1D(64, 32)

    def forward(self, x):
        return x + self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class KnSwiGlu(nn.Module):
    """SwiGLU over K x N weights (`x @ W`), its result read through a view that needs a packed tensor."""

    def __init__(self, flat: bool = False):
        super().__init__()
        self.wg, self.wu = nn.Parameter(torch.randn(32, 48) * 0.1), nn.Parameter(torch.randn(32, 48) * 0.1)
        self.flat = flat

    def forward(self, x):
        y = F.silu(x @ self.wg) * (x @ self.wu)
        return y.view(-1) if self.flat else y


def _impls(rep, policy: str, layout_b=None, lo: bool = False) -> dict:
    """A stand-in kernel for every planned GEMM region, its spec's layout_b as planned (or `layout_b`)."""
    impls = {}
    for i, (r, p) in enumerate(zip(rep.regions, plan(rep, policy))):
        if p.workload is None:
            continue
        e = "none" if r.rule == "dual-gemm-swiglu" else p.workload.epilogue
        spec = {"epilogue": e, "layout_b": layout_b or p.workload.layout_b}
        impls[i] = Impl("gemm", f"stand-in {e}", standins.gemm_op(e), {"spec": spec},
                        op_lo=standins.gemm_lo_op(e) if lo else None, split_lo=standins.split_lo if lo else None)
    return impls


def _held(gm, prefix: str) -> dict:
    return {n: b for n, b in gm.named_buffers() if n.startswith(prefix)}


def test_a_kn_weight_is_planned_k_major_under_the_float32_policies_only():
    rep = fact_db.discover(Gpt2Mlp().eval(), (torch.randn(2, 8, 32),))
    assert [r.rule for r in rep.regions] == ["gemm-bias-gelu-tanh", "gemm-residual"]
    assert all(r.attrs.get("b_weight") for r in rep.regions)
    for policy in ("fp32", "tf32x3", "tf32"):
        ps = plan(rep, policy)
        assert [p.workload.layout_b for p in ps] == ["col", "col"]
        assert all("held transposed" in p.note for p in ps)
    assert [p.workload.layout_b for p in plan(rep, "bf16")] == ["row", "row"]  # 16-bit kernels read B either way
    assert not any(p.note for p in plan(rep, "bf16"))


def test_an_activation_b_is_not_a_weight():
    class Bmm(nn.Module):
        def forward(self, a, b):
            return a @ b

    rep = fact_db.discover(Bmm(), (torch.randn(16, 32), torch.randn(32, 48)))
    [r] = rep.regions
    assert "b_weight" not in r.attrs
    assert plan(rep, "fp32")[0].workload.layout_b == "row"


@pytest.mark.parametrize("lo", [False, True])
def test_a_kn_weight_is_transposed_once_for_a_k_major_kernel(lo):
    torch.manual_seed(0)
    model = Gpt2Mlp().eval()
    x = torch.randn(2, 8, 32)
    rep = fact_db.discover(model, (x,))
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, "fp32", lo=lo))
    assert notes == []
    held = _held(gm, "_factdb_wt_")
    weights = [model.c_fc.weight, model.c_proj.weight]
    assert sorted(tuple(b.shape) for b in held.values()) == sorted(tuple(w.t().shape) for w in weights)
    for b in held.values():  # N x K, packed: the weight's transpose, made once
        assert b.is_contiguous() and any(torch.equal(b, w.t()) for w in weights)
    gemms = [n for n in gm.graph.nodes if str(n.target).startswith("factdb_test.gemm")]
    bs = [n.args[1] for n in gemms]  # B as each op takes it: t(the held buffer), a K-major view
    assert len(gemms) == 2 and all(str(b.target) == "aten.t.default" and b.args[0].op == "get_attr"
                                   and b.args[0].target.startswith("_factdb_wt_") for b in bs)
    before = standins.CALLS.copy()
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    calls = standins.CALLS - before
    assert sum(v for k, v in calls.items() if k.startswith("gemm_lo_" if lo else "gemm_")) == 2
    if lo:  # the lo parts are split from the held transpose (the stand-in refuses any other b_lo)
        assert len(_held(gm, "_factdb_b_lo_")) == 2


def test_a_kernel_that_reads_b_as_given_gets_the_weight_itself():
    torch.manual_seed(0)
    model = Gpt2Mlp().eval()
    x = torch.randn(2, 8, 32)
    rep = fact_db.discover(model, (x,))
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, "bf16"))
    assert notes == [] and not _held(gm, "_factdb_wt_")
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_swiglu_runs_in_place_in_the_dual_gemms_output(policy):
    torch.manual_seed(0)
    model = KnSwiGlu().eval()
    x = torch.randn(2, 8, 32)
    rep = fact_db.discover(model, (x,))
    [r] = rep.regions
    assert r.rule == "dual-gemm-swiglu"
    [p] = plan(rep, policy)
    assert (p.workload.n, p.workload.layout_b) == (96, "col" if policy == "fp32" else "row")
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, policy))
    assert notes == []
    [fused] = _held(gm, "_factdb_gate_up_").values()
    if policy == "fp32":  # N x K for the K-major kernel: [Wg; Wu] as rows
        assert fused.is_contiguous() and torch.equal(fused, torch.cat([model.wg.t(), model.wu.t()]))
    else:
        assert torch.equal(fused, torch.cat([model.wg, model.wu], dim=1))
    t = _targets(gm)
    # One op computes it (the dual GEMM, then SiLU and the product in place inside it): no
    # out-of-place SiLU or product in the graph, and no mutation for torch.compile to functionalize.
    assert sum(x.startswith("factdb.swiglu_") for x in t) == 1
    assert not {"aten.silu.default", "aten.mul.Tensor", "aten.silu_.default", "aten.mul_.Tensor"} & set(t)
    with torch.no_grad():
        got = gm(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert got.stride()[-2:] == (96, 1)  # the gate half of the M x 2N output, no copy


def test_a_view_that_needs_a_packed_result_gets_a_copy():
    torch.manual_seed(0)
    model = KnSwiGlu(flat=True).eval()
    x = torch.randn(16, 32)
    rep = fact_db.discover(model, (x,))
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, "fp32"))
    assert notes == [] and "aten.clone.default" in _targets(gm)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Compositions for other input shapes share what the first one made.

class Block(nn.Module):
    """A K x N weight, Q/K/V-style siblings and SwiGLU: every kind of weight composition makes."""

    def __init__(self):
        super().__init__()
        self.proj = Conv1D(32, 32)
        self.q, self.k = nn.Linear(32, 32), nn.Linear(32, 32, bias=False)
        self.gate, self.up = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False)

    def forward(self, x):
        h = self.proj(x)
        h = torch.cat([torch.tanh(self.q(h)), torch.sigmoid(self.k(h))], -1)[..., ::2]
        return F.silu(self.gate(h)) * self.up(h)


@pytest.mark.slow
def test_a_composition_for_other_shapes_shares_the_weights_the_first_made():
    from fact_db.composition.module import ComposedModule, signature
    torch.manual_seed(0)
    model = Block().eval()
    derived: dict = {}
    mods = []
    for batch in (2, 3):
        x = torch.randn(batch, 8, 32)
        rep = fact_db.discover(model, (x,))
        gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, "fp32", lo=True), derived=derived)
        assert notes == []
        with torch.no_grad():
            torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
        mods.append(gm)
    first, second = (_held(m, "_factdb_") for m in mods)
    kinds = {n.rsplit("_", 1)[0] for n in first}
    assert {"_factdb_wt", "_factdb_hcat_weight", "_factdb_hcat_bias", "_factdb_gate_up", "_factdb_b_lo"} <= kinds
    ptrs = {b.untyped_storage().data_ptr() for b in first.values()}
    assert {b.untyped_storage().data_ptr() for b in second.values()} == ptrs  # nothing made twice

    x2, x3 = torch.randn(2, 8, 32), torch.randn(3, 8, 32)
    fast = ComposedModule(mods[0], model, policy="fp32", optimized_for=signature((x2,)),
                          variants=lambda sig, args, kwargs: (mods[1], "the stand-in variant"))
    once = fast.held_mib()
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in first.values()}
    assert once * 2**20 == sum(storages.values())  # a buffer shared by two regions counted once
    with pytest.warns(UserWarning, match="the stand-in variant"):
        torch.testing.assert_close(fast(x3), model(x3), rtol=1e-5, atol=1e-5)
    assert fast.held_mib() == once  # the variant holds nothing of its own
