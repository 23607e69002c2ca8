"""ATen operator names as rules write them (`aten.mm`, `aten.gelu.default`) and what they mean.

Rules name operators by their ATen packet (`aten.addmm`) or a specific overload
(`aten.add.Tensor`). This module resolves those names against the installed torch,
classifies the ops the matcher looks through (views, dropout at p=0), and knows the
GEMM semantics of the matmul family so discovery can read M, N, K and batch off a node.
"""
from __future__ import annotations

import difflib
from functools import lru_cache

import torch

from fact_db.discovery import einsum

# Ops that move no data or only re-describe it. The matcher may look through them between
# two pattern nodes, and they count as part of the region that consumes them.
VIEW_OPS = frozenset({
    "aten.view", "aten.reshape", "aten._unsafe_view", "aten.t", "aten.transpose",
    "aten.permute", "aten.expand", "aten.contiguous", "aten.clone", "aten.alias",
    "aten.squeeze", "aten.unsqueeze", "aten.flatten", "aten.detach", "aten.lift_fresh_copy",
    "aten.slice",
})
# Identity at inference when their probability is 0 or train is False.
DROPOUT_OPS = frozenset({"aten.dropout", "aten.native_dropout", "aten.feature_dropout"})

# Ops whose first two operands commute: a pattern `add(a, b)` also matches `add(b, a)`.
COMMUTATIVE_OPS = frozenset({"aten.add", "aten.mul", "aten.maximum", "aten.minimum"})

# GEMM-like ops: the argument positions of the two multiplied operands.
GEMM_OPERANDS = {
    "aten.mm": (0, 1), "aten.bmm": (0, 1), "aten.matmul": (0, 1),
    "aten.addmm": (1, 2), "aten.baddbmm": (1, 2), "aten.linear": (0, 1),
}


def split_name(name: str) -> tuple[str, str | None]:
    """`aten.add.Tensor` -> (`aten.add`, `Tensor`); `aten.mm` -> (`aten.mm`, None)."""
    parts = name.split(".")
    if len(parts) == 3:
        return ".".join(parts[:2]), parts[2]
    return name, None


@lru_cache(maxsize=None)
def _packet_names() -> tuple[str, ...]:
    return tuple(sorted(f"aten.{n}" for n in dir(torch.ops.aten) if not n.startswith("__")))


def resolve(name: str) -> tuple[str, str | None]:
    """Check that `name` is a real ATen op (packet or overload) of the installed torch.

    >>> resolve("aten.gelu")
    ('aten.gelu', None)

    Raises KeyError with a did-you-mean message when it is not.
    """
    packet, overload = split_name(name)
    ns, _, op = packet.partition(".")
    if ns != "aten" or not op:
        raise KeyError(f"`{name}` is not an ATen op name; write it as `aten.<op>` or `aten.<op>.<overload>`")
    try:
        pk = getattr(torch.ops.aten, op)
        names = [n for n in pk.overloads()]
    except (AttributeError, RuntimeError):
        guess = difflib.get_close_matches(packet, _packet_names(), n=1)
        hint = f"; did you mean `{guess[0]}`?" if guess else ""
        raise KeyError(f"unknown ATen op `{packet}`{hint}") from None
    if overload is not None and overload not in names:
        raise KeyError(f"`{packet}` has no overload `{overload}`; it has {', '.join(sorted(names))}")
    return packet, overload


def target_name(target) -> tuple[str, str]:
    """The (packet, overload) of an FX node target, e.g. (`aten.linear`, `default`)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._opname}" if target.namespace == "aten" else f"{target.namespace}.{target._opname}", target._overloadname
    name = getattr(target, "__name__", str(target))
    return f"python.{name}", "default"


def schema_args(target) -> list[tuple[str, object, bool]]:
    """(name, default, is_tensor) for each argument in the op's schema, in order."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    out = []
    for a in target._schema.arguments:
        default = a.default_value if a.has_default_value() else None
        is_tensor = "Tensor" in str(a.type)
        out.append((a.name, default, is_tensor))
    return out


def is_transparent(node) -> bool:
    """True for a view-like node, or dropout that is the identity (p == 0 or not training)."""
    if node.op in VIEW_OPS:
        return True
    if node.op in DROPOUT_OPS and node.op != "aten.native_dropout":
        p, train = node.arg("p", 0.0), node.arg("train", True)
        return p == 0 or train is False
    return False


# Ops that never change values or their logical layout: safe to look through anywhere.
IDENTITY_OPS = frozenset({"aten.contiguous", "aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy"})
# Reshapes: safe to look through only when the last dimension is unchanged, so that a
# row-wise epilogue (a bias along N, a softmax over the last dim) still means the same.
RESHAPE_OPS = frozenset({"aten.view", "aten.reshape", "aten._unsafe_view", "aten.squeeze", "aten.unsqueeze", "aten.flatten"})
# Casts: safe when they do not change the dtype (x.float() on a float32 tensor).
CAST_OPS = frozenset({"aten.to", "aten._to_copy", "aten.type_as"})


def passes_through(node) -> bool:
    """May the matcher look through `node` on an edge between two pattern nodes?

    Identity-like ops and dropout at p=0 always; reshapes only when they keep the last
    dimension; casts only when they keep the dtype. Transposes, permutes, slices and
    expands never: they change which element a row-wise epilogue would touch.
    """
    src = node.args[0] if node.args else None
    if not hasattr(src, "shape"):
        return False
    if node.op in IDENTITY_OPS or (node.op in DROPOUT_OPS and is_transparent(node)):
        return True
    if node.op in RESHAPE_OPS:
        return bool(node.shape) and bool(src.shape) and node.shape[-1] == src.shape[-1]
    if node.op in CAST_OPS:
        return node.dtype == src.dtype and node.shape == src.shape
    return False


def layout(node) -> str:
    """`row` if the last dim is contiguous, `col` if the second to last is, else `strided`."""
    if not node.stride or len(node.stride) < 2:
        return "row"
    if node.stride[-1] == 1 or node.shape[-1] == 1:
        return "row"
    if node.stride[-2] == 1 or node.shape[-2] == 1:
        return "col"
    return "strided"


def batched_layout(node) -> str:
    """The layout of an operand of rank 4 or more as the batched GEMM reads it: its leading
    dimensions merged into one batch (`x.reshape(-1, rows, cols)`). Where they cannot merge
    without a copy (a [B, T, H, D] tensor transposed to [B, H, T, D]), the copy is row-major."""
    if node.shape is None or len(node.shape) <= 3 or node.stride is None:
        return layout(node)
    x = torch.empty_strided(node.shape, node.stride, device="meta")
    try:
        x.view(-1, *node.shape[-2:])
    except RuntimeError:
        return "row"
    return layout(node)


def einsum_lowering(node):
    """(einsum.Lowering, "") of an `aten.einsum` node that is one GEMM or batched GEMM, else
    (None, why not)."""
    ops = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], (list, tuple)) else []
    if not ops or any(getattr(x, "shape", None) is None for x in ops):
        return None, "its operands' shapes are unknown"
    return einsum.lower(str(node.args[0]), [x.shape for x in ops], [x.stride for x in ops])


def gemm_operands(node) -> tuple | None:
    """(A, B): the two multiplied operands of a GEMM-like node (an einsum that is one GEMM
    included), else None."""
    if node.op == "aten.einsum":
        return tuple(node.args[1]) if einsum_lowering(node)[0] is not None else None
    if node.op not in GEMM_OPERANDS:
        return None
    ia, ib = GEMM_OPERANDS[node.op]
    return node.args[ia], node.args[ib]


def gemm_problem(node) -> dict | None:
    """M, N, K, batch and operand layouts of a GEMM-like node, or None for other ops.

    Layouts are of the logical operands A (M x K) and B (K x N): nn.Linear's weight is
    stored N x K row-major, which is B in column-major. An einsum that is one GEMM is read
    as that GEMM (discovery.einsum); operands of rank 4 or more as the batched 3-D GEMM
    they are.
    """
    if node.op == "aten.einsum":
        low, _ = einsum_lowering(node)
        if low is None:
            return None
        return {**low.problem, "layout_a": low.a.layout, "layout_b": low.b.layout}
    if node.op not in GEMM_OPERANDS:
        return None
    ia, ib = GEMM_OPERANDS[node.op]
    a, b = node.args[ia], node.args[ib]
    if not (hasattr(a, "shape") and hasattr(b, "shape")) or a.shape is None or b.shape is None or node.shape is None:
        return None
    out = node.shape
    if len(a.shape) < 1 or len(b.shape) < 1:
        return None
    K = a.shape[-1]
    if node.op == "aten.linear":
        N = b.shape[0]
        M = 1
        for s in a.shape[:-1]:
            M *= s
        return {"M": M, "N": N, "K": K, "batch": 1, "layout_a": layout(a),
                "layout_b": {"row": "col", "col": "row"}.get(layout(b), "strided")}
    N = b.shape[-1] if len(b.shape) >= 2 else 1
    if len(b.shape) <= 2:
        M = 1
        for s in a.shape[:-1]:
            M *= s
        batch = 1
    else:
        M = a.shape[-2] if len(a.shape) >= 2 else 1
        batch = 1
        for s in out[:-2]:
            batch *= s
    return {"M": M, "N": N, "K": K, "batch": batch, "layout_a": batched_layout(a), "layout_b": batched_layout(b)}
