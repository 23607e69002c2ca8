"""Realize: stages 1 and 2 on a model -- discover its regions, turn each GEMM-family region
into a workload, and tune it (registry first).

>>> results = realize_problem("benchmarks/problems/square_gemm_fp32.py", policy="tf32", registry=reg)

Regions whose template is not in the GEMM family (attention, norms, dual GEMM, GEMM +
softmax) are listed with a note: stage 2 realizes the GEMM family today.
"""
from __future__ import annotations

from dataclasses import dataclass

from .workload import GemmWorkload

GEMM_TEMPLATES = {"gemm_sm90"}
EPILOGUE_OF = {("none",): "none", ("bias",): "bias", ("bias", "relu"): "bias_relu", ("bias", "gelu"): "bias_gelu",
               ("bias", "gelu_tanh"): "bias_gelu_tanh", ("bias", "silu"): "bias_silu",
               ("bias", "residual"): "residual"}


@dataclass
class Planned:
    region: object            # discover.Region
    workload: GemmWorkload | None
    note: str = ""


def plan(report, policy: str) -> list[Planned]:
    """One workload per GEMM-family region of a discovery report (None with a note otherwise).

    The epilogue and operand layouts come from the region, as discovery read them."""
    out = []
    for r in report.regions:
        if r.template not in GEMM_TEMPLATES:
            out.append(Planned(r, None, f"template {r.template}: not realized yet (stage 2 covers the GEMM family)"))
            continue
        epi = EPILOGUE_OF.get(tuple(r.epilogue or ["none"]))
        p = r.problem
        la, lb = r.layouts.get("a", "row"), r.layouts.get("b", "row")
        if epi is None or la not in ("row", "col") or lb not in ("row", "col"):
            out.append(Planned(r, None, f"epilogue or layout not supported by the GEMM templates ({la}, {lb})"))
            continue
        try:
            w = GemmWorkload(p["M"], p["N"], p["K"], p.get("batch", 1), policy=policy, layout_a=la, layout_b=lb,
                             epilogue=epi, rule=r.rule)
        except Exception as e:  # noqa: BLE001  (a workload the templates cannot express: say why)
            out.append(Planned(r, None, str(e)))
            continue
        out.append(Planned(r, w))
    return out


def realize_problem(problem: str, *, policy: str = "tf32", arch: str = "sm90a", registry=None, on_result=None,
                    **tune_kw):
    """Discover `problem` and tune every GEMM-family region. Returns (report, [(Planned, TuneResult | None)]).

    Regions with the same workload (a Llama block's K and V projections) are tuned once and
    share the result; `on_result(planned, result)` is called as each region is done, in order.
    """
    from .discover import discover_problem
    from .tune import tune
    report = discover_problem(problem, arch="sm90", policy=policy)
    results = []
    done: dict[GemmWorkload, tuple[int, object]] = {}
    for i, p in enumerate(plan(report, policy)):
        r = None
        if p.workload is not None:
            if p.workload in done:
                j, r = done[p.workload]
                p.note = f"same workload as region {j + 1}: tuned once"
            else:
                r = tune(p.workload, arch=arch, registry=registry, **tune_kw)
                done[p.workload] = (i, r)
        results.append((p, r))
        if on_result is not None:
            on_result(p, r)
    return report, results
