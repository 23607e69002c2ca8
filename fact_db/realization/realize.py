"""Realize: stages 1 and 2 on a model -- discover its regions, turn each GEMM-family region
into a workload, and tune it (registry first).

>>> results = realize_problem("benchmarks/problems/square_gemm_fp32.py", policy="tf32", registry=reg)

`plan` maps GEMM-family regions to workloads; `realize_regions` (what `optimize` runs)
also realizes attention regions (fact_db/kernels/attention/tune.py) and LayerNorm / RMSNorm
regions, with the residual add before them where the graph has one (fact_db/kernels/norm/norm.py).
Other templates (GEMM + softmax, the sm80 fused kernels) stay eager, with a note.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fact_db.core.device import build_arch
from fact_db.core.errors import first_line
from fact_db.kernels.norm.norm import NormWorkload
from fact_db.core.policy import HALF_POLICIES, POLICY_DTYPE, policy_mode
from fact_db.kernels.gemm.workload import GemmWorkload

GEMM_TEMPLATES = {"gemm_sm90"}
EPILOGUE_OF = {("none",): "none", ("bias",): "bias", ("bias", "relu"): "bias_relu", ("bias", "gelu"): "bias_gelu",
               ("bias", "gelu_tanh"): "bias_gelu_tanh", ("bias", "silu"): "bias_silu",
               ("bias", "residual"): "residual"}


@dataclass
class Planned:
    region: object            # discover.Region
    workload: GemmWorkload | None
    note: str = ""
    same_as: int | None = None  # the index of an earlier region with the same workload (tuned once)


def plan(report, policy: str) -> list[Planned]:
    """One workload per GEMM-family region of a discovery report (None with a note otherwise).

    The epilogue and operand layouts come from the region, as discovery read them."""
    out = []
    for r in report.regions:
        if r.template.startswith("dual_gemm") and r.operands and not r.composable:
            # On Hopper: one GEMM over the concatenated gate and up weights (x read once, one
            # launch); SiLU and the product stay in PyTorch, in place in its output. Held N x K
            # (K-major) for a Linear's weights, and for K x N ones under the float32 policies.
            p = r.problem
            kmajor = r.attrs.get("b_layout") == "nk" or POLICY_DTYPE[policy] == "float32"
            w = GemmWorkload(p["M"], 2 * p["N"], p["K"], 1, policy=policy, layout_a="row",
                             layout_b="col" if kmajor else "row", epilogue="none", rule="gemm")
            out.append(Planned(r, w, "one GEMM over the concatenated gate and up weights; SiLU and the product "
                                     "in PyTorch, in place in its output"))
            continue
        if r.template not in GEMM_TEMPLATES:
            out.append(Planned(r, None, f"template {r.template}: not realized yet (stage 2 covers the GEMM family)"))
            continue
        # A constant scale is the kernel's alpha (discovery read it into attrs), not an epilogue of its own.
        epi = EPILOGUE_OF.get(tuple(e for e in r.epilogue or [] if e != "scale") or ("none",))
        p = r.problem
        la, lb = r.layouts.get("a", "row"), r.layouts.get("b", "row")
        if epi is None or la not in ("row", "col") or lb not in ("row", "col"):
            out.append(Planned(r, None, f"epilogue or layout not supported by the GEMM templates ({la}, {lb})"))
            continue
        # Projections of one input (gemm-horizontal) are one plain GEMM over their concatenated
        # weights: keyed as that GEMM (the rule its epilogue implies), so the registry's rows
        # for the shape serve it and what is tuned for it serves them.
        rule = "gemm" if r.attrs.get("members") else r.rule
        note = ""
        if lb == "row" and r.attrs.get("b_weight") and POLICY_DTYPE[policy] == "float32" and p.get("batch", 1) == 1:
            # A K x N weight (GPT-2's Conv1D, `x @ W`): the float32 kernels read B K-major (TF32
            # MMAs, the lo parts made once), so composition holds the weight transposed once.
            lb, note = "col", "the K x N weight is held transposed (N x K) once, for the K-major kernels"
        try:
            w = GemmWorkload(p["M"], p["N"], p["K"], p.get("batch", 1), policy=policy, layout_a=la, layout_b=lb,
                             epilogue=epi, rule=rule)
        except Exception as e:  # noqa: BLE001  (a workload the templates cannot express: say why)
            out.append(Planned(r, None, str(e)))
            continue
        out.append(Planned(r, w, note))
    return out


def realize_problem(problem: str, *, policy: str = "tf32", arch: str = "sm90a", registry=None, on_result=None,
                    rules=None, **tune_kw):
    """Discover `problem` (with `rules`, default the shipped ones) and tune every GEMM-family
    region. Returns (report, [(Planned, TuneResult | None)]).

    Regions with the same workload (a Llama block's K and V projections) are tuned once and
    share the result; `on_result(planned, result)` is called as each region is done, in order.
    """
    from fact_db.discovery.discover import discover_problem
    from fact_db.kernels.gemm.tune import tune
    report = discover_problem(problem, arch="sm90", policy=policy, rules=rules)
    results = []
    done: dict[GemmWorkload, tuple[int, object]] = {}
    for i, p in enumerate(plan(report, policy)):
        r = None
        if p.workload is not None:
            if p.workload in done:
                j, r = done[p.workload]
                p.same_as = j
                p.note = "; ".join(x for x in (p.note, f"same workload as region {j + 1}: tuned once") if x)
            else:
                r = tune(p.workload, arch=arch, registry=registry, **tune_kw)
                done[p.workload] = (i, r)
        results.append((p, r))
        if on_result is not None:
            on_result(p, r)
    return report, results


# ------------------------------------------------------------------------------------------
# Realizing every region of a model for composition.

@dataclass
class Realized:
    """How one region of a model will run, and what was measured on the way."""

    index: int
    region: object                 # discover.Region
    workload: object | None        # GemmWorkload, AttentionWorkload, or None (not realizable yet)
    impl: object                   # compose.Impl
    how: str = "eager"             # registry | tuned | eager | skipped | planned
    eager_ms: float | None = None  # the region as the model wrote it, under the policy
    ms: float | None = None        # what runs in the composed model
    err: float | None = None
    eager_err: float | None = None
    registry: str = "miss"         # hit / near (distance) / stale / miss, before realizing
    notes: list = field(default_factory=list)
    tune: object | None = None     # TuneResult, for GEMM regions that were tuned or found

    @property
    def speedup(self) -> float | None:
        return self.eager_ms / self.ms if self.eager_ms and self.ms else None

    def as_dict(self) -> dict:
        r = self.region
        return {"index": self.index + 1, "rule": r.rule, "shape": r.shape, "nodes": r.nodes, "output": r.output,
                "how": self.how, "impl": {"kind": self.impl.kind, "label": self.impl.label, **self.impl.record},
                "eager_ms": self.eager_ms, "ms": self.ms, "speedup": self.speedup, "err": self.err,
                "eager_err": self.eager_err, "registry": self.registry, "notes": self.notes,
                "workload": self.workload.as_dict() if self.workload is not None else None}


def attention_workload(region, graph, policy: str):
    """The AttentionWorkload of an attention region (None, note when it has none)."""
    from fact_db.kernels.attention.workload import AttentionError, AttentionWorkload
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


NORM_TEMPLATES = {"add_norm", "layernorm", "rmsnorm"}


def norm_workload(region, graph, policy: str):
    """The NormWorkload of a LayerNorm / RMSNorm region, with or without the residual add
    before it (None, note when the region has none: an eps that is not a constant, a weight
    that is not one value per channel, a dtype the template does not take)."""
    from math import prod

    from fact_db.kernels.norm.norm import ELEMENT, NormError, NormWorkload
    ops, attrs = region.operands, region.attrs
    if "x" not in ops or "weight" not in ops:
        return None, "norm operands unknown (no input or no weight: a weightless norm stays eager)"
    eps = attrs.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None, "the norm's eps is not a constant"
    try:
        x, wt = graph[ops["x"]], graph[ops["weight"]]
    except (KeyError, TypeError):
        return None, "norm operand shapes unknown"
    if not x.shape or wt.shape != (x.shape[-1],):
        return None, f"norm over {x.shape} with a weight of shape {wt.shape}: one weight per channel needed"
    # bf16/fp16 policies run the whole model in that dtype (compose.run_at_policy), whatever it was traced in.
    dtype = HALF_POLICIES.get(policy, x.dtype)
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
        w = NormWorkload(kind, rows=prod(x.shape[:-1]), width=x.shape[-1], residual="res" in ops,
                         write_sum="res" in ops and bool(attrs.get("sum")), eps=float(eps), dtype=dtype,
                         policy=policy, has_bias="bias" in ops)
    except NormError as e:
        return None, str(e)
    return w, ""


def workload_of(region, planned: Planned, graph, policy: str):
    """(workload, note) of a region: the plan's GEMM workload, else its attention or norm
    workload, else None with the reason it has none."""
    if planned.workload is not None:
        return planned.workload, planned.note
    if region.template.startswith("fmha"):
        return attention_workload(region, graph, policy)
    if region.template in NORM_TEMPLATES:
        return norm_workload(region, graph, policy)
    return None, planned.note


def registry_answer(registry, w, arch: str, gpu: str) -> tuple[str, float | None]:
    """(state, measured ms) of the registry's answer for workload `w`. A GEMM workload: hit
    (an exact, current row, with its time), near (D) (the nearest compatible shape at distance
    D), stale (its template or toolchain changed) or miss. An attention or norm workload, keyed
    exactly: hit with the winner's time, stale (a norm kernel whose template changed since it
    was tuned) or miss."""
    from fact_db.kernels.attention.workload import AttentionWorkload
    if registry is None or w is None:
        return "miss", None
    if isinstance(w, GemmWorkload):
        hit = registry.lookup(w.key(arch, gpu))
        if hit is None:
            return "miss", None
        if hit.stale:
            return "stale", None
        return ("hit", hit.record.time_ms or None) if hit.exact else (f"near ({hit.distance:.2f})", None)
    if isinstance(w, NormWorkload):
        from fact_db.kernels.norm.norm import from_registry
        if registry.norm_get(w, arch, gpu) is None:
            return "miss", None
        hit = from_registry(w, registry, arch, gpu)
        return ("hit", hit.time_ms) if hit is not None else ("stale", None)
    if isinstance(w, AttentionWorkload):
        hit = registry.attention_get(w, arch, gpu)
        return ("hit", hit.time_ms) if hit is not None else ("miss", None)
    return "miss", None


def gemm_impl(result, w: GemmWorkload, library: bool = True):
    """The compose.Impl of a tuned GEMM region: its winner's kernel op; where the library
    (the tuner's `eager` candidate) won, the library path with a kernel op's signature
    (kernel.library_gemm_op: cuBLAS and the activation as one op, which is what was timed),
    or, with `library=False` (the dual GEMM, whose library path is two GEMMs), the model's
    own ops."""
    from fact_db.kernels.impl import Impl
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec, library_gemm_op
    from fact_db.kernels.gemm.tune import _spec
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
    spec = _spec(w, c)
    k = GemmKernel(win.so, c.template, GemmSpec(**spec), c.options, build_key=win.build_key)
    key = w.key(result.arch, result.gpu)
    return Impl.gemm_kernel(k, c.label, {
        "template": c.template, "spec": spec, "options": list(c.options or ()), "build_key": win.build_key,
        "so": str(win.so), "config": c.config, "registry_key": key.as_dict(), "registry_digest": key.digest(),
        "op": f"factdb::{k.op_name}"})


def choose_attention(w, *, trials: int = 4, reps: int = 20, device="cuda", timer=None):
    """Verify and time the attention candidates the library offers at `w`'s policy: the
    explicit form (the model's own ops), PyTorch's SDPA dispatch, and each SDPA backend that
    accepts the dtype. Returns (rows, best): rows are dicts (label, impl kind, ok, ms, err,
    eager_err, note), best the fastest verified row. In-process: library code only.
    """
    import os

    import torch

    from fact_db.kernels.attention.workload import backends_for, library_op, sdpa
    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import bound_for, rel_err
    scale = w.softmax_scale
    cands = [("explicit", "eager", lambda x: w.eager(x)),
             ("sdpa", "sdpa", lambda x: sdpa(x["q"], x["k"], x["v"], scale, w.causal))]
    for b in backends_for(w.dtype):
        cands.append((f"sdpa-{b}", "attention", (lambda op: lambda x: op(x["q"], x["k"], x["v"], scale, w.causal))(
            library_op(b))))
    timer = timer or (lambda fn, sets: time_cuda(fn, sets, reps=reps, device=device).median_ms)
    inputs = []
    for t in range(trials):
        gen = torch.Generator(device=device)
        gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1))
        inputs.append(w.make_inputs("randn" if t % 2 == 0 else "rand", device=device, generator=gen))
    refs = [w.reference(x) for x in inputs]
    eager_errs = [rel_err(w.eager(x), r) for x, r in zip(inputs, refs)]
    tf32_errs = [rel_err(w.eager(x, policy="tf32"), r) for x, r in zip(inputs, refs)] if w.policy == "tf32x3" \
        else [0.0] * trials
    rows = []
    for label, kind, fn in cands:
        row = {"label": label, "kind": kind, "ok": True, "ms": None, "err": 0.0, "eager_err": max(eager_errs), "note": ""}
        try:
            with policy_mode(w.policy):
                for t, (x, r) in enumerate(zip(inputs, refs)):
                    err = rel_err(fn(x), r)
                    bound = bound_for(w.policy, "randn" if t % 2 == 0 else "rand", eager_errs[t], tf32_errs[t])
                    row["err"] = max(row["err"], err) if err == err else float("nan")
                    if not err <= bound:
                        row["ok"], row["note"] = False, f"error {err:.3g} > bound {bound:.3g}"
                        break
                if row["ok"]:
                    row["ms"] = timer(fn, inputs[:3])
        except RuntimeError as e:  # a backend that does not take this problem says so at the call
            row["ok"], row["note"] = False, f"not available: {first_line(e, 160)}"
        rows.append(row)
    ok = [r for r in rows if r["ok"] and r["ms"] is not None]
    return rows, (min(ok, key=lambda r: r["ms"]) if ok else None)


def tune_attention(w, *, arch: str = "sm90a", gpu: str | None = None, registry=None, max_candidates: int = 8,
                   gpus=None, force: bool = False, progress: bool = False):
    """The attention tuner (fact_db/kernels/attention/tune.py: SDPA backends and family kernels, run in
    the worker subprocess, registry first) with its result in choose_attention's (rows, best)
    form; a kernel winner carries its built library (a registry hit is rebuilt from its config,
    from the build cache when it is there)."""
    from fact_db.kernels.attention import tune as attention_tune
    res = attention_tune.tune(w, arch=arch, gpu=gpu, registry=registry, max_candidates=max_candidates, gpus=gpus,
                              force=force, progress=progress)
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
            [b] = build.build([fam.source(w, best_row["config"])], progress=progress)
            if b.ok:
                best_row["so"], best_row["build_key"] = str(b.path), b.key
        if not best_row["so"]:
            best_row = None
    if best_row is not None:
        best_row["from_registry"] = "registry hit" in res.notes
    rows += [{"label": n.split(":", 1)[0], "kind": "note", "ok": False, "ms": None, "err": 0.0, "eager_err": None,
              "note": n} for n in res.notes if n != "registry hit"]
    return rows, best_row


def _attention_impl(best, w=None):
    from fact_db.kernels.attention.workload import library_op
    from fact_db.kernels.impl import Impl
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


def tune_norm_region(w, *, arch: str = "sm90a", registry=None, gpu: str = "", gpus=None, force: bool = False,
                     tune: bool = True, progress: bool = False):
    """(trials, best, how) for norm workload `w`: the registry's winner first (a kernel's library
    from the build cache, built again when it is not there), else fact_db.kernels.norm.norm.tune_norm
    (every candidate and eager verified against float64 and timed in the worker; the winner
    written to `registry`). `best` is a NormTrial (candidate None: eager won) or None; `how`
    is "registry", "tuned", or "skipped" where `tune` is off and the registry has nothing usable."""
    from fact_db.kernels.norm import norm
    if registry is not None and not force:
        hit = norm.from_registry(w, registry, arch, gpu)
        if hit is not None:
            if hit.candidate is None:
                return [hit], hit, "registry"
            b = norm.build_candidates(w, [hit.candidate], arch=arch, progress=progress)[hit.candidate]
            if b.ok:
                hit.so, hit.build_key = str(b.path), b.key
                return [hit], hit, "registry"
    if not tune:
        return [], None, "skipped"
    trials = norm.tune_norm(w, arch=arch, registry=registry, gpu=gpu, gpus=gpus, progress=progress)
    return trials, next((t for t in trials if t.status == "ok"), None), "tuned"


def _prebuild_norms(workloads: list, arch: str, progress: bool) -> None:
    """Every norm region's candidates compiled in one parallel batch (the tuner then finds
    them in the build cache); a failed build is recorded by the tuner, not here."""
    from fact_db.kernels import build
    from fact_db.kernels.norm.norm import TEMPLATE, candidates, render
    sources = [build.Source(TEMPLATE, render(w, c), arch) for w in dict.fromkeys(workloads) for c in candidates(w)]
    if sources:
        build.build(sources, progress=progress)


def _norm_impl(w, best):
    """The compose.Impl of a tuned norm region: its winner's kernel op, or eager."""
    from dataclasses import asdict

    from fact_db.kernels.impl import Impl
    from fact_db.kernels.norm.norm import TEMPLATE, NormKernel
    if best is None:
        return Impl.eager("no norm candidate verified")
    if best.candidate is None:
        return Impl.eager(f"eager is the fastest verified candidate ({best.time_ms:.3f} ms)" if best.time_ms else
                          "eager is the fastest verified candidate")
    k = NormKernel(best.so, w, build_key=best.build_key)
    return Impl("norm", f"{TEMPLATE} {best.label}", k.as_op(), {
        "template": TEMPLATE, "config": asdict(best.candidate), "workload": w.as_dict(), "build_key": best.build_key,
        "so": str(best.so), "registry_key": w.key(), "op": f"factdb::{k.op_name}"})


def realize_regions(report, policy: str, *, registry=None, arch: str = "sm90a", gpu: str | None = None,
                    max_candidates: int = 24, budget_s: float | None = None, gpus: list[int] | None = None,
                    runner=None, plan_only: bool = False, force: bool = False, progress: bool = True,
                    on_result=None, attention_chooser=None, norm_chooser=None, norm_impl=None) -> list[Realized]:
    """Decide how every region of `report` runs: registry first, then tuning (GEMM family,
    attention, LayerNorm / RMSNorm with or without the residual add), within `budget_s`
    seconds; everything else stays eager, with the reason. Regions are tuned in order of
    estimated gain; a workload repeated across regions is tuned once. `plan_only` looks
    things up and tunes nothing (what `factdb optimize` shows without a GPU).

    `attention_chooser(w) -> (rows, best)` and `norm_chooser(w) -> (trials, best, how)` replace
    the tuners, `norm_impl(w, best) -> Impl` the kernel loader (tests on the CPU).
    """
    import time

    from fact_db.kernels.impl import Impl
    from fact_db.kernels.gemm.tune import from_registry, tune
    t0 = time.perf_counter()
    planned = {id(p.region): p for p in plan(report, policy)}
    gpu_name = gpu or "h100"
    out: list[Realized] = []
    for i, r in enumerate(report.regions):
        w, note = workload_of(r, planned[id(r)], report.graph, policy)
        rz = Realized(i, r, w, Impl.eager(), "eager", notes=[note] if note else [])
        if r.composable:
            rz.notes.append(f"not composable: {r.composable}")
        else:
            rz.registry = registry_answer(registry, rz.workload, arch, gpu_name)[0]
        out.append(rz)
    order = sorted(out, key=lambda z: -z.region.estimate.gain_s)
    if not plan_only and runner is None and budget_s is None:
        # Every region's candidates compile in one parallel batch, not region by region.
        from fact_db.kernels.gemm.tune import prebuild
        gemms = list(dict.fromkeys(z.workload for z in order if isinstance(z.workload, GemmWorkload)
                                   and not z.region.composable))
        prebuild(gemms, arch=arch, gpu=gpu_name, registry=registry, max_candidates=max_candidates, force=force,
                 progress=progress)
        if norm_chooser is None:
            _prebuild_norms([z.workload for z in order if isinstance(z.workload, NormWorkload)
                             and not z.region.composable], arch, progress)
    done: dict = {}
    for rz in order:
        w = rz.workload
        if w is None or rz.region.composable:
            rz.how = "eager"
        elif plan_only:
            rz.how = "planned"
        elif w in done:
            src = done[w]
            rz.impl, rz.how, rz.tune = src.impl, src.how, src.tune
            rz.eager_ms, rz.ms, rz.err, rz.eager_err = src.eager_ms, src.ms, src.err, src.eager_err
            rz.notes.append(f"same workload as region {src.index + 1}: realized once")
        elif isinstance(w, GemmWorkload):
            over = budget_s is not None and time.perf_counter() - t0 > budget_s
            res = None
            if over:
                res = from_registry(w, registry, arch=arch, gpu=gpu_name) if registry is not None else None
                rz.how = "registry" if res else "skipped"
                if res is None:
                    rz.notes.append("skipped: the tuning budget was spent; eager serves it")
            else:
                res = tune(w, arch=arch, gpu=gpu, registry=registry, max_candidates=max_candidates, gpus=gpus,
                           runner=runner, force=force, progress=progress)
                rz.how = "registry" if res.from_registry else "tuned"
            if res is not None:
                rz.tune = res
                rz.impl = gemm_impl(res, w, library=not (rz.region.template or "").startswith("dual_gemm"))
                rz.notes += res.notes
                if res.eager:
                    rz.eager_ms, rz.eager_err = res.eager.time_ms, res.eager.err
                if res.winner:
                    rz.ms, rz.err = res.winner.time_ms, res.winner.err
            done[w] = rz
        elif isinstance(w, NormWorkload):
            over = budget_s is not None and time.perf_counter() - t0 > budget_s
            if over:  # what the registry has, nothing tuned
                trials, best, rz.how = tune_norm_region(w, arch=arch, registry=registry, gpu=gpu_name,
                                                        tune=False, progress=progress)
            else:
                chooser = norm_chooser or (lambda w: tune_norm_region(
                    w, arch=arch, registry=registry, gpu=gpu_name, gpus=gpus, force=force, progress=progress))
                trials, best, rz.how = chooser(w)
            if rz.how == "skipped":
                rz.notes.append("skipped: the tuning budget was spent; eager serves it")
            else:
                rz.impl = (norm_impl or _norm_impl)(w, best)
                eager = next((t for t in trials if t.label == "eager" and t.status == "ok"), None)
                if eager is not None:
                    rz.eager_ms, rz.eager_err = eager.time_ms, eager.err
                if best is not None:
                    rz.ms, rz.err = best.time_ms, best.err
                rz.notes += [f"{t.label}: {'%.3f ms' % t.time_ms if t.time_ms else t.error or t.status}"
                             for t in trials]
            done[w] = rz
        elif budget_s is not None and time.perf_counter() - t0 > budget_s:
            rz.how = "skipped"
            rz.notes.append("skipped: the tuning budget was spent; the model's own attention serves it")
        else:  # attention: the library candidates, timed here
            chooser = attention_chooser or (lambda w: tune_attention(
                w, arch=arch, gpu=gpu_name, registry=registry, max_candidates=min(max_candidates, 8), gpus=gpus, force=force,
                progress=progress))
            rows, best = chooser(w)
            explicit = next((x for x in rows if x["label"] == "explicit"), None)
            rz.impl = _attention_impl(best, w)
            rz.how = "registry" if best and best.get("from_registry") else "tuned"
            rz.eager_ms = explicit["ms"] if explicit else None
            rz.eager_err = explicit["err"] if explicit else None
            if best:
                rz.ms, rz.err = best["ms"], best["err"]
            rz.notes += [f"{x['label']}: {'%.3f ms' % x['ms'] if x['ms'] else x['note'] or 'failed'}" for x in rows]
            done[w] = rz
        if on_result is not None:
            on_result(rz)
    return out


def realize_region_kernels(report, realized: list, registry, *, gpu: str, arch: str = "sm90a", rules=None,
                           loader=None) -> list[Realized]:
    """The agent's kernels that the registry holds for regions of `report` (table
    region_kernels, provenance llm: each compiled, verified against float64 and faster than
    eager when it was stored), as Realized entries appended to `realized`, indexed after the
    rule regions (compose them with `report.regions + [z.region for z in added]`). No model
    is called: the questions the agent would ask (agent.asks) are looked up, nothing else.

    A kernel that covers rule regions (the agent's GEMM + ReLU where a plain GEMM region
    matched) replaces them only when its measured time beats theirs plus the eager rest of
    its ops, estimated as its stored eager time less theirs; those regions then stay eager
    in favour of it, with a note. A kernel that overlaps a region only in part is not used.
    `loader(row, spec) -> (Impl, note)` loads one (default: compiled in the worker, from the
    build cache when it is there, and registered as a custom op); returns what was added.
    """
    from fact_db.realization.asks import asks, region_spec
    from fact_db.kernels.impl import Impl
    from fact_db.discovery.discover import Region
    from fact_db.discovery.roofline import Estimate
    if registry is None or report.graph is None:
        return []
    build = build_arch(arch)
    added: list[Realized] = []
    taken: set = set()
    for ask in asks(report, rules):
        spec, _ = region_spec(ask, report)
        row = registry.region_get(spec, build, gpu) if spec is not None else None
        if row is None or taken & set(spec.nodes):
            continue
        mine = set(spec.nodes)
        over = [z for z in realized if mine & set(z.region.nodes)]
        label = f"llm kernel {row['name']}"
        if any(not set(z.region.nodes) <= mine for z in over):
            for z in over:
                z.notes.append(f"{label} from the registry overlaps this region only in part: not used")
            continue
        served = [z for z in over if z.impl.kind != "eager"]
        if served:
            known = all(z.eager_ms is not None and z.ms is not None for z in served) and row["eager_ms"] is not None
            if not known:
                for z in served:
                    z.notes.append(f"{label} also covers this region; not used (no timing to compare it with)")
                continue
            rest = max(0.0, row["eager_ms"] - sum(z.eager_ms for z in over if z.eager_ms is not None))
            now = sum(z.ms for z in served) + sum(z.eager_ms or 0.0 for z in over if z.impl.kind == "eager") + rest
            if row["time_ms"] >= now:
                for z in served:
                    z.notes.append(f"{label} covers this region and {len(mine) - len(z.region.nodes)} more op(s) in "
                                   f"{row['time_ms']:.3f} ms; this region's kernel and the eager rest, about "
                                   f"{now:.3f} ms, stay")
                continue
        try:
            impl, how = (loader or _load_region_kernel)(row, spec)
        except Exception as e:  # noqa: BLE001  (a kernel that will not build or load leaves its region eager)
            for z in over:
                z.notes.append(f"{label}: not loaded ({e})")
            continue
        for z in over:
            z.impl, z.how = Impl.eager(f"served by {label}"), "eager"
            z.ms, z.err = None, None
            z.notes.append(f"served by {label} (region {len(report.regions) + len(added) + 1}), which covers its ops "
                           f"and {len(mine) - len(z.region.nodes)} more")
        taken |= mine
        shape = " x ".join("x".join(str(d) for d in x["shape"]) for x in spec.inputs)
        region = Region(rule="llm-kernel", title=f"{spec.summary()} ({row['name']})", template="llm_region",
                        form="llm", nodes=list(spec.nodes), output=spec.output, problem={}, shape=shape,
                        dtypes=[spec.dtype], layouts={}, estimate=Estimate(0.0, 0.0, 0.0, 0.0, 0.0, "memory"),
                        share=0.0, registry="hit", source=ask.ops[0].get("source") if ask.ops else None,
                        operands={x["name"]: x["name"] for x in spec.inputs})
        z = Realized(len(report.regions) + len(added), region, None, impl, "registry", eager_ms=row["eager_ms"],
                     ms=row["time_ms"], err=row["rel_err"], eager_err=row["eager_rel_err"], registry="hit",
                     notes=[f"{label} (provenance {row['provenance']}, model {row['model'] or '?'}) from the "
                            f"registry: {how}"])
        added.append(z)
    realized.extend(added)
    return added


def _load_region_kernel(row: dict, spec):
    """(Impl, how) for a registry row of region_kernels: its source compiled in the worker
    (a build-cache hit when it was built here before) and registered as a custom op."""
    from fact_db.kernels.impl import Impl
    from fact_db.kernels.region.region_kernel import TEMPLATE, Pipeline, RegionKernel
    pipe = Pipeline(spec, arch=row["arch"], gpu=row["gpu"])
    try:
        handle = pipe.compile(row["source"], row["name"])
    finally:
        pipe.close()
    k = RegionKernel(handle["so"], spec, build_key=handle.get("build_key", ""))
    record = {"template": TEMPLATE, "so": str(k.path), "build_key": k.build_key, "region": spec.as_dict(),
              "registry_digest": row["digest"], "name": row["name"], "provenance": row["provenance"]}
    how = "built from the build cache" if handle.get("cached") else "compiled from its stored source"
    return Impl("region", f"llm kernel {row['name']}", k.as_op(), record), how


def ask_registry(report, registry) -> dict:
    """Each GEMM-family region's REGISTRY answer from `registry`: `hit` (an exact, current
    row: its measured time is kept in `measured_s`), `near (D)` (the nearest compatible
    shape at distance D), `stale` (a row whose template or toolchain changed) or `miss`.
    Attention and norm regions are looked up by their exact key (hit, stale or miss).
    Returns the counts."""
    from collections import Counter

    arch = build_arch(report.arch)
    gpu = report.gpu.lower()
    counts = Counter()
    with registry.pinned():
        for r, p in zip(report.regions, plan(report, report.policy)):
            w = workload_of(r, p, report.graph, report.policy)[0]
            r.registry, ms = registry_answer(registry, w, arch, gpu)
            if ms:
                r.measured_s = ms / 1e3
            counts[r.registry.split(" ")[0]] += 1
    return dict(counts)
