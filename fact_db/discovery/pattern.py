"""Patterns: the DAG of ATen ops a rule matches, after its fragments are expanded.

A rule's `match` section is data (see rules.schema.json). This module turns it into
`Pattern` objects: flat DAGs of `PNode`s whose inputs are references to other pattern
nodes, captures (`$x`: any external value, the same name always the same value),
wildcards (`_`) or constants. Fragments (`rules/fragments/*.yaml`, used as
`{use: gelu-tanh, inputs: [gemm]}`) are inlined here, and a fragment with several
alternatives multiplies the rule's patterns, so the matcher only ever sees flat DAGs.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from fact_db.discovery import aten
from fact_db.discovery.expr import Expr


@dataclass(frozen=True)
class Ref:
    """Input produced by another pattern node (views and dropout(p=0) may sit between)."""
    node: str


@dataclass(frozen=True)
class Capture:
    """Input bound to whatever graph value is there; a name seen twice must be the same value."""
    name: str


@dataclass(frozen=True)
class Wildcard:
    pass


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class Const:
    """A constant argument: equal to `value` (floats within `rtol`), or one of `values`."""
    values: tuple
    rtol: float = 1e-6

    def accepts(self, v) -> bool:
        for want in self.values:
            if want == "any":  # {const: any}: any number, never a tensor
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return True
                continue
            if want is None or v is None:
                if want is None and v is None:
                    return True
                continue
            if isinstance(want, str) or isinstance(v, str):
                if str(want) == str(v):
                    return True
                continue
            if isinstance(v, bool) or isinstance(want, bool):
                if v is want:
                    return True
                continue
            if isinstance(v, (int, float)) and isinstance(want, (int, float)):
                if math.isinf(want) or math.isinf(v):
                    if want == v:
                        return True
                elif math.isclose(v, want, rel_tol=self.rtol, abs_tol=0.0) or v == want:
                    return True
            elif _plain(want) == _plain(v):
                return True
        return False

    def __str__(self):
        if self.values == ("any",):
            return "a number"
        return repr(self.values[0]) if len(self.values) == 1 else f"one of {list(self.values)}"


@dataclass(frozen=True)
class PNode:
    name: str
    ops: tuple  # of (packet, overload or None)
    inputs: tuple  # of Ref | Capture | Wildcard | Const, positional
    args: tuple = ()  # of (schema arg name, Const)
    dtypes: tuple = ()
    ranks: tuple = ()
    # (min, max) for a chain node: `min` to `max` ops of `ops` applied one after another, each
    # reading the one before (its first operand; either of add's and mul's), the first reading
    # the node's one input; other operands of each are free (scalars, per-channel tensors).
    repeat: tuple = ()

    def op_text(self) -> str:
        names = [p if o is None else f"{p}.{o}" for p, o in self.ops]
        return names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"


@dataclass(frozen=True)
class Siblings:
    """A multi-root pattern: every match of the pattern whose `share` captures are the same
    value, and whose `same` expressions evaluate equal, joins one region of at least `min`
    members (horizontal fusion: Q, K and V projections of one input as one GEMM)."""
    share: tuple  # capture names
    same: tuple = ()  # of Expr, evaluated per member
    min: int = 2


@dataclass(frozen=True)
class Pattern:
    nodes: dict  # name -> PNode, in declaration order
    output: str
    where: tuple = ()  # of Expr
    dtypes: tuple = ()
    label: str = ""  # which alternative, for messages ("gemm-bias[linear] + gelu-tanh[decomposed]")
    exposes: tuple = ()  # node names whose value may also be used outside the region (extra outputs)
    siblings: Siblings | None = None  # several matches reading one value, grouped into one region

    def captures(self) -> set:
        return {i.name for n in self.nodes.values() for i in n.inputs if isinstance(i, Capture)}


class PatternError(ValueError):
    """A structural fault in a match section; `where` is the field path it concerns."""

    def __init__(self, where: str, message: str, fix: str = ""):
        super().__init__(message)
        self.where, self.message, self.fix = where, message, fix


_NUMERIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def parse_input(spec, where: str):
    if isinstance(spec, dict):
        if "const" in spec:
            v = spec["const"]
            vals = tuple(v) if isinstance(v, list) else (v,)
            for x in vals:
                if isinstance(x, str) and _NUMERIC.match(x):
                    raise PatternError(where, f"constant {x!r} is a string, not a number (YAML 1.1 reads 1.0e9 as text)",
                                       f"write it with a signed exponent, e.g. {x.replace('e', 'e+') if 'e+' not in x and 'e-' not in x else x}, or as a plain decimal")
            return Const(vals, float(spec.get("rtol", 1e-6)))
        raise PatternError(where, f"input {spec!r} is not a constant", "write {const: VALUE} or {const: [V1, V2], rtol: 1e-4}")
    if isinstance(spec, bool) or spec is None or isinstance(spec, (int, float)):
        return Const((spec,))
    if spec == "_":
        return Wildcard()
    if isinstance(spec, str) and spec.startswith("$"):
        if not spec[1:].isidentifier():
            raise PatternError(where, f"capture `{spec}` is not a valid name", "use $ followed by letters, digits or _")
        return Capture(spec[1:])
    if isinstance(spec, str):
        return Ref(spec)
    raise PatternError(where, f"cannot read input {spec!r}", "use a node name, $capture, _ or {const: V}")


def _parse_node(name: str, spec: dict, where: str) -> PNode:
    ops = spec.get("op")
    ops = [ops] if isinstance(ops, str) else list(ops or [])
    resolved = []
    for i, op in enumerate(ops):
        try:
            resolved.append(aten.resolve(op))
        except KeyError as e:
            raise PatternError(f"{where}.op" + (f"[{i}]" if len(ops) > 1 else ""), str(e.args[0]),
                               "use an op from torch.ops.aten, as it appears in torch.export graphs") from None
    inputs = tuple(parse_input(s, f"{where}.inputs[{i}]") for i, s in enumerate(spec.get("inputs", [])))
    args = []
    for k, v in (spec.get("args") or {}).items():
        c = v if isinstance(v, dict) else {"const": v}
        args.append((k, parse_input(c, f"{where}.args.{k}")))
    dt = spec.get("dtype") or ()
    rk = spec.get("rank") or ()
    repeat = ()
    if "repeat" in spec:
        rp = spec["repeat"] or {}
        lo, hi = rp.get("min", 1), rp.get("max", 32)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= 64):
            raise PatternError(f"{where}.repeat", f"repeat min={lo!r} max={hi!r} is not 1 <= min <= max <= 64",
                               "write repeat: {min: 1, max: 32}")
        if len(inputs) != 1 or not isinstance(inputs[0], (Ref, Capture)):
            raise PatternError(f"{where}.inputs", f"a repeated node takes exactly one input (the node or capture the "
                               f"chain reads), got {len(inputs)}", "write inputs: [conv]")
        if args:
            raise PatternError(f"{where}.args", "a repeated node cannot constrain arguments (its ops differ)",
                               "constrain the chain in `where`, or write its ops as separate nodes")
        repeat = (lo, hi)
    return PNode(name, tuple(resolved), inputs, tuple(args),
                 tuple([dt] if isinstance(dt, str) else dt), tuple([rk] if isinstance(rk, int) else rk), repeat)


def _substitute(spec, mapping: dict, prefix: str):
    """Rename one input spec of a fragment node for inlining at a use site."""
    if isinstance(spec, Ref):
        return Ref(spec.node if spec.node == mapping.get("__output__") else f"{prefix}/{spec.node}")
    if isinstance(spec, Capture):
        if spec.name in mapping:
            return mapping[spec.name]
        return Capture(f"{prefix}_{spec.name}")
    return spec


@dataclass
class Fragment:
    name: str
    params: list
    body: dict  # the fragment file's pattern section: nodes + output, or either
    path: str = ""


def _alternatives(section: dict) -> list:
    if "either" in section:
        return [(alt.get("name", str(i)), alt.get("nodes") or {}, alt.get("output")) for i, alt in enumerate(section["either"])]
    return [("", section.get("nodes") or {}, section.get("output"))]


def expand(section: dict, fragments: dict, where: str = "match", _depth: int = 0) -> list:
    """Expand a match section (or a fragment body) into a list of (label, {name: PNode}, output).

    Raises PatternError naming the field at fault.
    """
    if _depth > 8:
        raise PatternError(where, "fragments nest more than 8 deep (a fragment uses itself?)", "remove the cycle")
    results = []
    for ai, (label, raw_nodes, output) in enumerate(_alternatives(section)):
        base = f"{where}.either[{ai}]" if "either" in section else where
        if not raw_nodes:
            raise PatternError(f"{base}.nodes", "a pattern needs at least one node", "add nodes: {name: {op: aten.mm, inputs: [$a, $b]}}")
        if output not in raw_nodes:
            raise PatternError(f"{base}.output", f"output `{output}` is not one of the nodes {sorted(raw_nodes)}", "name the node whose value is the region's result")
        # Each node expands into alternatives; combine them.
        per_node = []
        for name, spec in raw_nodes.items():
            nwhere = f"{base}.nodes.{name}"
            if not isinstance(spec, dict):
                raise PatternError(nwhere, f"node `{name}` must be a mapping", "write {op: aten.mm, inputs: [...]}")
            if "use" in spec:
                frag = fragments.get(spec["use"])
                if frag is None:
                    import difflib
                    guess = difflib.get_close_matches(spec["use"], list(fragments), n=1)
                    raise PatternError(f"{nwhere}.use", f"unknown fragment `{spec['use']}`" + (f"; did you mean `{guess[0]}`?" if guess else ""),
                                       f"use one of {sorted(fragments)} (rules/fragments/)")
                use_inputs = [parse_input(s, f"{nwhere}.inputs[{i}]") for i, s in enumerate(spec.get("inputs", []))]
                if len(use_inputs) != len(frag.params):
                    raise PatternError(f"{nwhere}.inputs", f"fragment `{frag.name}` takes {len(frag.params)} inputs ({', '.join(frag.params)}), got {len(use_inputs)}",
                                       "pass one input per fragment parameter")
                options = []
                for flabel, fnodes, fout in expand(frag.body, fragments, f"fragment {frag.name}", _depth + 1):
                    mapping = dict(zip(frag.params, use_inputs))
                    mapping["__output__"] = fout
                    renamed = {}
                    for iname, inode in fnodes.items():
                        new = name if iname == fout else f"{name}/{iname}"
                        renamed[new] = PNode(new, inode.ops, tuple(_substitute(s, mapping, name) for s in inode.inputs),
                                             inode.args, inode.dtypes or _tuple(spec.get("dtype")), inode.ranks,
                                             inode.repeat)
                    # References to the fragment output inside it point at the use-site name.
                    renamed = {k: PNode(v.name, v.ops, tuple(Ref(name) if isinstance(s, Ref) and s.node == fout else s for s in v.inputs), v.args, v.dtypes, v.ranks, v.repeat)
                               for k, v in renamed.items()}
                    options.append((f"{frag.name}[{flabel}]" if flabel else frag.name, renamed))
                per_node.append(options)
            else:
                if "op" not in spec:
                    raise PatternError(nwhere, f"node `{name}` has neither `op` nor `use`", "add op: aten.<name> or use: <fragment>")
                per_node.append([("", {name: _parse_node(name, spec, nwhere)})])
        for combo in itertools.product(*per_node):
            nodes = {}
            for _, part in combo:
                nodes.update(part)
            labels = [lab for lab, _ in combo if lab]
            lab = " + ".join(labels)
            if label:
                lab = f"{label}: {lab}" if lab else label
            _check_refs(nodes, output, base)
            results.append((lab, nodes, output))
    return results


def _tuple(v):
    if v is None:
        return ()
    return tuple([v] if isinstance(v, (str, int)) else v)


def _check_refs(nodes: dict, output: str, where: str):
    for n in nodes.values():
        for s in n.inputs:
            if isinstance(s, Ref) and s.node not in nodes:
                raise PatternError(f"{where}.nodes.{n.name.split('/')[0]}.inputs", f"input `{s.node}` is not a node of this pattern",
                                   f"use one of {sorted(k for k in nodes if '/' not in k)}, or `${s.node}` to capture an external value")
    reach, stack = set(), [output]
    while stack:
        cur = stack.pop()
        if cur in reach:
            continue
        reach.add(cur)
        stack.extend(s.node for s in nodes[cur].inputs if isinstance(s, Ref))
    dead = [k for k in nodes if k not in reach]
    if dead:
        raise PatternError(f"{where}.nodes.{dead[0].split('/')[0]}", f"node `{dead[0]}` does not feed the output `{output}`",
                           "connect it through inputs or remove it")
    # cycles: a DFS over refs
    state = {}

    def visit(k, path):
        if state.get(k) == 1:
            raise PatternError(f"{where}.nodes.{k}", f"nodes form a cycle: {' -> '.join(path + [k])}", "a pattern is a DAG")
        if state.get(k) == 2:
            return
        state[k] = 1
        for s in nodes[k].inputs:
            if isinstance(s, Ref):
                visit(s.node, path + [k])
        state[k] = 2
    visit(output, [])


# Names a `where` constraint may read besides the pattern's nodes and captures: the GEMM
# problem of the matched region, and a convolution's geometry (see match.py, discovery/conv.py).
PROBLEM_NAMES = frozenset({"M", "N", "K", "batch", "groups", "spatial", "channels_in", "channels_out",
                           "transposed"})


def build_patterns(match: dict, fragments: dict) -> list:
    """All flat Patterns of a rule's match section. Each `where` constraint is parsed and its
    names resolved against the nodes and captures of the patterns (a typo, or a look-alike
    letter, would otherwise validate and then silently never match)."""
    from fact_db.core.errors import ExprError
    from fact_db.discovery.expr import FUNCTIONS
    where = []
    for i, w in enumerate(match.get("where") or []):
        try:
            where.append(Expr.parse(w))
        except ExprError as e:
            raise PatternError(f"match.where[{i}]", str(e), "use pattern nodes, captures, M, N, K, batch and the functions listed (README: limits on `where` expressions)") from None
    dtypes = tuple(match.get("dtypes") or ())
    exposes = tuple(match.get("exposes") or ())
    alts = expand(match, fragments)
    for label, nodes, out in alts:
        for name in exposes:
            if name not in nodes:
                raise PatternError("match.exposes", f"exposed node `{name}` is not one of the nodes {sorted(nodes)}"
                                   + (f" of alternative `{label}`" if label else ""),
                                   "name a node every alternative declares")
    siblings = _siblings(match.get("siblings"), alts, exposes)
    patterns = [Pattern(nodes, out, tuple(where), dtypes, label, exposes, siblings) for label, nodes, out in alts]
    known = set(PROBLEM_NAMES) | set(FUNCTIONS)
    for p in patterns:
        known |= {k for k in p.nodes if "/" not in k} | {c for c in p.captures() if "/" not in c}
    for i, w in enumerate(siblings.same if siblings else ()):
        unknown = sorted(w.names - known)
        if unknown:
            raise PatternError(f"match.siblings.same[{i}]", f"`{unknown[0]}` in `{w.source}` is not a node, capture or "
                               "problem size of this rule", f"use one of {', '.join(sorted(known - set(FUNCTIONS)))}")
    for i, w in enumerate(where):
        unknown = sorted(w.names - known)
        if unknown:
            import difflib
            guess = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.6)
            raise PatternError(f"match.where[{i}]", f"`{unknown[0]}` in `{w.source}` is not a node, capture or "
                               f"problem size of this rule",
                               f"did you mean `{guess[0]}`?" if guess else
                               f"use one of {', '.join(sorted(known - set(FUNCTIONS)))}")
    return patterns


def _siblings(spec, alts: list, exposes: tuple) -> Siblings | None:
    """The parsed `siblings` section: every `share` name must be a capture of every
    alternative (it is what the members have in common)."""
    from fact_db.core.errors import ExprError
    if not spec:
        return None
    share = tuple(spec.get("share") or ())
    if not share:
        raise PatternError("match.siblings.share", "siblings share no capture", "name the capture every member reads, e.g. share: [x]")
    if exposes:
        raise PatternError("match.siblings", "a sibling pattern cannot also expose nodes", "remove `exposes` or `siblings`")
    for label, nodes, out in alts:
        caps = {i.name for n in nodes.values() for i in n.inputs if isinstance(i, Capture)}
        for name in share:
            if name not in caps:
                raise PatternError("match.siblings.share", f"`{name}` is not a capture of the pattern"
                                   + (f" (alternative `{label}`)" if label else ""),
                                   f"use one of {', '.join('$' + c for c in sorted(c for c in caps if '/' not in c))}")
    same = []
    for i, text in enumerate(spec.get("same") or ()):
        try:
            same.append(Expr.parse(text))
        except ExprError as e:
            raise PatternError(f"match.siblings.same[{i}]", str(e), "use pattern nodes, captures, M, N, K, batch") from None
    return Siblings(share, tuple(same), int(spec.get("min", 2)))
