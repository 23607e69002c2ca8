"""NormKernel: a built `kernels_cpp/add_norm.cu.j2` loaded through ctypes, and registered as a
torch custom op named from its build key (never its path), with a fake implementation, so a
composed module keeps it under torch.compile and in CUDA graphs.

>>> k = NormKernel(so, w, build_key=key)
>>> y, s = k(x, r, weight, bias)
>>> op = k.as_op()          # torch.ops.factdb.n_<hash>(x, r, weight, bias) -> (y, s)
"""
from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

from fact_db.kernels.abi import launch_status, raw_stream, torch_dtype
from fact_db.kernels.norm.workload import TEMPLATE, NormError, NormWorkload
from fact_db.kernels.ops import SCHEMAS, factdb_op

STATUS = {1: "misaligned operand", 4: "invalid problem (n differs from the kernel's width, or a pointer missing)"}


class NormKernel:
    """A loaded add_norm build. `k(x, r, weight, bias)` -> (y, s or None)."""

    def __init__(self, path: str | Path, workload: NormWorkload, build_key: str = ""):
        self.path = Path(path)
        self.workload = workload
        self.build_key = build_key
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise NormError(f"cannot load norm kernel {self.path}: {e} (built for another GPU arch?)") from None
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self._launch = self._lib.fact_add_norm_launch
        self._launch.argtypes = [vp] * 6 + [i64, i64, ctypes.c_float, vp]
        self._launch.restype = ctypes.c_int
        self._op = None

    def __call__(self, x, r=None, weight=None, bias=None, out=None, sum_out=None):
        import torch
        w = self.workload
        dt = torch_dtype(w.dtype)
        if x.shape[-1] != w.width or x.dtype != dt:
            raise NormError(f"norm kernel takes {w.dtype} [..., {w.width}], got {x.dtype} {tuple(x.shape)}")
        if w.residual and (r is None or r.shape != x.shape or r.dtype != dt):
            raise NormError(f"this norm kernel adds a residual: pass r of shape {tuple(x.shape)} and dtype {w.dtype}")
        shape = x.shape
        x2 = x.contiguous().view(-1, w.width)
        r2 = r.contiguous().view(-1, w.width) if w.residual else None
        wt = weight.to(dt).contiguous()
        b = bias.to(dt).contiguous() if (bias is not None and w.kind == "layernorm" and w.has_bias) else None
        if w.kind == "layernorm" and w.has_bias and b is None:
            raise NormError("this LayerNorm kernel adds a bias: pass bias")
        y = torch.empty_like(x2) if out is None else out.view(-1, w.width)
        s = (torch.empty_like(x2) if sum_out is None else sum_out.view(-1, w.width)) if w.write_sum else None
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        rc = self._launch(ptr(x2), ptr(r2), ptr(wt), ptr(b), ptr(y), ptr(s), x2.shape[0], w.width, w.eps,
                          raw_stream(x.device))
        if rc != 0:
            what = launch_status(rc, STATUS)
            raise NormError(f"norm kernel {self.path.parent.name} refused or failed the launch: {what} "
                            f"(rows={x2.shape[0]} width={w.width})")
        return y.view(shape), (s.view(shape) if s is not None else None)

    @property
    def op_name(self) -> str:
        """`n_<hash>` of the build key (or the library's bytes) and the workload, never the path."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        w = self.workload
        h = hashlib.sha256(f"{ident}|{TEMPLATE}|{w.kind}|{w.width}|{w.residual}|{w.write_sum}|{w.has_bias}|"
                           f"{w.eps!r}|{w.dtype}".encode()).hexdigest()[:12]
        return f"n_{h}"

    def as_op(self):
        """`torch.ops.factdb.<op_name>(x, r, weight, bias) -> (y, s)`; s is an empty tensor when
        the kernel does not write the sum. Has a fake implementation for torch.compile/export."""
        if self._op is not None:
            return self._op
        kernel = self

        def run(x, r, weight, bias):
            y, s = kernel(x, r, weight, bias)
            return y, (s if s is not None else x.new_empty(0))

        self._op = factdb_op(self.op_name, SCHEMAS["norm"], run, norm_fake(self.workload.write_sum))
        return self._op


def norm_fake(write_sum: bool):
    """The fake of a norm op `(x, r, weight, bias) -> (y, s)`: y, and s where the kernel writes
    the sum, packed in x's shape whatever x's strides (the kernel reads x made contiguous and
    writes packed rows); s is an empty tensor otherwise."""
    def fake(x, r, weight, bias):
        return x.new_empty(x.shape), (x.new_empty(x.shape) if write_sum else x.new_empty(0))
    return fake
