"""What the agent may ask the language model about: the questions a discovery report leaves
open, as data (`Ask`), and the region each one is about as a `RegionSpec` (its ATen ops,
evaluated in float64 for the reference), which is also how the registry keys the kernels
the agent's proposals became.

    >>> [a.why for a in asks(report, rules)]
    ['aten.cumsum is not covered by any rule', 'region gemm-bias is followed by aten.div, ...']
    >>> spec, why = region_spec(asks(report, rules)[0], report)

Asked for: heavy ops no region covers (discovery's `uncovered`, with the ops that consume
them), a matched GEMM region followed by elementwise ops no rule fuses, and matched regions
whose rule names a template that does not exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fact_db.core import paths

# Elementwise ops a GEMM epilogue could take (what follows a GEMM region and makes it worth asking).
POINTWISE = {"div", "mul", "add", "sub", "relu", "gelu", "silu", "sigmoid", "tanh", "erf", "clamp", "clamp_min",
             "clamp_max", "hardtanh", "leaky_relu", "mish", "softplus", "exp", "neg", "abs", "hardswish", "hardsigmoid"}


@dataclass
class Ask:
    """One question for the model: a region of the graph and why the rules do not cover it."""
    node: str
    why: str
    ops: list  # dicts: name, op, shape, dtype, source
    rule: str = ""  # for a matched region without a template


def _source_line(src: str | None) -> str:
    if not src or ":" not in src:
        return ""
    f, _, line = src.rpartition(":")
    try:
        return Path(f).read_text().splitlines()[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return ""


def asks(report, rules) -> list:
    """The questions discovery leaves open: uncovered heavy ops (with the ops that consume
    them, up to four deep), and matched regions whose template file does not exist."""
    graph = report.graph
    out = []
    if graph is not None:
        by_name = {n.name: n for n in graph.nodes}
        for u in report.uncovered:
            name, why = u.node, u.reason
            n = by_name.get(name)
            chain, cur = [], n
            while cur is not None and len(chain) < 5:
                chain.append(cur)
                calls = [u for u in cur.users if getattr(u, "is_call", False)]
                cur = calls[0] if len(calls) == 1 else None
            ops = [{"name": c.name, "op": c.op, "shape": list(c.shape or ()), "dtype": c.dtype, "source": c.source,
                    "line": _source_line(c.source)} for c in chain]
            out.append(Ask(name, why, ops))
        # A matched GEMM region whose output goes on through ops no region covers: the
        # neighbourhood a larger fusion could take (GEMM, then a division and a GELU).
        covered = {n for r in report.regions for n in r.nodes}
        asked = {a.node for a in out}
        for r in report.regions:
            n = by_name.get(r.output)
            if n is None or not r.template.startswith("gemm"):
                continue
            chain, cur = [], n
            while len(chain) < 4:
                calls = [u for u in cur.users if getattr(u, "is_call", False)]
                if len(calls) != 1 or calls[0].name in covered or calls[0].op.split(".")[1:2] not in ([w] for w in POINTWISE):
                    break
                cur = calls[0]
                chain.append(cur)
            if chain and r.output not in asked:
                ops = [{"name": c.name, "op": c.op, "shape": list(c.shape or ()), "dtype": c.dtype, "source": c.source,
                        "line": _source_line(c.source)} for c in [by_name[x] for x in r.nodes if x in by_name] + chain]
                out.append(Ask(r.output, f"region {r.rule} is followed by {', '.join(c.op for c in chain)}, "
                               "which no rule fuses into it", ops, r.rule))
    have = {p.name.split(".")[0] for p in paths.templates_dir().glob("*.j2")}
    for r in report.regions:
        if r.template and r.template not in have:
            out.append(Ask(r.output, f"rule {r.rule} names template {r.template}, which does not exist",
                           [{"name": r.output, "op": r.rule, "shape": r.shape, "dtype": r.dtypes, "source": r.source}], r.rule))
    return out


def region_spec(ask: Ask, report):
    """(RegionSpec of the ask's ops, "") or (None, why a kernel cannot be asked for it)."""
    from fact_db.kernels.region.spec import RegionKernelError, RegionSpec
    if report.graph is None:
        return None, "no traced graph"
    try:
        return RegionSpec.from_graph(report.graph, [o["name"] for o in ask.ops], report.policy), ""
    except RegionKernelError as e:
        return None, f"no kernel can be asked for this region: {e}"
