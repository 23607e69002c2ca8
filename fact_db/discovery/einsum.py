"""Einsum: which `torch.einsum` calls are one GEMM (or batched GEMM), how to lower them to it,
and what the others cost.

An einsum of two operands is one GEMM when every index is of one of four kinds: in both
operands and the output (a batch index), in both operands only (contracted: K), in the first
operand and the output only (M) or in the second and the output only (N), with at least one
contracted index. The lowering permutes each operand to (batch, M, K) / (batch, K, N), merges
each group into one dimension, and after the GEMM splits and permutes the result back.

>>> low, why = lower("bhqd,bhkd->bhqk", [(2, 4, 16, 8), (2, 4, 16, 8)])
>>> low.problem, low.b.perm, low.b.layout           # B read K x N in place: column-major
({'M': 16, 'N': 16, 'K': 8, 'batch': 8}, [0, 1, 3, 2], 'col')
>>> lower("bik,bk->bi", [(2, 3, 4), (2, 4)])[0].problem      # a batched GEMV: N = 1
{'M': 3, 'N': 1, 'K': 4, 'batch': 2}
>>> lower("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)])[1]
'einsum `ij,jk,kl->il` has 3 operands; one GEMM has two'
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


class EinsumError(ValueError):
    """An equation this module cannot read (torch would have refused it at trace time)."""


def parse(equation: str, ranks: list) -> tuple[list, str]:
    """([letters of each operand], output letters) with `...` spelled out as private letters
    (right-aligned, as torch broadcasts them) and an implicit output made explicit (the
    letters used once, in alphabetical order, after the ellipsis).

    >>> parse("...ij,jk", [3, 2])
    (['0ij', 'jk'], '0ik')
    """
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ranks):
        raise EinsumError(f"einsum `{equation}` names {len(ins)} operands, the call passes {len(ranks)}")
    ell = max((r - (len(s) - 3) for s, r in zip(ins, ranks) if "..." in s), default=0)
    pad = "0123456789"[:ell] if ell <= 10 else None
    if pad is None:
        raise EinsumError(f"einsum `{equation}`: an ellipsis over {ell} dimensions")
    spelled = []
    for s, r in zip(ins, ranks):
        if "..." in s:
            n = r - (len(s) - 3)
            s = s.replace("...", pad[ell - n:])
        if len(s) != r:
            raise EinsumError(f"einsum `{equation}`: operand `{s}` has rank {r}")
        spelled.append(s)
    if arrow:
        out = out.replace("...", pad)
    else:
        counts = {c: sum(s.count(c) for s in spelled) for c in set("".join(spelled))}
        once = sorted(c for c, k in counts.items() if k == 1 and c not in pad)
        out = "".join(c for c in pad if c in counts) + "".join(once)
    return spelled, out


def sizes(letters: list, shapes: list) -> dict:
    """letter -> size; a letter of size 1 in one operand broadcasts against the other's."""
    out: dict = {}
    for s, shp in zip(letters, shapes):
        for c, d in zip(s, shp):
            out[c] = max(out.get(c, 1), int(d))
    return out


@dataclass
class Operand:
    """How one operand becomes the GEMM's 2-D or 3-D operand: `x.permute(perm).reshape(shape)`.
    `layout` is the result's (row or col); `copies` says the reshape has to copy, because the
    dimensions it merges are not evenly strided (the copy is row-major)."""

    perm: list
    shape: list
    layout: str
    copies: bool


@dataclass
class Lowering:
    """An einsum as one GEMM: A (batch x M x K) @ B (batch x K x N), 2-D where there is no
    batch index; the result reshaped to `out_shape` (batch, M, N letters in that order) and
    permuted by `out_perm` into the einsum's output order."""

    equation: str
    a: Operand
    b: Operand
    problem: dict  # M, N, K, batch
    out_shape: list
    out_perm: list

    def as_dict(self) -> dict:
        return asdict(self)


def _layout(shape, stride) -> str:
    if len(shape) < 2 or stride[-1] == 1 or shape[-1] == 1:
        return "row"
    if stride[-2] == 1 or shape[-2] == 1:
        return "col"
    return "strided"


def _contiguous(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def _operand(shape, stride, letters: str, groups: tuple, size: dict, batched: bool) -> Operand:
    """The lowering of one operand (index letters `letters`) to its three groups of letters
    (batch, rows, columns): a view where the merged dimensions are evenly strided and the
    result is row- or column-major, else a row-major copy."""
    x = torch.empty_strided(tuple(shape), tuple(stride or _contiguous(shape)), device="meta")
    perm = [letters.index(c) for g in groups for c in g]
    dims = [math.prod(size[c] for c in g) for g in groups][0 if batched else 1:]
    try:
        v = x.permute(*perm).view(dims)
    except RuntimeError:
        return Operand(perm, dims, "row", True)
    layout = _layout(tuple(v.shape), tuple(v.stride()))
    # Neither of the last two dimensions unit-stride: the kernel would copy it anyway.
    return Operand(perm, dims, "row", True) if layout == "strided" else Operand(perm, dims, layout, False)


def lower(equation: str, shapes: list, strides: list | None = None) -> tuple[Lowering | None, str]:
    """(the GEMM an einsum is, "") or (None, why it is not one GEMM). `strides` of the
    operands (default contiguous) decide each operand's layout."""
    try:
        letters, out = parse(equation, [len(s) for s in shapes])
    except EinsumError as e:
        return None, str(e)
    eq = f"{','.join(letters)}->{out}" if "..." in equation else equation.replace(" ", "")
    if len(letters) != 2:
        return None, f"einsum `{eq}` has {len(letters)} operand{'s' if len(letters) != 1 else ''}; one GEMM has two"
    sa, sb = letters
    for i, s in enumerate(letters):
        rep = next((c for c in s if s.count(c) > 1), None)
        if rep:
            return None, f"einsum `{eq}` repeats index `{rep}` in operand {i + 1} (a diagonal), which no GEMM reads"
    size = sizes(letters, shapes)
    for c in set(sa) & set(sb):
        da, db = shapes[0][sa.index(c)], shapes[1][sb.index(c)]
        if da != db:
            return None, f"einsum `{eq}` broadcasts index `{c}` ({da} against {db})"
    alone = [c for c in sa + sb if c not in out and ((c in sa) != (c in sb))]
    if alone:
        return None, (f"einsum `{eq}` sums index `{alone[0]}` over one operand alone before the product, "
                      "which is a reduction, not part of one GEMM")
    batch = [c for c in sa if c in sb and c in out]
    k = [c for c in sa if c in sb and c not in out]
    m = [c for c in sa if c not in sb]
    n = [c for c in sb if c not in sa]
    if not k:
        return None, f"einsum `{eq}` contracts no index (an elementwise or outer product, not a GEMM)"
    batched = bool(batch)
    st = strides or [None, None]
    a = _operand(shapes[0], st[0], sa, (batch, m, k), size, batched)
    b = _operand(shapes[1], st[1], sb, (batch, k, n), size, batched)
    grouped = batch + m + n
    prob = {"M": math.prod(size[c] for c in m), "N": math.prod(size[c] for c in n),
            "K": math.prod(size[c] for c in k), "batch": math.prod(size[c] for c in batch)}
    return Lowering(eq, a, b, prob, [size[c] for c in grouped], [grouped.index(c) for c in out]), ""


def flops(equation: str, shapes: list) -> float:
    """Multiply-adds of an einsum as torch runs it without opt_einsum: operands contracted
    left to right, each step 2 x (product of the sizes of every index the pair spans); an
    index used by no later operand nor the output is summed in that step. One operand: one
    FLOP per element read (a sum or a permutation).

    >>> flops("ij,jk->ik", [(2, 3), (3, 4)])       # 2 * 2 * 3 * 4
    48.0
    """
    letters, out = parse(equation, [len(s) for s in shapes])
    size = sizes(letters, shapes)
    if len(letters) == 1:
        return float(math.prod(size[c] for c in letters[0]))
    total, cur = 0.0, set(letters[0])
    for i in range(1, len(letters)):
        span = cur | set(letters[i])
        total += 2.0 * math.prod(size[c] for c in span)
        later = set(out).union(*letters[i + 1:])
        cur = {c for c in span if c in later}
    return total


def intermediates(equation: str, shapes: list) -> float:
    """Elements of the intermediate results a left-to-right contraction writes and reads back
    (none for one or two operands)."""
    letters, out = parse(equation, [len(s) for s in shapes])
    size = sizes(letters, shapes)
    total, cur = 0.0, set(letters[0])
    for i in range(1, len(letters) - 1):
        span = cur | set(letters[i])
        later = set(out).union(*letters[i + 1:])
        cur = {c for c in span if c in later}
        total += float(math.prod(size[c] for c in cur))
    return total
