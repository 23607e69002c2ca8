"""A small, safe expression language for rule constraints.

Rules are data and are never executed. A `where` constraint such as
`K >= 8 * max(M, N)` or `scores.shape[-1] == scores.shape[-2]` is parsed with Python's
`ast` module in "eval" mode, checked against a whitelist of node types, names and
functions, and then interpreted by walking the tree: there is no `eval`, no attribute
access beyond a fixed set of tensor properties, and no way to call arbitrary code.

>>> Expr.parse("K >= 8 * max(M, N)").evaluate({"M": 256, "N": 256, "K": 524288})
True
"""
from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass

from fact_db.core.errors import ExprError

# Limits on an expression (rules arrive by pull request: a constraint must not be able to
# hang or exhaust the machine that validates or matches it). Documented in the README,
# "Limits on untrusted input".
MAX_SOURCE = 1000         # characters
MAX_NODES = 200           # syntax-tree nodes
MAX_DEPTH = 24            # nesting of the syntax tree
MAX_INT_BITS = 64         # integer constants and every integer result
MAX_STR = 256             # string constants, and strings or tuples an operation builds
MAX_EXPONENT = 64         # `a ** b`: |b| at most this, and the result within MAX_INT_BITS

# Properties an expression may read off a bound tensor (see match.TensorView).
ATTRIBUTES = frozenset({"shape", "stride", "rank", "dtype", "numel", "kind", "contiguous", "value_known", "args"})


def _prod(xs):
    return math.prod(xs)


FUNCTIONS = {
    "min": min, "max": max, "abs": abs, "len": len, "prod": _prod, "all": all, "any": any,
    "is_tril": None,  # resolved by the caller's environment (needs tensor values)
    "is_gemm": None,  # resolved by the caller's environment (reads the node's GEMM form)
    "isclose": lambda a, b, rtol=1e-4: math.isclose(a, b, rel_tol=rtol),
}

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


@dataclass(frozen=True)
class Expr:
    """A parsed constraint. `names` lists the free names it reads."""

    source: str
    tree: ast.Expression
    names: frozenset

    @classmethod
    def parse(cls, source: str) -> "Expr":
        if not isinstance(source, str) or not source.strip():
            raise ExprError("an expression must be a non-empty string")
        if len(source) > MAX_SOURCE:
            raise ExprError(f"an expression of {len(source)} characters is longer than the limit of {MAX_SOURCE}: "
                            f"`{source[:40]}...`")
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as e:
            raise ExprError(f"syntax error at column {e.offset}: {e.msg} in `{_short(source)}`") from None
        except (RecursionError, MemoryError):
            raise ExprError(f"an expression nested deeper than Python's parser allows: `{_short(source)}`") from None
        _check_size(tree, source)
        names = set()
        for node in ast.walk(tree):
            _check_node(node, source)
            if isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        _fold_constants(tree.body, source)
        return cls(source.strip(), tree, frozenset(names))

    def evaluate(self, env: dict):
        return _eval(self.tree.body, env, self.source)


_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Load,
    ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.IfExp,
    ast.And, ast.Or, *_BINOPS, *_CMPOPS, *_UNARY,
)


def _short(source: str) -> str:
    return source if len(source) <= 60 else source[:57] + "..."


def _check_size(tree, source):
    """Node count and depth, walked without recursion (a chain of thousands of `not` or `+`
    must not end in a RecursionError here or in the evaluator)."""
    count, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ExprError(f"an expression of more than {MAX_NODES} parts is over the limit: `{_short(source)}`")
        if depth > MAX_DEPTH:
            raise ExprError(f"an expression nested more than {MAX_DEPTH} deep is over the limit: `{_short(source)}`")
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node))


def _bounded(value, source):
    """An intermediate result within the limits, or ExprError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExprError(f"an integer of {value.bit_length()} bits is beyond the {MAX_INT_BITS}-bit limit in "
                        f"`{_short(source)}`")
    if isinstance(value, (str, tuple, list)) and len(value) > MAX_STR:
        raise ExprError(f"a value of {len(value)} items is beyond the limit of {MAX_STR} in `{_short(source)}`")
    return value


def _binop(op, a, b, source):
    """`a op b` with its cost bounded before it is computed."""
    if op is ast.Pow:
        if isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b) > MAX_EXPONENT:
            raise ExprError(f"an exponent of {b} is beyond the limit of {MAX_EXPONENT} in `{_short(source)}`")
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and \
                b * math.log2(abs(a)) > MAX_INT_BITS:
            raise ExprError(f"`{a} ** {b}` is beyond the {MAX_INT_BITS}-bit limit in `{_short(source)}`")
    if op is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, tuple, list)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_STR:
                raise ExprError(f"repeating a value {n} times is beyond the limit of {MAX_STR} items in "
                                f"`{_short(source)}`")
    if op is ast.Add and isinstance(a, (str, tuple, list)) and isinstance(b, (str, tuple, list)) and \
            len(a) + len(b) > MAX_STR:
        raise ExprError(f"a value of {len(a) + len(b)} items is beyond the limit of {MAX_STR} in `{_short(source)}`")
    try:
        return _bounded(_BINOPS[op](a, b), source)
    except OverflowError:
        raise ExprError(f"a number overflows in `{_short(source)}`") from None


def _fold_constants(node, source):
    """Evaluate, under the limits, every operation whose operands are constants, so that
    `9**9**9` or `'a' * 10**11` is refused when the rule is validated, not when it matches."""
    if isinstance(node, (ast.BinOp, ast.UnaryOp)) and not any(isinstance(n, (ast.Name, ast.Call, ast.Attribute))
                                                                for n in ast.walk(node)):
        try:
            _eval(node, {}, source)
        except ExprError:
            raise
        except Exception as e:  # noqa: BLE001  (1 / 0 and the like: refused, with what)
            raise ExprError(f"a constant part of `{_short(source)}` fails: {type(e).__name__}: {e}") from None
        return
    for child in ast.iter_child_nodes(node):
        _fold_constants(child, source)


def _check_node(node, source):
    if not isinstance(node, _ALLOWED):
        raise ExprError(f"`{type(node).__name__}` is not allowed in a rule expression: `{source}`")
    if isinstance(node, ast.Attribute) and node.attr not in ATTRIBUTES:
        raise ExprError(f"attribute `.{node.attr}` is not allowed in `{source}`; use one of {sorted(ATTRIBUTES)}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            fn = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"function `{fn}` is not allowed in `{source}`; use one of {sorted(FUNCTIONS)}")
        if any(not isinstance(k.arg, str) for k in node.keywords):
            raise ExprError(f"`**` arguments are not allowed in `{source}`")
    if isinstance(node, (ast.Is, ast.IsNot)):
        pass  # only meaningful against None: `bias is None or bias.rank == 1`
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        raise ExprError(f"constant {node.value!r} is not allowed in `{_short(source)}`")
    if isinstance(node, ast.Constant):
        try:
            _bounded(node.value, source)
        except ExprError as e:
            raise ExprError(f"constant: {e}") from None


def _eval(node, env, source):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id in FUNCTIONS:
            return FUNCTIONS[node.id]
        raise ExprError(f"unknown name `{node.id}` in `{source}`; known: {', '.join(sorted(env))}")
    if isinstance(node, ast.BinOp):
        return _binop(type(node.op), _eval(node.left, env, source), _eval(node.right, env, source), source)
    if isinstance(node, ast.UnaryOp):
        return _bounded(_UNARY[type(node.op)](_eval(node.operand, env, source)), source)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env, source) for v in node.values)
        return any(_eval(v, env, source) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, source)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, source)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, source) else node.orelse, env, source)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env, source) for e in node.elts)
    if isinstance(node, ast.Attribute):
        return getattr(_eval(node.value, env, source), node.attr)
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, env, source)
        if isinstance(node.slice, ast.Slice):
            s = node.slice
            idx = slice(*(None if p is None else _eval(p, env, source) for p in (s.lower, s.upper, s.step)))
        else:
            idx = _eval(node.slice, env, source)
        return base[idx]
    if isinstance(node, ast.Call):
        fn = _eval(node.func, env, source)
        if fn is None:
            raise ExprError(f"function `{node.func.id}` is not available here")
        args = [_eval(a, env, source) for a in node.args]
        kwargs = {k.arg: _eval(k.value, env, source) for k in node.keywords}
        return _bounded(fn(*args, **kwargs), source)
    raise ExprError(f"cannot evaluate `{ast.unparse(node)}` in `{source}`")
