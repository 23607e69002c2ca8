"""The GEMM family (fact_db.kernels.family): GEMMs with fused epilogues, batched GEMMs, the
dual GEMM of SwiGLU and horizontal projections of one input, on the sm90 templates.

    >>> w, note = workload(region, graph, "fp32")     # a GemmWorkload from a discovered region
    >>> out = realize(w, region, Context(registry=reg))  # registry first, else tuned
    >>> out.impl.label, out.ms
"""
from __future__ import annotations

from fact_db.core.policy import POLICY_DTYPE
from fact_db.kernels.family import Context, Outcome
from fact_db.kernels.gemm.workload import GemmWorkload
from fact_db.kernels.impl import Impl, stored

NAME = "gemm"
IMPLS = ("gemm",)
JOBS = ("cutlass", "eager")

TEMPLATES = {"gemm_sm90"}
EPILOGUE_OF = {("none",): "none", ("bias",): "bias", ("bias", "relu"): "bias_relu", ("bias", "gelu"): "bias_gelu",
               ("bias", "gelu_tanh"): "bias_gelu_tanh", ("bias", "silu"): "bias_silu",
               ("bias", "residual"): "residual"}


def _dual(region) -> bool:
    return (region.template or "").startswith("dual_gemm")


def claims(region) -> bool:
    """Whether a discovered region is this family's: a GEMM template, or SwiGLU's dual GEMM."""
    return region.template in TEMPLATES or (_dual(region) and bool(region.operands) and not region.composable)


def plan_region(region, policy: str) -> tuple[GemmWorkload | None, str]:
    """(workload, note) of a GEMM-family region; (None, why) where the templates cannot express it.

    The epilogue and operand layouts come from the region, as discovery read them."""
    r = region
    if _dual(r) and r.operands and not r.composable:
        # On Hopper: one GEMM over the concatenated gate and up weights (x read once, one
        # launch); SiLU and the product stay in PyTorch, in place in its output. Held N x K
        # (K-major) for a Linear's weights, and for K x N ones under the float32 policies.
        p = r.problem
        kmajor = r.attrs.get("b_layout") == "nk" or POLICY_DTYPE[policy] == "float32"
        w = GemmWorkload(p["M"], 2 * p["N"], p["K"], 1, policy=policy, layout_a="row",
                         layout_b="col" if kmajor else "row", epilogue="none", rule="gemm")
        return w, ("one GEMM over the concatenated gate and up weights; SiLU and the product in PyTorch, in place "
                   "in its output")
    if r.template not in TEMPLATES:
        return None, (f"template {r.template}: not realized yet by the GEMM family (`factdb realize` tunes GEMMs; "
                      "`factdb optimize` realizes every family)")
    # A constant scale is the kernel's alpha (discovery read it into attrs), not an epilogue of its own.
    epi = EPILOGUE_OF.get(tuple(e for e in r.epilogue or [] if e != "scale") or ("none",))
    p = r.problem
    la, lb = r.layouts.get("a", "row"), r.layouts.get("b", "row")
    if epi is None or la not in ("row", "col") or lb not in ("row", "col"):
        return None, f"epilogue or layout not supported by the GEMM templates ({la}, {lb})"
    # Projections of one input (gemm-horizontal) are one plain GEMM over their concatenated
    # weights: keyed as that GEMM (the rule its epilogue implies), so the registry's rows
    # for the shape serve it and what is tuned for it serves them.
    rule = "gemm" if r.attrs.get("members") else r.rule
    if r.attrs.get("einsum"):  # an einsum lowered to a GEMM is keyed as the GEMM it is
        rule = "gemm" if p.get("batch", 1) == 1 else "batched-gemm"
    note = ""
    if lb == "row" and r.attrs.get("b_weight") and POLICY_DTYPE[policy] == "float32" and p.get("batch", 1) == 1:
        # A K x N weight (GPT-2's Conv1D, `x @ W`): the float32 kernels read B K-major (TF32
        # MMAs, the lo parts made once), so composition holds the weight transposed once.
        lb, note = "col", "the K x N weight is held transposed (N x K) once, for the K-major kernels"
    try:
        w = GemmWorkload(p["M"], p["N"], p["K"], p.get("batch", 1), policy=policy, layout_a=la, layout_b=lb,
                         epilogue=epi, rule=rule)
    except Exception as e:  # noqa: BLE001  (a workload the templates cannot express: say why)
        return None, str(e)
    return w, note


def workload(region, graph, policy: str):
    if not claims(region):
        return None
    return plan_region(region, policy)


def owns(w) -> bool:
    return isinstance(w, GemmWorkload)


def answer(registry, w: GemmWorkload, arch: str, gpu: str) -> tuple[str, float | None]:
    """hit (an exact, current row, with its time), near (D) (the nearest compatible shape at
    distance D), stale (its template or environment changed) or miss."""
    hit = registry.lookup(w.key(arch, gpu))
    if hit is None:
        return "miss", None
    if hit.stale:
        return "stale", None
    return ("hit", hit.record.time_ms or None) if hit.exact else (f"near ({hit.distance:.2f})", None)


def prebuild(workloads: list, ctx: Context) -> set:
    """Every GEMM region's candidates compiled in one parallel batch, not region by region; the
    workloads with a candidate built."""
    if "runner" in ctx.hooks or not workloads:
        return set()
    from fact_db.kernels.gemm.tune import prebuild as tune_prebuild
    return tune_prebuild(list(dict.fromkeys(workloads)), arch=ctx.arch, gpu=ctx.gpu_name, registry=ctx.registry,
                         max_candidates=ctx.max_candidates, force=ctx.force, progress=ctx.progress,
                         deadline=ctx.deadline)


def impl_of(result, w: GemmWorkload, library: bool = True) -> Impl:
    """The Impl of a tuned GEMM region: its winner's kernel op; where the library (the tuner's
    `eager` candidate) won, the library path with a kernel op's signature
    (kernel.library_gemm_op: cuBLAS and the activation as one op, which is what was timed),
    or, with `library=False` (the dual GEMM, whose library path is two GEMMs), the model's
    own ops."""
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec, library_gemm_op
    from fact_db.kernels.gemm.tune import spec_of
    win = result.winner if result is not None else None
    if win is None:
        return Impl.eager("no candidate verified")
    c = win.candidate
    if c.template == "eager":
        t = f" ({win.time_ms:.3f} ms)" if win.time_ms else ""
        if not library:
            return Impl.eager(f"eager is the fastest verified candidate{t}")
        act = {"none": "", "bias": "", "residual": " + residual add"}.get(w.epilogue, f" + {w.epilogue[5:]}")
        return Impl("gemm", f"library: cuBLAS {'addmm' if w.epilogue != 'none' else 'matmul'}{act}",
                    library_gemm_op(w.epilogue), {"library": "cublas", "spec": {"epilogue": w.epilogue}},
                    note=f"the library is the fastest verified candidate{t}")
    spec = spec_of(w, c)
    k = GemmKernel(win.so, c.template, GemmSpec(**spec), c.options, build_key=win.build_key)
    key = w.key(result.arch, result.gpu)
    return Impl.gemm_kernel(k, c.label, {
        "template": c.template, "spec": spec, "options": list(c.options or ()), "build_key": win.build_key,
        "so": str(win.so), "config": c.config, "registry_key": key.as_dict(), "registry_digest": key.digest(),
        "op": f"factdb::{k.op_name}"})


def realize(w: GemmWorkload, region, ctx: Context) -> Outcome:
    """Tuned (registry first); out of budget, what the registry has, else skipped."""
    from fact_db.kernels.gemm.tune import from_registry, tune
    res = None
    if not ctx.may_tune(w):
        res = from_registry(w, ctx.registry, arch=ctx.arch, gpu=ctx.gpu_name) if ctx.registry is not None else None
        out = Outcome(Impl.eager(), "registry" if res else "skipped")
        if res is None:
            out.notes.append("skipped: the tuning budget was spent; eager serves it")
    else:
        res = tune(w, arch=ctx.arch, gpu=ctx.gpu, registry=ctx.registry, max_candidates=ctx.max_candidates,
                   gpus=ctx.gpus, runner=ctx.hooks.get("runner"), force=ctx.force, progress=ctx.progress)
        out = Outcome(Impl.eager(), "registry" if res.from_registry else "tuned",
                      candidates=0 if res.from_registry else len(res.trials))
    if res is not None:
        out.tune = res
        out.impl = impl_of(res, w, library=not _dual(region))
        out.notes += res.notes
        if res.eager:
            out.eager_ms, out.eager_err = res.eager.time_ms, res.eager.err
        if res.winner:
            out.ms, out.err = res.winner.time_ms, res.winner.err
    return out


# ------------------------------------------------------------------------------------------
# In the worker process.

def run_job(job: dict, cache: dict) -> dict:
    """Verify one candidate (`cutlass`: a built library; `eager`: the library path) against
    float64 under the policy, then time it on rotating input sets."""
    import json
    import os

    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec
    from fact_db.kernels.verify import verify

    w = GemmWorkload(**job["workload"])
    if job["kind"] == "eager":
        def run(inputs, out=None):
            y = w.eager(inputs)
            if out is not None:
                out.copy_(y)
            return y
    else:
        k = GemmKernel(job["so"], job["template"], GemmSpec(**job["spec"]),
                       tuple(job["options"]) if job.get("options") else None)

        def run(inputs, out=None):
            return k(inputs["a"], inputs["b"], bias=inputs.get("bias"), c=inputs.get("c"),
                     alpha=1.0, beta=1.0 if "c" in inputs else 0.0, out=out)
    verdict = verify(run, w, trials=job.get("trials", 5))
    res = {"id": job["id"], "err": verdict.err, "eager_err": verdict.eager_err,
           "device": torch.cuda.get_device_name(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
           "uuid": str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))}
    if not verdict.ok:
        status = "launch_error" if verdict.reason.startswith("launch failed") else "verify_failed"
        return {**res, "status": status, "error": verdict.reason}
    wk = json.dumps(job["workload"], sort_keys=True)
    if cache.get("key") != wk:
        cache.clear()
        torch.cuda.empty_cache()
        cache["key"] = wk
        cache["sets"] = [w.make_inputs("randn") for _ in range(INPUT_SETS)]
    t = time_cuda(run, cache["sets"], reps=job.get("reps", 20))
    return {**res, "status": "ok", "time_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
            "error": ""}


INPUT_SETS = 3


# ------------------------------------------------------------------------------------------
# From an artifact.

def load(path, record: dict) -> Impl:
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec
    k = GemmKernel(path, record["template"], GemmSpec(**record["spec"]), tuple(record.get("options") or ()) or None,
                   build_key=record["build_key"])
    return Impl.gemm_kernel(k, record.get("label", ""), stored(record))


def reverify(path, impl: Impl, record: dict) -> tuple[bool, str]:
    """The tuner's own check (kernels.verify against float64 under the policy), in this process."""
    from fact_db.kernels.verify import verify
    key = record.get("registry_key") or {}
    w = GemmWorkload(key["m"], key["n"], key["k"], key.get("batch", 1), policy=key["policy"],
                     layout_a=key["layout_a"], layout_b=key["layout_b"], epilogue=key["epilogue"])
    op = impl.op

    def run(inputs, out):
        out.copy_(op(inputs["a"], inputs["b"], inputs.get("bias"), inputs.get("c"), 1.0, 1.0 if "c" in inputs else 0.0))
    v = verify(run, w)
    return v.ok, v.reason


def library(record: dict) -> Impl | None:
    """cuBLAS with the epilogue's activation, where the tuner found the library fastest."""
    if record.get("library") != "cublas":
        return None
    from fact_db.kernels.gemm.kernel import library_gemm_op
    return Impl("gemm", record.get("label", ""), library_gemm_op(record["spec"]["epilogue"]), record)
