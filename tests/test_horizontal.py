"""Horizontal fusion (rules/gemm/gemm-horizontal.yaml): projections that read one input found
as one multi-output region, composed as one GEMM over concatenated weights (stand-in
kernel ops on the CPU, tests/standins.py), split back so every reader gets what it had,
saved and loaded as an artifact; and the groups that must not form."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact_db
import standins
from fact_db.composition.compose import rewrite
from fact_db.kernels.impl import Impl
from fact_db.discovery.pattern import PatternError, build_patterns
from fact_db.realization.realize import Realized, plan


class Qkv(nn.Module):
    """Llama-style attention projections: no bias, K and V narrower than Q (GQA), the heads
    viewed out of each projection as HF models do."""

    def __init__(self, d=64, kv=32, heads=4):
        super().__init__()
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.heads, self.hd = heads, d // heads

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class Mixed(nn.Module):
    """Three projections of x in three forms: a Linear with bias, a Linear without, and
    x @ W with a K x N parameter; one result is flattened with view (which a strided slice
    of the fused result cannot serve), one is returned as it is."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 16)
        self.b = nn.Linear(32, 8, bias=False)
        self.w = nn.Parameter(torch.randn(32, 24) / 6)

    def forward(self, x):
        return self.a(x).view(-1), torch.relu(self.b(x)), x @ self.w


def _region(report, rule="gemm-horizontal"):
    found = [r for r in report.regions if r.rule == rule]
    assert len(found) == 1, [r.rule for r in report.regions]
    return found[0]


def _impls(report, policy="fp32"):
    """A stand-in GEMM op for every gemm-horizontal region, at the epilogue its workload has."""
    out = {}
    for i, (r, p) in enumerate(zip(report.regions, plan(report, policy))):
        if r.rule == "gemm-horizontal":
            e = p.workload.epilogue
            out[i] = Impl("gemm", f"stand-in {e}", standins.gemm_op(e),
                          {"spec": {"epilogue": e, "dtype": p.workload.dtype}, "standin": e})
    return out


# ------------------------------------------------------------------------------------------
# Discovery.

def test_qkv_projections_are_one_region_with_the_concatenated_n():
    rep = fact_db.discover(Qkv(), (torch.randn(2, 8, 64),))
    assert [r.rule for r in rep.regions] == ["gemm-horizontal", "sdpa-attention", "gemm"]
    r = _region(rep)
    assert r.problem == {"M": 16, "N": 128, "K": 64, "batch": 1} and r.shape == "16x128x64 (64 + 32 + 32)"
    assert r.operands == {"a": "x"} and r.epilogue == ["none"] and r.layouts == {"a": "row", "b": "col"}
    assert [(m["b"], m["n"], m["bias"], m["b_layout"]) for m in r.attrs["members"]] == [
        ("p_q_proj_weight", 64, None, "nk"), ("p_k_proj_weight", 32, None, "nk"), ("p_v_proj_weight", 32, None, "nk")]
    assert r.nodes == [m["output"] for m in r.attrs["members"]] and r.output == r.nodes[-1]
    assert r.composable == "" and r.subsumes == ["gemm"]
    assert r.form.startswith("3 siblings")
    [p] = [p for p in plan(rep, "bf16") if p.region is r]
    w = p.workload
    assert (w.m, w.n, w.k, w.layout_a, w.layout_b, w.epilogue, w.dtype) == (16, 128, 64, "row", "col", "none", "bfloat16")
    # keyed as the plain GEMM it is: the registry's rows for this shape serve it
    from fact_db.kernels.gemm.tune import with_rule
    assert w.rule == "gemm" and with_rule(w).rule == "gemm"


def test_mixed_forms_and_biases_group_with_a_bias_epilogue():
    rep = fact_db.discover(Mixed(), (torch.randn(8, 32),))
    r = _region(rep)
    assert [(m["n"], m["bias"], m["b_layout"]) for m in r.attrs["members"]] == [
        (16, "p_a_bias", "nk"), (8, None, "nk"), (24, None, "kn")]
    assert r.problem["N"] == 48 and r.epilogue == ["bias"]
    [w] = [p.workload for p in plan(rep, "fp32") if p.region is r]
    assert w.epilogue == "bias" and w.layout_b == "col"
    from fact_db.kernels.gemm.tune import with_rule
    assert with_rule(w).rule == "gemm-bias"


class _Two(nn.Module):
    def __init__(self, forward, **params):
        super().__init__()
        self.fwd = forward
        self.p = nn.ParameterDict({k: nn.Parameter(v) for k, v in params.items()})

    def forward(self, *xs):
        return self.fwd(self, *xs)


class _BufferWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w1", torch.randn(32, 16))
        self.register_buffer("w2", torch.randn(32, 16))

    def forward(self, x):
        return x @ self.w1, x @ self.w2


W = {"w1": torch.randn(16, 32), "w2": torch.randn(16, 32)}
NOT_FUSED = {
    "different inputs": (_Two(lambda m, x, y: (F.linear(x, m.p["w1"]), F.linear(y, m.p["w2"])), **W),
                         (torch.randn(8, 32), torch.randn(8, 32))),
    "different K": (_Two(lambda m, x: (F.linear(x, m.p["w1"]), F.linear(x[:, :16], m.p["w2"])),
                         w1=torch.randn(16, 32), w2=torch.randn(16, 16)), (torch.randn(8, 32),)),
    "weight not a parameter": (_Two(lambda m, x, w: (F.linear(x, m.p["w1"]), F.linear(x, w)), w1=W["w1"]),
                               (torch.randn(8, 32), torch.randn(16, 32))),
    "weight computed in forward": (_Two(lambda m, x: (F.linear(x, m.p["w1"]), F.linear(x, m.p["w2"] * 2)), **W),
                                   (torch.randn(8, 32),)),
    "buffers (they may change between calls)": (_BufferWeights(), (torch.randn(8, 32),)),
}

KIND = '`w.kind in ("parameter", "constant")` is false'
WHY = {"different inputs": "only 1 match (`linear`) reads $x", "different K": "only 1 match (`linear`) reads $x",
       "weight not a parameter": KIND, "weight computed in forward": KIND,
       "buffers (they may change between calls)": KIND}


@pytest.mark.parametrize("case", list(NOT_FUSED))
def test_projections_that_do_not_share_a_constant_weighted_read_are_not_fused(case):
    model, xs = NOT_FUSED[case]
    rep = fact_db.discover(model, xs)
    assert "gemm-horizontal" not in [r.rule for r in rep.regions]
    assert WHY[case] in rep.misses["gemm-horizontal"].reason  # says why, for --explain
    assert any(r.rule in ("gemm", "gemm-bias") for r in rep.regions)  # the projections are still regions


def test_a_projection_whose_epilogue_fuses_leaves_the_group():
    """OPT's scaled query beside its key and value projections: the scale is the query
    GEMM's alpha (gemm-bias-scale), the other two are one horizontal region; with only two
    projections, one of them scaled, nothing is left to group."""

    class Opt(nn.Module):
        def __init__(self, n=3):
            super().__init__()
            self.proj = nn.ModuleList(nn.Linear(32, 32) for _ in range(n))

        def forward(self, x):
            q = self.proj[0](x) * 0.125
            return (q,) + tuple(p(x) for p in self.proj[1:])

    rep = fact_db.discover(Opt(), (torch.randn(8, 32),))
    assert [r.rule for r in rep.regions] == ["gemm-bias-scale", "gemm-horizontal"]
    assert [m["output"] for m in _region(rep).attrs["members"]] == ["linear_1", "linear_2"]
    rep = fact_db.discover(Opt(2), (torch.randn(8, 32),))
    assert [r.rule for r in rep.regions] == ["gemm-bias-scale", "gemm-bias"]


class Mlp(nn.Module):
    """Llama's SwiGLU MLP."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False), \
            nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def test_gate_and_up_stay_dual_gemm_swiglu():
    rep = fact_db.discover(Mlp(), (torch.randn(8, 32),))
    assert [r.rule for r in rep.regions] == ["dual-gemm-swiglu", "gemm"]


@pytest.mark.parametrize("make, xs", [(Qkv, (torch.randn(2, 8, 64),)), (Mlp, (torch.randn(8, 32),))])
def test_weights_are_split_once_for_kernels_that_take_their_lo_parts(make, xs):
    """A kernel that takes B's lo parts (fp32tc presplit) gets them from a buffer the rewrite
    split once, for the concatenated Q/K/V and gate/up weights and a plain Linear's alike."""
    torch.manual_seed(0)
    model = make().eval()
    rep = fact_db.discover(model, xs)
    impls = {}
    for i, (r, p) in enumerate(zip(rep.regions, plan(rep, "fp32"))):
        if p.workload is not None:
            e = "none" if r.rule == "dual-gemm-swiglu" else p.workload.epilogue
            impls[i] = Impl("gemm", f"stand-in {e}", standins.gemm_op(e), {"spec": {"epilogue": e}},
                            op_lo=standins.gemm_lo_op(e), split_lo=standins.split_lo)
    gm, notes = rewrite(rep.graph.program, rep.regions, impls)
    assert notes == []
    before = standins.CALLS.copy()
    with torch.no_grad():
        torch.testing.assert_close(gm(*xs), model(*xs), rtol=1e-5, atol=1e-5)
    calls = standins.CALLS - before
    assert sum(v for k, v in calls.items() if k.startswith("gemm_lo_")) == len(impls) == 2  # the stand-in refuses a wrong b_lo
    los = {n: b for n, b in gm.named_buffers() if n.startswith("_factdb_b_lo_")}
    fused = next(b for n, b in gm.named_buffers() if n.startswith(("_factdb_hcat_weight_", "_factdb_gate_up_")))
    assert len(los) == 2 and any(b.shape == fused.shape for b in los.values())  # N x K, as the weight
    assert all(b.is_contiguous() for b in los.values())


# ------------------------------------------------------------------------------------------
# Composition.

@pytest.mark.parametrize("make, xs", [(Qkv, (torch.randn(2, 8, 64),)), (Mixed, (torch.randn(8, 32),))])
def test_one_gemm_serves_every_projection(make, xs):
    torch.manual_seed(0)
    model = make().eval()
    rep = fact_db.discover(model, xs)
    impls = _impls(rep)
    gm, notes = rewrite(rep.graph.program, rep.regions, impls)
    assert notes == []
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    linears = sum(t.startswith(("aten.linear", "aten.matmul")) for t in targets)
    assert linears == (1 if make is Qkv else 0)  # Qkv's o_proj is not part of the group
    before = standins.CALLS.copy()
    with torch.no_grad():
        got, want = gm(*xs), model(*xs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 1
    # The flattened projection needs a packed copy of its slice; the others read theirs in place.
    assert sum(t.startswith("aten.clone") for t in targets) == (1 if make is Mixed else 0)
    gm.graph.lint()


def test_the_composed_module_counts_the_weights_it_concatenated_as_held_memory():
    from fact_db.composition.module import ComposedModule, signature
    from fact_db.composition.report import _mib
    model = Mixed().eval()
    xs = (torch.randn(8, 32),)
    rep = fact_db.discover(model, xs)
    gm, _ = rewrite(rep.graph.program, rep.regions, _impls(rep))
    fast = ComposedModule(gm, model, policy="fp32", optimized_for=signature(xs))
    # [a.weight; b.weight; w^T] is 48 x 32 floats, the bias 16 + 8 (zeros) + 24 (zeros)
    want = (48 * 32 + 48) * 4 / 2**20
    assert fast.held_mib() == pytest.approx(want)
    assert fast.held_mib(graphs=False) == pytest.approx(want)  # no CUDA graph on the CPU
    # An eager composition made no buffers.
    gm0, _ = rewrite(rep.graph.program, rep.regions, {})
    assert ComposedModule(gm0, model, policy="fp32", optimized_for=signature(xs)).held_mib() == 0
    assert _mib({"peak_mib": 12.5, "held_mib": 4.25}) == "12.5 (4.2)" and _mib({"peak_mib": 12.0}) == "12"


def test_the_library_path_leaves_the_projections_as_they_were():
    model = Qkv().eval()
    x = torch.randn(2, 8, 64)
    rep = fact_db.discover(model, (x,))
    i = rep.regions.index(_region(rep))
    gm, notes = rewrite(rep.graph.program, rep.regions, {i: Impl.eager("eager is the fastest verified candidate")})
    assert notes == []
    assert sum(str(n.target).startswith("aten.linear") for n in gm.graph.nodes) == 4
    assert not any(str(n.target).startswith("aten.split") for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x), model(x))


def test_a_group_whose_weight_is_no_longer_a_parameter_stays_eager():
    model = Qkv().eval()
    x = torch.randn(2, 8, 64)
    rep = fact_db.discover(model, (x,))
    r = _region(rep)
    r.attrs["members"][1]["b"] = "x"  # what an edited manifest could claim
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep))
    assert len(notes) == 1 and "stays eager" in notes[0] and "not a parameter" in notes[0]
    torch.testing.assert_close(gm(x), model(x))


# ------------------------------------------------------------------------------------------
# optimize end to end on the CPU and the artifact.

def _realizer(disc, policy):
    impls = _impls(disc, policy)
    return [Realized(i, r, p.workload, impls.get(i, Impl.eager("not realized in this test")),
                     "tuned" if i in impls else "eager", eager_ms=1.0 if i in impls else None,
                     ms=0.5 if i in impls else None)
            for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy)))]


def _loader(rec):
    if "standin" not in rec:
        return None
    return Impl(rec["kind"], rec.get("label", ""), standins.gemm_op(rec["standin"]), rec)


def test_optimize_saves_and_loads_a_horizontal_region(tmp_path):
    from fact_db.composition.artifact import load
    from fact_db.pipeline import optimize
    torch.manual_seed(0)
    model = Mixed().eval()
    x = torch.randn(8, 32)
    fast = optimize(model, (x,), realizer=_realizer, timer=standins.composed_faster, peers=(), out=tmp_path / "art",
                    progress=False)
    assert fast.report.verification.ok
    m = json.loads((Path(fast.artifact) / "manifest.json").read_text())
    [entry] = [r for r in m["regions"] if r["rule"] == "gemm-horizontal"]
    assert [x["n"] for x in entry["attrs"]["members"]] == [16, 8, 24] and entry["impl"]["kind"] == "gemm"
    again = load(fast.artifact, loader=_loader)
    before = standins.CALLS.copy()
    with torch.no_grad():
        for g, w in zip(again(x), model(x)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert (standins.CALLS - before)["gemm_bias"] == 1
    assert any("gemm-horizontal: loaded" in n for n in again.load_notes)


# ------------------------------------------------------------------------------------------
# The schema construct.

def test_siblings_must_share_a_capture_every_alternative_has(ruleset):
    match = {"nodes": {"proj": {"use": "gemm", "inputs": ["$x", "$w"]}}, "output": "proj"}
    assert build_patterns({**match, "siblings": {"share": ["x"], "same": ["K"]}}, ruleset.fragments)[0].siblings.min == 2
    with pytest.raises(PatternError, match="`y` is not a capture"):
        build_patterns({**match, "siblings": {"share": ["y"]}}, ruleset.fragments)
    with pytest.raises(PatternError, match="`Q` in `Q` is not a node"):
        build_patterns({**match, "siblings": {"share": ["x"], "same": ["Q"]}}, ruleset.fragments)


@pytest.mark.slow
def test_the_split_projections_run_under_torch_compile_fullgraph():
    from fact_db.composition.module import ComposedModule, signature
    torch.manual_seed(0)
    model = Qkv().eval()
    x = torch.randn(2, 8, 64)
    rep = fact_db.discover(model, (x,))
    gm, _ = rewrite(rep.graph.program, rep.regions, _impls(rep))
    compiled = torch.compile(ComposedModule(gm, model, policy="fp32", optimized_for=signature((x,))), fullgraph=True)
    before = standins.CALLS.copy()
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert (standins.CALLS - before)["gemm_none"] == 1
