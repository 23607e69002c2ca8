"""How far a model's outputs are from a reference and from each other, piece by piece: no
float64 copy of a whole output is made, and a reference held on another device (the CPU,
where a float64 run does not fit on the GPU) is compared by moving one piece at a time.

    >>> a = agreement(composed_out, eager_out, ref_out, tol=1e-4, out_dtype="float32")
    >>> a.err, a.eager_err, a.n_bad          # errors against the reference; elements outside allclose
    >>> tree_err(out, ref_out)               # one output against the reference (None: other sizes)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Elements compared at once: a few float64 temporaries of this size (32 MiB each) at most.
CHUNK = 1 << 22
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


def floating_leaves(out) -> list:
    """The floating tensors of an output pytree, in order."""
    import torch
    from torch.utils._pytree import tree_flatten
    return [x.detach() for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.is_floating_point()]


def sizes(out) -> list[int]:
    return [x.numel() for x in floating_leaves(out)]


def ulp(x, dtype: str):
    """The spacing of `dtype` numbers at |x| (x in float64; its normal range only)."""
    import torch
    _, e = torch.frexp(x.abs().clamp_min(torch.finfo(getattr(torch, dtype)).tiny))
    return torch.ldexp(torch.ones_like(x), e - 1 - MANTISSA_BITS[dtype])


def _pieces(*trees):
    """Aligned float64 pieces of the trees' floating leaves, on the last tree's device."""
    import torch
    leaves = [floating_leaves(t) for t in trees]
    for group in zip(*leaves):
        dev = group[-1].device
        flat = [x.reshape(-1) for x in group]
        for i in range(0, flat[-1].numel(), CHUNK):
            yield [x[i:i + CHUNK].to(dev).to(torch.float64) for x in flat]


def _ratio(num: float, den: float, finite: bool) -> float:
    return math.sqrt(num) / (math.sqrt(den) if den > 0 else 1.0) if finite else float("nan")


def tree_err(out, ref) -> float | None:
    """‖out − ref‖ / ‖ref‖ over the floating leaves of two output trees; NaN where `out` is
    not finite; None where their sizes differ."""
    import torch
    if sizes(out) != sizes(ref):
        return None
    num = den = 0.0
    finite = True
    for o, r in _pieces(out, ref):
        finite &= bool(torch.isfinite(o).all())
        num += float(((o - r) ** 2).sum())
        den += float((r ** 2).sum())
    return _ratio(num, den, finite)


@dataclass
class Agreement:
    """Composed (c) and eager (e) outputs against a reference (r), and against each other."""

    n: int              # floating elements compared
    err: float          # ‖c − r‖ / ‖r‖ (NaN: c not finite)
    eager_err: float    # ‖e − r‖ / ‖r‖
    n_bad: int          # elements where KernelBench's allclose(c, e) fails
    max_diff: float     # max |c − e| (NaN where either has a NaN)
    max_ulps: float     # over the failing elements, |c − e| in units of the output format (inf: not half)
    own_error: bool     # every failing element: c at least as close to r as e, or within the tolerance of r


def agreement(composed, eager, reference, tol: float, out_dtype: str) -> Agreement:
    """Compare three output trees of equal sizes (check `sizes` first) piece by piece."""
    import torch
    n = n_bad = 0
    c_num = e_num = den = 0.0
    c_fin = e_fin = own = True
    max_diff, max_ulps = 0.0, 0.0
    half = out_dtype in MANTISSA_BITS
    for c, e, r in _pieces(composed, eager, reference):
        n += c.numel()
        c_fin &= bool(torch.isfinite(c).all())
        e_fin &= bool(torch.isfinite(e).all())
        c_num += float(((c - r) ** 2).sum())
        e_num += float(((e - r) ** 2).sum())
        den += float((r ** 2).sum())
        d = (c - e).abs()
        max_diff = max(max_diff, float(d.max())) if c.numel() else max_diff
        if d.isnan().any():
            max_diff = float("nan")
        bad = ~torch.isclose(c, e, atol=tol, rtol=tol)
        if bool(bad.any()):
            n_bad += int(bad.sum())
            db = d[bad]
            max_ulps = max(max_ulps, float((db / ulp(e[bad], out_dtype)).max())) if half else float("inf")
            c_err, e_err = (c[bad] - r[bad]).abs(), (e[bad] - r[bad]).abs()
            own &= bool(((c_err <= e_err) | (c_err <= tol + tol * r[bad].abs())).all())
    return Agreement(n, _ratio(c_num, den, c_fin), _ratio(e_num, den, e_fin), n_bad, max_diff, max_ulps, own)
