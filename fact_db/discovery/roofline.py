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
from fact_db.discovery import aten, einsum


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

CONV_OPS = frozenset({"aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution", "aten._convolution"})
CONV_TRANSPOSE_OPS = frozenset({"aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d"})
# Gates per hidden unit, and the FLOPs of the gate arithmetic per hidden unit and step (the
# two projections summed, the activations at 4 FLOPs as in _ELEMENTWISE_FLOPS, the state update):
# LSTM: 4 sums + 3 sigmoids + 2 tanh + c = f*c + i*g (3) + h = o*tanh(c) (1) = 28;
# GRU: 2 sums + 2 sigmoids + n = tanh(x_n + r*h_n) (2 + 4) + h = (1-z)*n + z*h (4) = 20;
# RNN: 1 sum + tanh (4) = 5, or + ReLU (1) = 2.
RECURRENT_OPS = {"aten.lstm": (4, 28), "aten.gru": (3, 20), "aten.rnn_tanh": (1, 5), "aten.rnn_relu": (1, 2)}


def conv_flops(n) -> float:
    """FLOPs of a convolution: 2 per multiply-add, each output element summing over
    C_in / groups x prod(kernel) inputs, plus one per output element for a bias:

        conv:            2 * numel(out) * prod(weight.shape[1:])  (+ numel(out) with a bias)
        conv_transpose:  2 * numel(in)  * prod(weight.shape[1:])  (+ numel(out) with a bias)

    (weight is C_out x C_in/groups x k... for a convolution, C_in x C_out/groups x k... for a
    transposed one, whose every input element scatters into C_out/groups x prod(k) outputs).
    """
    x, w = n.args[0], n.args[1]
    bias = n.arg("bias")
    if getattr(w, "shape", None) is None or getattr(x, "shape", None) is None or n.shape is None:
        return float(n.numel)
    per = 1
    for s in w.shape[1:]:
        per *= s
    transposed = n.op in CONV_TRANSPOSE_OPS or bool(n.arg("transposed", False))
    f = 2.0 * (x.numel if transposed else n.numel) * per
    return f + (n.numel if bias is not None else 0.0)


def _recurrent(n) -> dict:
    """What a recurrent op (aten.lstm / gru / rnn_tanh / rnn_relu, `.input` or `.data` over a
    packed sequence) computes, read off its operands: steps x batch rows S = numel(x) / I,
    its weights, hidden size H, output size P (the LSTM projection, else H), layers L and
    directions D."""
    x = n.args[0]
    params = n.arg("params") or []
    gates, pointwise = RECURRENT_OPS[n.op]
    hx = n.arg("hx")
    states = [t for t in (hx if isinstance(hx, (list, tuple)) else [hx]) if getattr(t, "shape", None) is not None]
    layers, dirs = int(n.arg("num_layers", 1) or 1), 2 if n.arg("bidirectional") else 1
    mats = [p for p in params if getattr(p, "shape", None) is not None and len(p.shape) == 2]
    vecs = [p for p in params if getattr(p, "shape", None) is not None and len(p.shape) == 1]
    rows = x.numel // x.shape[-1] if x.shape else 0
    if n.overload == "data":  # a packed sequence: one batch size per step
        bs = n.args[1]
        steps = bs.shape[0] if getattr(bs, "shape", None) else rows
    elif x.shape and len(x.shape) == 3:
        steps = x.shape[1] if n.arg("batch_first") else x.shape[0]
    else:
        steps = x.shape[0] if x.shape else 0
    hidden = mats[1].shape[0] // gates if len(mats) > 1 else 0
    out = mats[1].shape[1] if len(mats) > 1 else hidden  # w_hh is G*H x P
    return {"rows": rows, "steps": steps, "mats": mats, "vecs": vecs, "states": states, "gates": gates,
            "pointwise": pointwise, "hidden": hidden, "out": out, "layers": layers, "dirs": dirs,
            "itemsize": x.itemsize}


def recurrent_flops(n) -> float:
    """FLOPs of an LSTM / GRU / RNN over S = steps x batch rows, every layer and direction:

        2 * S * numel(W)    for every weight matrix W (w_ih: G*H x I_l, w_hh: G*H x P, and the
                            LSTM projection w_hr: P x H), 2 FLOPs per multiply-add
      + S * numel(b)        for every bias vector (b_ih, b_hh)
      + S * H * c * L * D   the gate arithmetic, c per hidden unit and step (RECURRENT_OPS:
                            LSTM 28, GRU 20, RNN 5 (tanh) or 2 (ReLU))

    with G gates per unit (LSTM 4, GRU 3, RNN 1), L layers and D directions; ATen passes the
    weights of every layer and direction in `params`, so the sums cover them all."""
    r = _recurrent(n)
    f = sum(2.0 * r["rows"] * w.numel for w in r["mats"]) + sum(float(r["rows"]) * b.numel for b in r["vecs"])
    return f + float(r["rows"]) * r["hidden"] * r["pointwise"] * r["layers"] * r["dirs"]


def recurrent_bytes(n) -> float:
    """Bytes a recurrent op moves through HBM at least, as cuDNN runs it (the input projection of
    every step as one GEMM per layer and direction, then the recurrence):

        x, the weights and the initial states read once
      + the output sequence (S x D*P) and the final states (as large as the initial) written
      + 2 * S * G*H * L * D        the input projections written, then read back step by step
      + 2 * S * D*P * (L - 1)      each layer's output sequence written, read by the next

    The weights are counted once: re-reads each step come from cache in the best case."""
    r = _recurrent(n)
    x = n.args[0]
    elems = (r["rows"] * r["dirs"] * r["out"] + 2.0 * r["rows"] * r["gates"] * r["hidden"] * r["layers"] * r["dirs"]
             + 2.0 * r["rows"] * r["dirs"] * r["out"] * (r["layers"] - 1))
    return (float(x.nbytes) + sum(p.nbytes for p in r["mats"] + r["vecs"]) + 2.0 * sum(s.nbytes for s in r["states"])
            + elems * r["itemsize"])


def recurrent_chain_s(n, dev: Device) -> float:
    """The dependency chain of a recurrent op: each step of each layer waits for the step
    before it, so it takes at least one kernel launch's latency per step and layer
    (steps x L x dev.launch_s; the two directions of a bidirectional layer run side by side).
    No FLOP or byte count sees this, and it is what bounds small recurrent layers: GRU(128, 256,
    6 layers) over 512 steps of batch 10 is 0.46 ms of FLOPs and bytes on an H100, 9.2 ms of
    chain, and ran in 34 ms in eager PyTorch (fp32, 2026-11)."""
    r = _recurrent(n)
    return float(r["steps"]) * r["layers"] * dev.launch_s


def einsum_flops(n) -> float:
    """An einsum that is one GEMM: 2 * batch * M * N * K; any other: its left-to-right
    pairwise contraction (discovery.einsum.flops)."""
    dims = aten.gemm_problem(n)
    if dims:
        return 2.0 * dims["batch"] * dims["M"] * dims["N"] * dims["K"]
    ops = n.args[1]
    try:
        return einsum.flops(str(n.args[0]), [x.shape for x in ops])
    except (einsum.EinsumError, AttributeError, TypeError):
        return float(n.numel)


def node_flops(n) -> float:
    """FLOPs of one node: GEMMs 2 * batch * M * N * K (+ one per output element for a bias),
    attention 2 * BH * Lq * Lk * (D + Dv) + 5 per score, convolutions and recurrent ops as
    `conv_flops` and `recurrent_flops` say, einsums as `einsum_flops`, other ops a few per
    output element (_ELEMENTWISE_FLOPS, else 1)."""
    if n.op == "aten.einsum":
        return einsum_flops(n)
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
    if n.op in CONV_OPS or n.op in CONV_TRANSPOSE_OPS:
        return conv_flops(n)
    if n.op in RECURRENT_OPS:
        return recurrent_flops(n)
    if aten.is_transparent(n) or n.shape is None or n.op == "python.getitem":
        return 0.0
    return float(_ELEMENTWISE_FLOPS.get(n.op, 1)) * n.numel


def node_bytes(n) -> float:
    """Bytes eager PyTorch moves for one node: its tensor inputs and its output (recurrent ops:
    `recurrent_bytes`; an einsum of three or more operands adds its intermediate results,
    written and read back once each)."""
    if n.op == "python.getitem":  # picks one output of a multi-output op: moves nothing
        return 0.0
    if aten.is_transparent(n) and n.op not in ("aten.contiguous", "aten.clone"):
        return 0.0
    if n.op in ("aten.contiguous", "aten.clone") and n.args and getattr(n.args[0], "stride", None) == n.stride:
        return 0.0
    if n.op in RECURRENT_OPS:
        return recurrent_bytes(n)
    b = float(sum(a.nbytes for a in n.tensor_inputs()) + n.nbytes)
    if n.op == "aten.einsum" and len(n.args[1]) > 2:
        try:
            b += 2.0 * einsum.intermediates(str(n.args[0]), [x.shape for x in n.args[1]]) * n.itemsize
        except (einsum.EinsumError, AttributeError, TypeError):
            pass
    return b


def node_dtype(n) -> str | None:
    """The dtype a node computes in: its output's, or for a multi-output op (LSTM, GRU), its
    first tensor input's."""
    if n.dtype:
        return n.dtype
    first = next(iter(n.tensor_inputs()), None)
    return first.dtype if first is not None else None


def _tensor_core(n) -> bool:
    """Does this node's math run at the matmul (tensor-core) rate? GEMMs, attention, einsums,
    convolutions and recurrent ops (cuDNN runs them as implicit GEMMs)."""
    return (aten.gemm_problem(n) is not None or n.op in ("aten.scaled_dot_product_attention", "aten.einsum")
            or n.op in CONV_OPS or n.op in CONV_TRANSPOSE_OPS or n.op in RECURRENT_OPS)


def node_time(n, dev: Device, policy: str) -> float:
    """Eager PyTorch's time for one node, at least: its FLOPs at the peak of its kind of math
    or its bytes at HBM bandwidth, whichever is longer (a recurrent op: or its dependency
    chain, `recurrent_chain_s`), plus one launch."""
    f, b = node_flops(n), node_bytes(n)
    if f == 0 and b == 0:
        return 0.0
    peak = matmul_tflops(dev, policy, node_dtype(n)) if _tensor_core(n) else dev.tflops["fp32"]
    chain = recurrent_chain_s(n, dev) if n.op in RECURRENT_OPS else 0.0
    return max(f / (peak * 1e12), b / dev.bandwidth, chain) + dev.launch_s


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
