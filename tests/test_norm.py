"""Norm workloads, candidates and the add_norm template on the CPU (no GPU, no nvcc)."""
from __future__ import annotations

import re

import pytest
import torch

from fact_db.kernels.norm import family as norm_family
from fact_db.kernels.norm import tune as norm_tune
from fact_db.kernels.norm.tune import NormCandidate
from fact_db.kernels.norm.workload import NormError, NormWorkload


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
    assert w.key_fields()["has_bias"] is False  # RMSNorm has no bias whatever the field says


@pytest.mark.parametrize("dtype,width", [("float32", 768), ("bfloat16", 768), ("bfloat16", 4096),
                                         ("float32", 4096), ("float16", 100)])
def test_candidates_are_valid_and_distinct(dtype, width):
    w = NormWorkload("layernorm", 1024, width, residual=True, dtype=dtype)
    cands = norm_tune.candidates(w)
    assert cands and len(set(cands)) == len(cands) and len(cands) <= 12
    for c in cands:
        assert norm_tune.valid(w, c)
        assert width % c.vec == 0
        assert 64 <= c.threads * c.rows_per_cta <= 512
    size = 4 if dtype == "float32" else 2
    assert cands[0].vec == max(v for v in (1, 2, 4, 8) if v * size <= 16 and width % v == 0)


def test_valid_refuses_what_the_template_static_asserts():
    w = NormWorkload("layernorm", 64, 768)
    assert not norm_tune.valid(w, NormCandidate(48, 4, 1))    # not a power of two below 32, not a multiple of 32
    assert not norm_tune.valid(w, NormCandidate(32, 8, 1))    # 32-byte fp32 vectors
    assert not norm_tune.valid(w, NormCandidate(512, 4, 4))   # 2048 threads
    assert not norm_tune.valid(w, NormCandidate(1, 1, 1))     # 768 values in one thread's registers
    assert norm_tune.valid(w, NormCandidate(64, 4, 2))


def test_render_sets_the_parameters_and_exports_the_c_abi():
    w = NormWorkload("layernorm", 128, 768, residual=True, write_sum=True, dtype="bfloat16", policy="bf16")
    src = norm_tune.render(w, NormCandidate(32, 8, 4))
    assert 'extern "C"' in src and re.search(r"\bint fact_add_norm_launch\(", src)
    assert "using T = __nv_bfloat16;" in src
    for line in ("kWidth = 768;", "kThreads = 32;", "kVec = 8;", "kRows = 4;", "kResidual = true;",
                 "kWriteSum = true;", "kLayerNorm = true;", "kBias = true;"):
        assert line in src, line
    src2 = norm_tune.render(NormWorkload("rmsnorm", 8, 4096), NormCandidate(256, 4, 1))
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
    from fact_db.discovery.discover import analyse
    from fact_db.discovery.rules import load_rules
    from fact_db.discovery.trace import trace_module
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
    from fact_db.store.registry import Registry
    w = NormWorkload("layernorm", 65536, 768, residual=True, write_sum=True, policy="fp32")
    c = NormCandidate(64, 4, 2)
    trials = [norm_tune.NormTrial("t64v4r2", "ok", 0.05, 1e-7, candidate=c),
              norm_tune.NormTrial("eager", "ok", 0.08, 2e-7),
              norm_tune.NormTrial("t32v4r1", "verify_failed", error="y error 1 > bound")]
    with Registry.open("memory") as reg:
        assert norm_tune.from_registry(w, reg, gpu="h100") is None
        best = norm_tune.record(w, trials, reg, gpu="h100", device_name="NVIDIA H100")
        assert best.label == "t64v4r2"
        got = norm_tune.from_registry(w, reg, gpu="h100")
        assert got.candidate == c and got.time_ms == 0.05
        rec = reg.lookup(w.key("sm90a", "h100"), nearest=False).record
        assert rec.baseline_ms == 0.08 and rec.template == "add_norm" and rec.label == "t64v4r2"
        assert {t.status for t in reg.trials(w.key("sm90a", "h100"))} == {"ok", "verify_failed"}
        # another key (no sum output) is another row
        assert norm_tune.from_registry(NormWorkload("layernorm", 65536, 768, residual=True, policy="fp32"), reg,
                                  gpu="h100") is None
        # eager winning is recorded as eager
        w2 = NormWorkload("rmsnorm", 8, 64)
        norm_tune.record(w2, [norm_tune.NormTrial("eager", "ok", 0.01, 0.0)], reg, gpu="h100")
        assert norm_tune.from_registry(w2, reg, gpu="h100").candidate is None
        # a changed template makes the kernel row stale: never served, and said so
        with reg.db.begin() as conn:
            import sqlalchemy as sa
            conn.execute(sa.text("UPDATE kernels SET template_hash = 'old' WHERE family = 'norm' "
                                 "AND template = 'add_norm'"))
        assert norm_tune.from_registry(w, reg, gpu="h100") is None
        hit = reg.lookup(w.key("sm90a", "h100"), nearest=False)
        assert hit.stale and "template add_norm changed" in hit.stale_reason


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
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.impl import Impl
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


# ---------------------------------------------------------------------------------------
# Norm regions in realize_regions (stage 2 for a model) and in the composed module.

class _Norms(torch.nn.Module):
    """LayerNorm alone, residual add + LayerNorm whose sum is read again, hand-written RMSNorm."""

    def __init__(self, width=64):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.ln2 = torch.nn.LayerNorm(width, eps=1e-6)
        self.w = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x, y):
        s = torch.tanh(self.ln1(x)) + y
        r = s + torch.tanh(self.ln2(s))
        return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


def _norm_trials(w):
    c = NormCandidate(32, 4, 1)
    kernel = norm_tune.NormTrial("t32v4r1", "ok", 0.02, 1e-7, 1e-7, candidate=c, so="/x/kernel.so", build_key="bk")
    return [kernel, norm_tune.NormTrial("eager", "ok", 0.05, 1e-7, 1e-7)], kernel, "tuned"


def _standin_norm_impl(w, best):
    """realize's own Impl for an eager winner or none; a stand-in op for a kernel winner."""
    import standins
    from fact_db.kernels.impl import Impl
    if best is None or best.candidate is None:
        return norm_family.impl_of(w, best)
    return Impl("norm", f"stand-in {best.label}", standins.norm_op(w.kind, w.eps),
                {"standin": f"norm:{w.kind}:{w.eps!r}", "workload": w.as_dict(), "template": "add_norm"})


def test_norm_regions_get_workloads_from_what_discovery_kept():
    rep = _analyse(_Norms(), torch.randn(2, 8, 64), torch.randn(2, 8, 64))
    by_rule = {r.rule: r for r in rep.regions}
    assert set(by_rule) == {"layernorm", "add-layernorm", "rmsnorm"}
    got = {rule: norm_family.workload(r, rep.graph, "fp32") for rule, r in by_rule.items()}
    assert got["layernorm"] == (NormWorkload("layernorm", 16, 64, eps=1e-5), "")
    assert got["add-layernorm"] == (NormWorkload("layernorm", 16, 64, residual=True, write_sum=True, eps=1e-6), "")
    assert got["rmsnorm"] == (NormWorkload("rmsnorm", 16, 64, eps=1e-6, has_bias=False), "")
    # a half policy runs the model in that dtype, so its norms are keyed in it
    assert norm_family.workload(by_rule["layernorm"], rep.graph, "bf16")[0].dtype == "bfloat16"


def test_a_weightless_norm_gets_a_workload_and_one_without_a_constant_eps_stays_eager_with_the_reason():

    class NoAffine(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.layer_norm(x, (x.shape[-1],))
    rep = _analyse(NoAffine(), torch.randn(4, 32))
    [r] = rep.regions
    # Composition passes ones for the weight (tests/test_compose.py composes one).
    assert "weight" not in r.operands
    assert norm_family.workload(r, rep.graph, "fp32") == (NormWorkload("layernorm", 4, 32, has_bias=False), "")
    r.attrs["eps"] = "eps"
    r.operands["weight"] = r.operands["x"]
    assert norm_family.workload(r, rep.graph, "fp32") == (None, "the norm's eps is not a constant")


def test_realize_regions_tunes_norm_regions_and_the_composed_model_computes_the_model():
    import standins
    from fact_db.composition.compose import rewrite
    from fact_db.realization.realize import realize_regions
    model = _Norms().eval()
    x, y = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    rep = _analyse(model, x, y)
    seen = []
    out = realize_regions(rep, "fp32", gpu="h100", progress=False, norm_impl=_standin_norm_impl,
                          norm_chooser=lambda w: (seen.append(w), _norm_trials(w))[1])
    assert len(seen) == 3 and {z.how for z in out} == {"tuned"}
    assert all(z.impl.kind == "norm" and z.ms == 0.02 and z.eager_ms == 0.05 and z.speedup == 2.5 for z in out)
    assert any("eager: 0.050 ms" in n for z in out for n in z.notes)
    gm, notes = rewrite(rep.graph.program, rep.regions, {z.index: z.impl for z in out})
    assert notes == []
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert not any(t.startswith(("aten.layer_norm", "aten.rsqrt", "aten.pow")) for t in targets), targets
    before = standins.CALLS.copy()
    torch.testing.assert_close(gm(x, y), model(x, y))
    assert sum((standins.CALLS - before).values()) == 3


def test_norm_regions_ask_the_registry_and_a_spent_budget_skips_what_it_has_not():
    from fact_db.realization.realize import realize_regions
    from fact_db.store.registry import Registry
    rep = _analyse(_Norms(), torch.randn(2, 8, 64), torch.randn(2, 8, 64))
    r_ln = next(r for r in rep.regions if r.rule == "layernorm")
    w_ln = norm_family.workload(r_ln, rep.graph, "fp32")[0]
    with Registry.open("memory") as reg:
        norm_tune.record(w_ln, [norm_tune.NormTrial("eager", "ok", 0.01, 1e-7)], reg, gpu="h100")
        out = realize_regions(rep, "fp32", registry=reg, gpu="h100", plan_only=True, progress=False)
        assert {z.region.rule: z.registry for z in out} == {"layernorm": "hit", "add-layernorm": "miss",
                                                            "rmsnorm": "miss"}
        assert reg.lookup(w_ln.key("sm90a", "h200"), nearest=False) is None  # keyed by GPU: never crosses hardware
        called = []
        out = realize_regions(rep, "fp32", registry=reg, gpu="h100", budget_s=0.0, progress=False,
                              norm_impl=_standin_norm_impl, norm_chooser=lambda w: called.append(w))
        hows = {z.region.rule: z.how for z in out}
        assert hows == {"layernorm": "registry", "add-layernorm": "skipped", "rmsnorm": "skipped"}
        ln = next(z for z in out if z.region.rule == "layernorm")
        assert ln.impl.kind == "eager" and "eager is the fastest" in ln.impl.note and not called
        assert all("budget was spent" in " ".join(z.notes) for z in out if z.how == "skipped")


def test_norm_impl_is_eager_when_eager_wins_or_nothing_verified():
    w = NormWorkload("layernorm", 16, 64)
    assert norm_family.impl_of(w, None).kind == "eager" and "no norm candidate verified" in norm_family.impl_of(w, None).note
    e = norm_family.impl_of(w, norm_tune.NormTrial("eager", "ok", 0.01, 1e-7))
    assert e.kind == "eager" and "0.010 ms" in e.note


def test_discovery_asks_the_registry_about_norm_regions_and_shows_the_measured_time():
    from fact_db.realization.realize import ask_registry
    from fact_db.store.registry import Registry
    rep = _analyse(_Norms(), torch.randn(2, 8, 64), torch.randn(2, 8, 64))
    r_ln = next(r for r in rep.regions if r.rule == "layernorm")
    with Registry.open("memory") as reg:
        norm_tune.record(norm_family.workload(r_ln, rep.graph, "fp32")[0], [norm_tune.NormTrial("t32v4r1", "ok", 0.004, 1e-7,
                    candidate=NormCandidate(32, 4, 1))], reg, gpu=rep.gpu)
        counts = ask_registry(rep, reg)
    assert counts == {"hit": 1, "miss": 2}
    assert r_ln.registry == "hit" and r_ln.measured_s == pytest.approx(4e-6)
    assert all(r.registry == "miss" and r.measured_s is None for r in rep.regions if r is not r_ln)


# ---------------------------------------------------------------------------------------
# LayerNorm over several trailing dims, RMSNorm written with a division, weightless norms.

class _ManyNorms(torch.nn.Module):
    """LayerNorm over (C, H, W) as KernelBench L1-40 writes it, weightless nn.RMSNorm, the
    division form over the last dim with a weight, and L1-36's form over the channels."""

    def __init__(self, c=4, h=8, w=8):
        super().__init__()
        self.ln = torch.nn.LayerNorm((c, h, w))
        torch.nn.init.uniform_(self.ln.weight, 0.5, 1.5)
        torch.nn.init.uniform_(self.ln.bias)
        self.rms = torch.nn.RMSNorm(w, eps=1e-6, elementwise_affine=False)
        self.g = torch.nn.Parameter(torch.rand(w) + 0.5)

    def forward(self, x):
        a = self.ln(x)
        b = self.rms(x)
        c = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.g
        d = x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)
        return a, b, c, d


def test_norm_family_takes_norms_over_trailing_dims_and_says_why_it_leaves_a_channel_norm_eager():
    rep = _analyse(_ManyNorms(), torch.randn(2, 4, 8, 8))
    ln, rms, divided, channels = rep.regions
    assert (ln.rule, ln.attrs["normalized"]) == ("layernorm", 3)
    assert norm_family.workload(ln, rep.graph, "fp32") == (NormWorkload("layernorm", 2, 256), "")
    assert (rms.form, "weight" in rms.operands) == ("op-weightless", False)
    assert norm_family.workload(rms, rep.graph, "fp32") == (
        NormWorkload("rmsnorm", 64, 8, eps=1e-6, has_bias=False), "")
    assert (divided.form, divided.operands.get("weight"), divided.attrs["dim"]) == ("divided", "p_g", -1)
    assert norm_family.workload(divided, rep.graph, "fp32") == (NormWorkload("rmsnorm", 64, 8, has_bias=False), "")
    assert (channels.form, channels.attrs["dim"]) == ("divided-weightless", -3)
    w, why = norm_family.workload(channels, rep.graph, "fp32")
    assert w is None and why == ("a norm over dim 1 of [2, 4, 8, 8], not the last: the add_norm kernel normalizes "
                                 "contiguous rows, so eager runs it")


def test_a_layernorm_row_longer_than_the_kernel_holds_stays_eager_with_the_reason():
    """KernelBench L1-40's rows are 64 x 256 x 256 = 4M elements; the add_norm kernel keeps a row in registers."""
    model = torch.nn.LayerNorm((64, 32, 32)).to("meta")
    rep = _analyse(model, torch.randn(2, 64, 32, 32, device="meta"))
    [r] = rep.regions
    w, why = norm_family.workload(r, rep.graph, "fp32")
    assert w is None and why == ("rows of 65536 elements: the add_norm kernel holds a row in registers, at most "
                                 f"{norm_tune.MAX_ROW_VALUES} float32 values, so eager runs it")
    assert norm_tune.MAX_ROW_VALUES == 32768
    assert norm_tune.candidates(NormWorkload("layernorm", 2, 32768)) and not norm_tune.candidates(
        NormWorkload("layernorm", 2, 32768 + 4))


def test_norms_over_trailing_dims_and_weightless_norms_compose_and_equal_eager():
    import standins
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.impl import Impl
    torch.manual_seed(0)
    model, x = _ManyNorms().eval(), torch.randn(2, 4, 8, 8)
    rep = _analyse(model, x)
    impls = {}
    for i, r in enumerate(rep.regions):
        w, _ = norm_family.workload(r, rep.graph, "fp32")
        if w is not None:
            impls[i] = Impl("norm", "stand-in", standins.norm_op(w.kind, w.eps), {})
    assert sorted(impls) == [0, 1, 2]  # the channel norm stays eager
    gm, notes = rewrite(rep.graph.program, rep.regions, impls)
    assert notes == []
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.layer_norm.default" not in targets and "aten.rms_norm.default" not in targets
    assert targets.count("aten.sqrt.default") == 1  # only the channel norm's
    before = standins.CALLS.copy()
    fresh = torch.randn_like(x)
    for got, want in zip(gm(fresh), model(fresh)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 3
    gm.graph.lint()


class _LlamaCasts(torch.nn.Module):
    """HF Llama's RMSNorm: upcast to float32, the norm, the cast back to the input's dtype, the
    weight; then a projection and the residual."""

    def __init__(self, width=64):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.lin = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        dt = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + self.lin(self.w * h.to(dt))


def test_an_upcast_norm_in_a_bf16_trace_runs_its_kernel_in_float32():
    """optimize traces the model as the policy runs it (cast to bf16): HF Llama's RMSNorm then
    normalizes a float32 upcast, and its kernel must take float32 (one built for bf16 was
    handed float32 and refused it: the 4 x 2048 decoder's composed module failed verification).
    Traced as written (float32, `factdb discover`), the same norm runs in the policy's dtype."""
    import standins
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.impl import Impl
    torch.manual_seed(0)
    model, x = _LlamaCasts().eval(), torch.randn(2, 8, 64)

    def norm_workloads(rep):
        return {i: w for i, r in enumerate(rep.regions) if (w := (norm_family.workload(r, rep.graph, "bf16")
                                                                  or (None,))[0]) is not None}
    assert [w.dtype for w in norm_workloads(_analyse(model, x)).values()] == ["bfloat16"]
    half, xb = model.bfloat16(), x.bfloat16()
    rep = _analyse(half, xb)
    found = norm_workloads(rep)
    assert [w.dtype for w in found.values()] == ["float32"]
    # and realize's operand check passes it: its operand is float32, as its kernel takes
    from fact_db.realization.realize import plan, workload_of
    for i in found:
        assert workload_of(rep.regions[i], plan(rep, "bf16")[i], rep.graph, "bf16")[0] == found[i]
    impls = {i: Impl("norm", "stand-in", standins.norm_op(w.kind, w.eps), {}) for i, w in found.items()}
    gm, notes = rewrite(rep.graph.program, rep.regions, impls)
    assert notes == []
    before = standins.CALLS.copy()
    got = gm(xb)
    assert sum((standins.CALLS - before).values()) == 1  # the weightless norm, on float32 ones
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, half(xb), rtol=2e-2, atol=2e-2)


def test_norm_candidates_count_eager_among_max_candidates_in_the_batch_build(monkeypatch):
    """--max-candidates 4 builds three norm kernels a workload (eager is the fourth), not twelve:
    KernelBench L3-28's ViT compiled twelve for its LayerNorms' one workload."""
    from fact_db.kernels import build
    from fact_db.kernels.family import Context
    w = NormWorkload("layernorm", 394, 512, residual=True, eps=1e-5)
    built = []
    monkeypatch.setattr(build, "build", lambda sources, **kw: built.extend(sources) or [])
    norm_family.prebuild([w, w], Context(max_candidates=4))
    assert len(built) == 3 and len({s.code for s in built}) == 3
    built.clear()
    norm_family.prebuild([w], Context(max_candidates=40))
    assert len(built) == norm_tune.MAX_CANDIDATES == len(norm_tune.candidates(w))
    assert norm_family.limit(Context(max_candidates=1)) == 1


def test_realize_says_a_line_per_region_with_its_candidates_and_its_time(capsys):
    from fact_db.realization.realize import realize_regions
    rep = _analyse(_Norms(), torch.randn(2, 8, 64), torch.randn(2, 8, 64))
    realize_regions(rep, "fp32", gpu="h100", progress=True, norm_impl=_standin_norm_impl,
                    norm_chooser=_norm_trials, budget_s=600.0)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[realize]")]
    assert lines[0].startswith("[realize] 3 region(s), 3 workload(s) to realize, up to 24 candidates each")
    done = [ln for ln in lines if ": tuned, 2 candidates, 0.02 ms against eager 0.05 ms" in ln]
    assert len(done) == 3 and all(re.search(r"\[\d/3\] region \d \S+ .*; \d+\.\d s \(\d+ s, \d+ s of the budget "
                                            r"left\)$", ln) for ln in done), lines
    assert sum(": realizing ..." in ln for ln in lines) == 3
    capsys.readouterr()
    realize_regions(rep, "fp32", gpu="h100", progress=False, norm_impl=_standin_norm_impl, norm_chooser=_norm_trials)
    assert "[realize]" not in capsys.readouterr().err
