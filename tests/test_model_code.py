"""Model code as people write it, through optimize on the CPU (issue 26): closures made in
`__init__`, plain tensor attributes, module-level tensors, random tensors drawn in forward,
state changed in forward, code with no float64 run, and running out of memory.

The problems are small KernelBench-format files in tests/kb_problems/, each shaped like the
KernelBench file it stands for (named in its docstring).
"""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from fact_db.pipeline import optimize, optimize_problem
from fact_db.pipeline.recast import recast
from fact_db.pipeline.reference import build_reference, placement
from test_compose import standin_realizer

KB = Path(__file__).resolve().parent / "kb_problems"


def _load(stem: str):
    spec = importlib.util.spec_from_file_location(f"kb_{stem}", KB / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model(stem: str):
    mod = _load(stem)
    torch.manual_seed(0)
    return mod, mod.Model(*mod.get_init_inputs()).eval(), tuple(mod.get_inputs())


def _opt(stem: str, policy: str = "fp32", **kw):
    kw.setdefault("realizer", standin_realizer())
    return optimize_problem(str(KB / f"{stem}.py"), policy=policy, timer=lambda fn, xs: 1.0, peers=(),
                            progress=False, save=False, **kw)


# ------------------------------------------------------------------------------------------
# The reference builder.

def test_a_fresh_build_closes_over_its_own_submodules_and_holds_the_models_weights():
    mod, model, (x,) = _model("closure_mlp")
    r = recast(model, torch.float64, build=lambda: mod.Model(*mod.get_init_inputs()))
    assert r.how == "fresh build" and not r.notes
    assert r.model.mlpf.__closure__[0].cell_contents is r.model.mlp  # the closure made in the new __init__
    assert all(p.dtype == torch.float64 for p in r.model.parameters())
    assert torch.equal(r.model.mlp.c_fc.weight, model.mlp.c_fc.weight.double())
    with pytest.raises(RuntimeError, match="dtype"):
        copy.deepcopy(model).double()(x.double())  # what optimize did before: the copy's closure calls float32 modules
    ref = r.model(x.double())
    assert ref.dtype == torch.float64 and torch.allclose(ref, model(x).double(), rtol=1e-5, atol=1e-6)


def test_without_a_problem_file_the_deep_copys_closures_are_rebound_and_said_so():
    _, model, (x,) = _model("closure_mlp")
    r = recast(model, torch.float64)
    assert r.how == "deep copy"
    assert r.model.mlpf.__closure__[0].cell_contents is r.model.mlp
    assert model.mlpf.__closure__[0].cell_contents is model.mlp and model.mlp.c_fc.weight.dtype == torch.float32
    assert len(r.notes) == 1 and "mlpf closes over the model's submodules" in r.notes[0]
    assert "could not be built afresh" in r.notes[0] and "rebound" in r.notes[0]
    assert r.model(x.double()).dtype == torch.float64


def test_plain_tensor_attributes_are_converted_and_copied_not_redrawn():
    mod, model, (x,) = _model("lstm_attr")
    torch.manual_seed(123)  # a fresh build draws other h0/c0: the model's own are copied in
    r = recast(model, torch.float64, build=lambda: mod.Model(*mod.get_init_inputs()))
    assert r.model.h0.dtype == torch.float64 and torch.equal(r.model.h0, model.h0.double())
    assert r.model.c0 is not model.c0 and model.c0.dtype == torch.float32
    assert r.model(x.double()).dtype == torch.float64  # model.double() would raise on h0


def test_the_float64_reference_reads_module_level_tensors_in_float64():
    mod, model, (x,) = _model("global_tensor")
    with pytest.raises(RuntimeError, match="dtype"):
        copy.deepcopy(model).double()(x.double())
    ref = build_reference(model, model, "fp32", (x,))
    assert ref.kind == "float64" and ref.label.startswith("the float64 model (a deep copy")
    want = (torch.nn.functional.linear(x.double() * mod.SCALE.double(), model.fc.weight.double(),
                                       model.fc.bias.double()) @ mod.MIX.double())
    assert torch.allclose(ref(x.double()), want, rtol=1e-12, atol=1e-12)


def test_a_reference_drawing_random_tensors_in_forward_draws_what_eager_draws():
    _, model, (x,) = _model("lstm_randn")
    ref = build_reference(model, model, "fp32", (x,))
    assert ref.kind == "float64"
    torch.manual_seed(7)
    eager = model(x)
    torch.manual_seed(7)
    r = ref(x.double())
    assert torch.allclose(r, eager.double(), rtol=1e-4, atol=1e-5)  # float32 against float64 of the same draw
    assert not torch.allclose(ref(x.double()), r, rtol=1e-2)          # another draw gives another output


def test_the_float64_run_goes_to_the_cpu_where_the_gpu_cannot_hold_it():
    gib = 2 ** 30
    assert placement(torch.device("cuda"), lambda: 8 * gib, lambda d: 40 * gib) == (torch.device("cuda"), "")
    dev, note = placement(torch.device("cuda"), lambda: 24 * gib, lambda d: 40 * gib)
    assert dev == torch.device("cpu") and "needs about 24.0 GiB and the GPU has 40.0 GiB free" in note
    dev, note = placement(torch.device("cuda"), lambda: 24 * gib, lambda d: 40 * gib, random=["aten.randn"])
    assert dev == torch.device("cuda") and "random" in note
    assert placement(torch.device("cpu"), lambda: 1 / 0, lambda d: 1 / 0) == (torch.device("cpu"), "")


# ------------------------------------------------------------------------------------------
# optimize on the problems.

@pytest.mark.slow
@pytest.mark.parametrize("stem", ["closure_mlp", "lstm_attr", "lstm_randn", "global_tensor"])
def test_optimize_verifies_model_code_against_a_fresh_float64_build(stem):
    fast = _opt(stem)
    v, r = fast.report.verification, fast.report
    assert v.ok, v.reason
    assert v.reference == "the float64 model (built afresh as the problem builds it, on the CPU)"
    assert 0 < v.err < 1e-5 and 0 < v.eager_err < 1e-5  # errors of float32 runs, not of another model or draw
    assert not r.fallback
    assert r.as_dict()["verification"]["reference"] == v.reference
    from fact_db.composition.report import markdown
    assert f"against {v.reference} (eager fp32:" in markdown(r)


def test_a_model_whose_state_reaches_its_output_is_not_verifiable_and_stays_as_it_was():
    mod = _load("rnn_mutates")
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    x, = mod.get_inputs()
    hidden = model.hidden
    fast = optimize(model, (x,), realizer=standin_realizer(), timer=lambda fn, xs: 1.0, peers=(), progress=False,
                    save=False)
    v = fast.report.verification
    assert not v.ok and v.reason.startswith("not verifiable: forward carries `hidden` from one call to the next")
    assert any("the composed module is not returned" in n for n in fast.report.notes)
    assert fast.choice == "eager"
    assert model.hidden is hidden  # optimize left the user's model in the state it was given
    y1, y2 = fast(x), fast(x)
    assert not torch.equal(y1, y2)  # eager: the second call starts from the state the first left


def test_a_model_whose_state_does_not_reach_its_output_verifies_from_its_state_as_built():
    fast = _opt("rnn_given_hidden")
    v = fast.report.verification
    assert v.ok, v.reason
    assert any("forward changes `hidden`, which its output does not depend on" in n for n in fast.report.notes)


def test_where_no_float64_run_exists_eager_is_the_reference_with_a_stricter_bound():
    from fact_db.composition.report import markdown
    from fact_db.kernels.verify import EAGER_REFERENCE_BOUND
    fast = _opt("float32_only")
    v = fast.report.verification
    assert v.ok, v.reason
    assert v.reference.startswith("eager fp32 (the float64 model raised TypeError: this model runs in float32 only")
    assert all(t.bound == EAGER_REFERENCE_BOUND["fp32"] for t in v.trials)
    assert v.eager_err == 0.0  # eager against itself, from the same state
    assert f"against {v.reference}" in markdown(fast.report)
    assert any(n.startswith(f"checked against {v.reference}, with the stricter bound") for n in fast.report.notes)

    broken = _opt("float32_only", realizer=standin_realizer(broken="bias_relu"))  # a GEMM that drops bias and ReLU
    assert not broken.report.verification.ok and "against eager fp32" in broken.report.verification.reason


def test_running_out_of_memory_after_discovery_returns_eager_with_the_reason(tmp_path):
    def realizer(disc, policy):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    mod, model, (x,) = _model("closure_mlp")
    fast = optimize(model, (x,), realizer=realizer, timer=lambda fn, xs: 1.0, peers=(), progress=False,
                    out=tmp_path / "art")
    r = fast.report
    assert r.fallback.startswith("the realize stage ran out of GPU memory (CUDA out of memory. Tried to allocate 8.00")
    assert any(n.startswith(r.fallback) and "one run on fresh inputs gives eager's output exactly" in n for n in r.notes)
    assert r.verification is None and fast.regions == []
    # what was returned is still timed against eager (the scoreboard's row takes its times from here)
    v = {x.name: x for x in r.variants}
    assert v["eager fp32"].ms == 1.0 and v["fact-db"].ms == 1.0 and v["fact-db"].err is None
    assert v["fact-db"].note.startswith("no error: no reference (optimize fell back to eager")
    assert f"eager PyTorch: {r.fallback}" in v["fact-db"].note
    assert "benchmark" in r.stages_s
    with torch.no_grad():
        assert torch.equal(fast(x), model(x))
    assert (Path(fast.artifact) / "report.md").read_text().count("Returned eager PyTorch under the `fp32` policy") == 1


def test_the_failed_stages_locals_are_freed_before_the_fallback_is_timed():
    """An exception's traceback keeps the failed stage's frames, and their locals: the choose
    stage's input sets, tens of GiB on KernelBench L1-45, which then ran out of memory again
    timing the eager module it fell back to. optimize clears those frames first."""
    import weakref

    class Big:
        pass
    refs, alive = [], []

    def realizer(disc, policy):
        held = Big()  # a local of the failing stage, as choose's input sets are
        refs.append(weakref.ref(held))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")

    def timer(fn, xs):
        alive.append(refs[0]() is not None)
        return 1.0
    _, model, (x,) = _model("closure_mlp")
    fast = optimize(model, (x,), realizer=realizer, timer=timer, peers=(), progress=False, save=False)
    assert fast.report.fallback.startswith("the realize stage ran out of GPU memory")
    assert alive and not any(alive)


def test_a_float64_reference_out_of_memory_falls_back_to_eager_and_says_so():
    class Big(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            if x.dtype == torch.float64:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
            return self.fc(x)
    m = Big().eval()
    ref = build_reference(m, m, "fp32", (torch.rand(4, 16),))
    assert ref.kind == "eager" and ref.label.startswith("eager fp32 (the float64 model ran out of GPU memory")


def test_any_failure_after_discovery_returns_eager_never_an_internal_error():
    def realizer(disc, policy):
        raise KeyError("a bug in a stage")
    _, model, (x,) = _model("lstm_attr")
    fast = optimize(model, (x,), realizer=realizer, timer=lambda fn, xs: 1.0, peers=(), progress=False, save=False)
    assert fast.report.fallback == "the realize stage failed: KeyError: 'a bug in a stage'"
    with torch.no_grad():
        assert torch.equal(fast(x), model(x))


# ------------------------------------------------------------------------------------------
# The half policies build their model the same way.

def test_bf16_runs_closures_plain_attributes_and_random_draws_in_bf16():
    from fact_db.composition.module import run_at_policy
    from fact_db.discovery.discover import discover
    from fact_db.pipeline.run import at_policy
    for stem in ("closure_mlp", "lstm_attr", "lstm_randn", "global_tensor"):
        mod, model, xs = _model(stem)
        notes: list = []
        half = at_policy(model, "bf16", build=lambda: mod.Model(*mod.get_init_inputs()), example_inputs=xs,
                         notes=notes)
        assert all(p.dtype == torch.bfloat16 for p in half.parameters()), stem
        assert run_at_policy(half, "bf16", xs).dtype == torch.float32  # eager at bf16 runs (it raised before)
        g = discover(half, tuple(x.to(torch.bfloat16) for x in xs)).graph
        dtypes = {n.dtype for n in g.calls() if n.op in ("aten.linear", "aten.lstm", "aten.matmul", "aten.mm")}
        assert dtypes <= {"bfloat16", None} and dtypes, (stem, dtypes)
        assert (stem in ("lstm_randn", "global_tensor")) == any("converts them to bfloat16" in n for n in notes)
    assert model.fc.weight.dtype == torch.float32  # the user's model is untouched


# ------------------------------------------------------------------------------------------
# Trials: one random state per trial, outputs compared piece by piece.

class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x) + torch.empty_like(x).uniform_()


def test_every_run_of_a_trial_starts_from_the_same_random_state():
    from fact_db.kernels.verify import verify_model
    model = Noisy()

    def draw(t):
        return (torch.rand(64),), "randn" if t % 2 else "like"
    ref = build_reference(model, model, "fp32", draw(0)[0])
    assert ref.kind == "float64"
    v = verify_model(model, model, ref, draw, "fp32")
    assert v.ok, v.reason
    assert all(t.err == t.eager_err and 0 < t.err < 1e-7 for t in v.trials)  # float32 rounding of one draw


def test_comparison_piece_by_piece_equals_the_whole(monkeypatch):
    from fact_db.kernels import agreement as ag
    g = torch.Generator().manual_seed(0)
    ref = (torch.randn(1000, dtype=torch.float64, generator=g), torch.randn(37, 3, dtype=torch.float64, generator=g))
    c = tuple((r * (1 + 1e-3 * torch.randn(r.shape, dtype=torch.float64, generator=g))).float() for r in ref)
    e = tuple((r * (1 + 1e-5 * torch.randn(r.shape, dtype=torch.float64, generator=g))).float() for r in ref)
    whole = ag.agreement(c, e, ref, 1e-4, "float32")
    monkeypatch.setattr(ag, "CHUNK", 7)
    pieces = ag.agreement(c, e, ref, 1e-4, "float32")
    flat = lambda t: torch.cat([x.double().reshape(-1) for x in t])  # noqa: E731
    direct = float((flat(c) - flat(ref)).norm() / flat(ref).norm())
    assert pieces.n == whole.n == 1111 and pieces.n_bad == whole.n_bad > 0
    assert pieces.err == pytest.approx(direct, rel=1e-9) and whole.err == pytest.approx(direct, rel=1e-9)
    assert pieces.max_diff == whole.max_diff and ag.tree_err(c, ref) == pytest.approx(direct, rel=1e-9)
    assert ag.tree_err(c[:1], ref) is None


def test_a_reference_that_fails_while_timing_leaves_the_errors_empty_and_says_why():
    from fact_db.pipeline.fallback import eager_module
    from fact_db.pipeline.measure import measure
    from fact_db.pipeline.run import like_drawer
    _, model, xs = _model("global_tensor")

    def ref(*x):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    fast = eager_module(model, "fp32", xs, xs, "Model")
    variants = measure(model, model, fast, "fp32", like_drawer(xs), ref, peers=(), timer=lambda fn, x: 1.0,
                       progress=False)
    assert [v.name for v in variants] == ["eager fp32", "fact-db"]
    assert all(v.err is None and v.ms == 1.0 and "the reference raised OutOfMemoryError" in v.note for v in variants)


def test_a_half_policy_copy_that_cannot_be_made_stops_before_tuning_with_one_sentence(monkeypatch):
    from fact_db.pipeline import recast as rc
    from fact_db.pipeline.results import OptimizeError

    def no_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(rc, "recast", no_memory)
    _, model, xs = _model("closure_mlp")
    with pytest.raises(OptimizeError, match=r"making the bf16 copy of Model failed \(OutOfMemoryError: CUDA out of"):
        optimize(model, xs, policy="bf16", realizer=standin_realizer(), progress=False, save=False)


def test_a_forward_that_writes_its_parameters_is_not_verifiable_and_optimize_still_returns():
    class Drifts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            with torch.no_grad():
                self.fc.weight.mul_(1.001)  # a model that updates itself as it runs
            return self.fc(x)
    m = Drifts().eval()
    x = torch.rand(4, 16)
    fast = optimize(m, (x,), realizer=standin_realizer(), timer=lambda fn, xs: 1.0, peers=(), progress=False,
                    save=False)
    v = fast.report.verification
    assert not v.ok and v.reason == ("not verifiable: forward writes parameter `fc.weight` in place, so two runs of "
                                     "the model never start from the same state")
    assert any(n.endswith("the model is left as its runs left it") for n in fast.report.notes)
    assert fast.regions == []  # eager


def test_a_model_in_training_mode_is_optimized_as_given_batchnorm_on_batch_statistics():
    """KernelBench builds its models in training mode and checks them there: optimize keeps
    the mode, so BatchNorm normalizes by the batch (not the running statistics), the GEMM
    region before it still runs on a kernel, and the report says how to optimize inference."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU())
    x = torch.randn(16, 32)
    before = model[1].running_mean.clone()
    fast = optimize(model, (x,), realizer=standin_realizer(), timer=lambda fn, xs: 1.0, peers=(), progress=False,
                    save=False)
    v = fast.report.verification
    assert v.ok, v.reason
    assert any(z.impl.kind == "gemm" for z in fast.report.regions)  # (nn.Sequential: its `input` composes)
    assert any("in training mode: its BatchNorm1d run as in training" in n for n in fast.report.notes)
    assert model.training and torch.equal(model[1].running_mean, before)  # the user's model as it was given
    y = fast(x)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)      # batch statistics, as in training
    assert not torch.allclose(y, model.eval()(x), atol=1e-3)           # not the running statistics
    model.train()
    eval_fast = optimize(model.eval(), (x,), realizer=standin_realizer(), timer=lambda fn, xs: 1.0, peers=(),
                         progress=False, save=False)
    assert not any("training mode" in n for n in eval_fast.report.notes)


def test_the_tuning_workers_give_their_gpu_memory_back_before_the_float64_model_is_placed(monkeypatch):
    """optimize closes the tuning workers' pool once realizing is done, before verification
    sizes the float64 model against the GPU's free memory: a worker keeps its jobs' tensors and
    its allocator's cache (KernelBench L1-63: verification then took 329 s of a 540 s budget)."""
    from fact_db.kernels import pool as pool_mod
    from fact_db.pipeline import verification
    events = []

    class Workers:          # a pool the realizer used, as pool.shared_pool keeps it
        def close(self):
            events.append("workers closed")

    def realizer(disc, policy):
        pool_mod._SHARED[("stand-in",)] = Workers()
        events.append("realized")
        return standin_realizer()(disc, policy)
    verify = verification.verify_end_to_end
    monkeypatch.setattr(verification, "verify_end_to_end",
                        lambda *a, **k: (events.append("verify"), verify(*a, **k))[1])
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).eval()
    fast = optimize(model, (torch.randn(4, 32),), realizer=realizer, timer=lambda fn, xs: 1.0, peers=(),
                    progress=False, save=False)
    assert fast.report.verification.ok
    assert events[:3] == ["realized", "workers closed", "verify"], events
    assert ("stand-in",) not in pool_mod._SHARED
