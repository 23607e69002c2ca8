"""The one table of kernel families (fact_db.kernels.family): the realizer, the worker and the
artifact loader find a family here, by workload, job kind or Impl kind, so none of them
switches on family types itself. This is the only module that imports every family.

    >>> for_job("attention").NAME, for_impl("sdpa").NAME
    ('attention', 'attention')
    >>> of(GemmWorkload(4096, 4096, 4096)).NAME
    'gemm'
"""
from __future__ import annotations

from fact_db.kernels.attention import family as attention
from fact_db.kernels.conv import family as conv
from fact_db.kernels.gemm import family as gemm
from fact_db.kernels.norm import family as norm
from fact_db.kernels.region import family as region

# In the order a region is offered to them: the first whose workload() answers owns it.
FAMILIES = (gemm, attention, norm, conv, region)
_BY_JOB = {job: f for f in FAMILIES for job in f.JOBS}
_BY_IMPL = {kind: f for f in FAMILIES for kind in f.IMPLS}


def by_name(name: str):
    for f in FAMILIES:
        if f.NAME == name:
            return f
    raise KeyError(f"no kernel family {name!r}; families are {', '.join(f.NAME for f in FAMILIES)}")


def for_job(kind: str):
    """The family that runs worker jobs of this kind."""
    try:
        return _BY_JOB[kind]
    except KeyError:
        raise KeyError(f"no kernel family runs worker jobs of kind {kind!r}; kinds are {', '.join(_BY_JOB)}") from None


def for_impl(kind: str):
    """The family that loads an artifact's implementations of this kind, or None."""
    return _BY_IMPL.get(kind)


def of(workload):
    """The family a workload belongs to, or None."""
    return next((f for f in FAMILIES if f.owns(workload)), None)


def workload_of(region, graph, policy: str) -> tuple[object | None, str]:
    """(workload, note) for a discovered region: the first family that claims it; (None, why)
    where one claims it but cannot realize it, or where none does."""
    for f in FAMILIES:
        got = f.workload(region, graph, policy)
        if got is not None:
            return got
    return None, f"template {region.template}: no kernel family realizes it yet"
