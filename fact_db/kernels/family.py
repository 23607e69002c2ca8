"""The kernel-family protocol: what the realizer, the worker and the artifact loader need of a
family of kernels (GEMM, attention, norms, convolutions, the agent's region kernels).

Each family is a module `fact_db/kernels/<family>/family.py` that provides the names below;
`fact_db.kernels.families` lists them, and is the one place that imports every family, so no
stage switches on family types itself. Families never import each other or the registry
class: what they need of a registry is the object passed in.

    NAME        the family's name: the registry family and its Impl kind ("gemm")
    IMPLS       the Impl kinds it loads from an artifact ("attention", "sdpa")
    JOBS        the worker job kinds it runs ("cutlass", "eager")

    workload(region, graph, policy) -> (workload, note) | None
        the family's workload for a discovered region, (None, why) where the region is the
        family's but cannot be realized, None where it is not the family's
    owns(workload) -> bool
    answer(registry, workload, arch, gpu) -> (state, measured ms)
        what the registry holds: hit, near (D), stale or miss
    prebuild(workloads, ctx) -> set
        compile every candidate of these workloads in one parallel batch (before tuning), none
        started past ctx.deadline; the workloads with a candidate built (or in the build cache)
    realize(workload, ctx) -> Outcome
        registry first, then tuning (where ctx.may_tune(workload)), into how the region runs
    run_job(job, cache) -> dict
        verify and time one candidate in the worker process
    load(path, record) -> Impl
        a built library at `path` as the Impl an artifact recorded
    reverify(path, impl, record) -> (ok, why)
        the family's own check of a rebuilt library, in this process
    library(record) -> Impl | None
        a library path (cuBLAS, an SDPA backend) an artifact recorded, or None
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


def traced_half(graph, policy: str) -> str | None:
    """The half dtype ("bfloat16", "float16") of a half `policy` where `graph` was traced as the
    policy runs the model (`optimize` traces it cast to that dtype: its inputs, parameters or
    buffers are in it), else None (a float32 policy, or a graph traced as written)."""
    from fact_db.core.policy import HALF_POLICIES
    half = HALF_POLICIES.get(policy)
    if half is None or not any(n.op in ("input", "parameter", "buffer") and n.dtype == half for n in graph.nodes):
        return None
    return half


def operand_dtype_mismatch(region, graph, policy: str, workload) -> str:
    """Why `workload`'s kernels cannot run `region`: in a graph traced as a half policy runs the
    model, an operand whose floating dtype is not the one the kernel takes (`workload.dtype`).
    That is a region the model computes in float32 on purpose (a router's `F.linear(x.float(),
    w.float())`): kernels built for bf16 would be handed float32 and refuse it, so eager keeps
    the precision the model asked for. A norm over an upcast takes float32 itself
    (norm.family.run_dtype) and passes. "" where nothing differs, or the graph was traced as
    written (float32, run later in the policy's dtype)."""
    want = getattr(workload, "dtype", None)
    if want is None or traced_half(graph, policy) is None:
        return ""
    for role, name in (region.operands or {}).items():
        try:
            node = graph[name] if isinstance(name, str) else None
        except KeyError:
            continue
        if node is not None and node.dtype in ("float32", "bfloat16", "float16") and node.dtype != want:
            return (f"operand {role} (`{name}`) is {node.dtype} in a model run at {policy}, and this region's "
                    f"kernels take {want}: the model computes it in {node.dtype} on purpose, so eager runs it")
    return ""


@dataclass
class Context:
    """What realizing a workload may use: where, with what budget, and the test hooks.

    `hooks` replaces GPU steps on the CPU in tests: "runner" (the GEMM tuner's jobs),
    "attention" (`w -> (rows, best)`), "norm" (`w -> (trials, best, how)`), "norm_impl"
    (`(w, best) -> Impl`), "conv" (`w -> (trials, best, how)`), "conv_impl" (`(w, best) -> Impl`)."""

    arch: str = "sm90a"
    gpu: str | None = None
    registry: Any = None
    max_candidates: int = 24
    gpus: list | None = None
    force: bool = False
    progress: bool = False
    over_budget: Callable[[], bool] = lambda: False
    deadline: float | None = None  # time.perf_counter() past which no compile starts (realize: the budget less GRACE)
    hooks: dict = field(default_factory=dict)
    prebuilt: set = field(default_factory=set)  # workloads with a candidate built before tuning began
    grace_until: float | None = None  # past `deadline`, prebuilt workloads are still tuned until then

    @property
    def gpu_name(self) -> str:
        return self.gpu or "h100"

    def may_tune(self, w) -> bool:
        """Before the compile deadline (not over_budget()), every workload; past it, one whose
        candidates were built before it (tuned on those alone: timing them costs seconds, and
        the compiles are paid for) until grace_until, and then none."""
        if not self.over_budget():
            return True
        return w in self.prebuilt and self.grace_until is not None and time.perf_counter() <= self.grace_until


@dataclass
class Outcome:
    """How a realized workload runs, and what was measured on the way."""

    impl: Any                      # kernels.impl.Impl
    how: str = "tuned"             # registry | tuned | eager | skipped
    eager_ms: float | None = None
    ms: float | None = None
    err: float | None = None
    eager_err: float | None = None
    notes: list = field(default_factory=list)
    tune: Any = None               # the family's own result (the GEMM tuner's TuneResult)
    candidates: int = 0            # candidates verified and timed, eager included (0: none, a registry answer)


def build_batch(owners: list, ctx: Context) -> set:
    """Build every (workload, build.Source) of `owners` in one parallel batch, none started past
    ctx.deadline (a family's prebuild); the workloads with a source built or in the build cache."""
    if not owners:
        return set()
    from fact_db.kernels import build
    built = build.build([s for _, s in owners], progress=ctx.progress, deadline=ctx.deadline)
    return {w for (w, _), b in zip(owners, built) if b.ok}


def stored_winner(hit, config, build: Callable):
    """(trials, best, "registry") from a family's registry hit, or None: no hit, or a winner whose
    kernel no longer builds. `config` is the hit's kernel config (None: the library or eager
    won, nothing to build); `build(config)` gives its Built (from the build cache where there),
    whose library path and key the hit takes."""
    if hit is None:
        return None
    if config is None:
        return [hit], hit, "registry"
    b = build(config)
    if not b.ok:
        return None
    hit.so, hit.build_key = str(b.path), b.key
    return [hit], hit, "registry"


def registry_first(w, ctx: Context, tune: bool, stored: Callable, tune_it: Callable) -> tuple:
    """(trials, best, how) for workload `w`: the registry's winner (`stored()`: that triple, or
    None where it has nothing usable) unless ctx.force, else `tune_it()`, or ([], None,
    "skipped") where `tune` is off. With a team registry the workload is claimed while it is
    tuned (one host at a time), and a winner the host it waited for stored meanwhile is taken
    instead of tuning again."""
    if ctx.registry is not None and not ctx.force:
        got = stored()
        if got is not None:
            return got
    if not tune:
        return [], None, "skipped"
    if ctx.registry is None:
        return tune_it()
    with ctx.registry.claim(w.key(ctx.arch, ctx.gpu_name)) as claim:
        if claim.coordinated and not ctx.force:
            got = stored()
            if got is not None:
                return got
        return tune_it()


class Family(Protocol):
    """A family module, as the stages see it (see the module docstring)."""

    NAME: str
    IMPLS: tuple
    JOBS: tuple

    def workload(self, region, graph, policy: str): ...
    def owns(self, workload) -> bool: ...
    def answer(self, registry, workload, arch: str, gpu: str) -> tuple: ...
    def prebuild(self, workloads: list, ctx: Context) -> None: ...
    def realize(self, workload, ctx: Context) -> Outcome: ...
    def run_job(self, job: dict, cache: dict) -> dict: ...
    def load(self, path, record: dict): ...
    def reverify(self, path, impl, record: dict) -> tuple: ...
    def library(self, record: dict): ...
