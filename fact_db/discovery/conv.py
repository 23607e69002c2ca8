"""Convolutions as discovery reads them: a conv node's geometry, and a conv region's operands
and epilogue chain, so realization and composition never re-derive them.

    >>> geo = geometry(node)            # an aten.conv2d node of a traced graph
    >>> geo["k"], geo["filter"], geo["groups"]
    (16, [3, 3], 1)
    >>> problem, shape, layouts = problem_of(match)
    >>> operands, attrs, why = operands_of(match)   # attrs["chain"]: the element-wise steps after the conv

A chain step is a dict: `{"op": "relu"}`, `{"op": "leaky_relu", "slope": 0.01}`,
`{"op": "clamp", "min": -1.0, "max": 1.0}`, `{"op": "sub", "scalar": 0.5}` or
`{"op": "mul", "tensor": "p_scale", "kind": "channel"}` (kind `channel`: one value per output
channel; `scalar`: a one-element tensor; `full`: a tensor of the output's shape, the residual).
"""
from __future__ import annotations

import math

from fact_db.discovery import aten

# aten.conv1d/2d/3d: (input, weight, bias, stride, padding, dilation, groups);
# aten.conv_transpose{1,2,3}d: (input, weight, bias, stride, padding, output_padding, groups, dilation);
# aten.convolution: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups).
FORWARD_OPS = frozenset({"aten.conv1d", "aten.conv2d", "aten.conv3d"})
TRANSPOSED_OPS = frozenset({"aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d"})
CONV_OPS = FORWARD_OPS | TRANSPOSED_OPS | {"aten.convolution"}

UNARY = {"aten.relu": "relu", "aten.relu_": "relu", "aten.silu": "silu", "aten.silu_": "silu", "aten.mish": "mish",
         "aten.hardswish": "hardswish", "aten.hardswish_": "hardswish", "aten.tanh": "tanh", "aten.sigmoid": "sigmoid",
         "aten.relu6": "relu6"}
BINARY = {"aten.add": "add", "aten.add_": "add", "aten.sub": "sub", "aten.sub_": "sub", "aten.mul": "mul",
          "aten.mul_": "mul", "aten.div": "div", "aten.div_": "div"}
# The epilogue steps the conv templates compute (kernels_cpp/conv_sm90.cu.j2).
STEP_OPS = ("relu", "relu6", "leaky_relu", "gelu", "gelu_tanh", "silu", "mish", "hardswish", "tanh", "sigmoid",
            "clamp", "add", "sub", "mul", "div")


def _ints(v, n: int) -> list:
    if isinstance(v, (list, tuple)):
        v = [int(x) for x in v]
        return v * n if len(v) == 1 else v
    return [int(v)] * n


def geometry(node) -> dict | None:
    """The geometry of a convolution node (None for any other node): batch `n`, input channels
    `c`, output channels `k`, `input`/`filter`/`output` spatial sizes, `stride`, `padding`
    (symmetric, per dim), `dilation`, `output_padding`, `groups`, `transposed`, `spatial`
    (1, 2 or 3), and `why` ("" or what makes it unusable for a kernel: a string padding whose
    two sides differ)."""
    op = getattr(node, "op", None)
    if op not in CONV_OPS:
        return None
    x, w = node.args[0], node.args[1]
    if not (hasattr(x, "shape") and hasattr(w, "shape")) or x.shape is None or w.shape is None or node.shape is None:
        return None
    d = len(w.shape) - 2
    if d < 1 or len(x.shape) not in (d + 1, d + 2):
        return None
    if op == "aten.convolution":
        stride, padding, dilation = node.arg("stride"), node.arg("padding"), node.arg("dilation")
        transposed, out_pad, groups = bool(node.arg("transposed")), node.arg("output_padding"), node.arg("groups")
    elif op in TRANSPOSED_OPS:
        stride, padding, dilation = node.arg("stride", 1), node.arg("padding", 0), node.arg("dilation", 1)
        transposed, out_pad, groups = True, node.arg("output_padding", 0), node.arg("groups", 1)
    else:
        stride, padding, dilation = node.arg("stride", 1), node.arg("padding", 0), node.arg("dilation", 1)
        transposed, out_pad, groups = False, 0, node.arg("groups", 1)
    batched = len(x.shape) == d + 2
    xs = list(x.shape) if batched else [1] + list(x.shape)
    ys = list(node.shape) if batched else [1] + list(node.shape)
    filt = [int(s) for s in w.shape[2:]]
    stride, dilation = _ints(stride, d), _ints(dilation, d)
    why = ""
    if isinstance(padding, str):  # aten.conv2d.padding: "valid" or "same"
        if padding == "valid":
            padding = [0] * d
        else:
            total = [dl * (f - 1) for dl, f in zip(dilation, filt)]
            padding = [t // 2 for t in total]
            if any(t % 2 for t in total):
                why = "padding='same' with an even filter pads one side more than the other"
    groups = int(groups or 1)
    k = int(w.shape[1]) * groups if transposed else int(w.shape[0])
    return {"n": int(xs[0]), "c": int(xs[1]), "k": k, "input": [int(s) for s in xs[2:]], "filter": filt,
            "output": [int(s) for s in ys[2:]], "stride": stride, "padding": _ints(padding, d), "dilation": dilation,
            "output_padding": _ints(out_pad or 0, d), "groups": groups, "transposed": transposed, "spatial": d,
            "batched": batched, "why": why}


def where_names(geo: dict) -> dict:
    """What a rule's `where` may read of a convolution: groups, spatial, channels_in,
    channels_out, transposed, and the implicit GEMM's M, N, K (output pixels, output
    channels, input channels per group times the filter's size)."""
    return {"groups": geo["groups"], "spatial": geo["spatial"], "channels_in": geo["c"], "channels_out": geo["k"],
            "transposed": int(geo["transposed"]), "M": geo["n"] * math.prod(geo["output"]), "N": geo["k"],
            "K": geo["c"] // geo["groups"] * math.prod(geo["filter"])}


def shape_text(geo: dict) -> str:
    """`N2 C3 K16 8x8 f3x3 s1 p1` (d2 where dilated, g4 where grouped, T for a transposed conv)."""
    j = lambda v: "x".join(map(str, v))  # noqa: E731
    s = f"N{geo['n']} C{geo['c']} K{geo['k']} {j(geo['input'])} f{j(geo['filter'])} s{j(geo['stride'])} p{j(geo['padding'])}"
    if any(x != 1 for x in geo["dilation"]):
        s += f" d{j(geo['dilation'])}"
    if geo["groups"] != 1:
        s += f" g{geo['groups']}"
    return ("T " if geo["transposed"] else "") + s


def _name(v):
    if not hasattr(v, "name"):
        return None
    return getattr(v, "outer", None) or v.name


def _strip(v):
    while hasattr(v, "op") and aten.passes_through(v):
        v = v.args[0]
    return v


def conv_node(match):
    """The convolution node of a conv region, or None."""
    return next((n for n in match.compute_nodes if n.op in CONV_OPS), None)


def problem_of(match) -> tuple | None:
    """(problem, human shape, layouts) of a conv region, None for a region without a conv."""
    c = conv_node(match)
    geo = geometry(c) if c is not None else None
    if geo is None:
        return None
    layout = "channels_last" if _channels_last(c.args[0]) else "contiguous"
    return ({k: v for k, v in geo.items() if k != "why"}, shape_text(geo), {"x": layout})


def _channels_last(x) -> bool:
    """Whether an NC... activation is stored channels-last (its channel stride is 1)."""
    st = getattr(x, "stride", None)
    return bool(st) and len(st) >= 3 and st[1] == 1 and x.shape[1] != 1


def _operand_kind(t, out_shape) -> str:
    """channel (one value per output channel, broadcast over the rest), scalar (one value),
    full (the output's shape), or "" (another broadcast)."""
    shp = list(t.shape or ())
    if math.prod(shp) == 1:
        return "scalar"
    if shp == list(out_shape):
        return "full"
    pad = [1] * (len(out_shape) - len(shp)) + shp
    if len(pad) == len(out_shape) and pad[1] == out_shape[1] and all(s == 1 for i, s in enumerate(pad) if i != 1):
        return "channel"
    return ""


def _step(n, prev, out_shape, region: set) -> tuple[dict | None, str]:
    """(chain step, why-not) of element-wise node `n`, which reads `prev`; `region` holds the
    ids of the region's nodes (an operand computed inside the region is no tensor to read)."""
    op = n.op
    if op in UNARY:
        return {"op": UNARY[op]}, ""
    if op == "aten.leaky_relu":
        return {"op": "leaky_relu", "slope": float(n.arg("negative_slope", 0.01))}, ""
    if op == "aten.gelu":
        return {"op": "gelu_tanh" if n.arg("approximate", "none") == "tanh" else "gelu"}, ""
    if op == "aten.hardtanh":
        return {"op": "clamp", "min": float(n.arg("min_val", -1.0)), "max": float(n.arg("max_val", 1.0))}, ""
    if op in ("aten.clamp", "aten.clamp_min", "aten.clamp_max"):
        lo = n.arg("min") if op != "aten.clamp_max" else None
        hi = n.arg("max") if op != "aten.clamp_min" else None
        if any(hasattr(v, "op") for v in (lo, hi)):
            return None, f"`{n.name}` clamps to a tensor"
        return {"op": "clamp", "min": None if lo is None else float(lo), "max": None if hi is None else float(hi)}, ""
    if op in BINARY:
        a, b = n.args[0], n.args[1]
        first = _strip(a) is prev or a is prev
        other = b if first else a
        kind = BINARY[op]
        if not first and kind in ("sub", "div"):
            return None, f"`{n.name}` computes {kind}(t, x) with x the convolution's value"
        alpha = n.arg("alpha", 1)
        alpha = 1.0 if alpha is None else float(alpha)
        if isinstance(other, bool) or other is None:
            return None, f"`{n.name}` has a non-numeric operand"
        if isinstance(other, (int, float)):
            return {"op": kind, "scalar": float(other) * (alpha if kind in ("add", "sub") else 1.0)}, ""
        if id(_strip(other)) in region or id(other) in region:
            return None, f"`{n.name}` reads `{other.name}`, a value computed inside the region, besides the chain's"
        if alpha != 1.0:
            return None, f"`{n.name}` scales its tensor operand by alpha={alpha:g}"
        k = _operand_kind(other, out_shape)
        if not k:
            return None, f"`{n.name}` reads `{other.name}` of shape {list(other.shape or ())}, neither one value per channel nor the output's shape"
        return {"op": kind, "tensor": _name(other), "kind": k}, ""
    return None, f"`{n.name}` is {op}, which the conv epilogue does not compute"


def operands_of(match) -> tuple[dict, dict, str]:
    """(operands, attrs, why-not) of a conv region: operands x, w, bias and BatchNorm's
    bn_weight, bn_bias, bn_mean, bn_var by graph name; attrs the geometry, bn_eps and the
    epilogue `chain`; why-not "" where composition can replace the region."""
    c = conv_node(match)
    geo = geometry(c) if c is not None else None
    if geo is None:
        return {}, {}, "no convolution node in the region"
    x, w, bias = c.args[0], c.args[1], c.args[2] if len(c.args) > 2 else None
    ops = {"x": _name(x), "w": _name(w)}
    if hasattr(bias, "op"):
        ops["bias"] = _name(bias)
    attrs = {"geometry": {k: v for k, v in geo.items() if k != "why"}, "chain": []}
    why = geo["why"]
    if getattr(w, "op", None) not in ("parameter", "constant", "buffer"):
        why = why or f"the weight `{_name(w)}` is not a parameter (it is converted to channels-last once, when composing)"
    prev = c
    inside = [n for n in match.compute_nodes if n is not c]
    out_shape = list(c.shape)
    for n in inside:
        if n.op == "aten.batch_norm":
            for role, arg in (("bn_weight", "weight"), ("bn_bias", "bias"), ("bn_mean", "running_mean"),
                              ("bn_var", "running_var")):
                v = n.arg(arg)
                if hasattr(v, "op"):
                    ops[role] = _name(v)
            attrs["bn_eps"] = float(n.arg("eps", 1e-5))
            if "bn_mean" not in ops or "bn_var" not in ops:
                why = why or f"`{n.name}` has no running statistics to fold"
            elif any(getattr(n.arg(a), "op", None) not in ("parameter", "buffer", "constant")
                     for a in ("running_mean", "running_var")):
                why = why or f"`{n.name}`'s statistics are not buffers, so they cannot be folded once"
            prev = n
            continue
        step, swhy = _step(n, prev, out_shape, {id(x) for x in match.nodes})
        if step is None:
            why = why or swhy
            break
        step["node"] = n.name
        attrs["chain"].append(step)
        prev = n
    fulls = [s for s in attrs["chain"] if s.get("kind") == "full"]
    if len(fulls) > 1:
        why = why or f"the chain reads {len(fulls)} tensors of the output's shape; the epilogue reads one (the residual)"
    return ops, attrs, why
