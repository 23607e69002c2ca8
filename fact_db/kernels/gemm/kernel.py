"""Kernel: a built GEMM-family `.so` loaded through ctypes, callable on torch tensors, and
registered as a `torch.library` custom op so it works under `torch.compile(fullgraph=True)`
and inside CUDA graph capture (DESIGN.md, "Realization contract").

Every GEMM-family template exports the same C ABI (see kernels_cpp/gemm_sm90.cu.j2):
`fact_<template>_launch[_ex]` and `fact_<template>_workspace_size[_ex]`.

>>> k = GemmKernel(path, "gemm_sm90", GemmSpec("bfloat16", "row", "col", "bias_gelu_tanh"))
>>> d = k(a, w.t(), bias=b)          # a: M x K, w: N x K (a Linear weight), b: N
>>> op = k.as_op()                   # torch.ops.factdb.k_<hash>(a, b, bias, c, alpha, beta)
"""
from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from pathlib import Path

from fact_db.kernels.abi import KernelError, launch_status, raw_stream, torch_dtype
from fact_db.kernels.ops import SCHEMAS, factdb_op

@dataclass(frozen=True)
class GemmSpec:
    """What a GEMM-family kernel computes: operand dtype, layouts, epilogue, and whether it reads C."""

    dtype: str            # operand dtype (torch name): float32, float16, bfloat16
    layout_a: str         # row | col
    layout_b: str         # row | col  (col: B given as N x K row-major, e.g. a Linear weight)
    epilogue: str = "none"
    bias_axis: str = "col"
    out_dtype: str = ""   # defaults to dtype

    @property
    def needs_bias(self) -> bool:
        return self.epilogue.startswith("bias") or self.epilogue == "residual"

    @property
    def reads_c(self) -> bool:
        return self.epilogue == "residual"


@dataclass(frozen=True)
class _Plan:
    """A GEMM call's launch arguments other than the data pointers, alpha and beta."""
    shape: tuple          # D's
    dtype: object         # D's torch dtype
    ws: int               # workspace bytes
    b_lo: bool            # launched with B's lo parts (launch_blo_ex)
    c: bool               # C's pointer passed
    bias: bool            # the bias pointer passed
    ints: tuple           # m, n, k, batch, lda, ldb, ldc, ldd, batch strides of A, B, C, D, and 0


def _geometry(a, b, bias, c, b_lo) -> tuple:
    """What a GEMM call's launch arguments depend on, besides the data pointers and scalars."""
    return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype),
            None if c is None else (c.shape, c.stride(), c.dtype),
            None if b_lo is None else (b_lo.shape, b_lo.stride(), b_lo.dtype, b_lo.device))


def operand_layout(t, logical_rows_dim: int = -2) -> tuple[str, int] | None:
    """(layout, leading dimension) of the last two dims of `t`, or None if neither is unit-stride."""
    if t.dim() < 2:
        return None
    rows, cols = t.shape[-2], t.shape[-1]
    s_r, s_c = t.stride(-2), t.stride(-1)
    if s_c == 1 and (s_r >= cols or rows == 1):
        return "row", max(s_r, cols)
    if s_r == 1 and (s_c >= rows or cols == 1):
        return "col", max(s_c, rows)
    return None


class GemmKernel:
    """A loaded GEMM-family kernel. Call it like `epilogue(alpha * a @ b + beta * c + bias)`."""

    def __init__(self, path: str | Path, template: str, spec: GemmSpec, options: tuple[int, ...] | None = None,
                 build_key: str = ""):
        self.path = Path(path)
        self.build_key = build_key  # names the op; without it the library's bytes do (never its path)
        self.template = template
        self.spec = spec
        self.options = tuple(options) if options else None
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise KernelError(f"cannot load kernel {self.path}: {e} (built for another GPU arch? sm_90a "
                              "kernels need an H100/H200, sm_80 ones an A100 or a build for sm_90a)") from None
        i64, vp, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        self._launch = getattr(self._lib, f"fact_{template}_launch_ex", None)
        self._ws = getattr(self._lib, f"fact_{template}_workspace_size_ex", None)
        self._has_ex = self._launch is not None
        if not self._has_ex:
            self._launch = getattr(self._lib, f"fact_{template}_launch")
            self._ws = getattr(self._lib, f"fact_{template}_workspace_size")
        args = [vp, vp, vp, vp, vp] + [i64] * 13 + [f32, f32, vp, vp]
        self._launch.argtypes = args + ([ctypes.POINTER(i64)] if self._has_ex else [])
        self._launch.restype = ctypes.c_int
        self._ws.argtypes = [i64] * 4 + ([ctypes.POINTER(i64)] if self._has_ex else [])
        self._ws.restype = ctypes.c_size_t
        self._opts = (i64 * 4)(*self.options) if self.options and self._has_ex else None
        # Templates that split B before the kernel (fp32tc presplit) also take B's lo parts
        # made once: for a B that is a weight, composition splits it when it builds the graph.
        self._launch_blo = getattr(self._lib, f"fact_{template}_launch_blo_ex", None) if self._has_ex else None
        if self._launch_blo is not None:
            self._launch_blo.argtypes = [vp] * 6 + [i64] * 13 + [f32, f32, vp, vp, ctypes.POINTER(i64)]
            self._launch_blo.restype = ctypes.c_int
            self._ws_blo = getattr(self._lib, f"fact_{template}_workspace_size_blo_ex")
            self._ws_blo.argtypes = [i64] * 4 + [ctypes.POINTER(i64)]
            self._ws_blo.restype = ctypes.c_size_t
            self._split = getattr(self._lib, f"fact_{template}_split_lo")
            self._split.argtypes = [vp, vp] + [i64] * 5 + [vp]
            self._split.restype = ctypes.c_int
        self._op = self._op_blo = None
        self._plans: dict = {}  # call geometry -> _Plan: a repeated call skips the checks and sizing

    # ----------------------------------------------------------------------------------
    def _prepare(self, x, want: str):
        """x with its last two dims in layout `want` (a copy only if it is not already)."""
        lay = operand_layout(x)
        if lay is not None and lay[0] == want:
            return x, lay[1]
        x = x.contiguous() if want == "row" else x.transpose(-1, -2).contiguous().transpose(-1, -2)
        return x, operand_layout(x)[1]

    def workspace_size(self, m: int, n: int, k: int, batch: int, b_lo: bool = False) -> int:
        if b_lo:
            return int(self._ws_blo(m, n, k, batch, self._opts))
        extra = (self._opts,) if self._has_ex else ()
        return int(self._ws(m, n, k, batch, *extra))

    @property
    def takes_b_lo(self) -> bool:
        """Whether a call can take B's lo parts made once (`split_lo`) instead of splitting B."""
        return self._launch_blo is not None

    def _check_b(self, b):
        import torch
        if not self.takes_b_lo:
            raise KernelError(f"{self.template} kernel {self.path.parent.name} does not take B's lo parts")
        if b.dim() != 2 or b.dtype != torch.float32:
            raise KernelError(f"B's lo parts are made for a 2-D float32 B (a weight), got {tuple(b.shape)} {b.dtype}")

    def split_lo(self, b):
        """B's lo parts, tf32_rna(x - tf32_trunc(x)), for a B (K x N, as a call takes it) that
        stays the same across calls: `self(a, b, b_lo=self.split_lo(b))` computes what
        `self(a, b)` does without splitting B again. A K x N tensor laid out K-major, so
        `b_lo.t()` is packed; it must be made again whenever B changes."""
        import torch
        self._check_b(b)
        b, ldb = self._prepare(b, self.spec.layout_b)
        k, n = b.shape
        lo = torch.empty((n, k), dtype=torch.float32, device=b.device)
        rc = self._split(b.data_ptr(), lo.data_ptr(), n, k, ldb, 0, 1, raw_stream(b.device))
        if rc != 0:
            raise KernelError(f"{self.template} kernel {self.path.parent.name}: splitting B failed: "
                              f"{launch_status(rc)}")
        return lo.t()

    def __call__(self, a, b, bias=None, c=None, alpha: float = 1.0, beta: float = 0.0, out=None, b_lo=None):
        import torch
        # A call like an earlier one (same shapes, strides, dtypes, devices, same operands
        # present) launches with the arguments worked out then: a composed module makes the
        # same calls every forward, and the checks below cost it tens of us of host time each.
        geo = _geometry(a, b, bias, c, b_lo) if out is None else None
        plan = self._plans.get(geo) if geo is not None else None
        if plan is not None:
            return self._run(plan, a, b, bias, c, b_lo, alpha, beta)
        spec = self.spec
        given = (a, b, bias, c)
        if b_lo is not None:
            self._check_b(b)
            k_, n_ = b.shape
            if (tuple(b_lo.shape) != (k_, n_) or b_lo.dtype != torch.float32 or b_lo.stride() != (1, k_)
                    or b_lo.device != b.device):
                raise KernelError(f"b_lo must be B's lo parts from split_lo: a float32 {k_} x {n_} tensor laid "
                                  f"out K-major on {b.device}, got {tuple(b_lo.shape)} {b_lo.dtype} strides "
                                  f"{tuple(b_lo.stride())} on {b_lo.device}")
        dt = torch_dtype(spec.dtype)
        if a.dtype != dt or b.dtype != dt:
            raise KernelError(f"kernel takes {spec.dtype} operands, got {a.dtype} and {b.dtype}")
        if a.dim() not in (2, 3) or b.dim() not in (2, 3) or a.shape[-1] != b.shape[-2]:
            raise KernelError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} are not a (batched) GEMM")
        batched = a.dim() == 3 or b.dim() == 3
        if batched and a.dim() == 3 and b.dim() == 2 and spec.layout_a == "row":
            lead = a.shape[0]
            d = self(a.reshape(-1, a.shape[-1]) if a.is_contiguous() else a.contiguous().reshape(-1, a.shape[-1]),
                     b, bias, None if c is None else c.reshape(-1, c.shape[-1]), alpha, beta,
                     None if out is None else out.view(-1, out.shape[-1]), b_lo=b_lo)
            return d.view(lead, -1, d.shape[-1]) if out is None else out
        if batched and b_lo is not None:
            raise KernelError("B's lo parts are for a 2-D B shared by every row of A, not a batched B")
        if batched:
            if a.dim() == 2:
                a = a.unsqueeze(0).expand(b.shape[0], *a.shape)
            if b.dim() == 2:
                b = b.unsqueeze(0).expand(a.shape[0], *b.shape)
            if a.shape[0] != b.shape[0]:
                raise KernelError(f"batch sizes differ: {a.shape[0]} and {b.shape[0]}")
            if a.stride(0) == 0:
                a = a.contiguous()
            if b.stride(0) == 0:
                b = b.contiguous()
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = a.shape[0] if batched else 1
        a, lda = self._prepare(a, spec.layout_a)
        b, ldb = self._prepare(b, spec.layout_b)
        out_dt = torch_dtype(spec.out_dtype or spec.dtype)
        shape = (batch, m, n) if batched else (m, n)
        if out is None:
            out = torch.empty(shape, dtype=out_dt, device=a.device)
        elif tuple(out.shape) != shape or out.dtype != out_dt or not out.is_contiguous():
            raise KernelError(f"out must be a contiguous {out_dt} tensor of shape {shape}")
        if spec.needs_bias and bias is not None:
            bias = bias.to(out_dt).contiguous()
        if spec.reads_c:
            if c is None:
                raise KernelError("this kernel adds a residual: pass c")
            c = c.to(out_dt)
            if c.stride(-1) != 1:
                c = c.contiguous()
        ldc = c.stride(-2) if c is not None else n
        bs_a = a.stride(0) if batched else 0
        bs_b = b.stride(0) if batched else 0
        bs_c = (c.stride(0) if c is not None and c.dim() == 3 else 0)
        bs_d = m * n if batched else 0
        ws_size = self.workspace_size(m, n, k, batch, b_lo=b_lo is not None)
        plan = _Plan(shape, out_dt, ws_size, b_lo is not None, spec.reads_c or c is not None, spec.needs_bias,
                     (m, n, k, batch, lda, ldb, ldc, n, bs_a, bs_b, bs_c, bs_d, 0))
        if geo is not None and not batched and all(x is y for x, y in zip((a, b, bias, c), given)):
            # Nothing was copied or cast: the same call next time needs none of the above.
            self._plans[geo] = plan
        return self._run(plan, a, b, bias, c, b_lo, alpha, beta, out)

    def _run(self, plan, a, b, bias, c, b_lo, alpha: float, beta: float, out=None):
        import torch
        dev = a.device
        if out is None:
            out = torch.empty(plan.shape, dtype=plan.dtype, device=dev)
        ws = torch.empty(max(plan.ws, 1), dtype=torch.uint8, device=dev) if plan.ws else None
        lo = (b_lo.data_ptr(),) if plan.b_lo else ()
        rc = (self._launch_blo if plan.b_lo else self._launch)(
            a.data_ptr(), b.data_ptr(), *lo, c.data_ptr() if plan.c and c is not None else None,
            bias.data_ptr() if plan.bias and bias is not None else None, out.data_ptr(), *plan.ints,
            alpha, beta, ws.data_ptr() if ws is not None else None, raw_stream(dev),
            *((self._opts,) if self._has_ex else ()))
        if rc != 0:
            what = launch_status(rc)
            m, n, k, batch = plan.ints[:4]
            raise KernelError(f"{self.template} kernel {self.path.parent.name} refused or failed the launch: {what} "
                              f"(M={m} N={n} K={k} batch={batch})")
        return out

    # ----------------------------------------------------------------------------------
    @property
    def op_name(self) -> str:
        """`k_<hash>` of the build key (or the library's bytes), run-time options and spec: the
        same kernel gets the same name wherever its `.so` lies (a build cache, an artifact)."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        h = hashlib.sha256(f"{ident}|{self.template}|{self.options}|{self.spec}".encode()).hexdigest()[:12]
        return f"k_{h}"

    def as_op(self, b_lo: bool = False):
        """This kernel as `torch.ops.factdb.<op_name>(a, b, bias, c, alpha, beta) -> Tensor`; with
        `b_lo`, as `torch.ops.factdb.<op_name>_blo(a, b, b_lo, bias, c, alpha, beta)`, which takes
        B's lo parts from `split_lo` (kernels that `takes_b_lo` only)."""
        if (self._op_blo if b_lo else self._op) is not None:
            return self._op_blo if b_lo else self._op
        if b_lo and not self.takes_b_lo:
            raise KernelError(f"{self.template} kernel {self.path.parent.name} does not take B's lo parts")
        kernel = self
        fake = gemm_fake(torch_dtype(self.spec.out_dtype or self.spec.dtype))
        if b_lo:
            existing = factdb_op(
                self.op_name + "_blo", SCHEMAS["gemm_blo"],
                lambda a, b, b_lo, bias, c, alpha, beta: kernel(a, b, bias=bias, c=c, alpha=alpha, beta=beta,
                                                                b_lo=b_lo),
                lambda a, b, b_lo, bias, c, alpha, beta: fake(a, b, bias, c, alpha, beta))
        else:
            existing = factdb_op(
                self.op_name, SCHEMAS["gemm"],
                lambda a, b, bias, c, alpha, beta: kernel(a, b, bias=bias, c=c, alpha=alpha, beta=beta), fake)
        if b_lo:
            self._op_blo = existing
        else:
            self._op = existing
        return existing


def gemm_fake(out_dtype):
    """The fake of a GEMM op `(a, b, bias, c, alpha, beta) -> d`: D is packed row-major, of A's
    rows by B's columns, with a leading batch dim where A or B has one (as GemmKernel writes it)."""
    def fake(a, b, bias, c, alpha, beta):
        lead = a.shape[:-2] if a.dim() == 3 else (b.shape[:-2] if b.dim() == 3 else ())
        return a.new_empty((*lead, a.shape[-2], b.shape[-1]), dtype=out_dtype)
    return fake


# ------------------------------------------------------------------------------------------
# SwiGLU over one GEMM's output.

def _op_name(op) -> str:
    name = getattr(op, "__name__", None) if not hasattr(op, "_qualified_op_name") else op._qualified_op_name
    return "".join(ch if ch.isalnum() else "_" for ch in str(name or op))


def swiglu_fake(a, b, b_lo, n):
    """SwiGLU's output is the gate half of the GEMM's M x 2N result, rows 2N apart."""
    return a.new_empty((a.shape[0], 2 * n))[:, :n]


def swiglu_op(gemm, gemm_lo=None):
    """`torch.ops.factdb.swiglu_<gemm>(a, b, b_lo, n) -> silu(a b[:, :n]) * (a b[:, n:])`: one GEMM
    over the concatenated gate and up weights (`gemm`, or `gemm_lo` with B's lo parts where
    b_lo is given), then SiLU and the product in place in the gate half of its output, which
    is what it returns: a strided M x N half of an M x 2N tensor, as its fake says, so the
    call holds one M x 2N tensor and Inductor plans its readers for those strides. Registered
    for every device: it only calls the GEMM op and two element-wise ones."""
    import torch.nn.functional as F

    def run(a, b, b_lo, n):
        if b_lo is not None:
            y = gemm_lo(a, b, b_lo, None, None, 1.0, 0.0)
        else:
            y = gemm(a, b, None, None, 1.0, 0.0)
        gate = y[:, :n]
        return F.silu(gate, inplace=True).mul_(y[:, n:])
    name = f"swiglu_{_op_name(gemm)}" + (f"_lo_{_op_name(gemm_lo)}" if gemm_lo is not None else "")
    return factdb_op(name, SCHEMAS["swiglu"], run, swiglu_fake,
                     dispatch="CompositeExplicitAutograd")


# ------------------------------------------------------------------------------------------
# The library path with a kernel op's signature.

_LIBRARY_OPS: dict = {}


def library_gemm_op(epilogue: str):
    """The library path of a GEMM-family region with a kernel op's signature
    `(a, b, bias, c, alpha, beta) -> epilogue(alpha * a @ b + beta * c + bias)`: cuBLAS through
    `addmm` (the bias added by cuBLAS, as nn.Linear does) or `matmul`, and the epilogue's
    activation as one PyTorch op. It is what the tuner times as the `eager` candidate
    (GemmWorkload.eager), so a region whose fastest verified candidate is the library runs
    that, rather than the model's own ops: a GELU written out as eight element-wise ops is one
    `gelu` here. The bias arrives scaled by alpha (compose._gemm_nodes folds it), as for a kernel."""
    if epilogue in _LIBRARY_OPS:
        return _LIBRARY_OPS[epilogue]
    import torch

    from fact_db.kernels.gemm.workload import activation
    act = activation(epilogue)
    if epilogue not in ("none", "residual") and act is None:
        raise KernelError(f"no library path for epilogue {epilogue!r}")

    def op(a, b, bias, c, alpha, beta):
        if epilogue == "none":
            bias = None
        if bias is not None and a.dim() == 2 and b.dim() == 2:
            y = torch.addmm(bias, a, b, alpha=alpha)
        else:
            y = torch.matmul(a, b)
            if alpha != 1.0:
                y = y * alpha
            if bias is not None:
                y = y + bias
        if c is not None and beta != 0.0:
            y = torch.add(y, c, alpha=beta)
        return act(y) if act is not None else y
    op.__name__ = op.__qualname__ = f"library_gemm_{epilogue}"
    _LIBRARY_OPS[epilogue] = op
    return op
