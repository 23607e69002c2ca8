"""The pipeline a kernel proposal goes through -- compile, verify, bench, store -- each step a
worker job (the agent's default kernel hooks).

    >>> pipe = Pipeline(spec, arch="sm90a", gpu="h100", registry=reg)
    >>> handle = pipe.compile(source, "gemm_relu"); ok, why = pipe.verify(handle)
"""
from __future__ import annotations

from fact_db.kernels.region.rows import store
from fact_db.kernels.region.spec import RegionSpec


class NeedsGPU(Exception):
    """Verification or timing needs a GPU the worker does not have."""


class NoToolchain(Exception):
    """nvcc or the CUTLASS headers are missing where the worker runs."""


class Pipeline:
    """compile -> verify -> bench -> store for proposals of one region, each step a worker job.

    `runner(jobs) -> results` replaces the worker pool, as in the tuner (tests inject one that
    passes compile jobs to a real worker and answers the GPU jobs). `compile_timeout` bounds
    nvcc (and, with a margin, the worker job); `registry` receives the winner.
    """

    def __init__(self, spec: RegionSpec, *, arch: str = "sm90a", gpu: str = "", registry=None, runner=None,
                 compile_timeout: float = 300.0, run_timeout: float = 120.0, model: str = "", explanation: str = ""):
        self.spec, self.arch, self.gpu, self.registry = spec, arch, gpu, registry
        self.runner, self.compile_timeout, self.run_timeout = runner, compile_timeout, run_timeout
        self.model, self.explanation = model, explanation
        self.result: dict = {}
        self._pools: dict = {}

    def _run(self, job: dict, timeout: float) -> dict:
        if self.runner is not None:
            return self.runner([job])[0]
        from fact_db.kernels.pool import WorkerPool
        pool = self._pools.get(timeout)
        if pool is None:
            pool = self._pools[timeout] = WorkerPool(timeout=timeout)
        return pool.run([job])[0]

    def close(self) -> None:
        for p in self._pools.values():
            p.close()
        self._pools.clear()

    def compile(self, source: str, name: str) -> dict:
        job = {"id": 0, "kind": "region_compile", "source": source, "name": name, "arch": self.arch,
               "timeout": self.compile_timeout}
        r = self._run(job, self.compile_timeout + 30)
        if r["status"] == "ok":
            return {**r, "name": name}
        if r["status"] == "timeout":
            raise TimeoutError(f"compile over {self.compile_timeout:g} s: {r.get('error', '')}")
        if r["status"] == "no_toolchain":
            raise NoToolchain(r.get("error", ""))
        cmd = f"\n$ {r['command']}" if r.get("command") else ""
        raise RuntimeError(f"{r.get('error') or r['status']}{cmd}")

    def verify(self, handle: dict):
        job = {"id": 1, "kind": "region_run", "so": handle["so"], "region": self.spec.as_dict(), "trials": 5, "reps": 20}
        r = self.result = self._run(job, self.run_timeout)
        if r["status"] == "needs_gpu":
            raise NeedsGPU(r.get("error", "needs a GPU"))
        if r["status"] == "timeout":
            raise TimeoutError(r.get("error", ""))
        if r["status"] != "ok":
            return False, r.get("error") or r["status"]
        return True, f"error {r.get('err', 0):.3g} (eager {r.get('eager_err', 0):.3g})"

    def bench(self, handle: dict) -> tuple[float, float]:
        r = self.result  # verify's job timed it too: the library is loaded once
        if r.get("time_ms") is None or r.get("eager_ms") is None:
            raise NeedsGPU("no timing came back from the worker")
        return r["time_ms"] / 1e3, r["eager_ms"] / 1e3

    def store(self, handle: dict, source: str) -> None:
        if self.registry is None:
            return
        r = self.result
        store(self.registry, self.spec, self.arch, r.get("device") or self.gpu, name=handle["name"], source=source,
              build_key=handle.get("build_key", ""), time_ms=r.get("time_ms"), eager_ms=r.get("eager_ms"),
              rel_err=r.get("err"), eager_rel_err=r.get("eager_err"), device_name=r.get("device", ""),
              model=self.model, explanation=self.explanation)

    def hooks(self) -> dict:
        return {"compile": self.compile, "verify": self.verify, "bench": self.bench, "store": self.store}
