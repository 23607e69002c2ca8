"""Compose: the model's exported program with each realized region replaced by its
kernel's op, everything else left as it was (DESIGN.md, "Composition contract").

    >>> gm, notes = rewrite(report.graph.program, report.regions, impls)   # impls: {index: Impl}
    >>> model = ComposedModule(gm, fallback, ...)   # composition/module.py: the module that runs it

An `Impl` says how one region runs: `eager` (its nodes stay), `gemm` (a GEMM-family
kernel's op `(a, b, bias, c, alpha, beta) -> d`, see fact_db/kernels/gemm/kernel.py), `attention` (an
op `(q, k, v, scale, causal) -> o` in SDPA's layout: a CUTLASS kernel or an SDPA backend
forced, see fact_db/kernels/attention/workload.py), `sdpa` (`aten.scaled_dot_product_attention` itself,
PyTorch choosing the backend), `norm` (add_norm's op `(x, r, weight, bias) -> (y, sum)`),
`conv` (a convolution kernel's op `(x, w, bias, vecs, residual) -> y`, y channels-last, its
weight held as the kernel reads it with a BatchNorm folded in; see fact_db/kernels/conv/) or
`region` (a region kernel the agent proposed and the registry holds: `op([inputs]) -> out`,
see fact_db/kernels/region/). Operands come from discovery (`Region.operands`), never
re-derived here.

The module that runs the result, guarded on its inputs, is `module.ComposedModule`.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from fact_db.core.errors import FactError
from fact_db.kernels.gemm.kernel import swiglu_op


class ComposeError(FactError):
    """A region cannot be replaced in the exported program (a missing operand, a shape the op cannot take)."""


def _fx_resolver(gm, program):
    """name -> FX node of `gm`, the unlifted `program`, for the exported program's node names
    (the names discovery's regions use). Call nodes and user inputs keep their names when a
    program is unlifted; parameters, buffers and constants become `get_attr` nodes, found
    through the program's graph signature."""
    by_name = {n.name: n for n in gm.graph.nodes}
    attrs = {n.target: n for n in gm.graph.nodes if n.op == "get_attr"}
    sig = program.graph_signature
    # user inputs by position: unlifting renames one that shadows a builtin (nn.Sequential's
    # `input` becomes `input_1`)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) == len(sig.user_inputs):
        by_name.update(zip(sig.user_inputs, placeholders))
    fqns = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    replaced: dict = {}  # a replaced region's output name -> the node that computes it now

    def fx(name):
        if name is None:
            return None
        if name in replaced:
            return replaced[name]
        if name in fqns:
            if fqns[name] in attrs:
                return attrs[fqns[name]]
            raise ComposeError(f"operand `{name}` ({fqns[name]}) has no node in the unlifted program")
        if name in by_name:
            node = by_name[name]
            if getattr(node, "_erased", False):  # an earlier region's rewrite took it out and said nothing
                raise ComposeError(f"operand `{name}` was replaced by an earlier region's rewrite")
            return node
        raise ComposeError(f"operand `{name}` is not a node of the exported program")
    fx.replaced = replaced
    fx.derived = {}  # key -> tensor: weights made for the composition (see _derived)
    fx.conv_outputs = set()  # nodes of fact-db conv ops: their values are channels-last
    fx.conversions = []  # the layout conversions composition inserted before conv ops
    fx.channels_last = {}  # FX node -> its channels-last conversion, shared by every conv op that reads it
    return fx


def _shapes(program) -> dict:
    """name -> shape of every tensor node of the exported program."""
    out = {}
    for n in program.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            out[n.name] = tuple(int(d) for d in v.shape)
    return out


def _attr_tensor(gm, target: str):
    return functools.reduce(getattr, target.split("."), gm)


def _ident(t) -> tuple:
    """Which tensor `t` is, for the derived-weights cache: its storage, offset, shape, strides and dtype."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _derived(gm, fx, name: str, key: tuple, make):
    """Register buffer `name` on `gm`: the tensor an earlier rewrite of the same model made for
    `key` (what it is made of and how: `_ident` of its sources), else `make()`. A composition
    for other input shapes (a ComposedModule variant) so shares the weights the first one
    concatenated, transposed or split, instead of holding copies of its own."""
    t = fx.derived.get(key)
    if t is None:
        with torch.no_grad():
            t = fx.derived[key] = make()
    gm.register_buffer(name, t)
    return t


def _lo_node(gm, g, fx, impl, weight, index: int):
    """Where B is a weight (`weight`: B as the op takes it, K x N) and the kernel takes B's lo
    parts: the node of those parts, split once into a buffer here so that no call splits the
    weight again; else None."""
    if impl.op_lo is None or weight is None:
        return None
    # Every presplit kernel splits alike (the template's split_lo): the lo parts are keyed by B alone.
    name = f"_factdb_b_lo_{index}"
    _derived(gm, fx, name, ("b_lo", _ident(weight)), lambda: impl.split_lo(weight.detach()).t())  # packed N x K
    return g.call_function(torch.ops.aten.t.default, (g.get_attr(name),))


def _gemm_call(gm, g, fx, impl, a, b, weight, bias, c, alpha: float, beta: float, index: int):
    """The node of `impl.op(a, b, bias, c, alpha, beta)`, or of `impl.op_lo` with B's lo parts
    where B is a weight and the kernel takes them (_lo_node)."""
    lo = _lo_node(gm, g, fx, impl, weight, index)
    if lo is None:
        return g.call_function(impl.op, (a, b, bias, c, alpha, beta))
    return g.call_function(impl.op_lo, (a, b, lo, bias, c, alpha, beta))


def _held_weight(gm, g, fx, name: str, key: tuple, make_nk):
    """Buffer `name` holding make_nk() (N x K, packed; see _derived); returns (the node of B
    as the GEMM op takes it, K x N: t(buffer), and that tensor)."""
    w_nk = _derived(gm, fx, name, key, make_nk)
    return g.call_function(torch.ops.aten.t.default, (g.get_attr(name),)), w_nk.t()


def _batched(g, x, shape: tuple, lead: list):
    """Operand `x` (of `shape`, rank 3 or more) as the batched GEMM reads it: its batch dims
    broadcast to the output's (`lead`), then merged into one, [prod(lead), rows, cols] (a
    view where the merged dims are evenly strided, else a copy)."""
    aten = torch.ops.aten
    if list(shape[:-2]) != lead:
        x = g.call_function(aten.expand.default, (x, [*lead, *shape[-2:]]))
    if len(lead) != 1:
        x = g.call_function(aten.reshape.default, (x, [-1, *shape[-2:]]))
    return x


def _einsum_nodes(gm, g, shapes, r, impl, fx, index: int):
    """An einsum that is one GEMM (attrs["einsum"], discovery.einsum.Lowering): each operand
    permuted and reshaped to the GEMM's, the kernel, and its result reshaped and permuted to
    the einsum's output; copied to a packed tensor where a reader views it in a way only a
    packed one allows."""
    aten = torch.ops.aten
    low, ops = r.attrs["einsum"], r.operands
    xs = []
    for role in ("a", "b"):
        x, how = fx(ops[role]), low[role]
        if how["perm"] != sorted(how["perm"]):
            x = g.call_function(aten.permute.default, (x, list(how["perm"])))
        xs.append(g.call_function(aten.reshape.default, (x, list(how["shape"]))))
    y = _gemm_call(gm, g, fx, impl, xs[0], xs[1], None, None, None, 1.0, 0.0, index)
    y = g.call_function(aten.view.default, (y, list(low["out_shape"])))
    perm = list(low["out_perm"])
    if perm != sorted(perm):
        y = g.call_function(aten.permute.default, (y, perm))
        meta = torch.empty(low["out_shape"], device="meta").permute(perm)
        if any(u.op == "call_function" and u.target is aten.view.default and not _views(meta, u.args[1])
               for u in fx(r.output).users):
            y = g.call_function(aten.clone.default, (y,), {"memory_format": torch.contiguous_format})
    return y


def _gemm_nodes(gm, g, shapes, r, impl, fx, index: int):
    """FX nodes computing region `r` with a GEMM kernel op; returns the node of its result.
    Operands of rank 4 and more are the batched 3-D GEMM over their merged batch dims."""
    aten = torch.ops.aten
    ops, attrs = r.operands, r.attrs
    if attrs.get("einsum"):
        return _einsum_nodes(gm, g, shapes, r, impl, fx, index)
    a, b = fx(ops["a"]), fx(ops["b"])
    weight = _attr_tensor(gm, b.target) if b.op == "get_attr" else None
    sa, sb, sout = shapes.get(ops["a"]), shapes.get(ops["b"]), shapes.get(r.output)
    if sa is None or sb is None or sout is None:
        raise ComposeError(f"region {r.rule} at `{r.output}`: operand shapes unknown")
    nk = attrs.get("b_layout") == "nk"
    spec = impl.record.get("spec", {})
    if nk:
        b = g.call_function(aten.t.default, (b,))
        n = sb[0]
    else:
        n = sb[-1]
        if weight is not None and len(sb) == 2 and spec.get("layout_b") == "col":
            # A K x N weight for a kernel that reads B K-major: transposed once into a buffer
            # (N x K), not copied by every call (realize.plan keys such regions K-major).
            w = weight
            b, weight = _held_weight(gm, g, fx, f"_factdb_wt_{index}", ("t", _ident(w)),
                                     lambda: w.detach().t().contiguous())
    k = sa[-1]
    if len(sa) < 2 or len(sb) < 2:
        raise ComposeError(f"region {r.rule} at `{r.output}`: a vector operand (ranks {len(sa)} and {len(sb)})")
    flatten = len(sb) == 2 and len(sa) != 2  # (..., K) @ (K, N): one 2-D GEMM over the leading dims
    # A batch of GEMMs: operands of rank 3 and more broadcast to the output's batch dims and
    # merged into one ([B, H, T, D] @ [B, H, D, T] as [B*H, T, D] @ [B*H, D, T]), the result viewed back.
    batched = not flatten and len(sout) > 3 or (len(sa) == len(sb) == 3 and sa[0] != sb[0])
    if flatten:
        a = g.call_function(aten.reshape.default, (a, [-1, k]))
    elif batched:
        lead = list(sout[:-2])
        if len(sa) >= 3:
            a = _batched(g, a, sa, lead)
        if len(sb) >= 3:
            b = _batched(g, b, sb, lead)
    bias = fx(ops.get("bias"))
    epi = spec.get("epilogue", "none")
    if bias is None and (epi.startswith("bias") or epi == "residual"):
        # The kernel adds a bias (a residual region without one, as in Llama): zeros cost a row read.
        if weight is None:
            raise ComposeError(f"region {r.rule} at `{r.output}`: the kernel adds a bias, the region has none, "
                               "and its weight is not a parameter to take a device from")
        name = f"_factdb_zero_bias_{index}"
        _derived(gm, fx, name, ("zeros", n, weight.dtype, weight.device),
                 lambda: torch.zeros(n, dtype=weight.dtype, device=weight.device))
        bias = g.get_attr(name)
    # A constant scale the region folds in (discover._gemm_scale): act(alpha * acc + beta * c + alpha * bias).
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0 and bias is not None:
        if bias.op == "get_attr":
            name, tb = f"_factdb_scaled_bias_{index}", _attr_tensor(gm, bias.target)
            _derived(gm, fx, name, ("scaled", alpha, _ident(tb)), lambda: (tb * alpha).detach())
            bias = g.get_attr(name)
        else:
            bias = g.call_function(aten.mul.Tensor, (bias, alpha))
    # One 2-D GEMM whose region output has more dims: A flattened here, or already 2-D in the
    # model (GPT-2's Conv1D: addmm over x.view(-1, K), the residual added after the view back).
    two_d = flatten or (len(sa) == 2 and len(sb) == 2 and len(sout) != 2)
    c = fx(ops.get("c"))
    if c is not None and two_d:
        c = g.call_function(aten.reshape.default, (c, [-1, n]))
    elif c is not None and batched:
        c = g.call_function(aten.reshape.default, (c, [-1, *sout[-2:]]))
    if weight is not None and len(sb) != 2:
        weight = None  # a batched constant B: split per call
    y = _gemm_call(gm, g, fx, impl, a, b, (weight.t() if nk else weight) if weight is not None else None, bias, c,
                   alpha, beta if c is not None else 0.0, index)
    if two_d or batched:
        y = g.call_function(aten.view.default, (y, list(sout)))
    return y


def _dual_gemm_nodes(gm, g, shapes, r, impl, fx, index: int):
    """silu(x Wg) * (x Wu) as one op (kernels.gemm.kernel.swiglu_op): one GEMM over [Wg; Wu]
    (a buffer made here), then SiLU and the product in place in the gate half of its output,
    so the call holds one M x 2N tensor, not also a SiLU output and a product. The result is
    that strided half (rows 2N apart), as the op's fake says; in place inside one op, so
    torch.compile sees no mutation to functionalize."""
    aten = torch.ops.aten
    ops, nk = r.operands, r.attrs.get("b_layout") == "nk"
    wg, wu = fx(ops["w_gate"]), fx(ops["w_up"])
    if wg.op != "get_attr" or wu.op != "get_attr":
        raise ComposeError(f"region {r.rule} at `{r.output}`: gate and up weights are not parameters")
    tg, tu = _attr_tensor(gm, wg.target).detach(), _attr_tensor(gm, wu.target).detach()
    n = tg.shape[0] if nk else tg.shape[1]
    sa, sout = shapes.get(ops["a"]), shapes.get(r.output)
    if sa is None or sout is None:
        raise ComposeError(f"region {r.rule} at `{r.output}`: operand shapes unknown")
    name, key = f"_factdb_gate_up_{index}", (nk, _ident(tg), _ident(tu))
    if nk or impl.record.get("spec", {}).get("layout_b") == "col":  # held N x K (K-major B)
        b, wt = _held_weight(gm, g, fx, name, ("gate_up_nk", *key),
                             lambda: torch.cat([tg, tu] if nk else [tg.t(), tu.t()], dim=0).contiguous())
    else:
        wt = _derived(gm, fx, name, ("gate_up_kn", *key), lambda: torch.cat([tg, tu], dim=1))
        b = g.get_attr(name)
    a = fx(ops["a"])
    if len(sa) != 2:
        a = g.call_function(aten.reshape.default, (a, [-1, sa[-1]]))
    lo = _lo_node(gm, g, fx, impl, wt, index)
    out = g.call_function(swiglu_op(impl.op, impl.op_lo if lo is not None else None), (a, b, lo, n))
    out = g.call_function(aten.view.default, (out, list(sout))) if len(sa) != 2 else out
    # A reader that views the result in a way only a packed tensor allows gets a packed copy.
    meta = torch.empty([math.prod(sout[:-1]), 2 * n], device="meta")[:, :n].view(list(sout))
    if any(u.op == "call_function" and u.target is aten.view.default and not _views(meta, u.args[1])
           for u in fx(r.output).users):
        out = g.call_function(aten.clone.default, (out,), {"memory_format": torch.contiguous_format})
    return out


def _horizontal_nodes(gm, g, shapes, r, impl, fx, index: int):
    """Sibling projections of one input (rules/gemm/gemm-horizontal.yaml) as one GEMM over
    their weights concatenated as N x K (and their biases, zeros where a member has none),
    buffers made here once; each member's output is its slice of the result. Returns
    {member output name: node}."""
    import operator
    aten = torch.ops.aten
    members, ops = r.attrs.get("members") or [], r.operands
    ws, bs = [], []
    for mem in members:
        w = fx(mem["b"])
        if w.op != "get_attr":
            raise ComposeError(f"region {r.rule} at `{r.output}`: the weight `{mem['b']}` is not a parameter")
        t = _attr_tensor(gm, w.target).detach()
        ws.append(t if mem.get("b_layout") == "nk" else t.t())
        if mem.get("bias"):
            b = fx(mem["bias"])
            if b.op != "get_attr":
                raise ComposeError(f"region {r.rule} at `{r.output}`: the bias `{mem['bias']}` is not a parameter")
            bs.append(_attr_tensor(gm, b.target).detach())
        else:
            bs.append(None)
    ns = [int(w.shape[0]) for w in ws]
    if len({int(w.shape[1]) for w in ws}) != 1 or [m["n"] for m in members] != ns:
        raise ComposeError(f"region {r.rule} at `{r.output}`: the weights' shapes differ from discovery's")
    sa = shapes.get(ops["a"])
    outs = [shapes.get(m["output"]) for m in members]
    if sa is None or any(o is None for o in outs):
        raise ComposeError(f"region {r.rule} at `{r.output}`: operand shapes unknown")
    wname, bname = f"_factdb_hcat_weight_{index}", f"_factdb_hcat_bias_{index}"
    _derived(gm, fx, wname, ("cat_nk", *(_ident(w) for w in ws)), lambda: torch.cat(ws, dim=0).contiguous())
    bias = None
    if any(b is not None for b in bs):
        _derived(gm, fx, bname, ("cat_bias", *(_ident(b) if b is not None else ns[i] for i, b in enumerate(bs))),
                 lambda: torch.cat([b if b is not None else ws[i].new_zeros(ns[i]) for i, b in enumerate(bs)]))
        bias = g.get_attr(bname)
    a = fx(ops["a"])
    if len(sa) != 2:
        a = g.call_function(aten.reshape.default, (a, [-1, sa[-1]]))
    y = _gemm_call(gm, g, fx, impl, a, g.call_function(aten.t.default, (g.get_attr(wname),)), getattr(gm, wname).t(),
                   bias, None, 1.0, 0.0, index)
    if len(sa) != 2:
        y = g.call_function(aten.view.default, (y, list(sa[:-1]) + [sum(ns)]))
    parts = g.call_function(aten.split_with_sizes.default, (y, ns, -1))
    # Each slice is strided (rows of the whole result apart); a reader that views it in a way
    # only a packed tensor allows gets a packed copy. The slices' strides, on meta:
    metas = torch.empty(list(sa[:-1]) + [sum(ns)], device="meta").split(ns, -1)
    out = {}
    for i, (mem, meta) in enumerate(zip(members, metas)):
        part = g.call_function(operator.getitem, (parts, i))
        if any(u.op == "call_function" and u.target is aten.view.default and not _views(meta, u.args[1])
               for u in fx(mem["output"]).users):
            part = g.call_function(aten.clone.default, (part,), {"memory_format": torch.contiguous_format})
        out[mem["output"]] = part
    return out


def _views(meta, shape) -> bool:
    try:
        meta.view(list(shape))
        return True
    except RuntimeError:
        return False


def _attention_nodes(gm, g, shapes, r, impl, fx, index: int):
    aten = torch.ops.aten
    ops, attrs = r.operands, r.attrs
    q, v = fx(ops["q"]), fx(ops["v"])
    if "k" in ops:
        k = fx(ops["k"])
    else:
        k = g.call_function(aten.transpose.int, (fx(ops["kt"]), -2, -1))
    sq = shapes.get(ops["q"])
    if sq is None or len(sq) != 4:
        raise ComposeError(f"region {r.rule} at `{r.output}`: q of rank {len(sq) if sq else '?'} (attention ops take 4-D q, k, v)")
    scale = attrs.get("scale")
    scale = float(scale) if scale is not None else sq[-1] ** -0.5
    causal = bool(attrs.get("causal"))
    if impl.kind == "sdpa":
        kw = {"is_causal": causal, "scale": scale}
        if attrs.get("gqa"):
            kw["enable_gqa"] = True
        return g.call_function(aten.scaled_dot_product_attention.default, (q, k, v), kw)
    return g.call_function(impl.op, (q, k, v, scale, causal))


def _norm_nodes(gm, g, shapes, r, impl, fx, index: int):
    """Residual add + norm (template add_norm): `impl.op(x, r, weight, bias) -> (y, s)`. Where
    the region exposes the sum (attrs["sum"]), its uses outside the region read s instead, so
    the add is erased; the op goes right after the add, where x, r and the sum's readers
    are all in order. A norm over several trailing dims (attrs["normalized"]) runs on rows of
    their product; a weightless one gets a weight of ones."""
    import operator
    aten = torch.ops.aten
    ops, attrs = r.operands, r.attrs
    if "x" not in ops:
        raise ComposeError(f"region {r.rule} at `{r.output}`: no x operand")
    total = attrs.get("sum") or ""
    anchor = fx(total) if total else None
    region = set(r.nodes)
    ctx = g.inserting_after(anchor) if anchor is not None else g.inserting_before(fx(r.output))
    sx = shapes.get(ops["x"])
    nd = int(attrs.get("normalized", 1) or 1)
    if sx is None:
        raise ComposeError(f"region {r.rule} at `{r.output}`: the input's shape is unknown")
    width = math.prod(sx[-nd:])

    def rows(name):
        """Operand `name`, a norm over several trailing dims being one over their product:
        x and the residual as rows of `width`, the weight and bias flattened alike."""
        v = fx(ops[name]) if name in ops else None
        if v is None or nd == 1:
            return v
        return g.call_function(aten.reshape.default, (v, [*sx[:-nd], width] if name in ("x", "res") else [width]))

    def whole(node):
        return g.call_function(aten.view.default, (node, list(sx))) if nd > 1 else node

    with ctx:
        x = rows("x")
        weight = rows("weight")
        if weight is None:  # a weightless norm: ones, made per call (no device is known here to hold them on)
            weight = g.call_function(aten.new_ones.default, (x, [width]))
        call = g.call_function(impl.op, (x, rows("res"), weight, rows("bias")))
    with g.inserting_after(call):
        y = g.call_function(operator.getitem, (call, 0))
    with g.inserting_after(y):
        y = whole(y)
    if anchor is not None:
        with g.inserting_after(y):
            s = g.call_function(operator.getitem, (call, 1))
        with g.inserting_after(s):
            s = whole(s)
        for u in list(anchor.users):
            if u is not call and u.name not in region:
                u.replace_input_with(anchor, s)
        # regions rewritten after this one that read the sum (a later residual GEMM's c, in a
        # pre-norm block whose residual add is no GEMM's epilogue) take s too: the add is erased
        fx.replaced[total] = s
    return y


def _region_nodes(gm, g, shapes, r, impl, fx, index: int):
    """A region kernel (fact_db/kernels/region/, the agent's): `impl.op([inputs...]) -> out`,
    its inputs in the ABI order its RegionSpec records (`impl.record["region"]`)."""
    spec = impl.record.get("region") or {}
    names = [x["name"] for x in spec.get("inputs", [])]
    if not names:
        raise ComposeError(f"region {r.rule} at `{r.output}`: its kernel records no inputs")
    for x in spec["inputs"]:
        if shapes.get(x["name"]) is not None and list(shapes[x["name"]]) != list(x["shape"]):
            raise ComposeError(f"region {r.rule}: input `{x['name']}` is {list(shapes[x['name']])} here, the "
                               f"kernel was verified at {x['shape']}")
    return g.call_function(impl.op, ([fx(n) for n in names],))


def _conv_weights(gm, fx, r, wl, cfg, index: int):
    """(weight buffer node's name, folded bias buffer's name or None) of a conv region: the weight
    held as the kernel reads it (KRSC; split3's [w, lo(w), w]; the pointwise GEMM's
    [hi(w); lo(w)]; `cfg` None, cuDNN's: as the model holds it), made once; with an eval-mode
    BatchNorm in the region, folded into that weight and a bias first (kernels/conv/fold.py)."""
    from fact_db.kernels.conv.fold import fold_bn
    from fact_db.kernels.conv.kernel import prepare_weight
    ops, attrs = r.operands, r.attrs
    wnode = fx(ops["w"])
    if wnode.op != "get_attr":
        raise ComposeError(f"region {r.rule} at `{r.output}`: the weight `{ops['w']}` is not a parameter")
    tw = _attr_tensor(gm, wnode.target)
    tensor = lambda role: _attr_tensor(gm, fx(ops[role]).target) if role in ops else None  # noqa: E731
    bias_name = None
    if "bn_mean" in ops:
        roles = [x for x in ("bias", "bn_weight", "bn_bias", "bn_mean", "bn_var") if x in ops]
        if any(fx(ops[x]).op != "get_attr" for x in roles):
            raise ComposeError(f"region {r.rule} at `{r.output}`: a BatchNorm or bias tensor is not a parameter or buffer")
        parts = {x: tensor(x) for x in roles}
        key = ("bn_fold", _ident(tw), *(_ident(parts[x]) for x in roles), attrs.get("bn_eps"))
        folded = fx.derived.get(key)
        if folded is None:
            folded = fx.derived[key] = fold_bn(tw, parts.get("bias"), parts.get("bn_weight"), parts.get("bn_bias"),
                                               parts["bn_mean"], parts["bn_var"], float(attrs.get("bn_eps", 1e-5)),
                                               transposed=wl.transposed, groups=wl.groups)
        tw, tb = folded
        bias_name = f"_factdb_conv_bias_{index}"
        _derived(gm, fx, bias_name, ("bn_bias", *key[1:]), lambda: tb.to(tw.dtype))
    name = f"_factdb_conv_weight_{index}"
    if cfg is None:  # the library's: as the model holds it
        _derived(gm, fx, name, ("conv_w_kcrs", _ident(tw)), lambda: tw.contiguous())
    else:
        _derived(gm, fx, name, ("conv_w", _ident(tw), cfg.split3, cfg.schedule == "gemm", wl.dtype),
                 lambda: prepare_weight(tw, wl, cfg))
    return name, bias_name


def _channels_last_node(g, x, rank: int):
    """FX nodes converting `x` (N, C, *spatial) to a packed channels-last tensor of the same shape."""
    aten = torch.ops.aten
    if rank in (4, 5):
        fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
        return g.call_function(aten.clone.default, (x,), {"memory_format": fmt})
    perm = [0] + list(range(2, rank)) + [1]
    inv = [0, rank - 1] + list(range(1, rank - 1))
    t = g.call_function(aten.permute.default, (x, perm))
    t = g.call_function(aten.clone.default, (t,), {"memory_format": torch.contiguous_format})
    return g.call_function(aten.permute.default, (t, inv))


def _precedes(g, a, b) -> bool:
    """Whether node `a` comes before node `b` in graph `g`."""
    for n in g.nodes:
        if n is a:
            return True
        if n is b:
            return False
    return False


def _fx_op(n) -> str:
    from fact_db.discovery.aten import target_name
    return target_name(n.target)[0] if n.op == "call_function" else n.op


def _first_tensor(n):
    return next((a for a in n.args if isinstance(a, torch.fx.Node)), None) if n.op == "call_function" else None


def _conv_nodes(gm, g, shapes, r, impl, fx, index: int):
    """A convolution region (kernels/conv): `impl.op(x, w, bias, vecs, residual) -> y`, y
    channels-last. The weight is held as the kernel reads it (BatchNorm folded in first), made
    once; an activation or residual that does not arrive channels-last from another fact-db
    convolution (kernels/conv/layout.py) gets an explicit conversion here, counted in
    `fx.conversions` for the report."""
    from fact_db.kernels.conv.kernel import ConvConfig
    from fact_db.kernels.conv.layout import arrives_channels_last
    from fact_db.kernels.conv.workload import ConvWorkload
    ops, attrs = r.operands, r.attrs
    wl = ConvWorkload(**impl.record["workload"])
    library = impl.record.get("library") == "cudnn"  # cuDNN on the folded weight, as the model holds it
    cfg = None if library else ConvConfig(**impl.record["config"])
    wname, bname = _conv_weights(gm, fx, r, wl, cfg, index)
    bias = g.get_attr(bname) if bname else fx(ops.get("bias"))
    steps = attrs.get("chain") or []
    vecs = [fx(s["tensor"]) for s in steps if s.get("kind") in ("channel", "scalar")]
    full = next((s["tensor"] for s in steps if s.get("kind") == "full"), None)
    kernels = fx.conv_outputs
    rank = wl.spatial + 2

    def planned(name, role):
        node = fx(name)
        if library or arrives_channels_last(node, lambda n: n in kernels, _fx_op, _first_tensor):
            return node
        done = fx.channels_last.get(node)
        if done is not None and _precedes(g, done, fx(r.output)):  # converted once for an earlier op (x
            return done  # read by the first convolution and again as a later one's residual)
        fx.conversions.append(f"region {index + 1} {r.rule}: {role} `{name}` converted to channels-last")
        fx.channels_last[node] = _channels_last_node(g, node, rank)
        return fx.channels_last[node]
    x = planned(ops["x"], "input")
    res = planned(full, "residual") if full else None
    y = g.call_function(impl.op, (x, g.get_attr(wname), bias, vecs, res))
    if not library:
        kernels.add(y)
    return y


_BUILDERS = {"gemm": _gemm_nodes, "attention": _attention_nodes, "sdpa": _attention_nodes, "norm": _norm_nodes,
             "region": _region_nodes, "conv": _conv_nodes}


def rewrite(program, regions: list, impls: dict, split_weights: bool = True, derived: dict | None = None):
    """The unlifted GraphModule of ExportedProgram `program` with every region whose Impl is
    not eager replaced by its op. Regions need `rule`, `nodes`, `output`, `operands`,
    `attrs` and `composable` (discover.Region has them; an artifact stores them). Returns
    (GraphModule, notes); a region that cannot be replaced stays eager, with a note.
    `split_weights`: a kernel that takes B's lo parts (Impl.op_lo) gets its weight's split
    once into a buffer, held beside the weight (faster calls, one more copy of the weight);
    False splits them per call. Buffers made here (concatenated weights, lo parts) are copies:
    the module serves the weights it was composed with. `derived`: a dict kept across the
    rewrites of one model (its compositions for other input shapes), so they share those
    buffers instead of each holding its own; this call adds what it makes.
    """
    if program is None:
        raise ComposeError("no exported program to compose (the graph was traced without one)")
    if not split_weights:
        impls = {i: dataclasses.replace(m, op_lo=None, split_lo=None) for i, m in impls.items()}
    gm = program.module()
    fx = _fx_resolver(gm, program)
    fx.derived = derived if derived is not None else {}
    shapes = _shapes(program)
    g = gm.graph
    notes = []
    for i, r in enumerate(regions):
        impl = impls.get(i)
        if impl is None or impl.kind == "eager":
            continue
        if r.composable:
            notes.append(f"region {i + 1} {r.rule}: stays eager ({r.composable})")
            impl.kind, impl.note = "eager", r.composable
            continue
        group = impl.kind == "gemm" and bool((r.attrs or {}).get("members"))
        build = _dual_gemm_nodes if impl.kind == "gemm" and (r.template or "").startswith("dual_gemm") else \
            _horizontal_nodes if group else _BUILDERS.get(impl.kind)
        if build is None:
            raise ComposeError(f"unknown implementation kind '{impl.kind}' for region {i + 1} ({r.rule})")
        try:
            out = fx(r.output)
            if group:  # the one GEMM goes before the first member: every member reads its input
                mine = set(r.nodes)
                out = next((n for n in g.nodes if n.name in mine), out)
            with g.inserting_before(out):
                new = build(gm, g, shapes, r, impl, fx, i)
        except ComposeError as e:
            notes.append(f"region {i + 1} {r.rule}: stays eager ({e})")
            impl.kind, impl.note = "eager", str(e)
            continue
        for name, node in (new if isinstance(new, dict) else {r.output: new}).items():
            fx(name).replace_all_uses_with(node)
            fx.replaced[name] = node
        # The region's own nodes, now unused: erased explicitly, since DCE keeps ops it thinks
        # impure (dropout, even at p=0, which discovery looked through as the identity).
        mine = {n.name for n in g.nodes} & set(r.nodes)
        for node in reversed(list(g.nodes)):
            if node.name in mine and not node.users and node.op == "call_function":
                g.erase_node(node)
    if fx.conv_outputs or fx.conversions:
        notes.append(f"layout: {len(fx.conversions)} conversion(s) to channels-last left for {len(fx.conv_outputs)} "
                     "fact-db convolution(s); the others read a fact-db convolution's channels-last output"
                     + ("".join(f"; {c}" for c in fx.conversions)))
    gm.meta["factdb_layout_conversions"] = list(fx.conversions)
    _drop_input_checks(gm)
    g.eliminate_dead_code()
    g.lint()
    gm.recompile()
    return gm, notes


def _drop_input_checks(gm) -> None:
    """The unlifted program checks every call's inputs against the exported ones (a forward
    pre-hook matching the pytree structure, and a `_guards_fn` call on the shapes): about half
    of a small model's host time per call. ComposedModule runs this graph only for the exact
    signature it guards (shapes, dtypes, devices), so those checks are dropped here."""
    hooks = gm._forward_pre_hooks
    for k, hook in list(hooks.items()):
        if getattr(hook, "__name__", "") == "_check_input_constraints_pre_hook":
            del hooks[k]
            gm._forward_pre_hooks_with_kwargs.pop(k, None)
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
