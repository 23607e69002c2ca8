"""Stand-ins for compiled kernels, for tests that compose on the CPU.

A stand-in op has the exact signature and semantics of a kernel op -- GEMM family
(`(a, b, bias, c, alpha, beta) -> epilogue(alpha * a @ b + beta * c + bias)`, see
fact_db/kernels/gemm/kernel.py), attention (`(q, k, v, scale, causal) -> o`) or residual add + norm
(`(x, r, weight, bias) -> (y, s)`, see fact_db/kernels/norm/) -- and counts its calls, so a
test can check both that the composed module computes the model's function and that the
kernel op really ran.
"""
from __future__ import annotations

import collections

import torch
import torch.nn.functional as F

CALLS: collections.Counter = collections.Counter()
_ACT = {"none": None, "bias": lambda t: t, "bias_relu": F.relu, "bias_gelu": F.gelu,
        "bias_gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "bias_silu": F.silu, "residual": lambda t: t}
_OPS: dict = {}


def gemm_op(epilogue: str):
    """torch.ops.factdb_test.gemm_<epilogue>, a CPU/CUDA stand-in for a GEMM kernel op."""
    if epilogue in _OPS:
        return _OPS[epilogue]
    name = f"gemm_{epilogue}"

    @torch.library.custom_op(f"factdb_test::{name}", mutates_args=(),
                             schema="(Tensor a, Tensor b, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor")
    def op(a, b, bias, c, alpha, beta):
        CALLS[name] += 1
        y = alpha * torch.matmul(a, b)
        if c is not None:
            y = y + beta * c
        if bias is not None and epilogue != "none":
            y = y + bias
        act = _ACT[epilogue]
        return act(y) if act is not None else y

    @op.register_fake
    def _(a, b, bias, c, alpha, beta):
        lead = a.shape[:-2] if a.dim() == 3 else (b.shape[:-2] if b.dim() == 3 else ())
        return a.new_empty((*lead, a.shape[-2], b.shape[-1]))
    _OPS[epilogue] = getattr(torch.ops.factdb_test, name)
    return _OPS[epilogue]


def split_lo(b):
    """A stand-in for GemmKernel.split_lo: tf32_rna(x - tf32_trunc(x)) in integer arithmetic on
    the float32 bits, returned K x N laid out K-major as the kernel's is."""
    bits = b.contiguous().view(torch.int32)
    r = b.contiguous() - (bits & ~0x1FFF).view(torch.float32)
    lo = ((r.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
    return lo.t().contiguous().t()


def gemm_lo_op(epilogue: str):
    """torch.ops.factdb_test.gemm_lo_<epilogue>(a, b, b_lo, bias, c, alpha, beta): a stand-in for
    a kernel op that takes B's lo parts (GemmKernel.as_op(b_lo=True)). It refuses a b_lo that
    is not split_lo(b), then computes what gemm_op(epilogue) does, counted."""
    name = f"gemm_lo_{epilogue}"
    if name in _OPS:
        return _OPS[name]
    plain = gemm_op(epilogue)

    @torch.library.custom_op(f"factdb_test::{name}", mutates_args=(), schema=(
        "(Tensor a, Tensor b, Tensor b_lo, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor"))
    def op(a, b, b_lo, bias, c, alpha, beta):
        if b_lo.shape != b.shape or b_lo.stride(-2) != 1 or not torch.equal(b_lo, split_lo(b)):
            raise RuntimeError("b_lo is not B's lo parts")
        CALLS[name] += 1
        return plain(a, b, bias, c, alpha, beta)

    @op.register_fake
    def _(a, b, b_lo, bias, c, alpha, beta):
        lead = a.shape[:-2] if a.dim() == 3 else (b.shape[:-2] if b.dim() == 3 else ())
        return a.new_empty((*lead, a.shape[-2], b.shape[-1]))
    _OPS[name] = getattr(torch.ops.factdb_test, name)
    return _OPS[name]


def attention_op():
    """torch.ops.factdb_test.attention(q, k, v, scale, causal): the explicit math, counted."""
    if "attention" in _OPS:
        return _OPS["attention"]

    @torch.library.custom_op("factdb_test::attention", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> Tensor")
    def op(q, k, v, scale, causal):
        CALLS["attention"] += 1
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).contiguous()

    @op.register_fake
    def _(q, k, v, scale, causal):
        return q.new_empty((*q.shape[:-1], v.shape[-1]))
    _OPS["attention"] = torch.ops.factdb_test.attention
    return _OPS["attention"]


def norm_op(kind: str = "layernorm", eps: float = 1e-5):
    """torch.ops.factdb_test.norm_<kind>_<eps>(x, r, weight, bias) -> (y, s): a stand-in for an
    add_norm kernel op (fact_db/kernels/norm/), y = norm(x + r), s = x + r (empty without r), counted."""
    name = f"norm_{kind}_{format(eps, 'g').replace('.', 'p').replace('-', 'm')}"
    if name in _OPS:
        return _OPS[name]

    @torch.library.custom_op(f"factdb_test::{name}", mutates_args=(),
                             schema="(Tensor x, Tensor? r, Tensor weight, Tensor? bias) -> (Tensor, Tensor)")
    def op(x, r, weight, bias):
        if x.dtype != weight.dtype or (r is not None and r.dtype != x.dtype):  # the kernel's contract (NormError)
            raise RuntimeError(f"norm kernel takes {weight.dtype}, got x {x.dtype}"
                               + (f", r {r.dtype}" if r is not None else ""))
        CALLS[name] += 1
        s = x + r if r is not None else x
        if kind == "layernorm":
            y = F.layer_norm(s, (x.shape[-1],), weight, bias, eps)
        else:
            y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight
        return y, (s.clone() if r is not None else x.new_empty(0))

    @op.register_fake
    def _(x, r, weight, bias):
        return torch.empty_like(x), (torch.empty_like(x) if r is not None else x.new_empty(0))
    _OPS[name] = getattr(torch.ops.factdb_test, name)
    return _OPS[name]


def region_op(spec):
    """torch.ops.factdb_test.region_<hash>([inputs]) -> out: a stand-in for an agent's region
    kernel (fact_db/kernels/region/), the RegionSpec's own ops at its dtype, counted."""
    import hashlib
    import json
    key = "region_" + hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode()).hexdigest()[:12]
    if key in _OPS:
        return _OPS[key]
    names = [x["name"] for x in spec.inputs]
    out_shape, out_dt = list(spec.out_shape), getattr(torch, spec.dtype)

    @torch.library.custom_op(f"factdb_test::{key}", mutates_args=(), schema="(Tensor[] inputs) -> Tensor")
    def op(inputs):
        CALLS["region"] += 1
        return spec.eager(dict(zip(names, inputs))).clone()

    @op.register_fake
    def _(inputs):
        return inputs[0].new_empty(out_shape, dtype=out_dt)
    _OPS[key] = getattr(torch.ops.factdb_test, key)
    return _OPS[key]


def conv_op(workload):
    """torch.ops.factdb_test.conv_<hash>(x, w, bias, vecs, residual): a stand-in for a conv kernel
    op (fact_db/kernels/conv/kernel.py) of `workload`: w as the kernel holds it (KRSC; split3's
    [hi(w), lo(w), hi(w)] along C: the first two thirds add up to w; the pointwise GEMM's
    [hi(w); lo(w)]), the output channels-last. Counts its calls,
    and separately the calls whose activation or residual did not arrive channels-last (the
    real op would convert them)."""
    import hashlib
    import json

    from fact_db.kernels.conv.kernel import conv_fake, is_channels_last, is_pointwise, to_channels_last
    name = "conv_" + hashlib.sha256(json.dumps(workload.as_dict(), sort_keys=True).encode()).hexdigest()[:12]
    if name in _OPS:
        return _OPS[name]

    @torch.library.custom_op(f"factdb_test::{name}", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor? bias, Tensor[] vecs, Tensor? residual) -> Tensor")
    def op(x, w, bias, vecs, residual):
        CALLS["conv"] += 1
        if not is_channels_last(x) or (residual is not None and not is_channels_last(residual)):
            CALLS["conv_not_channels_last"] += 1
        c = workload.c
        held = w[..., :c] + w[..., c:2 * c] if w.shape[-1] == 3 * c else w  # split3: hi(w) + lo(w), fp32-class
        if is_pointwise(workload) and tuple(w.shape) == (2, workload.k, c):  # the pointwise GEMM's [hi(w); lo(w)]
            held = (w[0] + w[1]).reshape(workload.k, *workload.filter, c)
        kcrs = held.movedim(-1, 1)
        if workload.transposed:  # held as the forward convolution it equals (kernel.prepare_weight)
            kcrs = kcrs.transpose(0, 1).flip(list(range(2, kcrs.dim())))
        inp = {"x": x, "w": kcrs, "bias": bias, **{f"v{i}": v for i, v in enumerate(vecs)}}
        if residual is not None:
            inp["r"] = residual
        return to_channels_last(workload.eager(inp)).clone()

    op.register_fake(conv_fake(workload))
    _OPS[name] = getattr(torch.ops.factdb_test, name)
    return _OPS[name]


def composed_faster(fn, xs) -> float:
    """A stand-in timer under which the composed module wins optimize's choice: 0.5 ms for the
    choice's composed candidates (named after them), 1 ms for everything else (eager, the
    benchmark's variants). Equal times are a tie, which eager keeps (choice.MARGINS)."""
    return 0.5 if getattr(fn, "__name__", "").startswith("composed") else 1.0


class FakeClock:
    """CUDA events on a fake clock, for tests of the timers on the CPU: `Event` records the
    clock's time, `fn(name, cost)` a callable that logs its name in `order` and advances the
    clock by `cost` ms."""

    def __init__(self):
        self.now, self.order = 0.0, []
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return end.t - self.t
        self.Event = Event

    def fn(self, name: str, cost: float):
        def run(*x):
            self.order.append(name)
            self.now += cost
        return run

