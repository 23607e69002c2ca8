"""Discover: trace a model, match the rules, estimate what each region would gain.

>>> report = discover_problem("benchmarks/problems/mingpt_block.py", arch="sm90", policy="fp32")
>>> [r.rule for r in report.regions]
['layernorm', 'gemm-bias', 'attention-causal', 'gemm-residual', ...]

or, from Python, on a module you already have:

>>> report = fact_db.discover(model, (x,))
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from fact_db.core.device import device
from fact_db.core.policy import POLICIES
from fact_db.discovery import aten, conv, roofline
from fact_db.discovery.match import GroupMatch, match_all, select
from fact_db.discovery.rules import RuleSet, load_rules
from fact_db.discovery.trace import Graph, load_problem, trace_module, trace_problem

# Ops worth a kernel of their own: every one no region covers is listed as uncovered, however
# small its share. Any other op is listed when its own estimate is at least SHARE_FLOOR of
# the model's and more than a launch of work (in a small model every op is a large share of
# launches, which CUDA graphs take care of, not a kernel); the rest of what no region covers
# is summed up (Report.rest).
HEAVY_OPS = (frozenset(aten.GEMM_OPERANDS) | roofline.CONV_OPS | roofline.CONV_TRANSPOSE_OPS
             | frozenset(roofline.RECURRENT_OPS)
             | {"aten.scaled_dot_product_attention", "aten.einsum", "aten.cumsum", "aten.cumprod", "aten.logcumsumexp"})
SHARE_FLOOR = 0.05


@dataclass
class Uncovered:
    """An op no region covers: why, and its share of the model's estimated eager time (None
    where discovery cannot see inside it: a higher-order op it does not follow)."""

    node: str
    op: str
    reason: str
    share: float | None = None
    est_s: float | None = None
    source: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Region:
    rule: str
    title: str
    template: str
    form: str  # which alternative of the pattern matched
    nodes: list  # graph node names
    output: str
    problem: dict  # M, N, K, batch or attention dims, for the registry key
    shape: str  # human form of the problem
    dtypes: list
    layouts: dict
    estimate: roofline.Estimate
    share: float  # of the whole model's estimated eager time
    registry: str  # hit / near / miss
    source: str | None
    assumptions: list = field(default_factory=list)
    subsumes: list = field(default_factory=list)  # rules whose smaller matches this region won over
    # What realization and composition need, so neither re-derives it: the rule's epilogue,
    # each operand's role -> graph node name (GEMM: a, b, bias, c; attention: q, k or kt, v;
    # norms: x, weight, bias), and scalar attributes (b_layout "nk" for a Linear weight,
    # b_weight where a GEMM's B is a 2-D parameter, attention scale and causal, norm eps).
    # `composable` is "" or why composition must leave the region to eager PyTorch.
    epilogue: list = field(default_factory=list)
    operands: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    composable: str = ""
    measured_s: float | None = None  # a registry hit's measured kernel time, which the table shows instead

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "estimate"}
        d["estimate"] = self.estimate.as_dict()
        return d


@dataclass
class Report:
    problem: str
    arch: str
    gpu: str
    policy: str
    regions: list
    misses: dict  # rule id -> NoMatch, for rules that matched nowhere
    uncovered: list  # Uncovered: heavy ops no region covers, and any other op of a large share
    eager_s: float
    trace_s: float
    match_s: float
    partial: bool = False
    note: str = ""
    n_ops: int = 0
    # What no region covers and `uncovered` does not list: {"ops": count, "share", "est_s"}.
    rest: dict = field(default_factory=lambda: {"ops": 0, "share": 0.0, "est_s": 0.0})
    graph: Graph | None = field(default=None, repr=False)  # the traced graph; graph.program is the ExportedProgram

    def as_dict(self) -> dict:
        return {
            "problem": self.problem, "arch": self.arch, "gpu": self.gpu, "policy": self.policy,
            "partial": self.partial, "note": self.note, "ops": self.n_ops,
            "est_eager_s": self.eager_s, "trace_s": self.trace_s, "match_s": self.match_s,
            "regions": [r.as_dict() for r in self.regions],
            "uncovered": [u.as_dict() for u in self.uncovered], "uncovered_rest": dict(self.rest),
            "misses": {rid: {"reason": m.reason, "nearest": m.node.name if m and m.node is not None else None,
                             "source": m.node.source if m and m.node is not None else None}
                       for rid, m in self.misses.items()},
        }


def _problem_dims(m) -> tuple:
    """(problem dict, human shape, layouts) of a region, read off its main node; a sibling
    group's is the one GEMM over its concatenated weights (N summed, B read N x K)."""
    if m.rule.realize.get("template", "").startswith("conv") and conv.problem_of(m) is not None:
        return conv.problem_of(m)
    if isinstance(m, GroupMatch):
        dims = [aten.gemm_problem(_gemm_of(x)) for x in m.members]
        prob = {"M": dims[0]["M"], "N": sum(d["N"] for d in dims), "K": dims[0]["K"], "batch": 1}
        shape = f"{prob['M']}x{prob['N']}x{prob['K']} ({' + '.join(str(d['N']) for d in dims)})"
        return prob, shape, {"a": dims[0]["layout_a"], "b": "col"}
    for n in m.compute_nodes:
        dims = aten.gemm_problem(n)
        if dims:
            prob = {k: dims[k] for k in ("M", "N", "K", "batch")}
            shape = f"{dims['M']}x{dims['N']}x{dims['K']}" + (f" (batch {dims['batch']})" if dims["batch"] > 1 else "")
            if m.rule.realize.get("template", "").startswith("fmha"):  # attention written out as matmuls
                q, v = m.captures.get("q"), m.captures.get("v")
                if q is not None and v is not None and q.shape:
                    return _attn(q.shape, m.captures.get("kt").shape[-1], v.shape[-1])
            return prob, shape, {"a": dims["layout_a"], "b": dims["layout_b"]}
        if n.op == "aten.scaled_dot_product_attention":
            q, k, v = n.args[0], n.args[1], n.args[2]
            return _attn(q.shape, k.shape[-2], v.shape[-1])
    out = m.output
    return {"shape": list(out.shape or ())}, "x".join(map(str, out.shape or ())), {}


def _attn(qshape, lk, dv) -> tuple:
    bh = 1
    for s in qshape[:-2]:
        bh *= s
    prob = {"batch_heads": bh, "Lq": qshape[-2], "Lk": lk, "D": qshape[-1], "Dv": dv}
    return prob, f"{'x'.join(map(str, qshape[:-2]))} heads, {qshape[-2]}x{lk}, d={qshape[-1]}", {}


def _name(v):
    """An operand's name in the exported program: a value a higher-order op's body computed is
    read through the wrapper's output (Node.outer)."""
    if not hasattr(v, "name"):
        return None
    return getattr(v, "outer", None) or v.name


ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def _gemm_scale(m, epi: list) -> tuple[dict, str]:
    """({alpha, beta}, why-not) for a GEMM region whose epilogue has `scale`: a multiplication
    or division by one constant. The kernels compute act(alpha * acc + beta * c + bias), so a
    scale before the activation (or after ReLU, when positive: relu(f x) = f relu(x)) is the
    GEMM's alpha with the bias scaled by it too; a scale after the residual scales it (beta)."""
    scales = [n for n in m.compute_nodes if n.op in ("aten.mul", "aten.div") and len(n.args) >= 2
              and sum(isinstance(a, (int, float)) and not isinstance(a, bool) for a in n.args[:2]) == 1]
    if len(scales) != 1:
        return {}, "the scale is not one multiplication or division by a constant"
    s = scales[0]
    c = next(a for a in s.args[:2] if isinstance(a, (int, float)) and not isinstance(a, bool))
    if s.op == "aten.div":
        if s.args[1] is not c:
            return {}, "a constant divided by the GEMM's result is not a scale of it"
        if c == 0:
            return {}, "a division by zero"
        factor = 1.0 / float(c)
    else:
        factor = float(c)
    acts = [e for e in epi if e in ACTIVATIONS]
    at = epi.index("scale")
    if any(epi.index(a) < at for a in acts) and not (acts == ["relu"] and factor > 0):
        return {}, (f"a scale by {factor:g} after {acts[0]} is not the GEMM's alpha (only ReLU commutes with a "
                    "positive scale)")
    after_residual = "residual" in epi and epi.index("residual") < at
    return {"alpha": factor, "beta": factor if after_residual else 1.0}, ""


def _gemm_of(m):
    """The GEMM node of a single-output GEMM match."""
    return next(n for n in m.compute_nodes if n.op in aten.GEMM_OPERANDS)


def _group_operands(m) -> tuple[dict, dict, str]:
    """A sibling group's operands: the shared input `a`; per member (attrs["members"], in graph
    order) its output, weight `b`, bias (or None), N and the weight's layout (nk: N x K, a
    Linear's; kn: K x N, `x @ w`). Composition concatenates the weights as N x K."""
    members, why = [], ""
    x = None
    for mem in m.members:
        g = _gemm_of(mem)
        ia, ib = aten.GEMM_OPERANDS[g.op]
        a, b = g.args[ia], g.args[ib]
        x = x or a
        bias = None
        for t in mem.inputs:  # besides a and b: a per-column bias, nothing else
            if t is a or t is b:
                continue
            if t.shape is not None and len(t.shape) == 1 and bias is None:
                bias = t
            else:
                why = why or f"`{mem.output.name}` reads `{t.name}`, neither its weight nor a bias"
        if bias is not None and bias.op not in ("parameter", "constant"):
            why = why or f"the bias `{bias.name}` is not a parameter or constant"
        nk = g.op == "aten.linear"
        members.append({"output": mem.output.name, "b": _name(b), "bias": _name(bias) if bias is not None else None,
                        "n": int(b.shape[0] if nk else b.shape[-1]), "b_layout": "nk" if nk else "kn"})
        if getattr(b, "op", None) not in ("parameter", "constant"):
            why = why or f"the weight `{_name(b)}` is not a parameter or constant"
    return {"a": _name(x)}, {"members": members, "b_layout": "nk"}, why


def _operands(m, template: str) -> tuple[dict, dict, str]:
    """(operands, attrs, why-not) of a region, read off its matched nodes.

    Operands are graph node names by role; why-not is "" when composition can replace the
    region, else the reason it stays eager.
    """
    if isinstance(m, GroupMatch):
        return _group_operands(m)
    if template.startswith("conv"):  # fact_db/discovery/conv.py: geometry, BatchNorm, the epilogue chain
        return conv.operands_of(m)
    comp = m.compute_nodes
    out_shape = m.output.shape
    if template.startswith("gemm"):
        g = next((n for n in comp if aten.gemm_operands(n) is not None), None)
        if g is None:
            return {}, {}, "no GEMM node in the region"
        a, b = aten.gemm_operands(g)
        ops = {"a": _name(a), "b": _name(b)}
        attrs = {"b_layout": "nk" if g.op == "aten.linear" else "kn"}
        if g.op == "aten.einsum":
            # How composition lowers it to the GEMM: each operand permuted and reshaped, the result back.
            attrs["einsum"] = aten.einsum_lowering(g)[0].as_dict()
        elif getattr(b, "op", None) in ("parameter", "constant") and len(b.shape or ()) == 2:
            attrs["b_weight"] = True  # B is the same on every call: composition may hold it in another layout
        why = ""
        if not (hasattr(a, "shape") and hasattr(b, "shape")) or a.shape is None or b.shape is None:
            return ops, attrs, "an operand has no known shape"
        # Operands of rank 4 and more are the batched GEMM over their merged leading dims (compose).
        if g.op == "aten.linear" and len(b.shape) != 2:
            why = f"Linear weight of rank {len(b.shape)}"
        # The other tensors the region reads: a bias (rank 1) and a residual (the output's shape).
        for x in m.inputs:
            if x is a or x is b or x.shape is None:
                continue
            if len(x.shape) == 1 and "bias" not in ops:
                ops["bias"] = x.name
            elif tuple(x.shape) == tuple(out_shape or ()) and "c" not in ops:
                ops["c"] = x.name
            elif x.op not in ("parameter", "buffer", "constant", "input") or x.numel > 1:
                why = why or f"reads `{x.name}` of shape {list(x.shape)}, neither a bias nor a residual"
        epi = list(m.rule.realize.get("epilogue") or [])
        if "scale" in epi:
            scale, swhy = _gemm_scale(m, epi)
            attrs.update(scale)
            why = why or swhy
        return ops, attrs, why
    if template.startswith("dual_gemm"):
        g, u = m.bindings.get("gate"), m.bindings.get("up")
        if g is None or u is None or g.op not in aten.GEMM_OPERANDS or u.op != g.op:
            return {}, {}, "the gate and up products are not GEMMs of one form"
        ia, ib = aten.GEMM_OPERANDS[g.op]
        x, wg, wu = g.args[ia], g.args[ib], u.args[ib]
        if u.args[ia] is not x or any(getattr(w, "op", None) != "parameter" for w in (wg, wu)):
            return {}, {}, "the gate and up weights are not parameters read by the same input"
        if g.op == "aten.linear" and (len(g.args) > 2 and g.args[2] is not None):
            return {}, {}, "a gate or up projection with a bias"
        if len(wg.shape or ()) != 2 or wg.shape != wu.shape:
            return {}, {}, "gate and up weights of different shapes"
        return ({"a": _name(x), "w_gate": _name(wg), "w_up": _name(wu)},
                {"b_layout": "nk" if g.op == "aten.linear" else "kn"}, "")
    if template.startswith("fmha"):
        sdpa = next((n for n in comp if n.op == "aten.scaled_dot_product_attention"), None)
        if sdpa is not None:
            q, k, v = sdpa.args[0], sdpa.args[1], sdpa.args[2]
            attrs = {"causal": bool(sdpa.arg("is_causal", False)), "scale": sdpa.arg("scale"),
                     "gqa": bool(sdpa.arg("enable_gqa", False))}
            why = "" if sdpa.arg("attn_mask") is None and not sdpa.arg("dropout_p", 0.0) else "an attention mask or dropout"
            return {"q": _name(q), "k": _name(k), "v": _name(v)}, attrs, why
        q, kt, v = m.captures.get("q"), m.captures.get("kt"), m.captures.get("v")
        scaled = m.bindings.get("scaled")
        if q is None or kt is None or v is None or scaled is None:
            return {}, {}, "the pattern did not capture q, k and v"
        c = scaled.args[1] if len(scaled.args) > 1 else None
        if not isinstance(c, (int, float)) or c == 0:
            return {}, {}, "the score scale is not a constant"
        scale = float(c) if scaled.op == "aten.mul" else 1.0 / float(c)
        causal = "causal_mask" in (m.rule.realize.get("epilogue") or [])
        return {"q": _name(q), "kt": _name(kt), "v": _name(v)}, {"causal": causal, "scale": scale, "gqa": False}, ""
    if template in ("layernorm", "rmsnorm"):
        out = m.output
        ops, attrs = {}, {}
        # `normalized`: how many trailing dimensions the norm is over (one norm over their
        # product); `dim`: the one dimension a hand-written norm reduces, as a negative index.
        if out.op == "aten.layer_norm":
            ops = {"x": _name(out.args[0]), "weight": _name(out.arg("weight")), "bias": _name(out.arg("bias"))}
            attrs = {"eps": out.arg("eps", 1e-5), "normalized": len(out.arg("normalized_shape") or [0])}
        elif out.op == "aten.rms_norm":
            ops = {"x": _name(out.args[0]), "weight": _name(out.arg("weight"))}
            attrs = {"eps": out.arg("eps"), "normalized": len(out.arg("normalized_shape") or [0])}
        else:
            x, w = m.captures.get("x"), m.captures.get("weight")
            eps_node, ms = m.bindings.get("eps"), m.bindings.get("ms")
            ops = {"x": _name(x), "weight": _name(w)}
            dims = list(ms.arg("dim") or []) if ms is not None else [-1]
            attrs = {"eps": eps_node.args[1] if eps_node is not None and len(eps_node.args) > 1 else None,
                     "dim": dims[0] if len(dims) == 1 else dims}
        return {k: v for k, v in ops.items() if v}, attrs, ""
    if template == "add_norm":  # residual add + norm (rules/norm/add-layernorm.yaml)
        out, add = m.output, m.bindings.get("add")
        x, res = m.captures.get("x"), m.captures.get("res")
        if add is None or x is None or res is None or out.op != "aten.layer_norm":
            return {}, {}, "the pattern did not capture the add's operands and the norm"
        ops = {"x": _name(x), "res": _name(res), "weight": _name(out.arg("weight")), "bias": _name(out.arg("bias"))}
        inside = {id(n) for n in m.nodes}
        # The sum is a second output when something outside the region reads it (the next residual).
        sum_used = any(id(u) not in inside for u in add.users)
        attrs = {"eps": out.arg("eps", 1e-5), "kind": "layernorm", "sum": add.name if sum_used else ""}
        return {k: v for k, v in ops.items() if v}, attrs, ""
    return {}, {}, f"template {template}: no composition yet"


def _skip_fraction(m) -> float:
    if "causal_mask" not in (m.rule.realize.get("epilogue") or []):
        return 0.0
    for n in m.compute_nodes:
        if n.op == "aten.scaled_dot_product_attention":
            return 0.5 if n.arg("is_causal") else 0.0
    return 0.5


def analyse(graph: Graph, rules: RuleSet, *, arch: str = "sm90", gpu: str | None = None, policy: str = "fp32",
            trace_s: float = 0.0) -> Report:
    """Match `rules` on a traced graph and build the report."""
    if policy not in POLICIES:
        raise ValueError(f"unknown precision policy `{policy}`; use one of {', '.join(POLICIES)}")
    dev = device(gpu, arch)
    t0 = time.perf_counter()
    matches, misses = match_all(rules, graph, arch)
    chosen, beaten = select(matches)
    match_s = time.perf_counter() - t0
    total = roofline.graph_eager_time(graph, dev, policy)
    regions = []
    for m in sorted(chosen, key=lambda m: graph.nodes.index(m.output)):
        est = roofline.estimate(m, dev, policy, _skip_fraction(m))
        prob, shape, layouts = _problem_dims(m)
        lost = sorted({b.rule.id for b in matches if beaten.get(id(b)) is m})
        tmpl = m.rule.realize.get("template", "")
        operands, attrs, why = _operands(m, tmpl)
        inner = next((n.name for n in m.nodes if "." in n.name), None)  # walked into a higher-order op
        if inner and not why:
            why = (f"inside the body of a higher-order op (node `{inner.rsplit('.', 1)[0]}`) that torch.export "
                   "wrapped around code under autocast or no_grad; composition does not rewrite inside it, so "
                   "eager runs it")
        epilogue = list(m.rule.realize.get("epilogue") or [])
        if isinstance(m, GroupMatch):  # a bias epilogue only where a member has a bias (zeros for the others)
            epilogue = ["bias"] if any(x["bias"] for x in attrs.get("members", [])) else ["none"]
        regions.append(Region(
            m.rule.id, m.rule.title, tmpl, m.pattern.label,
            [n.name for n in m.nodes], m.output.name, prob, shape,
            sorted({n.dtype for n in m.compute_nodes if n.dtype and n.dtype != "bool"}), layouts, est,
            est.eager_s / total if total else 0.0, "miss", m.output.source, m.assumptions, lost,
            epilogue, operands, attrs, why))
    uncovered, rest = _uncovered(graph, rules, regions, dev, policy, total)
    return Report(graph.name, arch, dev.name, policy, regions, misses, uncovered, total, trace_s, match_s,
                  graph.partial, graph.note, len(graph.calls()), graph=graph, rest=rest)


def _uncovered(graph: Graph, rules: RuleSet, regions: list, dev, policy: str, total: float) -> tuple[list, dict]:
    """(Uncovered entries, the rest) of the ops no region covers: every heavy op, and any
    other op whose estimate is at least SHARE_FLOOR of `total` and at least two launches,
    largest share first; then the calls discovery could not look inside. The rest sums what
    is left."""
    covered = {n for r in regions for n in r.nodes}
    all_dtypes = {d for r in rules for p in r.patterns for d in p.dtypes}
    named = {op for r in rules for p in r.patterns for pn in p.nodes.values() for op, _ in pn.ops}
    out, rest = [], {"ops": 0, "share": 0.0, "est_s": 0.0}
    for n in graph.calls():
        if n.name in covered:
            continue
        t = roofline.node_time(n, dev, policy)
        share = t / total if total else 0.0
        if n.op not in HEAVY_OPS and (share < SHARE_FLOOR or t < 2 * dev.launch_s):
            if t > 0:
                rest["ops"] += 1
                rest["share"] += share
                rest["est_s"] += t
            continue
        out.append(Uncovered(n.name, n.op, _why_uncovered(n, all_dtypes, named), share, t, n.source))
    out.sort(key=lambda u: -u.share)
    out.extend(Uncovered(name, op, why) for name, op, why in getattr(graph, "opaque", None) or [])
    return out, rest


def _why_uncovered(n, all_dtypes: set, named: set) -> str:
    """Why no region covers node `n`, in one sentence."""
    dtype = roofline.node_dtype(n)
    if n.op == "aten.einsum":
        low, why = aten.einsum_lowering(n)
        if low is None:
            return f"not one GEMM: {why}; it stays in eager PyTorch"
    if dtype not in all_dtypes:
        return (f"dtype {dtype} is not covered by any rule (rules cover {', '.join(sorted(all_dtypes))}); "
                "it stays in eager PyTorch")
    if n.op not in named:
        kind = ("convolutions have" if n.op in roofline.CONV_OPS | roofline.CONV_TRANSPOSE_OPS else
                "recurrent layers have" if n.op in roofline.RECURRENT_OPS else "")
        if kind:
            return f"no rule matches {n.op}: {kind} no kernel family yet; eager PyTorch (cuDNN) runs it"
        return f"no rule matches {n.op}; it stays in eager PyTorch"
    return "no rule matched it; run with --explain to see each rule's reason"


def discover_problem(spec: str, *, arch: str = "sm90", gpu: str | None = None, policy: str = "fp32",
                     rules: RuleSet | None = None, eval_mode: bool = False) -> Report:
    """Discover on a KernelBench-format file or an import spec (see trace.load_problem; in eval
    mode with `eval_mode`)."""
    rules = rules or load_rules()
    t0 = time.perf_counter()
    graph = trace_problem(load_problem(spec, eval_mode=eval_mode))
    return analyse(graph, rules, arch=arch, gpu=gpu, policy=policy, trace_s=time.perf_counter() - t0)


def discover(module, example_inputs, *, arch: str = "sm90", gpu: str | None = None, policy: str = "fp32",
             rules: RuleSet | None = None) -> Report:
    """Discover on a module you already have. Inputs may be real, fake or meta tensors;
    the model is traced on fake tensors and never run at full size.
    """
    rules = rules or load_rules()
    t0 = time.perf_counter()
    graph = trace_module(module, example_inputs, name=type(module).__name__)
    return analyse(graph, rules, arch=arch, gpu=gpu, policy=policy, trace_s=time.perf_counter() - t0)
