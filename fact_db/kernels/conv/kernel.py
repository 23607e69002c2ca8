"""ConvKernel: a built `kernels_cpp/conv_sm90.cu.j2` loaded through ctypes and registered as a torch
custom op named from its build key (never its path), with a fake that gives the real
(channels-last) output strides, so a composed module keeps it under torch.compile and in CUDA
graphs.

>>> cfg = ConvConfig(128, 128, 64)
>>> src = render(w, cfg)                                   # one .cu per (workload class, config)
>>> k = ConvKernel(so, w, cfg, build_key=key)
>>> wt = prepare_weight(inputs["w"], w, cfg)               # once: KRSC (and TF32 lo parts for split3)
>>> y = k(x, wt, bias, [v0], residual)                    # logical N, K, *out; channels-last in memory

Layout: the kernel reads channels-last activations and writes a channels-last output (a
tensor of the usual N, K, *spatial shape whose channel stride is 1), so PyTorch ops after it
work unchanged and the next fact-db convolution reads it without a copy; an input that is
not channels-last is converted in the op (composition inserts that conversion explicitly
where it plans one, fact_db/kernels/conv/layout.py).

`split3` (the fp32 and tf32x3 candidates): 3xTF32 along the reduction. The weight is held
once as [hi(w), lo(w), hi(w)] along its input channels (prepare_weight), and each launch first
writes [hi(x), hi(x), lo(x)] into its workspace (one pass in the template), so the one TF32
implicit GEMM over 3C channels sums hi(x) hi(w) + hi(x) lo(w) + lo(x) hi(w), with hi(v) =
tf32_trunc(v) and lo(v) = tf32_rna(v - hi(v)). Every operand is a TF32 value, so the sum does not
depend on whether the tensor cores truncate raw fp32 or round it (the first version held raw x
and w in the hi blocks and counted on truncation: an H200 rounded, and every split3 candidate
failed verification at TF32's error, 8.7e-4). Left in the tensor cores' accumulators, the
partial sums still missed the fp32 bound by 3-4x on an H200; `promote` adds them into fp32
registers every few k-tiles (kernels_cpp/_sm90_conv_promote.j2), as the GEMM family's fp32tc
mainloop does. Kept only where it verifies under the policy.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from fact_db.kernels.abi import launch_status, raw_stream, torch_dtype
from fact_db.kernels.conv import phases
from fact_db.kernels.conv.workload import ELEMENT, ConvError, ConvWorkload
from fact_db.kernels.ops import factdb_op

TEMPLATE = "conv_sm90"
GEMM_TEMPLATE = "conv_gemm_sm90"  # a pointwise fp32 convolution as the GEMM it is (schedule "gemm")
TEMPLATES = (TEMPLATE, GEMM_TEMPLATE)
SCHEDULES = ("ws", "coop", "persistent", "pingpong", "gemm")  # conv_sm90.cu.j2's `schedule`, or "gemm": conv_gemm_sm90.cu.j2
GEOMETRY_LEN = 21


@dataclass(frozen=True)
class ConvConfig:
    """A candidate's compile-time parameters: CTA tile, cluster, stages, and the 3xTF32 split."""

    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int = 1
    cluster_n: int = 1
    stages: object = "auto"
    split3: bool = False
    promote: int = 0  # k-tiles between promotions of the tensor cores' partial sums into fp32 registers; 0: none
    schedule: str = "ws"  # "ws": CUTLASS's one-consumer kernel; "coop": two consumer warpgroups (fact-db's kernel),
    # a CTA a tile; "persistent": the same kernel with a CTA an SM, each taking tile after tile; "pingpong":
    # a CTA an SM whose two consumer warpgroups take a tile each in turn (one's epilogue under the other's mainloop);
    # "gemm": a pointwise convolution as a GEMM with A split in registers (conv_gemm_sm90; split3 and promote needed)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ConvError(f"conv config: schedule '{self.schedule}' is not one of {', '.join(SCHEDULES)} "
                            "(ws: CUTLASS's one-consumer kernel, coop: two consumer warpgroups, persistent: coop "
                            "with a CTA an SM, pingpong: two consumer warpgroups a tile each in turn, gemm: a "
                            "pointwise convolution as a GEMM)")
        if self.schedule == "gemm" and (not self.split3 or self.promote < 1):
            raise ConvError(f"conv config: schedule gemm is the fp32-class pointwise kernel: it needs split3 and "
                            f"promote >= 1, got split3={self.split3} promote={self.promote}")

    @property
    def template(self) -> str:
        """The kernels_cpp template that renders this config."""
        return GEMM_TEMPLATE if self.schedule == "gemm" else TEMPLATE

    @property
    def label(self) -> str:
        split = "regsplit " if self.schedule == "gemm" else "split3 " if self.split3 else ""
        return (f"{split}{f'promote/{self.promote} ' if self.promote else ''}"
                f"{self.tile_m}x{self.tile_n}x{self.tile_k} "
                f"c{self.cluster_m}x{self.cluster_n}" + ("" if self.stages == "auto" else f" s{self.stages}")
                + ("" if self.schedule == "ws" else f" {self.schedule}"))


def _literal(x: float) -> str:
    """A C float literal for a chain constant."""
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"{float(x)!r}f"


def groups_of(w: ConvWorkload) -> list:
    """The template's `groups`: the bias (vector 0) and the chain, consecutive unary and scalar
    steps merged into one functor, each vector step its own (vectors numbered in order)."""
    out, unary, vi = [], [], 0

    def flush():
        if unary:
            out.append({"kind": "unary", "steps": list(unary)})
            unary.clear()
    if w.bias:
        out.append({"kind": "vec", "op": "add", "index": 0})
        vi = 1
    for s in w.steps:
        op = s["op"]
        if op in ("add", "sub", "mul", "div") and "scalar" not in s:
            flush()
            if s.get("kind") == "full":
                out.append({"kind": "src", "op": op})
            else:
                out.append({"kind": "vec", "op": op, "index": vi})
                vi += 1
            continue
        step = {"op": op, "value": None, "slope": None, "min": None, "max": None}
        if "scalar" in s:
            step["value"] = _literal(s["scalar"])
        if op == "leaky_relu":
            step["slope"] = _literal(s.get("slope", 0.01))
        if op == "clamp":
            step["min"] = None if s.get("min") is None else _literal(s["min"])
            step["max"] = None if s.get("max") is None else _literal(s["max"])
        unary.append(step)
    flush()
    return out


def params(w: ConvWorkload, c: ConvConfig) -> dict:
    el = ELEMENT[w.dtype]
    return {"element": el, "element_out": el, "element_vec": el, "element_c": el if w.residual else "void",
            "spatial": w.spatial, "tile_m": c.tile_m, "tile_n": c.tile_n, "tile_k": c.tile_k, "cluster_m": c.cluster_m,
            "cluster_n": c.cluster_n, "stages": c.stages, "split3": c.split3, "promote": c.promote,
            "schedule": c.schedule, "groups": groups_of(w)}


def render(w: ConvWorkload, c: ConvConfig) -> str:
    from fact_db.kernels import template
    return template.render(c.template, params(w, c))


def source(w: ConvWorkload, c: ConvConfig, arch: str = "sm90a"):
    """What kernels.build compiles for `w` under `c` (its template, rendered, for `arch`)."""
    from fact_db.kernels import build
    return build.Source(c.template, render(w, c), arch)


def alignment(dtype: str) -> int:
    """Elements per 16 bytes: TMA needs C and K multiples of it."""
    return 16 // {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def channels(w: ConvWorkload) -> int:
    """The input channels the kernel runs with: C, rounded up to a multiple of the alignment.
    A network's first convolution reads 3 channels (RGB), which TMA cannot address (12 bytes a
    pixel at fp32); the kernel reads the activation with zero channels added (channels-last, in
    the pass that converts it anyway) and a weight padded with zeros the same way, which adds
    nothing to any sum."""
    a = alignment(w.dtype)
    return -(-w.c // a) * a


def why_not(w: ConvWorkload) -> str:
    """"" where the template can compute `w`, else why cuDNN keeps it."""
    if phases.phased(w) and w.residual:
        return ("a transposed convolution with a stride (run as phases) and a residual in its epilogue: the "
                "residual's pixels are not the phases' own, cuDNN runs it")
    if phases.phased(w) and w.steps and w.groups == 1 and phases.plan(w).empty:
        return (f"a transposed convolution whose stride {w.stride} leaves output pixels no filter tap reaches (filter "
                f"{w.filter}, dilation {w.dilation}), with an element-wise chain on them: cuDNN runs it")
    if w.groups != 1:
        return f"groups={w.groups}: CUTLASS's sm90 implicit GEMM has no grouped or depthwise kernel, cuDNN runs it"
    a = alignment(w.dtype)
    if w.k % a:
        return (f"K={w.k}: TMA needs the output channels a multiple of {a} ({w.dtype}: 16 bytes); cuDNN runs odd "
                "output channel counts (input channels are padded: kernel.channels)")
    return ""


def is_pointwise(w: ConvWorkload) -> bool:
    """Whether `w` is a GEMM as it stands: every filter size 1, stride 1, no padding, one group,
    not transposed (a channels-last activation is then an M x C matrix)."""
    return (not w.transposed and w.groups == 1 and all(f == 1 for f in w.filter) and all(s == 1 for s in w.stride)
            and not any(w.padding))


def why_not_gemm(w: ConvWorkload) -> str:
    """"" where conv_gemm_sm90 (schedule "gemm") can compute `w`, else why not."""
    if w.dtype != "float32" or w.policy not in ("fp32", "tf32x3"):
        return f"the pointwise GEMM kernel is the fp32-class path (fp32, tf32x3), not {w.policy} on {w.dtype}"
    if not is_pointwise(w):
        return "not a pointwise convolution (filter 1, stride 1, no padding, one group)"
    if w.c % alignment(w.dtype):
        return f"C={w.c}: the pointwise GEMM kernel reads the channels as stored, a multiple of {alignment(w.dtype)}"
    return why_not(w)


# ------------------------------------------------------------------------------------------
# Layout and the 3xTF32 split, in PyTorch ops (run on any device, so tests check them on the CPU).

def is_channels_last(t) -> bool:
    """Whether an N, C, *spatial tensor is packed channels-last (N, *spatial, C in memory)."""
    return t.movedim(1, -1).is_contiguous()


def to_channels_last(t):
    """`t` packed channels-last (the same tensor where it already is), for 1-D, 2-D and 3-D."""
    if is_channels_last(t):
        return t
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def tf32_hi(t):
    """tf32_trunc(t): t with its low 13 mantissa bits cleared, a TF32 value whatever the tensor
    cores do with raw fp32 (truncate or round)."""
    import torch
    return (t.contiguous().view(torch.int32) & -8192).view(torch.float32).view(t.shape)


def tf32_lo(t):
    """tf32_rna(t - tf32_trunc(t)): what TF32 operands lose when the tensor cores truncate raw
    fp32 bits, rounded to TF32 (the template's split pass computes the same bits)."""
    import torch
    c = t.contiguous()
    hi = (c.view(torch.int32) & -8192).view(torch.float32)  # sign, exponent, 10 mantissa bits
    r = c - hi
    return ((r.view(torch.int32) + 0x1000) & -8192).view(torch.float32).view(t.shape)


def forward_padding(w: ConvWorkload) -> tuple:
    """The padding the kernel runs with: the workload's; for a stride-1 transposed convolution,
    that of the forward convolution it equals (dilation x (filter - 1) - padding). (A strided
    one runs as phases, each with its own: phases.plan.)"""
    if not w.transposed:
        return w.padding
    return tuple(d * (f - 1) - p for d, f, p in zip(w.dilation, w.filter, w.padding))


def prepare_weight(w_kcrs, workload: ConvWorkload, cfg: ConvConfig):
    """The weight as the kernel reads it, made once: K x R... x C packed (KRSC), in the
    workload's dtype; for split3 [hi(w), lo(w), hi(w)] along C (each part TF32 already: see the
    template); for the pointwise GEMM (schedule "gemm") [hi(w); lo(w)], two K x C matrices. A
    stride-1 transposed convolution's weight (C x K x R...) becomes the forward one it equals:
    flipped in space, C and K swapped; a strided one's, each phase's forward weight so made
    (phases.weight), flattened one after another (16-byte aligned each: C and K are)."""
    import torch
    w = w_kcrs.detach()
    if phases.phased(workload):
        return torch.cat([_prepared(phases.weight(w, ph), workload, cfg).reshape(-1)
                          for ph in phases.plan(workload).phases])
    if workload.transposed:
        w = w.flip(list(range(2, w.dim()))).transpose(0, 1)
    return _prepared(w, workload, cfg)


def _prepared(w, workload: ConvWorkload, cfg: ConvConfig):
    """Forward weight `w` (K x C x R...) as prepare_weight makes it."""
    import torch
    wt = w.to(torch_dtype(workload.dtype)).movedim(1, -1).contiguous()
    cp = channels(workload)
    if cp > wt.shape[-1]:  # zero channels, as the activation gets (channels)
        wt = torch.nn.functional.pad(wt, (0, cp - wt.shape[-1])).contiguous()
    if cfg.schedule == "gemm":  # conv_gemm_sm90's B and its lo parts: [hi(w); lo(w)], K x C each
        flat = wt.reshape(wt.shape[0], -1)
        return torch.stack([tf32_hi(flat), tf32_lo(flat)]).contiguous()
    if cfg.split3:
        hi = tf32_hi(wt)
        wt = torch.cat([hi, tf32_lo(wt), hi], dim=-1).contiguous()
    return wt


def split_activation(x_nhwc):
    """[hi(x), hi(x), lo(x)] along the channels of a packed N, *spatial, C tensor: what split3's
    launch writes into its workspace, in PyTorch ops (the CPU tests' reference)."""
    import torch
    hi = tf32_hi(x_nhwc)
    return torch.cat([hi, hi, tf32_lo(x_nhwc)], dim=-1)


def channels_last_strides(shape) -> list:
    """Strides of a packed channels-last tensor of logical shape N, C, *spatial."""
    n, c, *sp = shape
    strides = [0] * len(shape)
    strides[1] = 1
    acc = c
    for i in range(len(shape) - 1, 1, -1):
        strides[i] = acc
        acc *= shape[i]
    strides[0] = acc
    return strides


class ConvKernel:
    """A loaded conv_sm90 (or, schedule "gemm", conv_gemm_sm90) build.
    `k(x, w_prepared, bias, vecs, residual)` -> y (channels-last)."""

    def __init__(self, path: str | Path, workload: ConvWorkload, config: ConvConfig, build_key: str = ""):
        self.path = Path(path)
        self.workload = workload
        self.config = config
        self.build_key = build_key
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise ConvError(f"cannot load conv kernel {self.path}: {e} (built for another GPU arch?)") from None
        vp = ctypes.c_void_p
        abi = f"fact_{config.template}"  # conv_sm90 and conv_gemm_sm90 take the same arguments
        self._launch = getattr(self._lib, f"{abi}_launch")
        self._launch.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp]
        self._launch.restype = ctypes.c_int
        self._ws = getattr(self._lib, f"{abi}_workspace_size")
        self._ws.argtypes = [vp]
        self._ws.restype = ctypes.c_size_t
        self._op = None

    def geometry(self, n: int, phase=None):
        """The launch's geometry: the workload's forward convolution, or one of its phases'
        (phases.Phase: stride 1, its taps, padding and output)."""
        w = self.workload
        c = channels(w)
        pad = lambda v: list(v) + [1] * (3 - len(v))  # noqa: E731
        if phase is None:
            fwd = (w.filter, w.output, w.stride, forward_padding(w), w.dilation)
        else:
            fwd = (phase.filter, phase.output, (1,) * w.spatial, phase.padding, phase.dilation)
        g = [n, c, w.k, *pad(w.input), *pad(fwd[0]), *pad(fwd[1]), *pad(fwd[2]),
             *(list(fwd[3]) + [0] * (3 - w.spatial)), *pad(fwd[4])]
        return (ctypes.c_int64 * GEOMETRY_LEN)(*g)

    def __call__(self, x, w, bias=None, vecs=(), residual=None, out=None):
        import torch
        wl = self.workload
        dt = torch_dtype(wl.dtype)
        if tuple(x.shape[1:]) != wl.x_shape()[1:] or x.dtype != dt:
            raise ConvError(f"conv kernel takes {wl.dtype} (N, {wl.c}, {', '.join(map(str, wl.input))}), got "
                            f"{x.dtype} {tuple(x.shape)}")
        if phases.phased(wl) and wl.residual:  # never built so (why_not): refused, not launched without it
            raise ConvError(f"{why_not(wl)} ({wl.describe()})")
        n, cp = x.shape[0], channels(wl)
        if cp > wl.c:  # N, *spatial, C packed with zero channels added, in one pass (channels)
            xn = torch.nn.functional.pad(x.movedim(1, -1), (0, cp - wl.c))
        else:
            xn = to_channels_last(x).movedim(1, -1)  # N, *spatial, C packed
        if xn.data_ptr() % 16:  # a view at an odd offset: TMA (and split3's float4 pass) need 16-byte bases
            xn = xn.clone()
        k = wl.k
        vec_list = []
        if wl.bias:
            if bias is None:
                raise ConvError("this conv kernel adds a bias: pass bias")
            vec_list.append(bias.reshape(k).to(dt).contiguous())
        for t in vecs:
            t = t.to(dt).reshape(-1)
            vec_list.append(t.expand(k).contiguous() if t.numel() == 1 else t.reshape(k).contiguous())
        if len(vec_list) != int(wl.bias) + len(wl.vec_steps):
            raise ConvError(f"this conv kernel reads {len(wl.vec_steps)} per-channel tensors, got {len(vecs)}")
        r = None
        if wl.residual:
            if residual is None:
                raise ConvError("this conv kernel adds a residual: pass it")
            r = to_channels_last(residual.to(dt))
            if r.data_ptr() % 16:
                r = r.clone(memory_format=torch.preserve_format)
        y = torch.empty((n, *wl.output, k), dtype=dt, device=x.device).movedim(-1, 1)
        ptrs = (ctypes.c_void_p * max(1, len(vec_list)))(*[v.data_ptr() for v in vec_list])
        if phases.phased(wl):
            self._phases(xn, w, ptrs, y, vec_list)
        else:
            self._run(xn, w.data_ptr(), ptrs, r, y, self.geometry(n))
        if out is not None:
            out.copy_(y)
            return out
        return y

    def _run(self, xn, w_ptr: int, ptrs, r, y, geo) -> None:
        """One launch: activation `xn` (N, *spatial, C packed), weight at `w_ptr`, into `y`."""
        import torch
        size = self._ws(ctypes.addressof(geo))
        ws = torch.empty(max(1, size), dtype=torch.uint8, device=xn.device)
        rc = self._launch(xn.data_ptr(), w_ptr, ctypes.addressof(ptrs), r.data_ptr() if r is not None else None,
                          y.data_ptr(), ctypes.addressof(geo), ws.data_ptr(), raw_stream(xn.device))
        if rc != 0:
            raise ConvError(f"conv kernel {self.path.parent.name} refused or failed the launch: {launch_status(rc)} "
                            f"({self.workload.describe()})")

    def _phases(self, xn, w, ptrs, y, vec_list) -> None:
        """A strided transposed convolution (phases.py): each phase's forward convolution into
        a buffer, its pixels copied into every s-th pixel of `y`; the pixels no tap reaches get
        the bias (why_not keeps a chain off them)."""
        import torch
        wl, n = self.workload, xn.shape[0]
        p = phases.plan(wl)
        if p.empty:
            if wl.bias:
                y.copy_(vec_list[0].reshape(1, -1, *([1] * wl.spatial)).expand_as(y))
            else:
                y.zero_()
        split = 3 if self.config.split3 else 1
        at, size = w.data_ptr(), w.element_size()
        for ph in p.phases:
            z = torch.empty((n, *ph.output, wl.k), dtype=y.dtype, device=y.device).movedim(-1, 1)
            self._run(xn, at, ptrs, None, z, self.geometry(n, ph))
            at += wl.k * math.prod(ph.filter) * channels(wl) * split * size
            y[phases.pixels(ph.dst, p.stride)] = z[phases.pixels(ph.src)]

    @property
    def op_name(self) -> str:
        """`c_<hash>` of the build key (or the library's bytes), the config and the workload."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        w = self.workload
        text = f"{ident}|{TEMPLATE}|{sorted(asdict(self.config).items())}|{sorted(w.as_dict().items())}"
        return f"c_{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def as_op(self):
        """`torch.ops.factdb.<op_name>(x, w, bias, vecs, residual) -> y`, y channels-last; the
        fake gives those strides."""
        if self._op is not None:
            return self._op
        kernel = self
        self._op = factdb_op(self.op_name, "(Tensor x, Tensor w, Tensor? bias, Tensor[] vecs, Tensor? residual) -> Tensor",
                             lambda x, w, bias, vecs, residual: kernel(x, w, bias, vecs, residual),
                             conv_fake(self.workload))
        return self._op


def conv_fake(w: ConvWorkload):
    """The fake implementation of a conv op: an empty output of the real shape and channels-last strides."""
    def fake(x, wt, bias, vecs, residual):
        import torch
        shape = (x.shape[0], w.k, *w.output)
        return torch.empty_strided(shape, channels_last_strides(shape), dtype=x.dtype, device=x.device)
    return fake


def _library_strides(x, shape) -> list:
    """The strides cuDNN's output has for input `x`: channels-last where x is (PyTorch's
    suggested memory format for 4-D and 5-D), else packed."""
    if x.dim() in (4, 5) and is_channels_last(x) and not x.is_contiguous():
        return channels_last_strides(shape)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def library_fn(w: ConvWorkload):
    """What the cuDNN op runs (and its CPU tests call): cuDNN's convolution on the weight as
    the model holds it (K x C x R..., BatchNorm folded in by composition), then the chain op by
    op, the output in the layout its fake promises."""
    import torch

    def run(x, wt, bias, vecs, residual):
        inp = {"x": x, "w": wt, "bias": bias, **{f"v{i}": v for i, v in enumerate(vecs)}}
        if residual is not None:
            inp["r"] = residual
        y = w.apply_chain(w._conv(x, wt, bias), inp)
        want = _library_strides(x, tuple(y.shape))
        if list(y.stride()) != want:
            y = torch.empty_strided(tuple(y.shape), want, dtype=y.dtype, device=y.device).copy_(y)
        return y
    return run


def cudnn_op(w: ConvWorkload):
    """The library path with the kernel op's signature, for a region whose BatchNorm composition
    folds where cuDNN won: `(x, w, bias, vecs, residual) -> y` (library_fn), so the BatchNorm's
    pass is saved at every policy, whichever runs the convolution."""
    import json

    import torch
    name = "cudnn_" + hashlib.sha256(json.dumps(w.as_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def fake(x, wt, bias, vecs, residual):
        shape = (x.shape[0], w.k, *w.output)
        return torch.empty_strided(shape, _library_strides(x, shape), dtype=x.dtype, device=x.device)
    return factdb_op(name, "(Tensor x, Tensor w, Tensor? bias, Tensor[] vecs, Tensor? residual) -> Tensor",
                     library_fn(w), fake)
