"""AttentionKernel: a built attention `.so` (any family of the attention C ABI, see
kernels_cpp/fmha_sm90.cu.j2) loaded through ctypes, callable on SDPA-layout tensors, and
registered as a `torch.library` custom op named from its build key (never its path), so a
composed module keeps it under torch.compile(fullgraph=True) and in CUDA graphs.

    >>> k = AttentionKernel(path, "fmha_sm90", workload_key="...", build_key="...")
    >>> o = k(q, k_, v, scale=0.125, causal=True)   # q [b,h,lq,d], k/v [b,hkv,lk,d] -> [b,h,lq,dv]
    >>> op = k.as_op()                              # torch.ops.factdb.attn_<hash>(q, k, v, scale, causal)
"""
from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

from fact_db.kernels.abi import KernelError, launch_status, raw_stream
from fact_db.kernels.ops import SCHEMAS, factdb_op

# The output dtype of each family, when it is not q's (fmha_fp32tc writes float32 for fp32 q).
OUT_DTYPE: dict[str, str] = {}


def out_strides(b: int, h: int, lq: int, dv: int) -> tuple[int, int, int, int]:
    """The strides of an attention output [batch, heads, lq, dv] laid out [batch, lq, heads, dv]
    in memory, as PyTorch's flash, memory-efficient and cuDNN SDPA return it on a GPU: model code
    that views `o.transpose(1, 2)` as [batch, lq, heads * dv] without `.contiguous()` (as eager on
    a GPU allows) works on a fact-db kernel's output too."""
    return (lq * h * dv, dv, h * dv, 1)


def empty_out(b: int, h: int, lq: int, dv: int, dtype, device):
    """An attention output of `out_strides`' layout."""
    import torch
    return torch.empty_strided((b, h, lq, dv), out_strides(b, h, lq, dv), dtype=dtype, device=device)


class AttentionKernel:
    """A loaded attention kernel: `o = softmax(scale * q k^T [causal]) v` over grouped heads."""

    def __init__(self, path: str | Path, template: str, workload_key: str = "", build_key: str = ""):
        self.path = Path(path)
        self.template = template
        self.workload_key = workload_key
        self.build_key = build_key
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise KernelError(f"cannot load attention kernel {self.path}: {e} (built for another GPU arch? "
                              "sm_90a kernels need an H100/H200)") from None
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        try:
            self._launch = getattr(self._lib, f"fact_{template}_launch")
            self._ws = getattr(self._lib, f"fact_{template}_workspace_size")
        except AttributeError:
            raise KernelError(f"{self.path} does not export fact_{template}_launch/_workspace_size: "
                              f"not a {template} attention kernel (rebuild it from kernels_cpp/{template}.cu.j2)") from None
        self._launch.argtypes = [vp, vp, vp, vp] + [i64] * 19 + [ctypes.c_float, i64, vp, vp]
        self._launch.restype = ctypes.c_int
        self._ws.argtypes = [i64] * 4
        self._ws.restype = ctypes.c_size_t
        self._op = None

    @staticmethod
    def check_inputs(q, k, v) -> str | None:
        """None, or why (q, k, v) is not something the attention ABI takes."""
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            return f"q, k, v must be 4-d [batch, heads, length, dim], got {q.dim()}, {k.dim()}, {v.dim()} dims"
        if q.dtype != k.dtype or q.dtype != v.dtype:
            return f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
        b, h, lq, d = q.shape
        if k.shape[0] != b or v.shape[0] != b or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
            return f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        if k.shape[-1] != d or k.shape[1] < 1 or h % k.shape[1]:
            return f"k {tuple(k.shape)} does not fit q {tuple(q.shape)} (head dim, or heads not a multiple of KV heads)"
        if any(t.stride(-1) != 1 for t in (q, k, v)):
            return "the last dim of q, k and v must be contiguous"
        return None

    def workspace_size(self, batch: int, heads: int, lq: int, lk: int) -> int:
        return int(self._ws(batch, heads, lq, lk))

    def __call__(self, q, k, v, scale: float | None = None, causal: bool = False, out=None):
        import torch
        why = self.check_inputs(q, k, v)
        if why:
            raise KernelError(f"{self.template} kernel: {why}")
        b, h, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        out_dt = getattr(torch, OUT_DTYPE.get(self.template, "")) if OUT_DTYPE.get(self.template) else q.dtype
        if out is None:
            out = empty_out(b, h, lq, dv, out_dt, q.device)
        elif tuple(out.shape) != (b, h, lq, dv) or out.dtype != out_dt or out.stride(-1) != 1:
            raise KernelError(f"out must be a {out_dt} tensor of shape {(b, h, lq, dv)} with a contiguous last dim")
        scale = float(scale) if scale is not None else d ** -0.5
        ws_size = self.workspace_size(b, h, lq, lk)
        ws = torch.empty(max(ws_size, 1), dtype=torch.uint8, device=q.device)
        s = lambda t: t.stride()[:3]  # noqa: E731
        rc = self._launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                          b, h, hkv, lq, lk, d, dv, *s(q), *s(k), *s(v), *s(out),
                          scale, int(bool(causal)), ws.data_ptr(), raw_stream(q.device))
        if rc != 0:
            what = launch_status(rc)
            raise KernelError(f"{self.template} attention kernel {self.path.parent.name} refused or failed the launch: "
                              f"{what} (batch={b} heads={h}/{hkv} lq={lq} lk={lk} d={d} causal={bool(causal)})")
        return out

    @property
    def op_name(self) -> str:
        """`attn_<hash>` of the build key (or the library's bytes) and template: the same
        kernel has the same op name wherever its `.so` lies."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        return "attn_" + hashlib.sha256(f"{ident}|{self.template}".encode()).hexdigest()[:12]

    def as_op(self):
        """This kernel as `torch.ops.factdb.attn_<hash>(q, k, v, scale, causal) -> Tensor`."""
        if self._op is not None:
            return self._op
        kernel = self
        self._op = factdb_op(self.op_name, SCHEMAS["attention"],
                             lambda q, k, v, scale, causal: kernel(q, k, v, scale=scale, causal=causal),
                             attention_fake(OUT_DTYPE.get(self.template)))
        return self._op


def attention_fake(out_dtype: str | None = None):
    """The fake of an attention op `(q, k, v, scale, causal) -> o`: o [batch, heads, lq, dv]
    laid out as `empty_out` allocates it, in `out_dtype` (a torch dtype name), else q's."""
    def fake(q, k, v, scale, causal):
        import torch
        dt = getattr(torch, out_dtype) if out_dtype else q.dtype
        return empty_out(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dt, q.device)
    return fake
