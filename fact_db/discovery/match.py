"""Match: find where a rule's patterns occur in a traced graph.

A successful match is a `Match` (rule, graph nodes of the region, bindings); a failed
one is a falsy `NoMatch` that carries its reason, so `factdb discover --explain` can say
why a rule did not apply (after torch.fx's and Inductor's `FailedMatch`). Overlapping
matches resolve to the larger fusion.

>>> found, nearest = match_rule(rules.get("gemm-bias"), graph)
>>> regions = select(all_matches)      # non-overlapping, larger fusions first
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from fact_db.discovery import aten, conv
from fact_db.core.errors import ExprError
from fact_db.discovery.pattern import Capture, Const, Pattern, Ref, Wildcard
from fact_db.discovery.trace import Graph, Node


@dataclass(eq=False)
class Match:
    rule: object
    pattern: Pattern
    output: Node
    nodes: list  # every graph node in the region, graph order
    bindings: dict  # pattern node name -> Node
    captures: dict  # capture name -> Node or constant
    assumptions: list = field(default_factory=list)

    def __bool__(self):
        return True

    @property
    def compute_nodes(self) -> list:
        return [n for n in self.nodes if not aten.is_transparent(n)]

    @property
    def outputs(self) -> list:
        """The values the region produces (one, except for a sibling group)."""
        return [self.output]

    @property
    def inputs(self) -> list:
        """External tensors the region reads (captures and inputs of region nodes from outside)."""
        inside = {id(n) for n in self.nodes}
        seen, out = set(), []
        for n in self.nodes:
            for a in n.tensor_inputs():
                if id(a) not in inside and id(a) not in seen:
                    seen.add(id(a))
                    out.append(a)
        return out


@dataclass(eq=False)
class GroupMatch(Match):
    """Several matches of one sibling pattern (`match.siblings`) that read the same value:
    one region with one output per member. `output` is the last member's, `nodes` all
    members' nodes in graph order, `captures` the shared ones."""

    members: list = field(default_factory=list)  # Match, in graph order

    @property
    def outputs(self) -> list:
        return [m.output for m in self.members]


def _group(rule, members: list, order: dict) -> GroupMatch:
    members = sorted(members, key=lambda m: order.get(id(m.output), 0))
    nodes = sorted({id(n): n for m in members for n in m.nodes}.values(), key=lambda n: order.get(id(n), 0))
    p = members[0].pattern
    shared = {k: members[0].captures[k] for k in p.siblings.share if k in members[0].captures}
    forms = sorted({m.pattern.label for m in members if m.pattern.label})
    p = replace(p, label=f"{len(members)} siblings" + (f" ({', '.join(forms)})" if forms else ""))
    return GroupMatch(rule, p, members[-1].output, nodes, {}, shared,
                      [a for m in members for a in m.assumptions], members)


@dataclass
class NoMatch:
    """Why a rule did not match; `node` is the nearest candidate region's root, if any."""

    reason: str
    node: Node | None = None
    depth: int = -1

    def __bool__(self):
        return False

    def __str__(self):
        return self.reason


class _Tracker:
    """Keeps the deepest failure seen, which is the most useful one to explain."""

    def __init__(self):
        self.best = NoMatch("no node has the pattern's output op")

    def fail(self, depth: int, msg: str, root: Node | None):
        if depth >= self.best.depth:
            self.best = NoMatch(msg, root, depth)


@dataclass(frozen=True)
class _State:
    bound: tuple = ()  # ((pattern name, Node), ...)
    caps: tuple = ()  # ((capture name, value), ...)
    through: tuple = ()  # looked-through view/dropout nodes

    def get(self, name):
        for k, v in self.bound:
            if k == name:
                return v
        return None

    def cap(self, name):
        for k, v in self.caps:
            if k == name:
                return True, v
        return False, None


def _op_ok(pn, g: Node) -> bool:
    return any(g.op == p and (o is None or g.overload == o) for p, o in pn.ops)


def _same(a, b) -> bool:
    """Same value: the same node, or the same view op applied to the same value twice
    (x.view(-1, D) written in two places)."""
    if isinstance(a, Node) and isinstance(b, Node):
        if a is b:
            return True
        return (a.op in aten.VIEW_OPS and a.op == b.op and a.overload == b.overload and len(a.args) == len(b.args)
                and all(_same(x, y) for x, y in zip(a.args, b.args)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Node) or isinstance(b, Node):
        return False
    return a == b


class _Matcher:
    def __init__(self, pattern: Pattern, root: Node, tracker: _Tracker):
        self.p, self.root, self.t = pattern, root, tracker

    def fail(self, st: _State, msg: str):
        self.t.fail(len(st.bound), msg, self.root)

    def node(self, pname: str, g: Node, st: _State):
        pn = self.p.nodes[pname]
        prev = st.get(pname)
        if prev is not None:
            if prev is g:
                yield st
            else:
                self.fail(st, f"pattern node `{pname}` would be both `{prev.name}` and `{g.name}`")
            return
        if pn.repeat:
            yield from self.chain(pname, pn, g, st, 0)
            return
        if not _op_ok(pn, g):
            self.fail(st, f"`{g.name}` is {g.op}, not {pn.op_text()} (pattern node `{pname}`)")
            return
        if any(v is g for _, v in st.bound):
            self.fail(st, f"`{g.name}` is already matched by another pattern node")
            return
        if pn.dtypes and g.dtype not in pn.dtypes:
            self.fail(st, f"`{g.name}` ({g.op}) has dtype {g.dtype}, not one of {list(pn.dtypes)}")
            return
        if pn.ranks and (g.shape is None or len(g.shape) not in pn.ranks):
            self.fail(st, f"`{g.name}` ({g.op}) has rank {len(g.shape or ())}, not {list(pn.ranks)}")
            return
        for name, c in pn.args:
            if name not in g.arg_names:
                self.fail(st, f"`{g.name}` ({g.op}) has no argument `{name}`")
                return
            v = g.arg(name)
            if not c.accepts(v):
                self.fail(st, f"`{g.name}` ({g.op}) has {name}={v!r}, the rule needs {c}")
                return
        st = _State(st.bound + ((pname, g),), st.caps, st.through)
        orders = [list(range(len(pn.inputs)))]
        if g.op in aten.COMMUTATIVE_OPS and len(pn.inputs) >= 2:
            orders.append([1, 0] + list(range(2, len(pn.inputs))))
        for order in orders:
            yield from self.inputs(pn, g, st, order, 0)

    def chain(self, pname: str, pn, g: Node, st: _State, count: int):
        """A repeated node: `g` is its element number `count` from the output end (bound as
        `pname`, then `pname/1`, `pname/2`, ...); the element it reads is another one (longer
        chains first) or, after at least `min`, the node's input. Each element keeps its
        input's shape: an element-wise op, never a broadcast that grows it."""
        lo, hi = pn.repeat
        if not _op_ok(pn, g):
            self.fail(st, f"`{g.name}` is {g.op}, not one of the chain's ops (pattern node `{pname}`)")
            return
        if any(v is g for _, v in st.bound):
            self.fail(st, f"`{g.name}` is already matched by another pattern node")
            return
        if pn.dtypes and g.dtype not in pn.dtypes:
            self.fail(st, f"`{g.name}` ({g.op}) has dtype {g.dtype}, not one of {list(pn.dtypes)}")
            return
        st = _State(st.bound + ((pname if count == 0 else f"{pname}/{count}", g),), st.caps, st.through)
        spec = pn.inputs[0]
        positions = [0, 1] if g.op in aten.COMMUTATIVE_OPS else [0]
        for pos in positions:
            actual = g.args[pos] if pos < len(g.args) else None
            if not isinstance(actual, Node):
                continue
            walk = [actual]
            while aten.passes_through(walk[-1]):
                walk.append(walk[-1].args[0])
            for k, cand in enumerate(walk):
                if cand.shape != g.shape:
                    self.fail(st, f"`{g.name}` ({g.op}) changes the shape {list(cand.shape or ())} of `{cand.name}` to "
                                  f"{list(g.shape or ())}: not an element-wise step")
                    continue
                st2 = _State(st.bound, st.caps, st.through + tuple(walk[:k]))
                if count + 1 < hi and _op_ok(pn, cand):
                    yield from self.chain(pname, pn, cand, st2, count + 1)
                if count + 1 >= lo:
                    if isinstance(spec, Ref):
                        yield from self.node(spec.node, cand, st2)
                    else:
                        have, v = st2.cap(spec.name)
                        if not have or _same(v, cand):
                            yield _State(st2.bound, st2.caps + (() if have else ((spec.name, cand),)), st2.through)

    def inputs(self, pn, g: Node, st: _State, order, i: int):
        if i == len(pn.inputs):
            yield st
            return
        spec = pn.inputs[i]
        pos = order[i]
        if pos >= len(g.args):
            self.fail(st, f"`{g.name}` ({g.op}) has only {len(g.args)} operands, the pattern needs {len(pn.inputs)}")
            return
        actual = g.args[pos]
        argname = g.arg_names[pos] if pos < len(g.arg_names) else f"#{pos}"
        if isinstance(spec, Wildcard):
            yield from self.inputs(pn, g, st, order, i + 1)
        elif isinstance(spec, Const):
            if isinstance(actual, Node):
                self.fail(st, f"`{g.name}` ({g.op}) operand `{argname}` is the tensor `{actual.name}`, the rule needs the constant {spec}")
            elif spec.accepts(actual):
                yield from self.inputs(pn, g, st, order, i + 1)
            else:
                self.fail(st, f"`{g.name}` ({g.op}) operand `{argname}` is {actual!r}, the rule needs {spec}")
        elif isinstance(spec, Capture):
            if not isinstance(actual, Node):
                self.fail(st, f"`{g.name}` ({g.op}) operand `{argname}` is {actual!r}, the rule needs a tensor (${spec.name})")
                return
            have, v = st.cap(spec.name)
            if have:
                if _same(v, actual):
                    yield from self.inputs(pn, g, st, order, i + 1)
                else:
                    self.fail(st, f"${spec.name} would be both `{getattr(v, 'name', v)}` and `{actual.name}`")
                return
            st2 = _State(st.bound, st.caps + ((spec.name, actual),), st.through)
            yield from self.inputs(pn, g, st2, order, i + 1)
        elif isinstance(spec, Ref):
            if not isinstance(actual, Node):
                self.fail(st, f"`{g.name}` ({g.op}) operand `{argname}` is {actual!r}, the rule needs the result of `{spec.node}`")
                return
            chain = [actual]
            while aten.passes_through(chain[-1]):
                chain.append(chain[-1].args[0])
            for k, cand in enumerate(chain):
                st2 = _State(st.bound, st.caps, st.through + tuple(chain[:k]))
                for st3 in self.node(spec.node, cand, st2):
                    yield from self.inputs(pn, g, st3, order, i + 1)


class TensorView:
    """What a `where` expression may read about a bound value."""

    def __init__(self, v):
        self._v = v

    @property
    def shape(self):
        return tuple(self._v.shape) if isinstance(self._v, Node) and self._v.shape is not None else ()

    @property
    def stride(self):
        return tuple(self._v.stride or ()) if isinstance(self._v, Node) else ()

    @property
    def rank(self):
        return len(self.shape)

    @property
    def dtype(self):
        return self._v.dtype if isinstance(self._v, Node) else type(self._v).__name__

    @property
    def numel(self):
        return self._v.numel if isinstance(self._v, Node) else 1

    @property
    def kind(self):
        return self._v.op if isinstance(self._v, Node) else "constant"

    @property
    def contiguous(self):
        return aten.layout(self._v) == "row" if isinstance(self._v, Node) else True

    @property
    def args(self):
        return dict(zip(self._v.arg_names, self._v.args)) if isinstance(self._v, Node) else {}

    @property
    def value_known(self):
        return _source_value(self._v) is not None


def _strip_views(v) -> tuple:
    """(the node a chain of views starts from, the views from `v` back to it)."""
    chain = []
    while isinstance(v, Node) and v.value is None and aten.is_transparent(v) and v.args and isinstance(v.args[0], Node):
        chain.append(v)
        v = v.args[0]
    return v, chain


def _source_value(v):
    """The known contents of `v`: a buffer's value with the chain of views between it and
    `v` (slices, reshapes) replayed on it, or None when not known at trace time."""
    v, chain = _strip_views(v)
    if not isinstance(v, Node) or v.value is None:
        return None
    import torch
    val = v.value
    for n in reversed(chain):
        op = getattr(getattr(torch.ops.aten, n.op.split(".", 1)[1]), n.overload or "default")
        val = op(val, *n.args[1:])
    return val


def _env(rule, p: Pattern, bound: dict, caps: dict) -> dict:
    """What a `where` or `siblings.same` expression may read: the bound nodes and captures
    (as TensorViews; a capture of another alternative is None) and the first GEMM's M, N, K, batch."""
    env = {}
    for name, n in bound.items():
        if "/" not in name:
            env[name] = TensorView(n)
    for q in getattr(rule, "patterns", [p]):
        for name in q.captures() | set(q.nodes):
            if "/" not in name and name not in bound:
                env[name] = None  # a capture or node of another alternative: absent here
    for name, v in caps.items():
        if "/" not in name:
            env[name] = TensorView(v)
    for n in bound.values():
        dims = aten.gemm_problem(n)
        if dims:
            env.update({k: v for k, v in dims.items() if k in ("M", "N", "K", "batch")})
            break
    for n in bound.values():
        geo = conv.geometry(n)
        if geo is not None:
            env.update(conv.where_names(geo))
            break
    return env


def _post_checks(p: Pattern, st: _State, root: Node, rule) -> tuple:
    """(region nodes, assumptions) or a failure message."""
    bound = dict(st.bound)
    region = list(bound.values()) + list(st.through)
    ids = {id(n) for n in region}
    if p.dtypes:
        for name, n in bound.items():
            if n.dtype not in p.dtypes and not p.nodes[name].dtypes:
                return None, f"`{n.name}` ({n.op}) has dtype {n.dtype}; rule `{rule.id}` covers {list(p.dtypes)}"
    exposed = {id(bound[name]) for name in p.exposes if name in bound}
    for n in region:
        if n is root or id(n) in exposed:
            continue
        outside = [u for u in n.users if id(u) not in ids]
        if outside:
            return None, (f"`{n.name}` ({n.op}) is also used by `{outside[0].name}` outside the region, "
                          f"so it cannot stay inside a fused kernel")
    assumptions = []
    if p.where:
        env = _env(rule, p, bound, dict(st.caps))

        def is_tril(view):
            """True when the mask is lower-triangular ones: checked on its values where they are
            known, recognised as tril(ones) where it is computed in forward, assumed (and said so)
            only for a buffer whose values were built on meta."""
            import torch
            val = _source_value(view._v)
            if val is not None:
                if val.dim() < 2:
                    return False
                m = (val != 0).reshape(-1, *val.shape[-2:])
                return bool(torch.equal(m, torch.tril(torch.ones_like(m[0])).expand_as(m)))
            root, _ = _strip_views(view._v)
            if isinstance(root, Node) and root.op == "aten.tril":
                src = root.args[0]
                return isinstance(src, Node) and src.op in ("aten.ones", "aten.ones_like") and not root.args[1]
            if isinstance(root, Node) and root.op in ("buffer", "constant", "parameter"):
                assumptions.append(f"mask `{root.fqn or root.name}` has no known values at trace time "
                                   "(built on meta); assumed lower-triangular, checked when the kernel is verified")
                return True
            return False
        env["is_tril"] = is_tril
        reasons = []

        def is_gemm(view):
            """True when the node is one GEMM or batched GEMM (an einsum that lowers to one
            included); else False, and the reason goes into the failure message."""
            n = view._v if isinstance(view, TensorView) else None
            if not isinstance(n, Node):
                reasons.append("not a graph node")
                return False
            if aten.gemm_problem(n) is not None:
                return True
            why = aten.einsum_lowering(n)[1] if n.op == "aten.einsum" else f"{n.op} is not a GEMM"
            reasons.append(why)
            return False
        env["is_gemm"] = is_gemm
        for w in p.where:
            try:
                ok = w.evaluate(env)
            except ExprError as e:
                return None, f"constraint `{w.source}` could not be checked: {e}"
            except (TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as e:
                return None, f"constraint `{w.source}` could not be checked: {type(e).__name__}: {e}"
            if not ok:
                shown = {k: v for k, v in env.items() if k in w.names and isinstance(v, (int, float))}
                vals = ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
                return None, f"`{w.source}` is false" + (f" ({vals})" if vals else "") + \
                    (f": {'; '.join(reasons)}" if reasons else "")
    order = {id(n): i for i, n in enumerate(_graph_order(root))}
    return (sorted(set(region), key=lambda n: order.get(id(n), 0)), assumptions), None


def _graph_order(root: Node) -> list:
    out, seen, stack = [], set(), [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(n.tensor_inputs())
    return list(reversed(out))


def match_pattern(rule, p: Pattern, g: Node, tracker: _Tracker | None = None) -> Match | NoMatch:
    """The first match of pattern `p` with its output at graph node `g`."""
    t = tracker or _Tracker()
    m = _Matcher(p, g, t)
    for st in m.node(p.output, g, _State()):
        res, err = _post_checks(p, st, g, rule)
        if err:
            t.fail(len(st.bound) + 1, err, g)
            continue
        region, assumptions = res
        return Match(rule, p, g, region, dict(st.bound), dict(st.caps), assumptions)
    return t.best if tracker is None else NoMatch(t.best.reason, g, t.best.depth)


def match_rule(rule, graph: Graph, arch: str | None = None) -> tuple:
    """(matches, nearest NoMatch or None) of one rule over a whole graph, one match per output node."""
    if arch and not arch_ok(rule, arch):
        return [], NoMatch(f"rule `{rule.id}` targets {', '.join(rule.arch)}, not {arch}")
    if rule.status == "deprecated":
        return [], NoMatch(f"rule `{rule.id}` is deprecated")
    t = _Tracker()
    found = []
    for g in graph.calls():
        for p in rule.patterns:
            if not _op_ok(p.nodes[p.output], g):
                continue
            res = match_pattern(rule, p, g, t)
            if res:
                found.append(res)
                break
    nearest = None if found else t.best
    if found and rule.patterns[0].siblings is not None:
        found, nearest = _sibling_groups(rule, found, graph, t.best)
    if nearest is not None and nearest.node is None:
        want = sorted({pn.op_text() for p in rule.patterns for pn in [p.nodes[p.output]]})
        have = sorted({n.op for n in graph.calls() if not aten.is_transparent(n) and n.op.startswith("aten.")})
        shown = ", ".join(have[:8]) + (", ..." if len(have) > 8 else "")
        nearest = NoMatch(f"no {' or '.join(want)} in the graph (it has {shown or 'no ATen ops'})", None, -1)
    return found, nearest


def _value(v) -> str:
    return getattr(v, "name", None) or repr(v)


def _sibling_groups(rule, found: list, graph: Graph, missed: NoMatch) -> tuple:
    """(GroupMatch list, NoMatch or None) of a sibling rule: its single-output matches grouped
    by the values of the shared captures, each group split further by the `same` expressions;
    a group with fewer than `min` members is no match (`missed`: the nearest failure of a
    would-be member, quoted in the reason)."""
    sib = rule.patterns[0].siblings
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    # One member per computation: the plain GEMM inside a GEMM + add is the same projection.
    members, taken = [], set()
    for m in sorted(found, key=lambda m: -len(m.compute_nodes)):
        ids = {id(n) for n in m.compute_nodes}
        if not ids & taken:
            members.append(m)
            taken |= ids
    members.sort(key=lambda m: order.get(id(m.output), 0))
    clusters: list = []  # [(shared values, [Match])]
    for m in members:
        vals = [m.captures.get(name) for name in sib.share]
        for key, group in clusters:
            if all(_same(a, b) for a, b in zip(key, vals)):
                group.append(m)
                break
        else:
            clusters.append((vals, [m]))
    groups, why = [], []
    for key, cluster in clusters:
        shared = ", ".join(f"${n} = `{_value(v)}`" for n, v in zip(sib.share, key))
        parts: dict = {}
        for m in cluster:
            env = _env(rule, m.pattern, m.bindings, m.captures)
            try:
                vals = tuple(w.evaluate(env) for w in sib.same)
            except (ExprError, TypeError, ValueError, IndexError, AttributeError) as e:
                why.append((1, NoMatch(f"`siblings.same` could not be checked at `{m.output.name}`: {e}", m.output, 1)))
                continue
            parts.setdefault(vals, []).append(m)
        for vals, part in parts.items():
            if len(part) >= sib.min:
                groups.append(_group(rule, part, order))
        small = [part for part in parts.values() if len(part) < sib.min]
        if small and len(parts) > 1:
            a, b = list(parts)[:2]
            diff = next((w.source, x, y) for w, x, y in zip(sib.same, a, b) if x != y)
            names = ", ".join(f"`{p[0].output.name}`" for p in parts.values())
            why.append((len(cluster), NoMatch(f"{names} read {shared} but `{diff[0]}` differs ({diff[1]!r} and "
                                              f"{diff[2]!r})", cluster[0].output, len(cluster))))
        elif small:
            outs = ", ".join(f"`{m.output.name}`" for m in cluster)
            why.append((len(cluster), NoMatch(f"only {len(cluster)} match{'es' if len(cluster) > 1 else ''} ({outs}) "
                                              f"read{'s' if len(cluster) == 1 else ''} {shared}; rule `{rule.id}` "
                                              f"groups at least {sib.min}"
                                              + (f"; nearest other: {missed.reason}" if missed.node is not None else ""),
                                              cluster[0].output, len(cluster))))
    if groups:
        return groups, None
    return [], max(why, key=lambda x: x[0])[1] if why else NoMatch("no sibling group", None, -1)


def arch_ok(rule, arch: str) -> bool:
    arch = arch.rstrip("a")
    return any(a.rstrip("a") == arch for a in rule.arch)


def match_all(rules, graph: Graph, arch: str | None = None) -> tuple:
    """(all matches, {rule id: NoMatch} for rules that matched nowhere)."""
    matches, misses = [], {}
    for r in rules:
        found, nearest = match_rule(r, graph, arch)
        matches.extend(found)
        if not found:
            misses[r.id] = nearest
    return matches, misses


def _resolve_groups(matches: list) -> list:
    """Sibling groups without the members that a larger single-output fusion covers (a
    projection whose epilogue fuses, gate and up inside dual-gemm-swiglu): that fusion is
    worth more to the member than sharing its input's read. A group left with fewer than
    its `min` members is dropped."""
    singles = [m for m in matches if not isinstance(m, GroupMatch)]
    out = list(singles)
    for g in (m for m in matches if isinstance(m, GroupMatch)):
        keep = []
        for mem in g.members:
            mine = {id(n) for n in mem.compute_nodes}
            if not any({id(n) for n in s.compute_nodes} & mine and {id(n) for n in s.compute_nodes} - mine
                       for s in singles):
                keep.append(mem)
        if len(keep) == len(g.members):
            out.append(g)
        elif len(keep) >= g.pattern.siblings.min:
            out.append(_group(g.rule, keep, {id(n): i for i, n in enumerate(g.nodes)}))
    return out


def select(matches: list) -> tuple:
    """Resolve overlaps: larger fusions (more compute nodes) first, then rule priority.
    Sibling groups first lose the members a larger single-output fusion covers.

    Returns (chosen, {id(match): the chosen match that subsumed it}).
    """
    matches = _resolve_groups(matches)
    ranked = sorted(matches, key=lambda m: (-len(m.compute_nodes), -m.rule.priority, m.rule.id))
    taken: dict = {}
    chosen, beaten = [], {}
    for m in ranked:
        clash = next((taken[id(n)] for n in m.compute_nodes if id(n) in taken), None)
        if clash is not None:
            beaten[id(m)] = clash
            continue
        chosen.append(m)
        for n in m.nodes:
            taken.setdefault(id(n), m)
    return chosen, beaten
