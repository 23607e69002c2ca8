"""The norm family (fact_db.kernels.family): LayerNorm and RMSNorm over the last dimension (or
the flattened trailing ones), with the residual add before them fused in; eager always among
the candidates.

    >>> w, note = workload(region, graph, "fp32")      # a NormWorkload from a norm region
    >>> out = realize(w, region, Context(registry=reg))
"""
from __future__ import annotations

from dataclasses import asdict

from fact_db.core.policy import HALF_POLICIES
from fact_db.kernels.family import Context, Outcome, build_batch, registry_first, stored_winner, traced_half
from fact_db.kernels.impl import Impl, stored
from fact_db.kernels.norm.workload import ELEMENT, TEMPLATE, NormError, NormWorkload

NAME = "norm"
IMPLS = ("norm",)
JOBS = ("norm",)
TEMPLATES = {"add_norm", "layernorm", "rmsnorm"}


def workload(region, graph, policy: str):
    """The NormWorkload of a LayerNorm / RMSNorm region, with or without the residual add
    before it; (None, why) where the region is a norm the add_norm kernel cannot take (an eps
    that is not a constant, a norm over a dimension other than the last ones, a weight that
    is not one value per normalized element, a row too long to hold in registers, a dtype
    the template does not take); None for a region of another family.

    A norm over several trailing dimensions (attrs["normalized"], LayerNorm((C, H, W))) is one
    norm over rows of their product; a norm without a weight gets ones from composition."""
    from math import prod
    if region.template not in TEMPLATES:
        return None
    ops, attrs = region.operands, region.attrs
    if "x" not in ops:
        return None, "norm input unknown"
    eps = attrs.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None, "the norm's eps is not a constant"
    try:
        x = graph[ops["x"]]
        wt = graph[ops["weight"]] if "weight" in ops else None
        bias = graph[ops["bias"]] if "bias" in ops else None
    except (KeyError, TypeError):
        return None, "norm operand shapes unknown"
    if not x.shape:
        return None, "norm input shape unknown"
    dim = attrs.get("dim", -1)
    if dim != -1:
        shown = dim + len(x.shape) if isinstance(dim, int) else dim
        return None, (f"a norm over dim {shown} of {list(x.shape)}, not the last: the add_norm kernel normalizes "
                      "contiguous rows, so eager runs it")
    nd = int(attrs.get("normalized", 1) or 1)
    inner = tuple(x.shape[-nd:])
    for name, t in (("weight", wt), ("bias", bias)):
        if t is not None and tuple(t.shape or ()) not in (inner, (prod(inner),)):
            return None, (f"norm over {list(inner)} of {list(x.shape)} with a {name} of shape {list(t.shape or ())}: "
                          f"one {name} per normalized element needed")
    dtype = run_dtype(x, graph, policy)
    if dtype not in ELEMENT:
        return None, f"norm on {dtype}: the add_norm template takes {', '.join(ELEMENT)}"
    if "res" in ops:
        try:
            if graph[ops["res"]].shape != x.shape:
                return None, "the residual's shape differs from the input's"
        except (KeyError, TypeError):
            return None, "the residual's shape is unknown"
    kind = attrs.get("kind") or ("rmsnorm" if region.template == "rmsnorm" else "layernorm")
    try:
        w = NormWorkload(kind, rows=prod(x.shape[:-nd]), width=prod(inner), residual="res" in ops,
                         write_sum="res" in ops and bool(attrs.get("sum")), eps=float(eps), dtype=dtype,
                         policy=policy, has_bias="bias" in ops)
    except NormError as e:
        return None, str(e)
    from fact_db.kernels.norm.tune import MAX_ROW_VALUES, candidates
    if not candidates(w):
        return None, (f"rows of {w.width} elements: the add_norm kernel holds a row in registers, at most "
                      f"{MAX_ROW_VALUES} {dtype} values, so eager runs it")
    return w, ""


def run_dtype(x, graph, policy: str) -> str:
    """The dtype a norm's input has when the model runs under `policy`. A half policy runs
    the model in its dtype, so a graph traced as written (float32: `factdb discover` and
    `plan`) says the policy's. A graph traced as the policy runs it (`optimize` traces the
    model cast to bf16) says it itself: a float32 input there is one the model upcasts on
    purpose (HF Llama's RMSNorm, `x.to(torch.float32)` before the norm and the cast back after
    it), and the kernel must take float32 (given bf16's, it refused the float32 it was handed)."""
    half = HALF_POLICIES.get(policy)
    if half is None or traced_half(graph, policy):
        return x.dtype
    return half


def owns(w) -> bool:
    return isinstance(w, NormWorkload)


def answer(registry, w: NormWorkload, arch: str, gpu: str) -> tuple[str, float | None]:
    """hit with the winner's time, stale (another environment, or its template changed), or miss."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None:
        return "miss", None
    return ("stale", None) if hit.stale else ("hit", hit.record.time_ms)


def limit(ctx: Context) -> int:
    """Kernel candidates a norm workload gets: ctx.max_candidates with eager counted among
    them (the ViT of KernelBench L3-28 compiled twelve for its twelve LayerNorms' one workload
    under --max-candidates 4, half of the kernels its realize built)."""
    from fact_db.kernels.norm.tune import MAX_CANDIDATES
    return max(1, min(MAX_CANDIDATES, ctx.max_candidates - 1))


def prebuild(workloads: list, ctx: Context) -> set:
    """Every norm region's candidates compiled in one parallel batch (the tuner then finds them
    in the build cache); a failed build is recorded by the tuner, not here. Returns the
    workloads with a candidate built."""
    if "norm" in ctx.hooks:
        return set()
    from fact_db.kernels import build
    from fact_db.kernels.norm.tune import candidates, render
    return build_batch([(w, build.Source(TEMPLATE, render(w, c), ctx.arch)) for w in dict.fromkeys(workloads)
                        for c in candidates(w, limit=limit(ctx))], ctx)


def tune_region(w: NormWorkload, ctx: Context, tune: bool = True):
    """(trials, best, how) for norm workload `w`: the registry's winner first (a kernel's library
    from the build cache, built again when it is not there), else tune.tune_norm (every
    candidate and eager verified against float64 and timed in the worker; the winner written
    to the registry). `best` is a NormTrial (candidate None: eager won) or None; `how` is
    "registry", "tuned", or "skipped" where `tune` is off and the registry has nothing usable.
    With a team registry the workload is claimed while it is tuned (registry.claim)."""
    return registry_first(w, ctx, tune, lambda: _stored(w, ctx), lambda: _tune(w, ctx))


def _stored(w: NormWorkload, ctx: Context):
    """(trials, best, "registry") from the registry's current winner, or None."""
    from fact_db.kernels.norm import tune as norm_tune
    hit = norm_tune.from_registry(w, ctx.registry, ctx.arch, ctx.gpu_name)
    return stored_winner(hit, hit.candidate if hit else None,
                         lambda c: norm_tune.build_candidates(w, [c], arch=ctx.arch, progress=ctx.progress)[c])


def _tune(w: NormWorkload, ctx: Context):
    from fact_db.kernels.norm import tune as norm_tune
    trials = norm_tune.tune_norm(w, norm_tune.candidates(w, limit=limit(ctx)), arch=ctx.arch, registry=ctx.registry,
                                 gpu=ctx.gpu_name, gpus=ctx.gpus, progress=ctx.progress)
    return trials, next((t for t in trials if t.status == "ok"), None), "tuned"


def impl_of(w: NormWorkload, best) -> Impl:
    """The Impl of a tuned norm region: its winner's kernel op, or eager."""
    from fact_db.kernels.norm.kernel import NormKernel
    if best is None:
        return Impl.eager("no norm candidate verified")
    if best.candidate is None:
        return Impl.eager(f"eager is the fastest verified candidate ({best.time_ms:.3f} ms)" if best.time_ms else
                          "eager is the fastest verified candidate")
    k = NormKernel(best.so, w, build_key=best.build_key)
    return Impl("norm", f"{TEMPLATE} {best.label}", k.as_op(), {
        "template": TEMPLATE, "config": asdict(best.candidate), "workload": w.as_dict(), "build_key": best.build_key,
        "so": str(best.so), "registry_key": w.key_fields(), "op": f"factdb::{k.op_name}"})


def realize(w: NormWorkload, region, ctx: Context) -> Outcome:
    if not ctx.may_tune(w):  # what the registry has, nothing tuned
        trials, best, how = tune_region(w, ctx, tune=False)
    else:
        chooser = ctx.hooks.get("norm") or (lambda w: tune_region(w, ctx))
        trials, best, how = chooser(w)
    if how == "skipped":
        return Outcome(Impl.eager(), how, notes=["skipped: the tuning budget was spent; eager serves it"])
    out = Outcome((ctx.hooks.get("norm_impl") or impl_of)(w, best), how, candidates=len(trials) if how == "tuned" else 0)
    eager = next((t for t in trials if t.label == "eager" and t.status == "ok"), None)
    if eager is not None:
        out.eager_ms, out.eager_err = eager.time_ms, eager.err
    if best is not None:
        out.ms, out.err = best.time_ms, best.err
    out.notes += [f"{t.label}: {'%.3f ms' % t.time_ms if t.time_ms else t.error or t.status}" for t in trials]
    return out


def run_job(job: dict, cache: dict) -> dict:
    """A norm candidate (`so` set) or eager (`so` empty), verified and timed in the worker."""
    import os

    from fact_db.kernels.norm.tune import evaluate_one
    res = evaluate_one(NormWorkload(**job["workload"]), job.get("so") or None, job.get("trials", 4),
                       job.get("reps", 30))
    return {"id": job["id"], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), **res}


# ------------------------------------------------------------------------------------------
# From an artifact.

def load(path, record: dict) -> Impl:
    from fact_db.kernels.norm.kernel import NormKernel
    k = NormKernel(path, NormWorkload(**record["workload"]), build_key=record["build_key"])
    return Impl("norm", record.get("label", ""), k.as_op(), stored(record))


def reverify(path, impl: Impl, record: dict) -> tuple[bool, str]:
    """The norm tuner's check (float64 reference, y and the sum), in this process."""
    from fact_db.kernels.norm.tune import evaluate_one
    res = evaluate_one(NormWorkload(**record["workload"]), str(path), reps=1)
    return res.get("status") == "ok", res.get("error", "")


def library(record: dict) -> Impl | None:
    return None
