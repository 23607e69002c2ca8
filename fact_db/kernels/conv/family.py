"""The convolution family (fact_db.kernels.family): forward 1-D, 2-D and 3-D convolutions with their
bias, a folded eval-mode BatchNorm and the element-wise chain after them, on the sm90
implicit-GEMM template; cuDNN (eager at the policy) always among the candidates.

    >>> w, note = workload(region, graph, "bf16")     # a ConvWorkload from a conv region
    >>> out = realize(w, region, Context(registry=reg))

Grouped and depthwise convolutions, output channel counts TMA cannot address, and the few
strided transposed ones the phases cannot take (kernel.why_not), are keyed and timed like the
others with cuDNN as their only candidate, so the registry remembers that the library serves
them.
"""
from __future__ import annotations

from dataclasses import asdict

from fact_db.core.policy import HALF_POLICIES
from fact_db.discovery.conv import geometry
from fact_db.kernels.conv.kernel import TEMPLATE, ConvConfig, why_not
from fact_db.kernels.conv.layout import arrives_channels_last, converted_anyway
from fact_db.kernels.conv.workload import ELEMENT, ConvError, ConvWorkload, canonical_chain
from fact_db.kernels.family import Context, Outcome, build_batch, registry_first, stored_winner
from fact_db.kernels.impl import Impl, stored

NAME = "conv"
IMPLS = ("conv",)
JOBS = ("conv",)


def _geometry_ok(node, dtype: str) -> bool:
    """Would this family's kernel compute `node` (a conv of the discovery graph)?"""
    g = geometry(node)
    if g is None or g["why"]:
        return False
    try:
        return not why_not(ConvWorkload(g["n"], g["c"], g["k"], g["input"], g["filter"], g["stride"], g["padding"],
                                        g["dilation"], g["output_padding"], g["groups"], g["transposed"], dtype=dtype))
    except ConvError:
        return False


def layout_of(x_node, dtype: str, region_nodes=()) -> str:
    """`nhwc` where the activation comes from another convolution this family computes through
    ops that keep channels-last (kernels/conv/layout.py), or where another such convolution
    outside this region reads it too (kernels/conv/layout.py: converted_anyway), so the one
    conversion composition makes is shared and not this region's cost; else `nchw`."""
    first = lambda n: next(iter(n.tensor_inputs()), None)  # noqa: E731
    computable = lambda n: _geometry_ok(n, dtype)  # noqa: E731
    if arrives_channels_last(x_node, computable, lambda n: n.op, first):
        return "nhwc"
    mine = set(region_nodes)
    others = [u for u in x_node.users if u.name not in mine]
    return "nhwc" if converted_anyway(x_node, others, computable, lambda n: n.op, first) else "nchw"


def workload(region, graph, policy: str):
    """The ConvWorkload of a conv region ((None, why) when discovery found it unusable);
    None for a region of another family."""
    if region.template != TEMPLATE:
        return None
    g, ops = region.attrs.get("geometry"), region.operands
    if not g or "x" not in ops:
        return None, region.composable or "conv operands unknown"
    try:
        x = graph[ops["x"]]
    except (KeyError, TypeError):
        return None, "the convolution's input is not in the graph"
    dtype = HALF_POLICIES.get(policy, x.dtype)
    if dtype not in ELEMENT:
        return None, f"convolution on {dtype}: the conv template takes {', '.join(ELEMENT)}"
    try:
        w = ConvWorkload(g["n"], g["c"], g["k"], g["input"], g["filter"], g["stride"], g["padding"], g["dilation"],
                         g["output_padding"], g["groups"], g["transposed"],
                         bias="bias" in ops or "bn_mean" in ops, chain=canonical_chain(region.attrs.get("chain") or []),
                         dtype=dtype, policy=policy, layout=layout_of(x, dtype, region.nodes), rule=region.rule)
    except ConvError as e:
        return None, str(e)
    why = why_not(w)
    return w, (f"cuDNN only: {why}" if why else "")


def owns(w) -> bool:
    return isinstance(w, ConvWorkload)


def answer(registry, w: ConvWorkload, arch: str, gpu: str) -> tuple[str, float | None]:
    """hit with the winner's time, stale (another environment, or its template changed), or miss."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None:
        return "miss", None
    return ("stale", None) if hit.stale else ("hit", hit.record.time_ms)


def prebuild(workloads: list, ctx: Context) -> set:
    """Every conv region's candidates compiled in one parallel batch; the workloads with a
    candidate built."""
    if "conv" in ctx.hooks:
        return set()
    from fact_db.kernels.conv.kernel import source
    from fact_db.kernels.conv.tune import candidates
    return build_batch([(w, source(w, c, ctx.arch)) for w in dict.fromkeys(workloads)
                        for c in candidates(w, ctx.max_candidates)], ctx)


def tune_region(w: ConvWorkload, ctx: Context, tune: bool = True):
    """(trials, best, how): the registry's winner first (its kernel from the build cache), else
    tune.tune_conv; how is registry, tuned or skipped. With a team registry the workload is
    claimed while it is tuned (kernels.family.registry_first)."""
    return registry_first(w, ctx, tune, lambda: _stored(w, ctx), lambda: _tune(w, ctx))


def _stored(w: ConvWorkload, ctx: Context):
    """(trials, best, "registry") from the registry's current winner, or None."""
    from fact_db.kernels.conv import tune as conv_tune
    hit = conv_tune.from_registry(w, ctx.registry, ctx.arch, ctx.gpu_name)
    return stored_winner(hit, hit.config if hit else None,
                         lambda c: conv_tune.build_candidates(w, [c], arch=ctx.arch, progress=ctx.progress)[c])


def _tune(w: ConvWorkload, ctx: Context):
    from fact_db.kernels.conv import tune as conv_tune
    trials = conv_tune.tune_conv(w, arch=ctx.arch, registry=ctx.registry, gpu=ctx.gpu_name, gpus=ctx.gpus,
                                 progress=ctx.progress, limit=ctx.max_candidates)
    return trials, next((t for t in trials if t.status == "ok"), None), "tuned"


def impl_of(w: ConvWorkload, best, arch: str = "sm90a", gpu: str = "h100", folds: bool = False) -> Impl:
    """The Impl of a tuned conv region: its winner's kernel op; where cuDNN won, the region's
    own ops, or (`folds`: the region has a BatchNorm composition folds) cuDNN on the folded
    weight as one op (kernel.cudnn_op), so the BatchNorm costs nothing either way."""
    from fact_db.kernels.conv.kernel import ConvKernel, cudnn_op
    if best is None:
        return Impl.eager("no conv candidate verified")
    if best.config is None:
        t = f" ({best.time_ms:.3f} ms)" if best.time_ms else ""
        if folds:
            return Impl("conv", "library: cuDNN, BatchNorm folded", cudnn_op(w),
                        {"library": "cudnn", "workload": w.as_dict()}, note=f"cuDNN is the fastest verified candidate{t}")
        return Impl.eager(f"cuDNN is the fastest verified candidate{t}")
    k = ConvKernel(best.so, w, best.config, build_key=best.build_key)
    key = w.key(arch, gpu)
    return Impl("conv", f"{best.config.template} {best.label}", k.as_op(), {
        "template": best.config.template, "config": asdict(best.config), "workload": w.as_dict(),
        "build_key": best.build_key, "so": str(best.so), "registry_key": w.key_fields(),
        "registry_digest": key.digest(), "op": f"factdb::{k.op_name}"})


def realize(w: ConvWorkload, region, ctx: Context) -> Outcome:
    if not ctx.may_tune(w):  # what the registry has, nothing tuned
        trials, best, how = tune_region(w, ctx, tune=False)
    else:
        chooser = ctx.hooks.get("conv") or (lambda w: tune_region(w, ctx))
        trials, best, how = chooser(w)
    if how == "skipped":
        return Outcome(Impl.eager(), how, notes=["skipped: the tuning budget was spent; cuDNN serves it"])
    folds = region is not None and "bn_mean" in (region.operands or {})
    make = ctx.hooks.get("conv_impl") or (lambda w, best: impl_of(w, best, ctx.arch, ctx.gpu_name, folds))
    out = Outcome(make(w, best), how)
    eager = next((t for t in trials if t.config is None and t.status == "ok"), None)
    if eager is not None:
        out.eager_ms, out.eager_err = eager.time_ms, eager.err
    if best is not None:
        out.ms, out.err = best.time_ms, best.err
    out.notes += [f"{t.label}: {'%.3f ms' % t.time_ms if t.time_ms else t.error or t.status}" for t in trials]
    return out


def run_job(job: dict, cache: dict) -> dict:
    """A conv candidate (`so` set) or cuDNN (`so` empty), verified and timed in the worker."""
    import os

    from fact_db.kernels.conv.tune import evaluate_one
    cfg = ConvConfig(**job["config"]) if job.get("config") else None
    res = evaluate_one(ConvWorkload(**job["workload"]), job.get("so") or None, cfg, job.get("trials", 5),
                       job.get("reps", 20))
    return {"id": job["id"], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), **res}


# ------------------------------------------------------------------------------------------
# From an artifact.

def load(path, record: dict) -> Impl:
    from fact_db.kernels.conv.kernel import ConvKernel
    k = ConvKernel(path, ConvWorkload(**record["workload"]), ConvConfig(**record["config"]),
                   build_key=record["build_key"])
    return Impl("conv", record.get("label", ""), k.as_op(), stored(record))


def reverify(path, impl: Impl, record: dict) -> tuple[bool, str]:
    """The tuner's check (float64 reference, the policy's bound), in this process."""
    from fact_db.kernels.conv.tune import evaluate_one
    res = evaluate_one(ConvWorkload(**record["workload"]), str(path), ConvConfig(**record["config"]), reps=20)
    return res.get("status") == "ok", res.get("error", "")


def library(record: dict) -> Impl | None:
    """cuDNN on the folded weight, where the tuner found the library fastest for a conv-bn region."""
    if record.get("library") != "cudnn":
        return None
    from fact_db.kernels.conv.kernel import cudnn_op
    return Impl("conv", record.get("label", ""), cudnn_op(ConvWorkload(**record["workload"])), record)
