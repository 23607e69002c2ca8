"""fact-db as a torch.compile backend (fact_db/pipeline/backend.py), on the CPU: the graph
rewrite with stand-in kernel ops (tests/standins.py) served by a stand-in registry lookup,
Inductor compiling the rest; options, registration, dynamic shapes, graph breaks, kernels
that fail to load, Inductor failing, the cache key, and the Inductor features relied on.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import standins
from fact_db.kernels.impl import Impl
from fact_db.pipeline import backend as B
from fact_db.pipeline import inductor
from test_compose import _mingpt

ROOT = Path(__file__).resolve().parent.parent


def lookup_for(verified=lambda w: True, broken: str = ""):
    """A stand-in registry: a stand-in kernel for each GEMM, attention and convolution workload
    `verified` accepts (a pointwise fp32 convolution the GEMM kernel's, as the tuner picks);
    `broken`: a family whose kernel fails to load."""
    def lookup(region, w, policy):
        fam = ("gemm" if hasattr(w, "epilogue") else "attention" if hasattr(w, "lq") else
               "conv" if hasattr(w, "filter") else None)
        if fam is None or not verified(w):
            return None
        if fam == broken:
            raise OSError(f"cannot load kernel /registry/{fam}/kernel.so: undefined symbol cutlass_launch")
        if fam == "gemm":
            return Impl("gemm", f"stand-in {w.epilogue}", standins.gemm_op(w.epilogue),
                        {"build_key": f"standin-{w.epilogue}"})
        if fam == "conv":
            from dataclasses import asdict

            from fact_db.kernels.conv.kernel import ConvConfig, is_pointwise
            cfg = (ConvConfig(64, 64, 32, split3=True, promote=1, schedule="gemm") if is_pointwise(w)
                   else ConvConfig(128, 64, 32, split3=True, promote=1))
            return Impl("conv", f"stand-in {cfg.label}", standins.conv_op(w),
                        {"workload": w.as_dict(), "config": asdict(cfg), "build_key": f"standin-{cfg.label}"})
        return Impl("attention", "stand-in attention", standins.attention_op(), {"build_key": "standin-attention"})
    return lookup


def compiled(model, **options):
    """torch.compile(model, backend="factdb", options=...) with dynamo's state reset, and the count
    of graphs dynamo handed to the backend."""
    torch._dynamo.reset()
    B.reset_report()
    calls = []

    def counted(gm, example_inputs):
        calls.append(gm)
        return B.factdb(gm, example_inputs, options=options)
    return torch.compile(model, backend=counted, dynamic=options.pop("_dynamic", None)), calls


def inductor_compiles(model, shapes, dynamic=None) -> int:
    """How many graphs dynamo hands Inductor itself (no fact-db) for calls with these shapes."""
    from torch._inductor.compile_fx import compile_fx
    torch._dynamo.reset()
    calls = []

    def counted(gm, example_inputs):
        calls.append(gm)
        return compile_fx(gm, example_inputs)
    fast = torch.compile(model, backend=counted, dynamic=dynamic)
    with torch.no_grad():
        for shape in shapes:
            fast(torch.rand(*shape))
    return len(calls)


def _ran(before) -> int:
    return sum((standins.CALLS - before).values())


# ------------------------------------------------------------------------------------------

def test_the_inductor_features_relied_on_exist_in_this_torch():
    """The private APIs the backend uses (fact_db/pipeline/inductor.py): a torch that moves one
    fails here, not in a user's compile. A torch it was not tested on fails too, until the
    backend's tests pass on it and its version joins TESTED."""
    assert inductor.missing() == []
    assert ".".join(torch.__version__.split(".")[:2]) in inductor.TESTED, torch.__version__


def test_dynamo_graph_arguments_name_their_parameter_sources():
    """The backend names a graph input by its dynamo source (`meta["grapharg"].source`, a private
    API): a torch that drops it fails here."""
    seen = []

    def capture(gm, example_inputs):
        seen.extend(inductor.source_name(n) for n in gm.graph.nodes if n.op == "placeholder")
        return gm.forward

    torch._dynamo.reset()
    lin = torch.nn.Linear(4, 3)
    torch.compile(lin, backend=capture)(torch.randn(2, 4))
    assert any("weight" in name for name in seen) and any("bias" in name for name in seen), seen
    torch._dynamo.reset()


def test_pyproject_declares_the_entry_point_and_register_resolves_factdb():
    import tomllib
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"factdb": "fact_db.pipeline.backend:factdb"}
    module, attr = eps["factdb"].split(":")
    assert getattr(sys.modules.get(module) or __import__(module, fromlist=[attr]), attr) is B.factdb
    B.register()
    B.register()  # twice: the same backend, no error
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("factdb") is B.factdb


def test_an_unknown_option_is_named_with_the_ones_accepted():
    with pytest.raises(B.BackendError) as e:
        B.options_from({"polcy": "bf16"})
    assert str(e.value).startswith("torch.compile(backend='factdb') has no option 'polcy' (did you mean 'policy'?); "
                                   "it accepts: policy, registry, gpu, tune, shapes, rules, mode, inductor, split_weights, lookup")
    with pytest.raises(B.BackendError, match="option policy='fp64' is not a policy: use one of fp32"):
        B.options_from({"policy": "fp64"})
    B.register()
    model = nn.Linear(8, 8)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="has no option 'polcy'"), torch.no_grad():
        torch.compile(model, backend="factdb", options={"polcy": "bf16"})(torch.randn(2, 8))


@pytest.mark.slow
@pytest.mark.parametrize("split", [True, False])
def test_split_weights_holds_the_lo_parts_once_or_splits_them_per_call(split):
    """The `split_weights` option, as optimize's: a kernel that takes B's lo parts gets each
    weight's split once into a buffer the compiled graph holds (one more copy of the weight),
    or with False the plain op, which splits per call and holds nothing. The cache key tells
    the two graphs apart; a value that is not a bool is named."""
    def lookup(region, w, policy):
        if not hasattr(w, "epilogue"):
            return None
        e = w.epilogue
        return Impl("gemm", f"stand-in {e}", standins.gemm_op(e), {"build_key": f"standin-lo-{e}"},
                    op_lo=standins.gemm_lo_op(e), split_lo=standins.split_lo)
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 16)).eval(), torch.randn(4, 32)
    fast, _ = compiled(model, policy="fp32", lookup=lookup, split_weights=split)
    with torch.no_grad():
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    ran = standins.CALLS - before
    lo = sum(v for k, v in ran.items() if k.startswith("gemm_lo_"))
    assert lo == (2 if split else 0) and sum(ran.values()) - lo == 2  # (the lo stand-in computes with the plain one)
    [g] = B.report().graphs
    assert g.key == B.cache_key("fp32", g.rows, None, split) and (g.key == B.cache_key("fp32", g.rows)) is split
    with pytest.raises(B.BackendError, match="option split_weights='no' must be True or False"):
        B.options_from({"split_weights": "no"})


def test_the_mode_option_reaches_inductor_and_a_wrong_one_is_named(monkeypatch):
    """torch.compile takes mode= or options=, not both: the backend's `mode` option is how a
    user asks for max-autotune's Inductor under fact-db's kernels."""
    with pytest.raises(B.BackendError, match="option mode='max-autotune-no-cudagraph' is not a torch.compile mode: "
                                             "use one of default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"):
        B.options_from({"mode": "max-autotune-no-cudagraph"})
    seen = []
    real = inductor.compile_graph
    monkeypatch.setattr(inductor, "compile_graph", lambda *a, **k: seen.append(k.get("mode")) or real(*a, **k))
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8)
    for opts, want in (({}, None), ({"mode": "max-autotune-no-cudagraphs"}, "max-autotune-no-cudagraphs")):
        seen.clear()
        fast, _ = compiled(model, lookup=lambda *a: None, **opts)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x))
        assert seen and set(seen) == {want}
        # no kernel went in: the report times what the pass did, and Inductor on the graph as captured
        assert list(B.report().graphs[-1].seconds) == ["discover", "lookup", "inductor"]


@pytest.mark.slow
def test_the_graph_runs_registry_kernels_and_inductor_compiles_the_rest():
    """minGPT: five regions get kernels (the stand-ins count each call), the LayerNorms have no
    kernel and stay with Inductor, listed once with the command that would tune them."""
    from torch._dynamo.utils import counters
    model, x = _mingpt(), torch.rand(2, 16, 64)
    fast, calls = compiled(model, lookup=lookup_for())
    inductor_before = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = standins.CALLS.copy()
        y = fast(x)
        assert _ran(before) == 5
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
        assert _ran(before) == 5 and torch.equal(y, fast(x))
    assert len(calls) == 1  # one graph, compiled once
    assert counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"] > inductor_before
    [g] = B.report().graphs
    assert {k[0] for k in g.kernels} == {"gemm-bias", "attention-causal", "gemm-residual", "gemm-bias-gelu-tanh"}
    assert list(g.seconds) == ["discover", "lookup", "rewrite", "inductor"] and all(v >= 0 for v in g.seconds.values())
    assert "compile time: discover" in str(B.report())
    assert len(g.kernels) == 5 and g.policy == "fp32" and g.key == B.cache_key("fp32", g.rows)
    assert [left[0] for left in g.left] == ["layernorm", "layernorm"]
    listed = [str(w.message) for w in seen if "stay with Inductor" in str(w.message)]
    assert len(listed) <= 1  # once per process: an earlier test may have listed these already
    assert "graph 1 (2x16x64, fp32): 5 kernel(s)" in str(B.report())


def test_convolutions_run_their_registry_kernels_with_batchnorm_folded_and_one_conversion():
    """A ResNet-50 bottleneck (eval mode) under the backend: its three conv-bn regions run their
    kernels (the 1x1s the pointwise GEMM kernel's [hi(w); lo(w)] weight, the BatchNorms folded
    into held weights), the block input converted to channels-last once for the first 1x1 and
    the residual, and the result equals eager."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("resnet50_bottleneck", ROOT / "benchmarks/problems/resnet50_bottleneck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(3)
    model = mod.Model(16, 4).eval()
    for bn in (model.bn1, model.bn2, model.bn3):
        bn.running_mean.uniform_(-0.5, 0.5), bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 16, 8, 8)
    fast, calls = compiled(model, lookup=lookup_for())
    with torch.no_grad():
        before = standins.CALLS.copy()
        got = fast(x)
        assert standins.CALLS["conv"] - before["conv"] == 3
        assert standins.CALLS["conv_not_channels_last"] == before["conv_not_channels_last"]
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    [g] = B.report().graphs
    assert [k[0] for k in g.kernels] == ["conv-bn"] * 3
    assert sum("gemm" in k[2] for k in g.kernels) == 2 and not g.left


def test_the_registry_serves_a_convolutions_kernel_only_where_it_is_current_and_built(monkeypatch):
    """lookup.kernel_for on a conv region: no row, a cuDNN winner (Inductor has its own) and a
    kernel not in the build cache leave it with Inductor, each saying so; a built winner comes
    back as the conv family's Impl (its template, its config, BatchNorm folding where the region
    has one), keyed by its build for the cache key."""
    import types

    from fact_db.kernels.conv import kernel as conv_kernel
    from fact_db.kernels.conv import tune as conv_tune
    from fact_db.kernels.conv.kernel import ConvConfig
    from fact_db.kernels.conv.workload import ConvWorkload
    from fact_db.pipeline import lookup
    from fact_db.store.registry import Registry
    w = ConvWorkload(32, 256, 64, (56, 56), (1, 1), chain='[{"op":"relu"}]', rule="conv-bn")
    region = types.SimpleNamespace(rule="conv-bn", template="conv_sm90", operands={"x": "x", "w": "w", "bn_mean": "m"})
    cfg = ConvConfig(64, 64, 32, split3=True, promote=1, schedule="gemm")
    ask = lambda wl: lookup.kernel_for(reg, region, wl, arch="sm90a", gpu="h100")  # noqa: E731
    with Registry.open("memory") as reg:
        assert ask(w).impl is None and ask(w).why == "no current registry row"
        conv_tune.record(w, [conv_tune.ConvTrial(cfg.label, "ok", 0.07, 1.8e-7, config=cfg),
                             conv_tune.ConvTrial("cudnn", "ok", 0.15, 2.2e-7)], reg, gpu="h100")
        assert ask(w).impl is None and "is not built here" in ask(w).why
        other = ConvWorkload(**(w.as_dict() | {"c": 128}))
        conv_tune.record(other, [conv_tune.ConvTrial("cudnn", "ok", 0.1, 2e-7)], reg, gpu="h100")
        assert ask(other).why == "the registry's winner is cuDNN"

        class Loaded:  # the library is not loaded on the CPU: what impl_of builds from it
            def __init__(self, so, wl, config, build_key=""):
                self.so, self.config, self.build_key, self.op_name = so, config, build_key, "c_standin"

            def as_op(self):
                return lambda *a: None
        monkeypatch.setattr(conv_kernel, "ConvKernel", Loaded)
        monkeypatch.setattr(lookup, "_cached_so", lambda source: ("/cache/k/kernel.so", "k" * 24))
        found = ask(w)
        assert found.impl is not None and found.impl.kind == "conv" and found.row == "conv:" + "k" * 24
        assert found.impl.record["template"] == "conv_gemm_sm90" and found.impl.record["config"]["schedule"] == "gemm"


class SwiGlu(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(32, 96, bias=False), nn.Linear(32, 96, bias=False), \
            nn.Linear(96, 32, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x)) + x


def test_swiglus_strided_output_is_planned_around_by_inductor():
    """The SwiGLU op returns the gate half of its GEMM's output (rows 2N apart); Inductor reads
    it with those strides, as its fake says."""
    torch.manual_seed(0)
    model, x = SwiGlu().eval(), torch.randn(2, 8, 32)
    fast, _ = compiled(model, lookup=lookup_for())
    with torch.no_grad():
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert (standins.CALLS - before)["gemm_none"] >= 1
    assert "dual-gemm-swiglu" in {k[0] for k in B.report().graphs[0].kernels}


class TwoBlocks(nn.Module):
    """Two Linear + GELU blocks with a graph break between them (a print, a .item(), ...)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        h = F.gelu(self.a(x))
        torch._dynamo.graph_break()
        return F.gelu(self.b(h))


def test_a_graph_break_splits_the_model_and_each_graph_runs_its_kernels():
    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(16, 32)
    fast, calls = compiled(model, lookup=lookup_for())
    with torch.no_grad():
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 and (standins.CALLS - before)["gemm_bias_gelu"] == 2
    rep = B.report()
    assert [len(g.kernels) for g in rep.graphs] == [1, 1]
    assert rep.breaks and any("graph_break" in reason for reason in rep.breaks), rep.breaks
    assert "break:" in str(rep)


@pytest.mark.slow
def test_dynamic_shapes_run_kernels_only_for_the_shapes_verified_and_never_recompile():
    """The registry has kernels for 2 x 16 tokens only. After dynamo turns the graph dynamic,
    2 x 16 still runs them, every other shape runs Inductor's code (no kernel call), all right;
    dynamo compiles exactly as often as for Inductor alone."""
    model = _mingpt()
    verified = lambda w: (getattr(w, "m", None) == 32 or (getattr(w, "lq", None) == 16 and w.batch == 2))  # noqa: E731
    shapes = [(2, 16), (2, 8), (2, 16), (3, 16), (1, 12), (2, 16), (2, 4), (4, 4), (2, 10)]
    alone = inductor_compiles(model, [(b, t, 64) for b, t in shapes])
    fast, calls = compiled(model, lookup=lookup_for(verified))
    with torch.no_grad():
        for b, t in shapes:
            x = torch.rand(b, t, 64)
            before = standins.CALLS.copy()
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
            assert _ran(before) == (5 if (b, t) == (2, 16) else 0), (b, t)
    assert len(calls) == alone <= 4  # static, then dynamic (and Inductor's own restarts): none per shape
    assert any(g.dynamic and g.shapes == "2x16x64" and len(g.kernels) == 5 for g in B.report().graphs)


@pytest.mark.slow
def test_dynamic_from_the_first_call_and_the_shapes_looked_up_are_bounded():
    """dynamic=True: one graph for every shape; the first `shapes` (2) new shapes are looked up
    once each, later ones run Inductor's code straight away, with one warning."""
    model = _mingpt()
    calls_shapes = [(2, t, 64) for t in (16, 8, 16, 4, 12, 8)]
    alone = inductor_compiles(model, calls_shapes, dynamic=True)
    fast, calls = compiled(model, lookup=lookup_for(lambda w: getattr(w, "m", 32) == 32 and
                                                    getattr(w, "lq", 16) == 16), shapes=2, _dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for shape in calls_shapes:
            x = torch.rand(*shape)
            before = standins.CALLS.copy()
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
            assert _ran(before) == (5 if shape[1] == 16 else 0), shape
    assert len(calls) == alone
    assert [g.shapes for g in B.report().graphs if g.dynamic] == ["2x16x64", "2x8x64"]
    assert sum("called with 2 input shapes" in str(w.message) for w in seen) == 1


def test_a_kernel_that_fails_to_load_leaves_its_region_to_inductor_with_a_warning():
    model, x = _mingpt(), torch.rand(2, 16, 64)
    fast, _ = compiled(model, lookup=lookup_for(broken="attention"))
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    ran = standins.CALLS - before
    assert ran["attention"] == 0 and sum(ran.values()) == 4
    assert any("region attention-causal" in str(w.message) and "failed to load (OSError: cannot load kernel"
               in str(w.message) and "stays with Inductor" in str(w.message) for w in seen)


def test_inductor_failing_on_the_rewritten_graph_compiles_the_models_own(monkeypatch):
    real = inductor.compile_graph

    def failing(gm, example_inputs, *, key=None, **kw):
        if key is not None:
            raise RuntimeError("LoweringException: no lowering for factdb_test.gemm_bias")
        return real(gm, example_inputs, key=key, **kw)
    monkeypatch.setattr(inductor, "compile_graph", failing)
    model, x = _mingpt(), torch.rand(2, 16, 64)
    fast, _ = compiled(model, lookup=lookup_for())
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = standins.CALLS.copy()
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert _ran(before) == 0
    assert any("Inductor failed on the graph with fact-db's kernels (RuntimeError: LoweringException" in str(w.message)
               for w in seen)
    assert B.report().graphs[0].kernels == []


def test_a_weight_changed_after_compiling_runs_inductors_code():
    """Composition's buffers were made from the weights; a weight changed in place makes them
    stale, so the call runs Inductor's code for the graph, with a warning, and stays right."""
    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(16, 32)
    fast, _ = compiled(model, lookup=lookup_for())
    with torch.no_grad():
        fast(x)
        model.a.weight.mul_(2.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            before = standins.CALLS.copy()
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert (standins.CALLS - before)["gemm_bias_gelu"] == 1  # the second graph's weights did not change
    assert any("a weight changed since" in str(w.message) for w in seen)


def test_a_graph_autograd_records_is_inductors_alone():
    torch.manual_seed(0)
    model, x = TwoBlocks(), torch.randn(16, 32)
    fast, _ = compiled(model, lookup=lookup_for())
    before = standins.CALLS.copy()
    y = fast(x)
    y.sum().backward()
    assert _ran(before) == 0 and model.a.weight.grad is not None
    assert "no backward" in B.report().graphs[0].note


def test_the_cache_key_covers_version_rules_rows_and_policy(monkeypatch):
    import fact_db
    from fact_db.discovery.rules import load_rules
    rules = load_rules()
    base = B.cache_key("fp32", ["row-a", "row-b"])
    assert base == B.cache_key("fp32", ["row-b", "row-a"])  # the same rows, however found
    assert len({base, B.cache_key("bf16", ["row-a", "row-b"]), B.cache_key("fp32", ["row-a"]),
                B.cache_key("fp32", ["row-a", "row-b"], rules=type(rules)(rules.rules[:-1], rules.fragments))}) == 4
    monkeypatch.setattr(fact_db, "__version__", "99.0.0", raising=False)
    assert B.cache_key("fp32", ["row-a", "row-b"]) != base


def test_a_rule_sets_digest_is_never_served_to_another_set_at_the_same_address(monkeypatch):
    """The digest was cached by id(rules) alone: a freed set's address, reused by a new set,
    would have served the old set's digest, and Inductor's cache key with it."""
    from fact_db.discovery.rules import load_rules
    rules = load_rules()
    fewer = type(rules)(rules.rules[:-1], rules.fragments)
    full = B.rules_digest(rules)
    # what a reused address looks like: the entry for `rules`' id, asked about another set there
    monkeypatch.setitem(B._RULES_DIGEST, id(fewer), B._RULES_DIGEST[id(rules)])
    assert B.rules_digest(fewer) != full
    assert B.rules_digest(rules) == full  # a set still alive is answered from the cache


def test_inductors_fx_graph_cache_serves_a_graph_again_only_under_the_same_key(tmp_path, monkeypatch):
    """The key goes into Inductor's FX graph cache key through a post-grad pass with a uuid (a
    pass without one would make the cache bypass the graph): the same model compiled again is
    a cache hit; under another fact-db version, the same graph text is a miss."""
    import fact_db
    from torch._dynamo.utils import counters
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(16, 32)

    def compile_once():
        fast, _ = compiled(model, lookup=lookup_for())
        c = counters["inductor"]
        before = (c["fxgraph_cache_hit"], c["fxgraph_cache_miss"], c["fxgraph_cache_bypass"])
        with torch.no_grad():
            fast(x)
        return tuple(a - b for a, b in zip((c["fxgraph_cache_hit"], c["fxgraph_cache_miss"],
                                            c["fxgraph_cache_bypass"]), before))
    assert compile_once() == (0, 2, 0)     # two graphs (the break), each compiled
    assert compile_once() == (2, 0, 0)     # served from the cache
    monkeypatch.setattr(fact_db, "__version__", "99.0.0", raising=False)
    assert compile_once() == (0, 2, 0)     # another fact-db: not served


def test_an_explicit_attention_gets_the_sdpa_backend_the_registry_holds_and_an_sdpa_call_keeps_its_own():
    """The registry's attention winner is an SDPA backend (a library): where the model writes
    attention out, the backend puts that backend in (Inductor does not turn matmul, mask,
    softmax, matmul into SDPA itself); where the model calls SDPA already, it keeps its call."""
    import types

    from fact_db.kernels.attention import tune as attention_tune
    from fact_db.kernels.attention.workload import AttentionWorkload
    from fact_db.pipeline.lookup import kernel_for
    from fact_db.store.registry import Registry
    w = AttentionWorkload(2, 4, 4, 64, 64, 32, 32, causal=True, policy="bf16")
    best = attention_tune.AttnTrial("sdpa-flash", "library", "ok", 0.01, 1e-3)
    trials = [best, attention_tune.AttnTrial("explicit", "eager", "ok", 0.05, 1e-3)]
    with Registry.open("memory") as reg:
        attention_tune.record(w, attention_tune.AttnResult(w, trials, []), reg, "sm90a", "h100")
        explicit = kernel_for(reg, types.SimpleNamespace(rule="attention-causal", template="fmha_sm90"), w,
                              arch="sm90a", gpu="h100")
        assert explicit.impl is not None and explicit.impl.kind == "attention"
        assert explicit.impl.record["library"] == "sdpa-flash" and explicit.row == "attention:sdpa-flash"
        called = kernel_for(reg, types.SimpleNamespace(rule="sdpa-attention", template="fmha_sm90"), w,
                            arch="sm90a", gpu="h100")
        assert called.impl is None and "already calls" in called.why
