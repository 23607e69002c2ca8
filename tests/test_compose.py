"""Composition on the CPU: the graph rewrite with stand-in kernel ops, the composed module's
guards and policies, verification, the artifact, and `factdb optimize`'s plan without a GPU.

Stand-in ops (tests/standins.py) have the kernels' exact signatures and semantics and count
their calls, so these tests check both that a composed model computes the model's function
and that the kernels really ran in it.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import standins
from fact_db.composition.compose import ComposeError, rewrite
from fact_db.composition.module import ComposedModule, run_at_policy, signature
from fact_db.kernels.impl import Impl
from fact_db.realization.realize import Realized, plan, realize_regions

ROOT = Path(__file__).resolve().parent.parent


def _mingpt(n_embd=64, n_head=4, max_seqlen=32):
    spec = importlib.util.spec_from_file_location("mingpt_small", ROOT / "benchmarks" / "problems" / "mingpt_block.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    return mod.Model(n_embd, n_head, 0.0, 0.0, max_seqlen).eval()


@pytest.fixture(scope="module")
def block():
    model = _mingpt()
    x = torch.rand(2, 16, 64)
    import fact_db
    return model, x, fact_db.discover(model, (x,))


def standin_impls(disc, policy="fp32", broken: str | None = None, lo: bool = False) -> dict:
    """A stand-in Impl for every GEMM and attention region (`broken`: an epilogue whose op
    ignores its bias; `lo`: GEMM ops that take B's lo parts, as presplit kernels do)."""
    impls = {}
    for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy))):
        if p.workload is not None:
            e = p.workload.epilogue
            op = standins.gemm_op("none" if e == broken else e)
            impls[i] = Impl("gemm", f"stand-in {e}", op, {"spec": {"epilogue": e, "dtype": p.workload.dtype},
                                                          "standin": "none" if e == broken else e, "lo": lo})
            if lo:
                impls[i].op_lo, impls[i].split_lo = standins.gemm_lo_op(impls[i].record["standin"]), standins.split_lo
        elif r.template.startswith("fmha"):
            impls[i] = Impl("attention", "stand-in attention", standins.attention_op(), {"standin": "attention"})
    return impls


def standin_realizer(broken=None, lo=False):
    def realize(disc, policy):
        impls = standin_impls(disc, policy, broken, lo)
        return [Realized(i, r, p.workload, impls.get(i, Impl.eager("not realized in this test")),
                         "tuned" if i in impls else "eager", eager_ms=1.0 if i in impls else None,
                         ms=0.5 if i in impls else None)
                for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy)))]
    return realize


def standin_loader(rec):
    if "standin" not in rec:
        return None
    op = standins.attention_op() if rec["standin"] == "attention" else standins.gemm_op(rec["standin"])
    if rec.get("lo"):
        return Impl(rec["kind"], rec.get("label", ""), op, rec, op_lo=standins.gemm_lo_op(rec["standin"]),
                    split_lo=standins.split_lo)
    return Impl(rec["kind"], rec.get("label", ""), op, rec)


# ------------------------------------------------------------------------------------------
# The rewrite.

def test_rewrite_replaces_every_region_and_computes_the_model(block):
    model, x, disc = block
    impls = standin_impls(disc)
    assert len(impls) == 5  # qkv, attention, attention projection + residual, MLP up + GELU, MLP down + residual
    gm, notes = rewrite(disc.graph.program, disc.regions, impls)
    assert notes == []
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    # The regions' own ops are gone: no explicit attention, no linear, no hand-written GELU, no dropout.
    for gone in ("aten.softmax", "aten.masked_fill", "aten.linear", "aten.tanh", "aten.dropout", "aten.pow"):
        assert not any(t.startswith(gone) for t in targets), (gone, targets)
    assert sum(t.startswith("factdb_test.") for t in targets) == 5
    assert any(t.startswith("aten.layer_norm") for t in targets)  # not realized: left as it was
    before = standins.CALLS.copy()
    y = gm(x)
    assert torch.allclose(y, model(x), atol=1e-5, rtol=1e-5)
    assert sum((standins.CALLS - before).values()) == 5
    gm.graph.lint()


def test_a_kernel_that_takes_b_lo_parts_gets_a_weights_split_once_and_an_activations_not():
    """B a weight: split into a buffer by the rewrite, the op_lo called; B an activation (x @ y):
    the plain op, which splits it per call."""
    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 48)

        def forward(self, x, y):
            return self.proj(x) @ y

    torch.manual_seed(0)
    model, xs = TwoInputs().eval(), (torch.randn(8, 32), torch.randn(48, 16))
    disc = __import__("fact_db").discover(model, xs)
    impls = {}
    for i, p in enumerate(plan(disc, "fp32")):
        e = p.workload.epilogue
        impls[i] = Impl("gemm", "stand-in", standins.gemm_op(e), {"spec": {"epilogue": e}},
                        op_lo=standins.gemm_lo_op(e), split_lo=standins.split_lo)
    assert len(impls) == 2
    gm, notes = rewrite(disc.graph.program, disc.regions, impls)
    assert notes == []
    before = standins.CALLS.copy()
    torch.testing.assert_close(gm(*xs), model(*xs), rtol=1e-5, atol=1e-5)
    calls = standins.CALLS - before
    assert sum(v for k, v in calls.items() if k.startswith("gemm_lo_")) == 1
    [(name, lo)] = [(n, b) for n, b in gm.named_buffers() if n.startswith("_factdb_b_lo_")]
    assert lo.shape == model.proj.weight.shape and torch.equal(lo, standins.split_lo(model.proj.weight.t()).t())
    fast = ComposedModule(gm, model, policy="fp32", optimized_for=signature(xs))
    assert fast.held_mib() == pytest.approx(48 * 32 * 4 / 2**20)  # the lo parts: held, counted


def test_the_composed_graph_drops_the_exported_programs_per_call_input_checks(block):
    """The unlifted program checks each call's inputs (a pre-hook on the pytree structure and a
    `_guards_fn` call on shapes), half a small model's host time per call; ComposedModule
    guards the exact signature itself, so the rewrite drops them, and still computes the model."""
    model, x, disc = block
    plain = disc.graph.program.module()
    hook_names = lambda m: [getattr(h, "__name__", "") for h in m._forward_pre_hooks.values()]  # noqa: E731
    # what the rewrite starts from (torch 2.13; older versions may lack the `_guards_fn` call)
    assert "_check_input_constraints_pre_hook" in hook_names(plain)
    gm, _ = rewrite(disc.graph.program, disc.regions, {})
    assert "_check_input_constraints_pre_hook" not in hook_names(gm)
    assert not any(n.op == "call_module" and n.target == "_guards_fn" for n in gm.graph.nodes)
    assert torch.equal(gm(x), plain(x))
    fast = ComposedModule(gm, model, policy="fp32", optimized_for=signature((x,)))
    with warnings.catch_warnings(record=True) as seen:  # another shape: the module's own guard, eager
        warnings.simplefilter("always")
        x2 = torch.rand(1, 8, 64)
        assert torch.allclose(fast(x2), model(x2)) and "optimized for inputs" in str(seen[0].message)


def test_rewrite_keeps_a_region_eager_when_its_op_cannot_take_it(block):
    model, x, disc = block
    impls = standin_impls(disc)
    i = next(i for i, r in enumerate(disc.regions) if r.rule == "attention-causal")
    disc.regions[i].composable = "a reason discovery gave"
    try:
        gm, notes = rewrite(disc.graph.program, disc.regions, impls)
    finally:
        disc.regions[i].composable = ""
    assert any("attention-causal: stays eager (a reason discovery gave)" in n for n in notes)
    assert any(str(n.target).startswith("aten.softmax") for n in gm.graph.nodes)
    assert torch.allclose(gm(x), model(x), atol=1e-5, rtol=1e-5)


def test_rewrite_refuses_a_missing_program(block):
    _, _, disc = block
    with pytest.raises(ComposeError, match="no exported program"):
        rewrite(None, disc.regions, {})


def test_sdpa_replaces_explicit_attention(block):
    model, x, disc = block
    i = next(i for i, r in enumerate(disc.regions) if r.rule == "attention-causal")
    gm, _ = rewrite(disc.graph.program, disc.regions, {i: Impl("sdpa", "sdpa")})
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.scaled_dot_product_attention.default" in targets
    assert not any(t.startswith("aten.masked_fill") for t in targets)
    assert torch.allclose(gm(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_residual_region_without_bias_gets_a_zero_bias():
    class Proj(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.o = torch.nn.Linear(32, 32, bias=False)

        def forward(self, x, h):
            return h + self.o(x)
    import fact_db
    m, x, h = Proj().eval(), torch.randn(4, 8, 32), torch.randn(4, 8, 32)
    disc = fact_db.discover(m, (x, h))
    [r] = [r for r in disc.regions if r.rule == "gemm-residual"]
    assert "bias" not in r.operands and r.operands["c"] == "h"
    op = standins.gemm_op("residual")
    gm, _ = rewrite(disc.graph.program, disc.regions, {disc.regions.index(r): Impl(
        "gemm", "stand-in", op, {"spec": {"epilogue": "residual"}})})
    assert torch.allclose(gm(x, h), m(x, h), atol=1e-5)
    assert any(n.op == "get_attr" and "zero_bias" in str(n.target) for n in gm.graph.nodes)


# ------------------------------------------------------------------------------------------
# The composed module.

def _composed(block, policy="fp32", variants=None):
    model, x, disc = block
    gm, _ = rewrite(disc.graph.program, disc.regions, standin_impls(disc))
    return ComposedModule(gm, model, policy=policy, optimized_for=signature((x,)), variants=variants)


def test_other_shapes_run_eager_with_one_warning(block):
    model, x, _ = block
    fast = _composed(block)
    x2 = torch.rand(3, 20, 64)
    before = standins.CALLS.copy()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y1, y2 = fast(x2), fast(x2)
    assert torch.equal(y1, model(x2)) and torch.equal(y2, y1)
    assert len(seen) == 1 and "3x20x64 float32" in str(seen[0].message) and "eager" in str(seen[0].message)
    assert standins.CALLS == before  # no kernel ran on a shape it was not made for
    # Another dtype: the fallback is what eager does with it, here the same error.
    with pytest.raises(RuntimeError) as eager_err:
        model(x.double())
    with warnings.catch_warnings(record=True) as seen, pytest.raises(RuntimeError) as err:
        warnings.simplefilter("always")
        fast(x.double())
    assert str(err.value) == str(eager_err.value)
    assert len(seen) == 1 and "float64" in str(seen[0].message)


def test_the_quick_guard_picks_what_the_full_signature_picks(block):
    """A call of positional tensors is matched against the guarded signatures without building
    its own; the target must be the one the full signature check gives, for any call."""
    model, x, _ = block
    quick, full = _composed(block), _composed(block)
    full._quick = []
    assert quick._quick and quick._quick[0][1] == signature((x,))
    calls = [(x,), (x.clone(),), (x.double(),), (torch.rand(3, 20, 64),), (x[:, :, :32],), (x, 1), (x.half(),)]

    def role(m, args, kwargs=None):
        t = m._target(args, kwargs or {})
        return "composed" if t is m.gm else "eager" if t is m.fallback else "other"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [role(quick, a) for a in calls] == [role(full, a) for a in calls] == \
            ["composed", "composed", "eager", "eager", "eager", "eager", "eager"]
        assert role(quick, (), {"x": x}) == "eager"  # keywords take the full check


def test_where_eager_is_chosen_every_call_runs_the_model_unguarded(block, monkeypatch):
    """The choice returned eager: the model as it is runs any signature, so no call pays the
    guard (a 0.12 ms LayerNorm timed from an idle GPU measured its microseconds) and no other
    shape warns; a call in autograd mode still runs without a graph."""
    model, x, _ = block
    fast = _composed(block)
    fast.use("eager")
    monkeypatch.setattr(fast, "_target", lambda *a: pytest.fail("the guard ran"))
    before = standins.CALLS.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for xs in (x, torch.rand(1, 8, 64)):
            y = fast(xs)
            assert torch.equal(y, model(xs)) and not y.requires_grad
    assert standins.CALLS == before


def test_a_variant_serves_other_shapes_when_one_can_be_built(block):
    model, x, _ = block
    made = []

    def variants(sig, args, kwargs):
        made.append(sig)
        return (lambda *a: model(*a) * 1.0), "a variant for these shapes"
    fast = _composed(block, variants=variants)
    x2 = torch.rand(1, 8, 64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert torch.allclose(fast(x2), model(x2))
        fast(x2)
    assert len(made) == 1 and "a variant for these shapes" in str(seen[0].message)


def test_a_variant_that_fails_to_build_falls_back_to_eager(block):
    model, _, _ = block

    def variants(sig, args, kwargs):
        raise RuntimeError("no such kernel")
    fast = _composed(block, variants=variants)
    x2 = torch.rand(1, 8, 64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert torch.equal(fast(x2), model(x2))
    assert "building a variant failed: RuntimeError: no such kernel" in str(seen[0].message)


@pytest.mark.slow
def test_composed_module_under_torch_compile_fullgraph(block):
    model, x, _ = block
    fast = _composed(block)
    compiled = torch.compile(fast, fullgraph=True)
    before = standins.CALLS.copy()
    assert torch.allclose(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert sum((standins.CALLS - before).values()) == 5


def test_half_policies_run_the_model_in_that_dtype():
    model = _mingpt()
    x = torch.rand(2, 16, 64)
    half = _mingpt().to(torch.bfloat16)
    y = run_at_policy(half, "bf16", (x,))
    assert y.dtype == torch.float32
    assert torch.equal(y, half(x.to(torch.bfloat16)).float())
    assert not torch.equal(y, model(x))


def test_run_at_policy_on_plain_tensors_skips_the_pytree_walk_and_casts_as_it_does(monkeypatch):
    """The common call (positional tensors) takes a path without pytree flattening: the wrapper
    runs before the first launch of every call timed from an idle GPU. It casts as the general
    path does: floating inputs to the policy's dtype, integer ones untouched, the output back
    to the first floating input's dtype; keyword arguments still take the general path."""
    import torch.utils._pytree as pytree
    seen = []

    def fn(a, idx, **kw):
        seen.append((a.dtype, idx.dtype))
        return {"y": a * 2, "i": idx}
    x, idx = torch.rand(3, 4), torch.arange(3)
    general = run_at_policy(fn, "bf16", (x, idx), {"k": None})  # keywords: the pytree path
    walked = []
    real = pytree.tree_flatten
    monkeypatch.setattr(pytree, "tree_flatten", lambda *a, **k: walked.append(1) or real(*a, **k))
    for args, back in (((x, idx), torch.float32), ((x.to(torch.bfloat16), idx), torch.bfloat16)):
        seen.clear(), walked.clear()
        out = run_at_policy(fn, "bf16", args)
        assert seen == [(torch.bfloat16, torch.int64)]
        assert out["y"].dtype == back and out["i"].dtype == torch.int64
        assert torch.equal(out["y"].float(), general["y"])
        # inputs already at the policy's dtype, the output too: nothing walks a pytree
        # (an fp32 caller's output is cast back, through the pytree of the output alone)
        assert bool(walked) == (back != torch.bfloat16)


@pytest.mark.parametrize("policy, inside", [("fp32", (False, False)), ("tf32x3", (False, False)),
                                            ("tf32", (True, True))])
@pytest.mark.parametrize("before", [(False, True), (True, False), (False, False)])
def test_float32_policies_set_torchs_tf32_flags_for_the_call_and_restore_them(policy, inside, before):
    """A float32 policy runs the model with TF32 off (fp32, tf32x3) or on (tf32) for what stays
    in PyTorch, whatever the caller had (PyTorch's default: cuDNN on, cuBLAS off), and restores
    the caller's flags after, also when the call raises. The flags are set through torch._C (a
    tenth of the context manager's host time a call); what torch.backends reads is what ran."""
    mm, dnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = mm.allow_tf32, dnn.allow_tf32
    seen = []

    def fn(x, fail=False):
        seen.append((mm.allow_tf32, dnn.allow_tf32))
        if fail:
            raise ValueError("boom")
        return x + 1
    try:
        mm.allow_tf32, dnn.allow_tf32 = before
        assert torch.equal(run_at_policy(fn, policy, (torch.zeros(2),)), torch.ones(2))
        with pytest.raises(ValueError, match="boom"):
            run_at_policy(fn, policy, (torch.zeros(2),), {"fail": True})
        assert seen == [inside, inside] and (mm.allow_tf32, dnn.allow_tf32) == before
    finally:
        mm.allow_tf32, dnn.allow_tf32 = saved


# ------------------------------------------------------------------------------------------
# optimize end to end on the CPU (realization and timing injected), the artifact.

def _optimize(tmp_path, **kw):
    from fact_db.pipeline import optimize
    model = _mingpt()
    x = torch.rand(2, 16, 64)
    fast = optimize(model, (x,), policy=kw.pop("policy", "fp32"), realizer=kw.pop("realizer", standin_realizer()),
                    timer=standins.composed_faster, peers=(), out=tmp_path / "art", progress=False, **kw)
    return model, x, fast


@pytest.mark.slow
def test_fact_db_optimize_is_the_function_on_every_read_and_call(tmp_path):
    """`fact_db.optimize` was the function on its first read and the module of that name after
    it, so the README's own call failed the second time. Now every read is the function, and
    two calls in a row both return a composed module."""
    import fact_db
    first, second = fact_db.optimize, fact_db.optimize
    assert first is second and callable(first) and first.__module__ == "fact_db.pipeline.run"
    model = _mingpt()
    x = torch.rand(2, 16, 64)
    for run in (1, 2):
        fast = fact_db.optimize(model, (x,), policy="fp32", realizer=standin_realizer(), timer=standins.composed_faster,
                                peers=(), out=tmp_path / f"art{run}", progress=False)
        assert torch.allclose(fast(x), model(x), atol=1e-5) and fast.report.verification.ok
    assert callable(fact_db.optimize) and callable(fact_db.discover) and callable(fact_db.plan)


@pytest.mark.slow
def test_optimize_end_to_end_with_stand_ins(tmp_path):
    model, x, fast = _optimize(tmp_path)
    r = fast.report
    assert r.verification.ok and len(r.verification.trials) >= 5
    assert {t.dist for t in r.verification.trials} == {"like", "randn"}
    assert [v.name for v in r.variants] == ["eager fp32", "fact-db"]
    before = standins.CALLS.copy()
    assert torch.allclose(fast(x), model(x), atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 5
    art = Path(fast.artifact)
    for f in ("manifest.json", "program.pt2", "fallback.pt2", "report.json", "report.md", "report.png"):
        assert (art / f).is_file(), f
    d = json.loads((art / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    assert d["verification"]["ok"] and len(d["regions"]) == 7
    assert {s["rule"] for s in d["skipped"]} == {"layernorm"}
    md = (art / "report.md").read_text()
    assert "| fact-db |" in md and "Left to eager PyTorch" in md


@pytest.mark.slow
@pytest.mark.parametrize("split", [True, False])
def test_weights_split_once_or_per_call_as_asked_and_as_the_artifact_records(tmp_path, split):
    from fact_db.composition.artifact import load
    model, x, fast = _optimize(tmp_path, realizer=standin_realizer(lo=True), split_weights=split)
    assert fast.report.verification.ok
    def los(m):
        return [b for n, b in m.gm.named_buffers() if n.startswith("_factdb_b_lo_")]
    assert len(los(fast)) == (4 if split else 0) and fast.held_mib() == sum(b.numel() * 4 for b in los(fast)) / 2**20
    assert json.loads((Path(fast.artifact) / "manifest.json").read_text())["split_weights"] is split
    again = load(fast.artifact, loader=standin_loader)
    assert len(los(again)) == len(los(fast))
    before = standins.CALLS.copy()
    assert torch.allclose(again(x), model(x), atol=1e-5)
    assert sum(v for k, v in (standins.CALLS - before).items() if k.startswith("gemm_lo_")) == (4 if split else 0)


@pytest.mark.slow
def test_optimize_returns_eager_when_verification_fails(tmp_path):
    """The one region on a kernel breaks the model: nothing smaller to compose, eager returned."""
    full = standin_realizer(broken="bias")

    def only_the_broken_one(disc, policy):
        out = full(disc, policy)
        for z in out:
            if z.impl.kind != "eager" and z.impl.record.get("standin") != "none":
                z.impl, z.how, z.eager_ms, z.ms = Impl.eager("not realized in this test"), "eager", None, None
        return out
    model, x, fast = _optimize(tmp_path, realizer=only_the_broken_one)
    v = fast.report.verification
    assert not v.ok and "bound" in v.reason
    assert any("verification failed" in n and "not returned" in n for n in fast.report.notes)
    before = standins.CALLS.copy()
    assert torch.equal(fast(x), model(x))  # the returned module is eager: right, if not faster
    assert standins.CALLS == before


@pytest.mark.slow
def test_optimize_leaves_the_region_that_breaks_verification_eager(tmp_path):
    """One of five regions' kernels (the QKV projection's, ignoring its bias) breaks the model:
    the composition is narrowed to the four that verify, and the report says which was left."""
    model, x, fast = _optimize(tmp_path, realizer=standin_realizer(broken="bias"))
    v = fast.report.verification
    assert v.ok, v.reason
    assert any("left as the model wrote it" in n and "4 region(s) on kernels" in n for n in fast.report.notes)
    left = [z for z in fast.report.regions if any("left eager" in n for n in z.notes)]
    assert len(left) == 1 and left[0].impl.kind == "eager"
    before = standins.CALLS.copy()
    assert torch.allclose(fast(x), model(x), atol=1e-5, rtol=1e-5)
    called = standins.CALLS - before
    assert called["gemm_none"] == 0 and sum(called.values()) == 4
    # the artifact records the narrowed module: loaded, the left-out region stays eager
    from fact_db.composition.artifact import load
    again = load(fast.artifact, loader=standin_loader)
    before = standins.CALLS.copy()
    assert torch.allclose(again(x), model(x), atol=1e-5, rtol=1e-5)
    called = standins.CALLS - before
    assert called["gemm_none"] == 0 and sum(called.values()) == 4


@pytest.mark.slow
def test_artifact_round_trip_tunes_nothing(tmp_path):
    from fact_db.composition.artifact import load
    model, x, fast = _optimize(tmp_path)
    again = load(fast.artifact, loader=standin_loader)
    before = standins.CALLS.copy()
    assert torch.allclose(again(x), model(x), atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 5
    assert sum("loaded" in n for n in again.load_notes) == 5
    x2 = torch.rand(3, 24, 64)  # another shape: the dynamic-shape eager fallback saved beside the program
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert torch.allclose(again(x2), model(x2), atol=1e-5)


@pytest.mark.slow
def test_artifact_kernels_run_eager_without_an_sm90_gpu(tmp_path):
    from fact_db.composition.artifact import load
    model, x, fast = _optimize(tmp_path)
    mf = Path(fast.artifact) / "manifest.json"
    m = json.loads(mf.read_text())
    for r in m["regions"]:  # pretend the GEMMs are CUTLASS kernels built on an H100
        if r["impl"].get("standin") not in (None, "attention"):
            r["impl"] = {"kind": "gemm", "label": "split3 ...", "template": "gemm_fp32tc_sm90",
                         "spec": {"dtype": "float32", "layout_a": "row", "layout_b": "col", "epilogue": "bias"},
                         "options": [0, 1, 1, 0], "build_key": "0" * 24, "so": "kernels/x/kernel.so",
                         "so_sha256": "0", "source": "kernels/x/kernel.cu", "source_sha256": "0"}
    mf.write_text(json.dumps(m))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = load(fast.artifact, loader=standin_loader)
    assert sum("eager: no sm90 GPU here" in n for n in again.load_notes) == 4
    assert any("run eager" in str(w.message) for w in seen)
    assert torch.allclose(again(x), model(x), atol=1e-5)


def _norm_realizer(kernel_files: Path | None = None):
    """The stand-in realizer with the LayerNorm regions realized too, as realize does
    (fact_db.kernels.norm.family.workload); `kernel_files`: a directory whose kernel.so / kernel.cu
    the norm regions claim as their built library, so the artifact saves them."""
    from fact_db.kernels.norm.family import workload as norm_workload

    def realize(disc, policy):
        out = standin_realizer()(disc, policy)
        for z in out:
            if z.region.rule != "layernorm":
                continue
            w, _ = norm_workload(z.region, disc.graph, policy)
            rec = {"standin": f"norm:{w.kind}:{w.eps!r}", "workload": w.as_dict(), "template": "add_norm",
                   "build_key": "b" * 24}
            if kernel_files is not None:
                rec["so"] = str(kernel_files / "kernel.so")
            z.workload, z.how, z.eager_ms, z.ms = w, "tuned", 1.0, 0.5
            z.impl = Impl("norm", "stand-in add_norm", standins.norm_op(w.kind, w.eps), rec)
        return out
    return realize


def _norm_loader(rec):
    if str(rec.get("standin", "")).startswith("norm:"):
        _, kind, eps = rec["standin"].split(":")
        return Impl("norm", rec.get("label", ""), standins.norm_op(kind, float(eps)), rec)
    return standin_loader(rec)


def test_a_residual_gemm_reading_an_add_norm_regions_sum_composes():
    """A pre-norm block whose residual add is no GEMM's epilogue (Swin's `shortcut + x`): the
    add-layernorm region erases the add and its sum comes from the fused op; a residual GEMM
    rewritten after it reads that sum (KernelBench L3-29 ended in `Argument 'add' ... used
    before it has been defined` on the GPU)."""
    from fact_db.kernels.norm.family import workload as norm_workload

    class PreNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc = torch.nn.LayerNorm(64), torch.nn.Linear(64, 64)

        def forward(self, x):
            h = x + torch.tanh(x)
            return h + self.fc(self.ln(h))

    def realize(disc, policy):
        out = standin_realizer()(disc, policy)
        for z in out:
            if z.region.rule == "add-layernorm":
                w, _ = norm_workload(z.region, disc.graph, policy)
                z.workload, z.how, z.eager_ms, z.ms = w, "tuned", 1.0, 0.5
                z.impl = Impl("norm", "stand-in add_norm", standins.norm_op(w.kind, w.eps), {"standin": "norm"})
        return out
    from fact_db.pipeline.run import optimize
    torch.manual_seed(0)
    model, x = PreNorm(), torch.randn(4, 16, 64)
    fast = optimize(model, (x,), realizer=realize, timer=standins.composed_faster, peers=(), progress=False, save=False)
    rep = fast.report
    assert not rep.fallback, rep.notes
    assert sorted(z.region.rule for z in rep.regions if z.impl.kind != "eager") == ["add-layernorm", "gemm-residual"]
    targets = [str(n.target) for n in fast.gm.graph.nodes if n.op == "call_function"]
    assert not any(t.startswith(("aten.layer_norm", "aten.linear", "aten.addmm")) for t in targets), targets
    assert rep.verification.ok and torch.allclose(fast(x), model(x), atol=1e-5)


@pytest.mark.slow
def test_norm_regions_compose_save_and_load(tmp_path):
    from fact_db.composition.artifact import load
    files = tmp_path / "build"
    files.mkdir()
    (files / "kernel.so").write_bytes(b"not a real library")
    (files / "kernel.cu").write_text("// add_norm source\n")
    model, x, fast = _optimize(tmp_path, realizer=_norm_realizer(files))
    assert fast.report.verification.ok
    before = standins.CALLS.copy()
    assert torch.allclose(fast(x), model(x), atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 7  # five GEMM/attention regions and both LayerNorms
    art = Path(fast.artifact)
    m = json.loads((art / "manifest.json").read_text())
    norms = [r["impl"] for r in m["regions"] if r["impl"]["kind"] == "norm"]
    assert len(norms) == 2 and all(n["so"] == f"kernels/{'b' * 24}/kernel.so" for n in norms)
    assert (art / "kernels" / ("b" * 24) / "kernel.cu").read_text() == "// add_norm source\n"
    assert norms[0]["workload"]["width"] == 64 and norms[0]["workload"]["rows"] == 32
    again = load(art, loader=_norm_loader)
    before = standins.CALLS.copy()
    assert torch.allclose(again(x), model(x), atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 7
    # Without the stand-in loader they are add_norm kernels built on another machine: no sm90 GPU here, eager.
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        eager_norms = load(art, loader=lambda rec: None if rec["kind"] == "norm" else _norm_loader(rec))
    assert sum("layernorm: eager: no sm90 GPU here" in n for n in eager_norms.load_notes) == 2
    assert torch.allclose(eager_norms(x), model(x), atol=1e-5)


@pytest.mark.slow
def test_artifact_refuses_edits_and_foreign_directories(tmp_path):
    from fact_db.composition.artifact import ArtifactError, load
    _, _, fast = _optimize(tmp_path)
    art = Path(fast.artifact)
    with open(art / "program.pt2", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match=r"program.pt2.*changed after it was saved"):
        load(art)
    (art / "program.pt2").unlink()
    with pytest.raises(ArtifactError, match="is missing"):
        load(art)
    with pytest.raises(ArtifactError, match="no manifest.json"):
        load(tmp_path)
    m = json.loads((art / "manifest.json").read_text())
    m["format"] = 99
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="format 99"):
        load(art)


@pytest.mark.slow
def test_a_failed_save_leaves_the_previous_artifact(tmp_path, monkeypatch):
    from fact_db.composition import artifact
    _, _, fast = _optimize(tmp_path)
    art = Path(fast.artifact)
    before = sorted(p.name for p in art.iterdir())
    mtime = (art / "manifest.json").stat().st_mtime_ns

    def fail(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(artifact, "write_all", fail)
    with pytest.raises(OSError, match="disk full"):
        _optimize(tmp_path)
    assert sorted(p.name for p in art.iterdir()) == before
    assert (art / "manifest.json").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".art.")]


def test_save_refuses_a_directory_that_is_not_an_artifact(tmp_path):
    from fact_db.composition.artifact import ArtifactError
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "mine.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="is not a fact-db artifact"):
        _optimize(tmp_path)
    assert (tmp_path / "art" / "mine.txt").read_text() == "keep me"


# ------------------------------------------------------------------------------------------
# Bad input.

def test_tuple_and_dict_outputs_and_in_place_inputs(tmp_path):
    from fact_db.pipeline import optimize

    class Outs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 64)
            self.b = torch.nn.Linear(64, 32)

        def forward(self, x, acc):
            h = torch.relu(self.a(x))
            acc.add_(1.0)  # in place on an input
            return self.b(h), {"h": h, "acc": acc * 2}
    m = Outs().eval()
    x, acc = torch.randn(8, 32), torch.randn(8, 32)
    fast = optimize(m, (x, acc), realizer=standin_realizer(), timer=standins.composed_faster, peers=(), progress=False,
                    out=tmp_path / "outs")
    assert fast.report.verification.ok, fast.report.verification.reason
    a1, a2 = acc.clone(), acc.clone()
    y, d = fast(x, a1)
    y0, d0 = m(x, a2)
    assert torch.allclose(y, y0, atol=1e-5) and torch.allclose(d["h"], d0["h"], atol=1e-5)
    assert torch.equal(a1, a2)  # the input was changed exactly as eager changes it


def test_a_model_that_raises_names_the_line():
    from fact_db.core.errors import TraceError
    from fact_db.pipeline import optimize

    class Bad(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")
    with pytest.raises(TraceError, match="boom"):
        optimize(Bad(), (torch.randn(2, 2),), realizer=standin_realizer(), progress=False, save=False)


def test_a_spent_budget_leaves_regions_to_the_registry_or_eager(block):
    _, _, disc = block
    out = realize_regions(disc, "fp32", registry=None, budget_s=0.0, progress=False)
    gemms = [z for z in out if z.workload is not None and z.region.template == "gemm_sm90"]
    assert gemms and all(z.how == "skipped" and z.impl.kind == "eager" for z in gemms)
    assert all(any("budget was spent" in n for n in z.notes) for z in gemms)


def test_optimize_without_a_gpu_says_so():
    from fact_db.pipeline import OptimizeError, optimize
    with pytest.raises(OptimizeError, match="no CUDA GPU"):
        optimize(_mingpt(), (torch.rand(2, 16, 64),), progress=False, save=False)


@pytest.mark.slow
def test_factdb_optimize_prints_the_plan_without_a_gpu(tmp_path):
    env = {**__import__("os").environ, "FACTDB_HOME": str(tmp_path), "FACTDB_SEED": ""}
    exe = shutil.which("factdb") or sys.executable
    cmd = ([exe] if exe.endswith("factdb") else [exe, "-m", "fact_db.cli"])
    p = subprocess.run(cmd + ["optimize", str(ROOT / "benchmarks/problems/mingpt_block.py"), "--policy", "bf16",
                              "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout, parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    assert d["plan_only"] and [r["rule"] for r in d["regions"]][:3] == ["layernorm", "gemm-bias", "attention-causal"]
    hows = {r["rule"]: r["how"] for r in d["regions"]}
    assert hows["gemm-bias"] == "planned" and hows["layernorm"] == "planned"
    ln = next(r for r in d["regions"] if r["rule"] == "layernorm")
    assert ln["workload"] == {"kind": "layernorm", "rows": 128 * 512, "width": 768, "residual": False,
                              "write_sum": False, "eps": 1e-5, "dtype": "bfloat16", "policy": "bf16", "has_bias": True}
    p = subprocess.run(cmd + ["optimize", str(ROOT / "benchmarks/problems/mingpt_block.py")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0 and "no CUDA GPU here, so this is the plan" in p.stdout
    assert "REGISTRY" in p.stdout and "tune" in p.stdout


def test_swiglu_runs_as_one_gemm_over_concatenated_weights():
    import fact_db
    spec = importlib.util.spec_from_file_location("llama_small", ROOT / "benchmarks" / "problems" / "llama_block.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Model(128, 4, 2, 320, 1e-5).eval()
    x = torch.randn(2, 16, 128)
    disc = fact_db.discover(model, (x,))
    i, (r, p) = next((i, rp) for i, rp in enumerate(zip(disc.regions, plan(disc, "fp32")))
                     if rp[0].rule == "dual-gemm-swiglu")
    assert (p.workload.m, p.workload.n, p.workload.k, p.workload.epilogue) == (32, 640, 128, "none")
    before = standins.CALLS.copy()
    gm, notes = rewrite(disc.graph.program, disc.regions, {i: Impl("gemm", "stand-in", standins.gemm_op("none"),
                                                                   {"spec": {"epilogue": "none"}})})
    assert not notes
    assert torch.allclose(gm(x), model(x), atol=1e-5, rtol=1e-5)
    assert (standins.CALLS - before)["gemm_none"] == 1  # gate and up: one GEMM
    assert sum(str(n.target).startswith("aten.linear") for n in gm.graph.nodes) == 5  # q, k, v, o, down stay


@pytest.mark.slow
def test_measure_times_every_peer_and_the_composed_module_compiled(tmp_path):
    """The benchmark stage on CPU with an injected timer: which variants run, in what order,
    each with its error against float64; torch.compile of the composed module works."""
    model, x, fast = _optimize(tmp_path, bench=False)
    from fact_db.pipeline.measure import measure
    from fact_db.pipeline.run import like_drawer
    ref = _mingpt().double()
    ref.load_state_dict(model.state_dict())
    variants = measure(model, model, fast, "fp32", like_drawer((x,)), ref, peers=("compile",),
                       timer=lambda fn, xs: 2.0, progress=False)
    assert [v.name for v in variants] == ["eager fp32", "torch.compile", "fact-db", "fact-db + torch.compile"]
    for v in variants:
        assert v.ms == 2.0 and v.err is not None and v.err < 1e-6, v
        assert v.note == ("returns composed" if v.name == "fact-db" else ""), v
    assert variants[1].compile_s > 0 and variants[3].compile_s > 0


@pytest.mark.slow
def test_measure_times_every_variant_in_the_same_rounds_and_keeps_each_rounds_median(tmp_path):
    """Every variant, the compiled peers too, is timed once per round, BENCH_ROUNDS rounds, so a
    drift of the GPU's clocks hits them all and fact-db is timed the way its peers are (a peer
    timed once at its compile and fact-db in rounds timed the same compiled module 6-21% apart).
    A variant's time is the median of its rounds, and the rounds are kept."""
    from fact_db.pipeline import measure as opt
    from fact_db.pipeline.run import like_drawer
    model, x, fast = _optimize(tmp_path, bench=False)
    ref = _mingpt().double()
    ref.load_state_dict(model.state_dict())
    calls = []

    def timer(fn, xs):
        calls.append(fn)
        return 1.0 + len(calls)  # every timing later than the one before: a drifting clock

    variants = opt.measure(model, model, fast, "fp32", like_drawer((x,)), ref, peers=("compile",),
                           timer=timer, progress=False)
    by = {v.name: v for v in variants}
    names = ["eager fp32", "torch.compile", "fact-db", "fact-db + torch.compile"]
    # a clock drifting this far spreads each variant's rounds past bench.ROUND_SPREAD: every
    # variant gets the extra rounds, up to bench.MAX_ROUNDS
    from fact_db.kernels.bench import MAX_ROUNDS
    rounds = MAX_ROUNDS
    assert rounds > opt.BENCH_ROUNDS
    assert len(calls) == len(names) * rounds
    for i, name in enumerate(names):  # each round times them all, in the order they were run
        assert by[name].round_ms == [2.0 + i + len(names) * r for r in range(rounds)], name
        assert by[name].ms == sorted(by[name].round_ms)[rounds // 2]
        # still spread after the last round: the note says how far, so a smaller gap reads as noise
        lo, hi = by[name].round_ms[0], by[name].round_ms[-1]
        assert f"rounds unsettled: {rounds} rounds spread {100 * (hi / lo - 1):.0f}%" in by[name].note, by[name].note
    # KernelBench L2-36 at bf16: the returned torch.compile timed 0.88x of the same compiled peer
    from fact_db.kernels.bench import rounds_unsettled
    assert rounds_unsettled([0.405, 0.513, 0.5175, 0.5038, 0.4444]).startswith(
        "rounds unsettled: 5 rounds spread 28% (0.405-0.5175 ms)")
    assert rounds_unsettled([1.0, 1.02, 0.99]) == "" and rounds_unsettled([2.0]) == ""
    counts: dict = {}
    for fn in calls:
        counts[fn] = counts.get(fn, 0) + 1
    assert sorted(counts.values()) == [rounds] * len(names)


def test_on_the_gpu_each_round_times_every_callable_in_its_own_block_starting_with_the_next(monkeypatch):
    """bench.time_cuda_blocks: a block of one callable's runs (each from an idle GPU), then the
    next callable's; each round of timer_of_many starts one callable later, so none is always
    first. Fake events on a fake clock stand in for CUDA's."""
    from fact_db.kernels import bench
    clock = standins.FakeClock()
    order = clock.order
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    real = bench.time_cuda_interleaved
    monkeypatch.setattr(bench, "time_cuda_interleaved",
                        lambda fns, sets, **kw: real(fns, sets, reps=20, warmup=2, flush=False, event=clock.Event))
    many = bench.timer_of_many()
    fns = [clock.fn("a", 1.0), clock.fn("b", 3.0), clock.fn("c", 2.0)]
    first = many(fns, [(1,), (2,)])
    assert order == ["a"] * 22 + ["b"] * 22 + ["c"] * 22  # warm-up and runs, one callable at a time
    assert [t.median_ms for t in first] == [1.0, 3.0, 2.0] and all(t.runs == 20 for t in first)
    order.clear()
    second = many(fns, [(1,), (2,)])
    assert order == ["b"] * 22 + ["c"] * 22 + ["a"] * 22  # the next round starts one later
    assert [t.median_ms for t in second] == [1.0, 3.0, 2.0]


# ------------------------------------------------------------------------------------------
# A constant scale folded into the GEMM's alpha (the agent's KernelBench rules: tests/data/agent).

AGENT_RULES = Path(__file__).resolve().parent / "data" / "agent"


class _ScaledLinear(torch.nn.Module):
    def __init__(self, form: str, c: float):
        super().__init__()
        self.fc, self.form, self.c = torch.nn.Linear(32, 16), form, c

    def forward(self, x):
        y = self.fc(x)
        if self.form == "div-gelu":
            return torch.nn.functional.gelu(y / self.c)
        if self.form == "relu-div":
            return torch.relu(y) / self.c
        return y * torch.sigmoid(y) * self.c


@pytest.mark.parametrize("form, rule, c, alpha, epilogue", [
    ("div-gelu", "gemm-bias-div-gelu", 10.0, 0.1, "bias_gelu"),
    ("relu-div", "gemm-bias-relu-div", 2.0, 0.5, "bias_relu"),
])
def test_a_constant_scale_is_the_gemms_alpha_with_the_bias_scaled_too(form, rule, c, alpha, epilogue):
    import fact_db
    from fact_db.discovery.rules import load_rules
    torch.manual_seed(0)
    model, x = _ScaledLinear(form, c).eval(), torch.randn(8, 32)
    disc = fact_db.discover(model, (x,), rules=load_rules(extra=[AGENT_RULES / f"{rule}.yaml"]))
    [r] = disc.regions
    assert r.rule == rule and r.composable == "" and r.attrs["alpha"] == pytest.approx(alpha)
    [p] = plan(disc, "fp32")
    assert p.workload.epilogue == epilogue  # the same kernel as without the scale: alpha is a launch argument
    before = standins.CALLS.copy()
    gm, notes = rewrite(disc.graph.program, disc.regions, {0: Impl("gemm", "stand-in", standins.gemm_op(epilogue),
                                                                   {"spec": {"epilogue": epilogue}})})
    assert notes == [] and not any(str(n.target).startswith(("aten.div", "aten.gelu", "aten.relu"))
                                   for n in gm.graph.nodes if n.op == "call_function")
    torch.testing.assert_close(gm(x), model(x))
    assert (standins.CALLS - before)[f"gemm_{epilogue}"] == 1


@pytest.mark.parametrize("form, rule, c, why", [
    ("swish-scale", "gemm-bias-silu-scale", 2.0, "after silu is not the GEMM's alpha"),
    ("relu-div", "gemm-bias-relu-div", -2.0, "after relu is not the GEMM's alpha"),
])
def test_a_scale_that_does_not_commute_with_the_activation_stays_eager(form, rule, c, why):
    import fact_db
    from fact_db.discovery.rules import load_rules
    model, x = _ScaledLinear(form, c).eval(), torch.randn(8, 32)
    disc = fact_db.discover(model, (x,), rules=load_rules(extra=[AGENT_RULES / f"{rule}.yaml"]))
    [r] = disc.regions
    assert r.rule == rule and why in r.composable
    [z] = realize_regions(disc, "fp32", plan_only=True, progress=False)
    assert z.how == "eager" and any(why in n for n in z.notes)


# ------------------------------------------------------------------------------------------
# Where the library wins a GEMM region, the library path runs, not the model's own ops.

def _library_realizer():
    from types import SimpleNamespace

    from fact_db.kernels.gemm.family import impl_of as gemm_impl

    def realize(disc, policy):
        out = []
        for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy))):
            impl = Impl.eager("not a GEMM region")
            if p.workload is not None:  # the tuner's `eager` candidate won
                won = SimpleNamespace(winner=SimpleNamespace(candidate=SimpleNamespace(template="eager"), time_ms=0.5))
                impl = gemm_impl(won, p.workload)
            out.append(Realized(i, r, p.workload, impl, "tuned", eager_ms=0.5, ms=0.5))
        return out
    return realize


@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh", "bias_silu",
                                      "residual"])
def test_the_library_op_computes_what_the_tuner_timed_as_eager(epilogue):
    from fact_db.kernels.gemm.kernel import library_gemm_op
    from fact_db.kernels.gemm.workload import GemmWorkload
    w = GemmWorkload(24, 40, 16, policy="fp32", layout_b="col", epilogue=epilogue)
    inputs = w.make_inputs("randn", device="cpu", generator=torch.Generator().manual_seed(0))
    op = library_gemm_op(epilogue)
    got = op(inputs["a"], inputs["b"], inputs.get("bias"), inputs.get("c"), 1.0, 1.0 if "c" in inputs else 0.0)
    assert torch.allclose(got, w.eager(inputs), atol=1e-6, rtol=1e-6)
    assert torch.allclose(got.double(), w.reference(inputs), atol=1e-5)
    assert library_gemm_op(epilogue) is op


@pytest.mark.slow
def test_a_region_the_library_wins_runs_the_library_path_not_the_models_ops(tmp_path):
    """minGPT's MLP writes GELU out as eight element-wise ops; where cuBLAS wins the GEMM
    region, the composed module runs addmm and one `gelu` (what the tuner timed), and the
    artifact loads it without a loader."""
    from fact_db.composition.artifact import load
    model, x, fast = _optimize(tmp_path, realizer=_library_realizer())
    r = fast.report
    assert r.verification.ok
    libs = [z for z in r.regions if z.impl.library]
    assert {z.region.rule for z in libs} >= {"gemm-bias-gelu-tanh", "gemm-residual"}
    assert all(not z.impl.kernel and "library is the fastest" in z.impl.note for z in libs)
    gelu = next(z for z in libs if z.region.rule == "gemm-bias-gelu-tanh")
    assert gelu.impl.label == "library: cuBLAS addmm + gelu_tanh"
    targets = [getattr(n.target, "__name__", str(n.target)) for n in fast.gm.graph.nodes if n.op == "call_function"]
    assert "library_gemm_bias_gelu_tanh" in targets
    assert not any("tanh" in t and "library" not in t for t in targets), targets  # the written-out GELU is gone
    assert torch.allclose(fast(x), model(x), atol=1e-5)
    assert "kernels=0" in repr(fast)
    back = load(fast.artifact)
    assert torch.allclose(back(x), model(x), atol=1e-5)
    assert not any(": eager:" in n for n in back.load_notes), back.load_notes


# ------------------------------------------------------------------------------------------
# Rank-4 GEMM operands and einsums lowered to GEMMs.

class _ReluSelfAttention(torch.nn.Module):
    """KernelBench L3-50's form, small: q @ k^T and att @ v on [B, H, T, D] head-split views."""

    def __init__(self, n_embd=32, n_head=4, max_seqlen=16):
        super().__init__()
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = torch.nn.functional.relu(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")))
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


class _Broadcast4d(torch.nn.Module):
    """Rank-4 operands whose batch dims broadcast: by a rank-3 one, and by a rank-4 one of batch 1."""

    def forward(self, a, b, c):
        return a @ b, a @ c

    def example_inputs(self):
        return torch.randn(2, 3, 5, 6), torch.randn(3, 6, 4), torch.randn(1, 3, 6, 7)


def _gemm_standins(disc) -> dict:
    impls = {}
    for i, (r, p) in enumerate(zip(disc.regions, plan(disc, "fp32"))):
        assert p.workload is not None and r.composable == "", (r.rule, p.note, r.composable)
        e = p.workload.epilogue
        impls[i] = Impl("gemm", f"stand-in {e}", standins.gemm_op(e), {"spec": {"epilogue": e}})
    return impls


@pytest.mark.parametrize("make", [_ReluSelfAttention, _Broadcast4d], ids=["relu-self-attention", "broadcast"])
def test_rank4_gemm_regions_compose_as_batched_3d_gemms_and_equal_eager(make):
    torch.manual_seed(0)
    model = make().eval()
    xs = model.example_inputs() if hasattr(model, "example_inputs") else (torch.rand(2, 16, 32),)
    disc = __import__("fact_db").discover(model, xs)
    batched = [r for r in disc.regions if r.problem.get("batch", 1) > 1]
    assert batched and all(r.composable == "" for r in batched)
    gm, notes = rewrite(disc.graph.program, disc.regions, _gemm_standins(disc))
    assert notes == []
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("factdb_test.")]
    assert len(ops) == len(disc.regions)
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(*xs)
    for n in ops:  # every kernel op is handed 2-D or 3-D operands, as the GEMM kernels take
        assert all(len(a.meta["tensor_meta"].shape) in (2, 3) for a in n.args[:2]), n
    before = standins.CALLS.copy()
    for _ in range(2):  # fresh random inputs each time
        fresh = tuple(torch.randn_like(x) for x in xs)
        torch.testing.assert_close(gm(*fresh), model(*fresh), rtol=1e-5, atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 2 * len(disc.regions)
    gm.graph.lint()


def test_einsum_regions_compose_as_their_gemms_and_equal_eager():
    class Einsums(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 12))

        def forward(self, x, q, k, r):
            a = torch.einsum("bijl,lk->bijk", x, self.w)          # leading dims folded into M
            s = torch.einsum("bhqd,bhkd->bhqk", q, k)              # batched, B read column-major
            t = torch.einsum("ikb,kjb->bji", r, r.transpose(0, 1))  # batch index innermost: copies
            return a.reshape(-1, 12), s, t.view(-1)                # readers that need packed tensors

    torch.manual_seed(0)
    model = Einsums().eval()
    xs = (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 6), torch.randn(2, 3, 7, 6), torch.randn(4, 4, 3))
    disc = __import__("fact_db").discover(model, xs)
    assert [r.rule for r in disc.regions] == ["einsum-gemm"] * 3
    assert [p.workload.rule for p in plan(disc, "fp32")] == ["gemm", "batched-gemm", "batched-gemm"]
    gm, notes = rewrite(disc.graph.program, disc.regions, _gemm_standins(disc))
    assert notes == []
    assert not any(str(n.target).startswith("aten.einsum") for n in gm.graph.nodes if n.op == "call_function")
    before = standins.CALLS.copy()
    fresh = tuple(torch.randn_like(x) for x in xs)
    for got, want in zip(gm(*fresh), model(*fresh)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sum((standins.CALLS - before).values()) == 3
    gm.graph.lint()


def test_attention_ops_return_sdpas_gpu_layout_so_a_models_view_works():
    """PyTorch's flash, memory-efficient and cuDNN SDPA write o [b, h, s, d] laid out [b, s, h, d],
    so model code may view `o.transpose(1, 2)` without `.contiguous()` (as the Llama block in
    benchmarks/problems does). The attention ops (the library's here, the kernels' through the
    same fake and allocation) return that layout, and say so to torch.compile: before, a composed
    Llama block raised "view size is not compatible" on an H200 (s18c)."""
    import torch.nn.functional as F

    from fact_db.kernels.attention.kernel import attention_fake, out_strides
    from fact_db.kernels.attention.workload import library_op
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g) for _ in range(3))
    op = library_op("math")
    o = op(q, k, v, 0.25, True)
    assert o.stride() == out_strides(2, 4, 8, 16) and not o.is_contiguous()
    assert torch.allclose(o, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25), atol=1e-6)
    assert o.transpose(1, 2).view(2, 8, 64).shape == (2, 8, 64)
    assert attention_fake(None)(q.to("meta"), k.to("meta"), v.to("meta"), 0.25, True).stride() == o.stride()
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: op(q, k, v, 0.25, True).transpose(1, 2).view(2, 8, 64), fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(q, k, v), o.transpose(1, 2).reshape(2, 8, 64))
