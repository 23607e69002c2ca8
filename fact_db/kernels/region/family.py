"""The region family (fact_db.kernels.family): kernels the language model wrote for regions no
rule covers, stored in the registry (provenance `llm`) only after they compiled, verified
against float64 and beat eager. No discovered region is this family's: the agent's kernels
reach a model through the registry (realization.realize.realize_region_kernels).

    >>> impl, how = load_row(record, spec)   # a registry row's source, compiled in the worker
"""
from __future__ import annotations

from fact_db.kernels.family import Context, Outcome
from fact_db.kernels.impl import Impl
from fact_db.kernels.impl import stored as stored_record
from fact_db.kernels.region.rows import store, stored  # noqa: F401  (the family's registry rows)
from fact_db.kernels.region.spec import RegionSpec

NAME = "region"
IMPLS = ("region",)
JOBS = ("region_compile", "region_run")


def workload(region, graph, policy: str):
    return None


def owns(w) -> bool:
    return isinstance(w, RegionSpec)


def answer(registry, w: RegionSpec, arch: str, gpu: str) -> tuple[str, float | None]:
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None:
        return "miss", None
    return ("stale", None) if hit.stale else ("hit", hit.record.time_ms)


def prebuild(workloads: list, ctx: Context) -> None:
    """Nothing: a region kernel's source compiles when it is loaded (load_row)."""


def realize(w: RegionSpec, region, ctx: Context) -> Outcome:
    raise NotImplementedError("region kernels are proposed by the agent and composed from the registry, "
                              "not tuned per region")


def load_row(rec, spec: RegionSpec) -> tuple[Impl, str]:
    """(Impl, how) for a registry row of this family (a KernelRecord): its stored source compiled
    in the worker (a build-cache hit when it was built here before) and registered as a custom op."""
    from fact_db.kernels.region.kernel import RegionKernel
    from fact_db.kernels.region.pipeline import Pipeline
    from fact_db.kernels.region.source import TEMPLATE
    pipe = Pipeline(spec, arch=rec.key.arch, gpu=rec.key.gpu)
    try:
        handle = pipe.compile(rec.source, rec.label)
    finally:
        pipe.close()
    k = RegionKernel(handle["so"], spec, build_key=handle.get("build_key", ""))
    record = {"template": TEMPLATE, "so": str(k.path), "build_key": k.build_key, "region": spec.as_dict(),
           "registry_digest": rec.digest, "name": rec.label, "provenance": rec.provenance}
    how = "built from the build cache" if handle.get("cached") else "compiled from its stored source"
    return Impl("region", f"llm kernel {rec.label}", k.as_op(), record), how


def run_job(job: dict, cache: dict) -> dict:
    from fact_db.kernels.region.kernel import compile_job
    from fact_db.kernels.region.kernel import run_job as region_run
    return compile_job(job) if job["kind"] == "region_compile" else region_run(job)


# ------------------------------------------------------------------------------------------
# From an artifact.

def load(path, record: dict) -> Impl:
    from fact_db.kernels.region.kernel import RegionKernel
    k = RegionKernel(path, RegionSpec.from_dict(record["region"]), build_key=record["build_key"])
    return Impl("region", record.get("label", ""), k.as_op(), stored_record(record))


def reverify(path, impl: Impl, record: dict) -> tuple[bool, str]:
    """The agent pipeline's own check (the region's float64 reference), in this process."""
    from fact_db.kernels.region.kernel import run_job as region_run
    res = region_run({"id": 0, "so": str(path), "region": record["region"], "trials": 5, "reps": 1})
    return res.get("status") == "ok", res.get("error", "")


def library(record: dict) -> Impl | None:
    return None
