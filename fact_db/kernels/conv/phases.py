"""The phases of a transposed convolution: a strided one as stride-1 forward convolutions the
sm90 kernel computes, one per output phase, each written into every s-th output pixel.

A transposed convolution (PyTorch's ConvTranspose) scatters each input pixel i through the
filter to outputs o = i * s - p + k * d. Along one dim, the outputs whose o + p leave the same
remainder rho modulo the stride s (a phase) are reached by one fixed subset of the filter's
taps, k * d = rho (mod s), every s / gcd(d, s)-th tap, and by the inputs i = q - m_k, where
o = rho - p + s * q. That is a stride-1 correlation of the input with those taps flipped, at
dilation d / gcd(d, s): the forward convolution the kernel computes. A 2-D stride-2 transposed
convolution is four forward convolutions with a quarter of the filter each (the multiply-adds
of the transposed one, none wasted on the zeros a dilated-input formulation would insert),
each output copied into its pixels of the full output.

CUTLASS 4.2's strided dgrad kernels are sm100 only (`KernelStridedDgradTmaWs*Sm100`); on sm90
cuDNN ran these until now, at fp32 without TF32 1.3 TFLOP/s on KernelBench L1-73.

    >>> plan(ConvWorkload(1, 8, 8, (4,), (3,), stride=(2,), padding=(1,), transposed=True)).phases
    (Phase(taps=((0, 3, 2),), filter=(2,), ...), Phase(taps=((1, 2, 2),), filter=(1,), ...))

`reference(x, weight, w)` runs the plan with PyTorch's forward convolutions (the CPU tests'
check of the plan against ConvTranspose); kernel.ConvKernel runs it with the sm90 kernel.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from fact_db.kernels.conv.workload import ConvWorkload


@dataclass(frozen=True)
class Phase:
    """One stride-1 forward convolution of the plan. Per spatial dim: `taps` (first, stop, step)
    of the transposed weight's filter taps it reads (flipped when prepared); `filter`,
    `dilation`, `padding` (symmetric) and `output` of the forward convolution; `src` (start,
    count) of its output pixels that are kept, `dst` (start, count) of the output pixels they
    go to, every s-th."""

    taps: tuple
    filter: tuple
    dilation: tuple
    padding: tuple
    output: tuple
    src: tuple
    dst: tuple


@dataclass(frozen=True)
class Plan:
    """The phases of workload `w`, and the output pixels no tap reaches (`empty`: per phase of
    those, per dim (start, count), every s-th), which hold the bias alone."""

    phases: tuple
    empty: tuple
    stride: tuple


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _dim(i: int, f: int, s: int, p: int, d: int, o: int) -> tuple[list, list]:
    """One spatial dim's phases: [(taps, filter, dilation, padding, output, src, dst)] for the
    remainders with taps, [dst] for those without."""
    g = math.gcd(d, s)
    full, empty = [], []
    for rho in range(s):
        q_lo, q_hi = _ceil_div(p - rho, s), (o - 1 + p - rho) // s
        count = q_hi - q_lo + 1
        if count <= 0:  # no output pixel in this phase (a small output)
            continue
        dst = (rho - p + s * q_lo, count)
        ks = [k for k in range(f) if (k * d - rho) % s == 0]
        if not ks:
            empty.append(dst)
            continue
        j, dd = len(ks), d // g            # taps, every s / g-th; their inputs d / g apart
        p_left = (ks[-1] * d - rho) // s - q_lo
        p_right = count - i - p_left + dd * (j - 1)
        pad = max(0, p_left, p_right)
        out = i + 2 * pad - dd * (j - 1)
        full.append(((ks[0], ks[-1] + 1, s // g), j, dd, pad, out, (pad - p_left, count), dst))
    return full, empty


def phased(w: ConvWorkload) -> bool:
    """Whether `w` runs as phases: a transposed convolution with a stride, an output padding or
    a padding beyond its filter (a plain stride-1 transposed one is one forward convolution,
    kernel.forward_padding)."""
    return w.transposed and (any(s != 1 for s in w.stride) or any(w.output_padding)
                             or any(d * (f - 1) < p for d, f, p in zip(w.dilation, w.filter, w.padding)))


@functools.lru_cache(maxsize=256)
def plan(w: ConvWorkload) -> Plan:
    """The phases of transposed convolution `w` (every combination of its dims' phases); made
    once per workload (a kernel call reads it on every call)."""
    dims = [_dim(i, f, s, p, d, o) for i, f, s, p, d, o in
            zip(w.input, w.filter, w.stride, w.padding, w.dilation, w.output)]
    phases = tuple(Phase(*(tuple(part[n] for part in combo) for n in range(7)))
                   for combo in itertools.product(*(full for full, _ in dims)))
    # an output pixel is empty where any of its dims' remainders has no tap
    rows = [[(dst, True) for *_, dst in full] + [(dst, False) for dst in empty] for full, empty in dims]
    empty = tuple(tuple(dst for dst, _ in combo) for combo in itertools.product(*rows)
                  if not all(has for _, has in combo))
    return Plan(phases, empty, w.stride)


def weight(wt, ph: Phase):
    """Phase `ph`'s forward weight from the transposed weight `wt` (C x K x F...): its taps,
    flipped in space, C and K swapped (K x C x J...)."""
    idx = (slice(None), slice(None), *(slice(a, b, st) for a, b, st in ph.taps))
    return wt[idx].flip(list(range(2, wt.dim()))).transpose(0, 1)


def pixels(spans: tuple, stride: tuple = None) -> tuple:
    """Index of the pixels (start, count) per dim, every stride-th (contiguous without `stride`),
    after the batch and channel dims of an N, C, *spatial tensor."""
    st = stride or (1,) * len(spans)
    return (slice(None), slice(None), *(slice(a, a + s * (n - 1) + 1, s) for (a, n), s in zip(spans, st)))


def reference(x, wt, w: ConvWorkload, bias=None):
    """ConvTranspose of `x` with `wt` (C x K x F...) as the plan computes it, with PyTorch's
    forward convolutions: what the kernel's phases must equal."""
    import torch
    import torch.nn.functional as F
    conv = (F.conv1d, F.conv2d, F.conv3d)[w.spatial - 1]
    p = plan(w)
    y = torch.zeros((x.shape[0], w.k, *w.output), dtype=x.dtype, device=x.device)
    if bias is not None:
        y += bias.reshape(1, -1, *([1] * w.spatial))
    for ph in p.phases:
        z = conv(x, weight(wt, ph), bias, 1, ph.padding, ph.dilation)
        assert tuple(z.shape[2:]) == ph.output, (z.shape, ph)
        y[pixels(ph.dst, p.stride)] = z[pixels(ph.src)]
    return y
