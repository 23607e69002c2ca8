"""The region family's registry rows: the agent's verified kernels, each stored with its own
source (no template renders it again), looked up exactly by the region's key.

    >>> digest = store(registry, spec, "sm90a", "h100", name="gemm_relu", source=src, time_ms=0.01,
    ...                eager_ms=0.02)
    >>> stored(registry, spec, "sm90a", "h100").label
    'gemm_relu'
"""
from __future__ import annotations

import hashlib

from fact_db.core import environment
from fact_db.kernels.region.source import TEMPLATE
from fact_db.kernels.region.spec import RegionSpec
from fact_db.store.records import KernelRecord


def stored(registry, spec: RegionSpec, arch: str, gpu: str):
    """The registry's current kernel for exactly this region (a KernelRecord: `label` is the
    kernel's name, `source` its source, `baseline_ms` eager's time), or None: absent, or stale
    (measured in another environment)."""
    hit = registry.lookup(spec.key(arch, gpu), nearest=False)
    return None if hit is None or hit.stale else hit.record


def store(registry, spec: RegionSpec, arch: str, gpu: str, *, name: str, source: str, build_key: str = "",
          time_ms: float | None = None, eager_ms: float | None = None, rel_err: float | None = None,
          eager_rel_err: float | None = None, device_name: str = "", model: str = "", explanation: str = "",
          provenance: str = "llm") -> str:
    """A verified kernel the agent proposed, as the region's registry row (provenance `llm`,
    its source kept: no template renders it again), stamped with this environment; its digest."""
    env = environment.current()
    if device_name:
        env = env.with_(gpu_sku=device_name)
    key = spec.key(arch, gpu)
    registry.put(KernelRecord(
        key=key, template=TEMPLATE, label=name, source=source, source_hash=hashlib.sha256(source.encode()).hexdigest(),
        config={"build_key": build_key, "model": model}, time_ms=time_ms, baseline="torch eager",
        baseline_ms=eager_ms, rel_err=rel_err, baseline_rel_err=eager_rel_err, provenance=provenance,
        notes=explanation[:4096]).stamped(env))
    return key.digest()
