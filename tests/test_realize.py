"""Realize (stages 1 and 2 on a model) without a GPU: the plan from discovery to workloads,
repeated workloads tuned once, regions reported as they finish, and `factdb realize`."""
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fact_db.kernels import build
from fact_db.kernels.gemm import tune as tune_mod
from fact_db.cli.main import cli
from fact_db.discovery.discover import discover_problem
from fact_db.realization.realize import plan, realize_problem

from conftest import PROBLEMS


def test_plan_turns_gemm_regions_into_workloads_and_notes_the_rest():
    report = discover_problem(str(PROBLEMS / "mingpt_block.py"), arch="sm90", policy="bf16")
    planned = plan(report, "bf16")
    assert len(planned) == len(report.regions)
    gemms = [(p.region.rule, p.workload.shape, p.workload.epilogue) for p in planned if p.workload]
    assert gemms == [("gemm-bias", "65536x2304x768", "bias"), ("gemm-residual", "65536x768x768", "residual"),
                     ("gemm-bias-gelu-tanh", "65536x3072x768", "bias_gelu_tanh"),
                     ("gemm-residual", "65536x768x3072", "residual")]
    assert all(p.workload.policy == "bf16" and p.workload.dtype == "bfloat16" for p in planned if p.workload)
    # nn.Linear keeps its weight (out, in): B is column-major, used in place
    assert {(p.workload.layout_a, p.workload.layout_b) for p in planned if p.workload} == {("row", "col")}
    others = [p for p in planned if p.workload is None]
    assert {p.region.rule for p in others} == {"layernorm", "attention-causal"}
    assert all("not realized yet" in p.note and p.region.template in p.note for p in others)


def fake_build(sources, **kw):
    """Stands in for nvcc: every source 'builds'."""
    return [build.Built(s, build.content_key(s), Path("/nonexistent/k.so")) for s in sources]


def test_realize_tunes_a_repeated_workload_once_and_reports_each_region_in_order(monkeypatch):
    monkeypatch.setattr(tune_mod.build_mod, "build", fake_build)
    timed = []

    def runner(jobs):
        timed.append(len(jobs))
        return [{"id": j["id"], "status": "ok", "time_ms": 1.0 if j["kind"] == "eager" else 0.9 + 0.01 * j["id"],
                 "err": 1e-3, "device": "NVIDIA H100 80GB HBM3"} for j in jobs]

    seen = []
    # Without horizontal fusion, Llama's K and V projections are two regions with one workload.
    from fact_db.discovery.rules import RuleSet, load_rules
    shipped = load_rules()
    rules = RuleSet([r for r in shipped if r.id != "gemm-horizontal"], shipped.fragments)
    report, results = realize_problem(str(PROBLEMS / "llama_block.py"), policy="bf16", runner=runner, gpu="h100",
                                      max_candidates=4, progress=False, on_result=lambda p, r: seen.append((p, r)),
                                      rules=rules)
    assert seen == results and len(results) == len(report.regions)
    tuned = [(p, r) for p, r in results if p.workload is not None]
    distinct = {p.workload for p, _ in tuned}
    # q, k, v, o projections, the SwiGLU gate+up pair as one GEMM over concatenated weights, the down projection;
    # the K and V projections are the same 2048x512x2048 GEMM, tuned once
    assert len(tuned) == 6 and len(distinct) == 5
    assert len(timed) == 5
    k, v = [(p, r) for p, r in tuned if p.workload.shape == "2048x512x2048"]
    assert v[1] is k[1] and v[0].note == f"same workload as region {results.index(k) + 1}: tuned once"
    assert all(r.winner is not None and r.winner.time_ms < 1.0 for _, r in tuned)
    assert all(r is None and p.note for p, r in results if p.workload is None)


@pytest.mark.slow
def test_realize_cli_lists_every_region_and_needs_no_gpu_with_compile_only():
    res = CliRunner().invoke(cli, ["realize", str(PROBLEMS / "llama_block.py"), "--policy", "bf16",
                                   "--compile-only", "--max-candidates", "1", "--no-registry"])
    assert res.exit_code == 0, res.output
    assert res.output.count("== ") == 7
    assert "max_candidates 1: eager only" in res.output
    assert "skipped: template rmsnorm: not realized yet" in res.output
    assert "gemm-horizontal" in res.output and "2048x3072x2048" in res.output  # q, k and v as one GEMM
    j = CliRunner().invoke(cli, ["realize", str(PROBLEMS / "llama_block.py"), "--policy", "bf16", "--compile-only",
                                 "--max-candidates", "1", "--no-registry", "--json"])
    assert j.exit_code == 0, j.output
    regions = json.loads(j.stdout)["regions"]
    assert len(regions) == 7 and sum(r["tune"] is not None for r in regions) == 4
    assert {r["tune"]["workload"]["policy"] for r in regions if r["tune"]} == {"bf16"}


@pytest.mark.slow
def test_realize_without_a_gpu_says_so_and_points_at_compile_only():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = CliRunner().invoke(cli, ["realize", str(PROBLEMS / "square_gemm_fp32.py"), "--policy", "bf16",
                                   "--no-registry"])
    assert res.exit_code != 0 and "no CUDA GPU is visible" in res.output and "--compile-only" in res.output


@pytest.mark.parametrize("hit", [True, False])
def test_an_attention_region_served_by_the_registry_says_so(hit):
    """realize_regions reports `how` registry for an attention region whose winner came from
    the registry (a warm re-run), tuned otherwise (the chooser stands in for the tuner)."""
    from fact_db.realization.realize import realize_regions
    rep = discover_problem(str(PROBLEMS / "sdpa_attention.py"), arch="sm90", policy="bf16")
    best = {"label": "sdpa", "kind": "sdpa", "ok": True, "ms": 0.2, "err": 1e-3, "eager_err": 1e-3, "note": "",
            "template": "", "config": None, "so": "", "build_key": "", "from_registry": hit}
    rows = [best, {**best, "label": "explicit", "kind": "eager", "ms": 0.5, "from_registry": False}]
    [rz] = [z for z in realize_regions(rep, "bf16", attention_chooser=lambda w: (rows, best), progress=False)
            if z.workload is not None]
    assert rz.how == ("registry" if hit else "tuned") and rz.ms == 0.2 and rz.eager_ms == 0.5


class _Upcasts(torch.nn.Module):
    """A bf16 model that computes two regions in float32 on purpose, as routers and norms do:
    a projection of an upcast and attention over upcast q, k, v; and one of each in bf16."""

    def __init__(self, width=64):
        super().__init__()
        self.router = torch.nn.Linear(width, 8, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        logits = torch.nn.functional.linear(x.float(), self.router.weight.float())
        q = x.view(2, 16, 4, 16).transpose(1, 2)
        up = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float())
        half = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return self.proj(x), logits, up, half


def test_regions_a_bf16_model_computes_in_float32_stay_eager_with_the_reason():
    """optimize traces the model as the policy runs it; a region whose operands the model upcast
    to float32 would hand the bf16 kernels float32: it stays eager, saying why. Traced as
    written (float32), every region is the policy's."""
    from fact_db.discovery.discover import analyse
    from fact_db.discovery.rules import load_rules
    from fact_db.discovery.trace import trace_module
    from fact_db.realization.realize import workload_of
    model, x = _Upcasts().eval(), torch.randn(2, 16, 64)

    def workloads(m, inp):
        rep = analyse(trace_module(m, (inp,)), load_rules(), arch="sm90", policy="bf16")
        return [(r.rule, *workload_of(r, p, rep.graph, "bf16")) for r, p in zip(rep.regions, plan(rep, "bf16"))]
    as_written = workloads(model, x)
    assert len(as_written) == 4 and all(w is not None and w.dtype == "bfloat16" for _, w, _ in as_written)
    as_run = workloads(model.bfloat16(), x.bfloat16())
    kept = sorted(rule for rule, w, _ in as_run if w is not None)
    eager = [(rule, why) for rule, w, why in as_run if w is None]
    assert len(kept) == 2 and len(eager) == 2
    assert all("is float32 in a model run at bf16" in why and "eager runs it" in why for _, why in eager)
    assert {rule for rule, _ in eager} == set(kept)  # one GEMM and one attention of each kind
