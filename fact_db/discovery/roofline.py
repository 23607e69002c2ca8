"""Roofline: FLOPs, bytes and an estimated time for a region on a target GPU.

The ceilings are measured or datasheet peaks (see DESIGN.md): they bound what a kernel
can reach, so an estimate is a floor on time, not a prediction of it. Eager PyTorch is
modelled as one kernel per compute node, each reading its inputs from and writing its
output to HBM; a fused region reads its external inputs once and writes its output once.

>>> dev = fact_db.core.device.device("h100")
>>> est = estimate(match, dev, policy="tf32")
>>> est.fused_s < est.eager_s
True
"""
from __future__ import annotations

from dataclasses import dataclass

from fact_db.core.device import Device
from fact_db.discovery import aten


def matmul_tflops(dev: Device, policy: str, dtype: str | None) -> float:
    """Peak for tensor-core-eligible math under a precision policy.

    Half-precision tensors run at the half rate whatever the policy. fp32 tensors run at
    the fp32 rate under `fp32`, the tf32 rate under `tf32`, a third of it under `tf32x3`
    (three products), and at the half rate under `bf16`/`fp16` (autocast).
    """
    if dtype in ("float16", "bfloat16"):
        return dev.tflops["bf16"]
    if policy == "fp32":
        return dev.tflops["fp32"]
    if policy == "tf32":
        return dev.tflops["tf32"]
    if policy == "tf32x3":
        return dev.tflops["tf32"] / 3
    return dev.tflops["bf16"]


def fused_matmul_tflops(dev: Device, policy: str, dtype: str | None) -> float:
    """Peak for fact-db's own kernels: as `matmul_tflops`, except that float32 operands under
    the `fp32` policy run on TF32 tensor cores with split operands (3xTF32 with promotion,
    DESIGN.md's precision table), a third of the TF32 rate, where eager PyTorch runs SIMT."""
    if policy == "fp32" and dtype not in ("float16", "bfloat16"):
        return dev.tflops["tf32"] / 3
    return matmul_tflops(dev, policy, dtype)


# FLOPs per output element of elementwise and reduction ops (rough, for ranking only).
_ELEMENTWISE_FLOPS = {"aten.gelu": 8, "aten.silu": 4, "aten.tanh": 4, "aten.erf": 4, "aten.sigmoid": 4,
                      "aten.softmax": 5, "aten._softmax": 5, "aten.layer_norm": 8, "aten.native_layer_norm": 8,
                      "aten.rms_norm": 5, "aten.rsqrt": 2, "aten.pow": 1}


def node_flops(n) -> float:
    dims = aten.gemm_problem(n)
    if dims:
        f = 2.0 * dims["batch"] * dims["M"] * dims["N"] * dims["K"]
        if n.op in ("aten.addmm", "aten.baddbmm") or (n.op == "aten.linear" and n.args[2] is not None):
            f += n.numel
        return f
    if n.op == "aten.scaled_dot_product_attention":
        q, k, v = n.args[0], n.args[1], n.args[2]
        bh = 1
        for s in q.shape[:-2]:
            bh *= s
        lq, d = q.shape[-2], q.shape[-1]
        lk, dv = k.shape[-2], v.shape[-1]
        f = 2.0 * bh * lq * lk * (d + dv) + 5.0 * bh * lq * lk
        return f
    if aten.is_transparent(n) or n.shape is None:
        return 0.0
    return float(_ELEMENTWISE_FLOPS.get(n.op, 1)) * n.numel


def node_bytes(n) -> float:
    """Bytes eager PyTorch moves for one node: its tensor inputs and its output."""
    if aten.is_transparent(n) and n.op not in ("aten.contiguous", "aten.clone"):
        return 0.0
    if n.op in ("aten.contiguous", "aten.clone") and n.args and getattr(n.args[0], "stride", None) == n.stride:
        return 0.0
    return float(sum(a.nbytes for a in n.tensor_inputs()) + n.nbytes)


def _tensor_core(n) -> bool:
    """Does this node's math run at the matmul (tensor-core) rate?"""
    return aten.gemm_problem(n) is not None or n.op == "aten.scaled_dot_product_attention"


def node_time(n, dev: Device, policy: str) -> float:
    f, b = node_flops(n), node_bytes(n)
    if f == 0 and b == 0:
        return 0.0
    peak = matmul_tflops(dev, policy, n.dtype) if _tensor_core(n) else dev.tflops["fp32"]
    return max(f / (peak * 1e12), b / dev.bandwidth) + dev.launch_s


@dataclass
class Estimate:
    flops: float
    bytes_fused: float
    bytes_eager: float
    fused_s: float
    eager_s: float
    bound: str  # "compute" or "memory"

    @property
    def bytes_saved(self) -> float:
        return max(0.0, self.bytes_eager - self.bytes_fused)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_fused if self.bytes_fused else float("inf")

    @property
    def gain_s(self) -> float:
        return self.eager_s - self.fused_s

    def as_dict(self) -> dict:
        return {"flops": self.flops, "bytes_fused": self.bytes_fused, "bytes_eager": self.bytes_eager,
                "bytes_saved": self.bytes_saved, "intensity": self.intensity, "bound": self.bound,
                "est_fused_s": self.fused_s, "est_eager_s": self.eager_s, "est_gain_s": self.gain_s}


def estimate(match, dev: Device, policy: str = "fp32", skip_fraction: float = 0.0) -> Estimate:
    """Roofline estimate of one matched region, fused vs eager at the same policy.

    `skip_fraction` is the share of the FLOPs the fused kernel never does (0.5 for the
    masked half of causal attention).
    """
    compute = match.compute_nodes
    flops = sum(node_flops(n) for n in compute)
    eager_bytes = sum(node_bytes(n) for n in compute)
    fused_bytes = float(sum(a.nbytes for a in match.inputs) + sum(o.nbytes for o in match.outputs))
    eager_s = sum(node_time(n, dev, policy) for n in compute)
    mm = next((n for n in compute if _tensor_core(n)), None)
    peak = fused_matmul_tflops(dev, policy, mm.dtype) if mm is not None else dev.tflops["fp32"]
    t_compute = flops * (1.0 - skip_fraction) / (peak * 1e12)
    t_memory = fused_bytes / dev.bandwidth
    fused_s = max(t_compute, t_memory) + dev.launch_s
    return Estimate(flops, fused_bytes, eager_bytes, fused_s, eager_s, "compute" if t_compute >= t_memory else "memory")


def graph_eager_time(graph, dev: Device, policy: str) -> float:
    return sum(node_time(n, dev, policy) for n in graph.calls())
