"""The attention family (fact_db.kernels.family): scaled-dot-product attention, causal or
not, with grouped KV heads; the library (SDPA, each backend its own candidate, and the model's
explicit form) always among the candidates.

    >>> w, note = workload(region, graph, "bf16")      # an AttentionWorkload from a region
    >>> out = realize(w, region, Context(registry=reg))
    >>> out.impl.label                                 # "SDPA flash backend", a kernel, ...
"""
from __future__ import annotations

from fact_db.kernels.attention.workload import AttentionError, AttentionWorkload, library_op
from fact_db.kernels.family import Context, Outcome
from fact_db.kernels.impl import Impl, stored

NAME = "attention"
IMPLS = ("attention", "sdpa")
JOBS = ("attention",)


def workload(region, graph, policy: str):
    """The AttentionWorkload of an attention region ((None, why) when its operands are not
    [batch, heads, length, dim] tensors); None for a region of another family."""
    if not (region.template or "").startswith("fmha"):
        return None
    ops, attrs = region.operands, region.attrs
    try:
        q = graph[ops["q"]].shape
        k = graph[ops["k"]].shape if "k" in ops else tuple(graph[ops["kt"]].shape[:-2]) + tuple(
            reversed(graph[ops["kt"]].shape[-2:]))
        v = graph[ops["v"]].shape
    except (KeyError, TypeError):
        return None, "attention operands unknown"
    if q is None or k is None or v is None or len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None, "attention on tensors that are not [batch, heads, length, dim]"
    try:
        w = AttentionWorkload(q[0], q[1], k[1], q[2], k[2], q[3], v[3], causal=bool(attrs.get("causal")),
                              scale=attrs.get("scale"), policy=policy, rule=region.rule)
    except AttentionError as e:
        return None, str(e)
    return w, ""


def owns(w) -> bool:
    return isinstance(w, AttentionWorkload)


def answer(registry, w: AttentionWorkload, arch: str, gpu: str) -> tuple[str, float | None]:
    """hit with the winner's time, stale (tuned in another environment, or its template
    changed), or miss: attention is keyed exactly."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None:
        return "miss", None
    return ("stale", None) if hit.stale else ("hit", hit.record.time_ms)


def prebuild(workloads: list, ctx: Context) -> set:
    """Nothing ahead: the attention tuner builds its few kernel candidates in one batch itself."""
    return set()


def tune_rows(w: AttentionWorkload, ctx: Context):
    """The attention tuner (fact_db/kernels/attention/tune.py: SDPA backends and family kernels,
    run in the worker subprocess, registry first) as (rows, best): rows are dicts (label, kind,
    ok, ms, err, eager_err, note, template, config, so, build_key); a kernel winner carries its
    built library (a registry hit is rebuilt from its config, from the build cache when there)."""
    from fact_db.kernels.attention import tune as attention_tune
    res = attention_tune.tune(w, arch=ctx.arch, gpu=ctx.gpu_name, registry=ctx.registry,
                              max_candidates=min(ctx.max_candidates, 8), gpus=ctx.gpus, force=ctx.force,
                              progress=ctx.progress)
    kinds = {"eager": "eager", "library": "attention", "kernel": "kernel"}
    rows = []
    for t in res.trials:
        kind = kinds.get(t.kind, t.kind)
        if t.label == "sdpa":
            kind = "sdpa"
        rows.append({"label": t.label, "kind": kind, "ok": t.status == "ok", "ms": t.time_ms, "err": t.err or 0.0,
                     "eager_err": t.eager_err, "note": t.error or ("" if t.status == "ok" else t.status),
                     "template": t.template, "config": t.config, "so": t.so, "build_key": t.build_key})
    best = res.best
    best_row = next((r for r in rows if best is not None and r["label"] == best.label), None)
    if best_row is not None and best_row["kind"] == "kernel" and not best_row["so"]:
        fam = next((f for f in attention_tune.families() if f.TEMPLATE == best_row["template"]), None)
        if fam is not None:
            from fact_db.kernels import build
            [b] = build.build([fam.source(w, best_row["config"])], progress=ctx.progress)
            if b.ok:
                best_row["so"], best_row["build_key"] = str(b.path), b.key
        if not best_row["so"]:
            best_row = None
    if best_row is not None:
        best_row["from_registry"] = "registry hit" in res.notes
    rows += [{"label": n.split(":", 1)[0], "kind": "note", "ok": False, "ms": None, "err": 0.0, "eager_err": None,
              "note": n} for n in res.notes if n != "registry hit"]
    return rows, best_row


def impl_of(best: dict | None, w: AttentionWorkload | None = None) -> Impl:
    """The Impl of the winning row: a kernel's op, an SDPA backend forced, SDPA's own choice,
    or the model's explicit form (eager)."""
    if best is not None and best["kind"] == "kernel":
        from fact_db.kernels.attention.kernel import AttentionKernel
        k = AttentionKernel(best["so"], best["template"], build_key=best["build_key"])
        return Impl("attention", best["label"], k.as_op(), {
            "template": best["template"], "config": best["config"], "build_key": best["build_key"],
            "so": str(best["so"]), "op": f"factdb::{k.op_name}",
            "workload": w.as_dict() if w is not None else None})
    if best is None or best["kind"] == "eager":
        return Impl.eager("the explicit form is the fastest verified candidate" if best else "no candidate verified")
    if best["kind"] == "sdpa":
        return Impl("sdpa", "scaled_dot_product_attention (PyTorch's backend choice)", None, {"library": "sdpa"})
    backend = best["label"].split("-", 1)[1]
    return Impl("attention", f"SDPA {backend} backend", library_op(backend),
                {"library": best["label"], "op": f"factdb::sdpa_{backend}"})


def realize(w: AttentionWorkload, region, ctx: Context) -> Outcome:
    if not ctx.may_tune(w):
        return Outcome(Impl.eager(), "skipped",
                       notes=["skipped: the tuning budget was spent; the model's own attention serves it"])
    chooser = ctx.hooks.get("attention") or (lambda w: tune_rows(w, ctx))
    rows, best = chooser(w)
    explicit = next((x for x in rows if x["label"] == "explicit"), None)
    from_registry = bool(best and best.get("from_registry"))
    out = Outcome(impl_of(best, w), "registry" if from_registry else "tuned",
                  eager_ms=explicit["ms"] if explicit else None, eager_err=explicit["err"] if explicit else None,
                  candidates=0 if from_registry else len(rows))
    if best:
        out.ms, out.err = best["ms"], best["err"]
    out.notes += [f"{x['label']}: {'%.3f ms' % x['ms'] if x['ms'] else x['note'] or 'failed'}" for x in rows]
    return out


def run_job(job: dict, cache: dict) -> dict:
    from fact_db.kernels.attention.tune import run_job as attention_job
    return attention_job(job, cache)


# ------------------------------------------------------------------------------------------
# From an artifact.

def load(path, record: dict) -> Impl:
    from fact_db.kernels.attention.kernel import AttentionKernel
    k = AttentionKernel(path, record["template"], build_key=record["build_key"])
    return Impl("attention", record.get("label", ""), k.as_op(), stored(record))


def reverify(path, impl: Impl, record: dict) -> tuple[bool, str]:
    """The attention tuner's own check (float64 reference, causal mask included), in this process."""
    from fact_db.kernels.attention.tune import AttnCandidate, job_for
    from fact_db.kernels.attention.tune import run_job as attention_job
    c = AttnCandidate(record.get("label", ""), "kernel", template=record["template"], so=str(path),
                      build_key=record["build_key"])
    res = attention_job(job_for(c, AttentionWorkload(**record["workload"]), reps=1), {})
    return res.get("status") == "ok", res.get("error", "")


def library(record: dict) -> Impl | None:
    """SDPA itself (PyTorch's choice of backend), or one SDPA backend forced."""
    if record.get("kind") == "sdpa":
        return Impl("sdpa", record.get("label", ""), None, {"library": "sdpa"})
    lib = str(record.get("library", ""))
    if lib.startswith("sdpa-"):
        return Impl("attention", record.get("label", ""), library_op(lib.split("-", 1)[1]), record)
    return None
