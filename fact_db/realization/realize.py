"""Realize: stages 1 and 2 on a model -- discover its regions, turn each GEMM-family region
into a workload, and tune it (registry first).

>>> results = realize_problem("benchmarks/problems/square_gemm_fp32.py", policy="tf32", registry=reg)

`plan` maps GEMM-family regions to workloads; `realize_regions` (what `optimize` runs)
also realizes attention regions (fact_db/kernels/attention/tune.py), LayerNorm / RMSNorm
regions, with the residual add before them where the graph has one (fact_db/kernels/norm/),
and convolutions with their BatchNorm and element-wise chain (fact_db/kernels/conv/).
Other templates (GEMM + softmax, the sm80 fused kernels) stay eager, with a note.
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field

from fact_db.core.device import build_arch
from fact_db.kernels import build as build_mod
from fact_db.kernels import families
from fact_db.kernels.family import Context, operand_dtype_mismatch
from fact_db.kernels.gemm import family as gemm_family
from fact_db.kernels.gemm.workload import GemmWorkload
from fact_db.kernels.region import family as region_family
from fact_db.kernels.impl import Impl

# The last GRACE of the tuning budget starts no compile: it tunes the workloads whose candidates
# were compiled before it, on those (timing takes seconds; the compiles are paid for). Where the
# batch compile ends after the whole budget (compiles started in time finish late), they are
# still tuned for LATE of the budget after it. KernelBench L3-7 (GoogleNet, 58 regions): the
# batch ran to the end of the budget, and every region was skipped, those it had built too.
GRACE = 0.2
LATE = 0.1


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
        w, note = gemm_family.plan_region(r, policy)
        out.append(Planned(r, w, note))
    return out


def realize_problem(problem: str, *, policy: str = "tf32", arch: str = "sm90a", registry=None, on_result=None,
                    rules=None, **tune_kw):
    """Discover `problem` (with `rules`, default the shipped ones) and tune every GEMM-family
    region. Returns (report, [(Planned, TuneResult | None)]).

    Regions with the same workload (a Llama block's K and V projections) are tuned once and
    share the result; `on_result(planned, result)` is called as each region is done, in order
    (with a team registry, in the order they are done: hosts running this at once divide the
    regions between them, each taking first those no other host holds).
    """
    from fact_db.discovery.discover import discover_problem
    from fact_db.kernels.gemm.tune import tune, with_rule
    report = discover_problem(problem, arch="sm90", policy=policy, rules=rules)
    planned = plan(report, policy)
    results: list = [None] * len(planned)
    done: dict[GemmWorkload, tuple[int, object]] = {}
    gpu = tune_kw.get("gpu") or "h100"

    def lease_key(i):
        w = planned[i].workload
        return None if w is None or w in done else with_rule(w).key(arch, gpu)
    team = registry is not None and registry.coordinated
    if team:
        from fact_db.store import lease  # (SQLAlchemy: imported where a team registry is used, not by plan's users)
    for i in lease.each(range(len(planned)), lease_key, registry.claim) if team else range(len(planned)):
        p, r = planned[i], None
        if p.workload is not None:
            if p.workload in done:
                j, r = done[p.workload]
                p.same_as = j
                p.note = "; ".join(x for x in (p.note, f"same workload as region {j + 1}: tuned once") if x)
            else:
                r = tune(p.workload, arch=arch, registry=registry, **tune_kw)
                done[p.workload] = (i, r)
        results[i] = (p, r)
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


def workload_of(region, planned: Planned, graph, policy: str):
    """(workload, note) of a region: the plan's GEMM workload, else the workload of the family
    that claims it (kernels.families), else None with the reason it has none."""
    if planned.workload is not None:
        w, note = planned.workload, planned.note
    else:
        w, note = families.workload_of(region, graph, policy)
        if w is None:
            return None, note or planned.note
    if why := operand_dtype_mismatch(region, graph, policy, w):
        return None, why
    return w, note


def registry_answer(registry, w, arch: str, gpu: str) -> tuple[str, float | None]:
    """(state, measured ms) of the registry's answer for workload `w`, from its family: hit (an
    exact, current row, with its time), near (D) (GEMM: the nearest compatible shape at
    distance D), stale (tuned in another environment, or its template changed) or miss."""
    fam = families.of(w) if w is not None else None
    if registry is None or fam is None:
        return "miss", None
    return fam.answer(registry, w, arch, gpu)


def realize_regions(report, policy: str, *, registry=None, arch: str = "sm90a", gpu: str | None = None,
                    max_candidates: int = 24, budget_s: float | None = None, gpus: list[int] | None = None,
                    runner=None, plan_only: bool = False, force: bool = False, progress: bool = True,
                    on_result=None, attention_chooser=None, norm_chooser=None, norm_impl=None, conv_chooser=None,
                    conv_impl=None) -> list[Realized]:
    """Decide how every region of `report` runs: registry first, then tuning (GEMM family,
    attention, LayerNorm / RMSNorm with or without the residual add), within `budget_s`
    seconds (where every family's candidates compile in one batch first, no compile starts in
    the budget's last GRACE, which tunes the workloads the batch built, on what was built);
    everything else stays eager, with the reason. Regions are tuned in order of estimated
    gain; a workload repeated across regions is tuned once. `plan_only` looks things up and
    tunes nothing (what `factdb optimize` shows without a GPU). With a team registry, hosts
    realizing the same model at once divide its regions between them.

    `attention_chooser(w) -> (rows, best)`, `norm_chooser(w)` and `conv_chooser(w) -> (trials,
    best, how)` replace the tuners, `norm_impl(w, best)` and `conv_impl(w, best) -> Impl` the
    kernel loaders (tests on the CPU).
    """
    t0 = time.perf_counter()
    hooks = {k: v for k, v in (("runner", runner), ("attention", attention_chooser), ("norm", norm_chooser),
                               ("norm_impl", norm_impl), ("conv", conv_chooser), ("conv_impl", conv_impl))
             if v is not None}
    team = registry is not None and registry.coordinated and not plan_only
    batch = not plan_only and runner is None and not team  # every family's candidates compiled first, together
    # no compile starts past the deadline: the budget less its last GRACE where a batch compiles
    # (that part tunes what the batch built), the whole budget where each region compiles its own
    deadline = t0 + budget_s * (1 - GRACE if batch else 1) if budget_s is not None else None
    ctx = Context(arch=arch, gpu=gpu, registry=registry, max_candidates=max_candidates, gpus=gpus, force=force,
                  progress=progress, hooks=hooks, deadline=deadline,
                  over_budget=lambda: deadline is not None and time.perf_counter() > deadline)
    planned = {id(p.region): p for p in plan(report, policy)}
    out: list[Realized] = []
    for i, r in enumerate(report.regions):
        w, note = workload_of(r, planned[id(r)], report.graph, policy)
        rz = Realized(i, r, w, Impl.eager(), "eager", notes=[note] if note else [])
        if r.composable:
            rz.notes.append(f"not composable: {r.composable}")
        else:
            rz.registry = registry_answer(registry, rz.workload, arch, ctx.gpu_name)[0]
        out.append(rz)
    order = sorted(out, key=lambda z: -z.region.estimate.gain_s)
    say = _sayer(progress and not plan_only, t0, budget_s)
    live = [z for z in order if _live(z)]
    say(f"{len(out)} region(s), {len(set(z.workload for z in live))} workload(s) to realize, up to {max_candidates} "
        "candidates each (eager included)")
    if batch and not ctx.over_budget():
        # Each family's candidates compile in one parallel batch, not region by region (KernelBench
        # L3-28's ViT: twelve fp32 GEMM kernels of about a minute of nvcc each); no compile starts
        # past the deadline, and after it only the workloads the batch built are tuned, until
        # grace_until. On a team registry each host builds the regions it takes, a few at a time.
        _prebuild(live, ctx, say)
    if budget_s is not None and batch:  # until then the workloads compiled above are tuned (GRACE, LATE)
        end = time.perf_counter()
        ctx.grace_until = t0 + budget_s if end <= t0 + budget_s else end + LATE * budget_s
    done: dict = {}

    def lease_key(rz):
        w = rz.workload
        return None if w is None or rz.region.composable or w in done else w.key(arch, ctx.gpu_name)
    # a team registry: hosts running this at once divide the regions (each takes those no other
    # host holds, and comes back to the rest, by then usually in the registry); where it shares
    # built kernels, a winner another host built is loaded, not compiled (build.sharing), and
    # each winner tuned here is shared
    with build_mod.sharing(registry if team else None), build_mod.compile_deadline(deadline):
        numbers = itertools.count(1)
        if team:   # taken a few at a time, each few built in one batch, then tuned
            from fact_db.store import lease
            size = claim_size(max_candidates)
            for group in lease.groups(order, lease_key, registry.claim, size):
                if runner is None:
                    _prebuild([z for z in group if _live(z) and z.workload not in done], ctx, say)
                _realize_each(group, numbers, len(order), team, registry, done, ctx, plan_only, say, on_result, arch)
        else:
            _realize_each(order, numbers, len(order), team, registry, done, ctx, plan_only, say, on_result, arch)
    return out


def claim_size(max_candidates: int) -> int:
    """How many workloads a host of a team registry takes at a time: as many as one batch of
    compiles keeps its cores busy with (build.default_jobs() over the kernel candidates of one),
    at least one. Taking them one at a time, each host compiled three candidates on eight cores
    (minGPT on two hosts: 0.81 of one host's time, where one host compiles all in one batch)."""
    return max(1, build_mod.default_jobs() // max(1, max_candidates - 1))


def _live(z: Realized) -> bool:
    """A region some family realizes: it has a workload and can be composed."""
    return z.workload is not None and not z.region.composable


def _prebuild(zs: list, ctx, say) -> None:
    """Compile the kernel candidates of the workloads of `zs` in one parallel batch per family
    (the tuners then find them in the build cache); ctx.prebuilt gains those built. A workload
    the registry answers now (a hit; on a team registry, maybe stored by another host since) is
    not built, unless ctx.force tunes it again."""
    if ctx.registry is not None and not ctx.force:
        zs = [z for z in zs if registry_answer(ctx.registry, z.workload, ctx.arch, ctx.gpu_name)[0] != "hit"]
    for fam in families.FAMILIES:
        ws = [z.workload for z in zs if fam.owns(z.workload)]
        if ws and not ctx.over_budget():
            t = time.perf_counter()
            say(f"compiling the {fam.NAME} candidates of {len(set(ws))} workload(s) in one batch")
            ctx.prebuilt |= fam.prebuild(ws, ctx)
            say(f"compiled the {fam.NAME} candidates in {time.perf_counter() - t:.1f} s")


def _realize_each(zs, numbers, total, team, registry, done, ctx, plan_only, say, on_result, arch) -> None:
    """realize_regions' loop: each region of `zs` from its family (or as the same workload's
    region before it), said on a line each, numbered from `numbers` of `total` as realized."""
    for rz in zs:
        n = next(numbers)
        w, t = rz.workload, time.perf_counter()
        head = f"[{n}/{total}] region {rz.index + 1} {rz.region.rule} {rz.region.shape}"
        if w is None or rz.region.composable:
            rz.how = "eager"
            say(f"{head}: eager ({(rz.notes or ['no kernel family realizes it'])[0]})")
        elif plan_only:
            rz.how = "planned"
        elif w in done:
            src = done[w]
            rz.impl, rz.how, rz.tune = src.impl, src.how, src.tune
            rz.eager_ms, rz.ms, rz.err, rz.eager_err = src.eager_ms, src.ms, src.err, src.eager_err
            rz.notes.append(f"same workload as region {src.index + 1}: realized once")
            say(f"{head}: as region {src.index + 1} (the same workload)")
        else:
            say(f"{head}: realizing ...")
            got = families.of(w).realize(w, rz.region, ctx)
            rz.impl, rz.how, rz.tune = got.impl, got.how, got.tune
            rz.eager_ms, rz.ms, rz.err, rz.eager_err = got.eager_ms, got.ms, got.err, got.eager_err
            rz.notes += got.notes
            done[w] = rz
            tried = f", {got.candidates} candidates" if got.candidates else ""
            timed = f", {rz.ms:.4g} ms against eager {rz.eager_ms:.4g} ms" if rz.ms and rz.eager_ms else ""
            say(f"{head}: {got.how}{tried}{timed}, runs {rz.impl.label}; {time.perf_counter() - t:.1f} s")
            rec = getattr(rz.impl, "record", None) or {}
            if team and got.how == "tuned" and rec.get("build_key") and rec.get("so"):
                build_mod.share_built(registry, rec["build_key"], rec["so"], arch)
        if on_result is not None:
            on_result(rz)


def _sayer(on: bool, t0: float, budget_s: float | None):
    """One `[realize]` line on stderr per step, with the time since realizing began (and the
    budget's seconds left); a no-op where progress is off."""
    def say(text: str) -> None:
        if not on:
            return
        spent = time.perf_counter() - t0
        left = f", {max(0.0, budget_s - spent):.0f} s of the budget left" if budget_s is not None else ""
        print(f"[realize] {text} ({spent:.0f} s{left})", file=sys.stderr, flush=True)
    return say


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
    from fact_db.discovery.discover import Region
    from fact_db.discovery.roofline import Estimate
    if registry is None or report.graph is None:
        return []
    build = build_arch(arch)
    added: list[Realized] = []
    taken: set = set()
    for ask in asks(report, rules):
        spec, _ = region_spec(ask, report)
        row = region_family.stored(registry, spec, build, gpu) if spec is not None else None
        if row is None or taken & set(spec.nodes):
            continue
        mine = set(spec.nodes)
        over = [z for z in realized if mine & set(z.region.nodes)]
        label = f"llm kernel {row.label}"
        if any(not set(z.region.nodes) <= mine for z in over):
            for z in over:
                z.notes.append(f"{label} from the registry overlaps this region only in part: not used")
            continue
        served = [z for z in over if z.impl.kind != "eager"]
        if served:
            known = all(z.eager_ms is not None and z.ms is not None for z in served) and row.baseline_ms is not None
            if not known:
                for z in served:
                    z.notes.append(f"{label} also covers this region; not used (no timing to compare it with)")
                continue
            rest = max(0.0, row.baseline_ms - sum(z.eager_ms for z in over if z.eager_ms is not None))
            now = sum(z.ms for z in served) + sum(z.eager_ms or 0.0 for z in over if z.impl.kind == "eager") + rest
            if row.time_ms >= now:
                for z in served:
                    z.notes.append(f"{label} covers this region and {len(mine) - len(z.region.nodes)} more op(s) in "
                                   f"{row.time_ms:.3f} ms; this region's kernel and the eager rest, about "
                                   f"{now:.3f} ms, stay")
                continue
        try:
            impl, how = (loader or region_family.load_row)(row, spec)
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
        region = Region(rule="llm-kernel", title=f"{spec.summary()} ({row.label})", template="llm_region",
                        form="llm", nodes=list(spec.nodes), output=spec.output, problem={}, shape=shape,
                        dtypes=[spec.dtype], layouts={}, estimate=Estimate(0.0, 0.0, 0.0, 0.0, 0.0, "memory"),
                        share=0.0, registry="hit", source=ask.ops[0].get("source") if ask.ops else None,
                        operands={x["name"]: x["name"] for x in spec.inputs})
        z = Realized(len(report.regions) + len(added), region, None, impl, "registry", eager_ms=row.baseline_ms,
                     ms=row.time_ms, err=row.rel_err, eager_err=row.baseline_rel_err, registry="hit",
                     notes=[f"{label} (provenance {row.provenance}, model {row.config.get('model') or '?'}) from the "
                            f"registry: {how}"])
        added.append(z)
    realized.extend(added)
    return added


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
