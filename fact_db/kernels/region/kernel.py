"""RegionKernel: a built region kernel loaded through ctypes and registered as a torch custom
op named from its build key; and the worker jobs that compile a proposed source (nvcc runs only
in the worker, under a time limit) and verify and time a built one against the region's
float64 reference and eager PyTorch.

    >>> k = RegionKernel(so, spec, build_key=key)
    >>> out = k([x, w], torch.empty(spec.out_shape, device="cuda"))
"""
from __future__ import annotations

import ctypes
import hashlib
import json
from pathlib import Path

from fact_db.kernels.abi import KernelError, launch_status, raw_stream
from fact_db.kernels.ops import SCHEMAS, factdb_op
from fact_db.kernels.region.source import ENTRY, TEMPLATE
from fact_db.kernels.region.spec import RegionSpec


class RegionKernel:
    """A built region kernel: `k(inputs, out)` launches it on tensors in ABI order."""

    def __init__(self, path: str | Path, spec: RegionSpec, build_key: str = ""):
        self.path, self.spec, self.build_key = Path(path), spec, build_key
        self._op = None
        try:
            self._lib = ctypes.CDLL(str(self.path))
            self._fn = getattr(self._lib, ENTRY)
        except (OSError, AttributeError) as e:
            raise KernelError(f"cannot load region kernel {self.path}: {e}") from None
        P = ctypes.POINTER
        self._fn.argtypes = [P(ctypes.c_void_p), P(P(ctypes.c_int64)), P(P(ctypes.c_int64)), P(ctypes.c_int),
                             ctypes.c_int, ctypes.c_void_p, P(ctypes.c_int64), ctypes.c_int, ctypes.c_void_p]
        self._fn.restype = ctypes.c_int

    def __call__(self, inputs: list, out):
        n = len(inputs)
        i64 = ctypes.c_int64
        shapes = [(i64 * max(t.dim(), 1))(*t.shape) for t in inputs]
        strides = [(i64 * max(t.dim(), 1))(*t.stride()) for t in inputs]
        ptrs = (ctypes.c_void_p * n)(*[t.data_ptr() for t in inputs])
        sp = (ctypes.POINTER(i64) * n)(*[ctypes.cast(s, ctypes.POINTER(i64)) for s in shapes])
        st = (ctypes.POINTER(i64) * n)(*[ctypes.cast(s, ctypes.POINTER(i64)) for s in strides])
        ranks = (ctypes.c_int * n)(*[t.dim() for t in inputs])
        oshape = (i64 * max(out.dim(), 1))(*out.shape)
        rc = self._fn(ptrs, sp, st, ranks, n, out.data_ptr(), oshape, out.dim(), raw_stream(out.device))
        if rc != 0:
            what = launch_status(rc, {})
            raise KernelError(f"region kernel {self.path.parent.name} refused or failed the launch: {what}")
        return out


    @property
    def op_name(self) -> str:
        """`r_<hash>` of the build key (or the library's bytes) and the region: the same kernel
        for the same region gets the same name wherever its `.so` lies (build cache, artifact)."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        region = json.dumps(self.spec.as_dict(), sort_keys=True)
        return "r_" + hashlib.sha256(f"{ident}|{region}".encode()).hexdigest()[:12]

    def as_op(self):
        """This kernel as `torch.ops.factdb.<op_name>(Tensor[] inputs) -> Tensor`, inputs in ABI
        order. Inputs are made contiguous first (the kernel was verified on contiguous tensors;
        a no-op for the usual ones), and a call with shapes other than the region's is refused:
        the kernel was verified at those shapes only."""
        if self._op is not None:
            return self._op
        import torch

        kernel, spec = self, self.spec
        shapes = [list(x["shape"]) for x in spec.inputs]
        out_shape, out_dt = list(spec.out_shape), getattr(torch, spec.dtype)

        def run(inputs):
            got = [list(t.shape) for t in inputs]
            if got != shapes:
                raise KernelError(f"region kernel {kernel.path.parent.name} takes inputs of shapes {shapes}, "
                                  f"got {got}")
            xs = [t.contiguous() for t in inputs]
            return kernel(xs, torch.empty(out_shape, dtype=out_dt, device=xs[0].device))

        self._op = factdb_op(self.op_name, SCHEMAS["region"], run, region_fake(out_shape, out_dt))
        return self._op


def region_fake(out_shape: list, out_dtype):
    """The fake of a region op `([inputs]) -> out`: the region's output, packed."""
    return lambda inputs: inputs[0].new_empty(out_shape, dtype=out_dtype)


# Worker jobs (fact_db/kernels/worker.py runs them in its subprocess; the parent never compiles).

def compile_job(job: dict) -> dict:
    """{"source", "name", "arch", "timeout"} -> {"status": ok|compile_error|timeout|no_toolchain,
    "so", "build_key", "error", "command", "seconds"}. nvcc runs under `timeout` seconds."""
    from fact_db.kernels import build as build_mod
    try:
        [b] = build_mod.build([build_mod.Source(TEMPLATE, job["source"], job.get("arch", "sm90a"))], jobs=1,
                              progress=False, timeout=float(job.get("timeout", 300)))
    except build_mod.BuildError as e:
        return {"id": job["id"], "status": "no_toolchain", "error": str(e)}
    if b.ok:
        return {"id": job["id"], "status": "ok", "so": str(b.path), "build_key": b.key, "command": b.command,
                "seconds": b.seconds, "cached": b.cached, "error": ""}
    status = "timeout" if b.error.startswith("nvcc timed out") else "compile_error"
    return {"id": job["id"], "status": status, "build_key": b.key, "error": b.error, "command": b.command,
            "seconds": b.seconds}


def run_job(job: dict) -> dict:
    """{"so", "region", "trials", "reps"} -> verify against float64 and time against eager on
    the GPU: {"status": ok|verify_failed|launch_error|needs_gpu, "err", "eager_err", "time_ms",
    "eager_ms", "device", "error"}."""
    import torch
    if not torch.cuda.is_available():
        return {"id": job["id"], "status": "needs_gpu",
                "error": "needs a GPU: no CUDA device is visible to the worker, so it was neither verified "
                         "nor timed"}
    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import verify
    spec = RegionSpec.from_dict(job["region"])
    k = RegionKernel(job["so"], spec)
    names = [x["name"] for x in spec.inputs]

    def run(inputs, out=None):
        if out is None:
            out = torch.empty(spec.out_shape, dtype=getattr(torch, spec.dtype), device="cuda")
        return k([inputs[n] for n in names], out)

    res = {"id": job["id"], "device": torch.cuda.get_device_name()}
    v = verify(run, spec, trials=job.get("trials", 5))
    res.update(err=v.err, eager_err=v.eager_err)
    if not v.ok:
        return {**res, "status": "launch_error" if v.reason.startswith("launch failed") else "verify_failed",
                "error": v.reason}
    sets = [spec.make_inputs("randn") for _ in range(3)]
    t = time_cuda(run, sets, reps=job.get("reps", 20))
    e = time_cuda(lambda x: spec.eager(x), sets, reps=job.get("reps", 20))
    return {**res, "status": "ok", "time_ms": t.median_ms, "eager_ms": e.median_ms, "error": ""}
