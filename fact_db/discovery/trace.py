"""Trace: a PyTorch model to an ATen-level graph whose every node carries shape, dtype, stride.

Tracing never runs the model at full size and never needs a GPU: the model is built
with large tensors on the meta device (small ones, such as a causal-mask buffer, are
built for real so their values can be checked, then moved to meta), inputs are made
on meta, and `torch.export` traces on fake tensors.

>>> g = trace_problem(load_problem("benchmarks/problems/mingpt_block.py"))
>>> [n.op for n in g.calls()][:2]
['aten.layer_norm', 'aten.linear']
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from fact_db.discovery import aten
from fact_db.core.errors import ProblemError, TraceError, first_line
from fact_db.core.paths import problem_file

# Tensors up to this many elements are built for real during construction so that buffer
# values (causal masks) can be inspected; larger ones go straight to meta, and so does any
# tensor that no longer fits in what is left of REAL_BUDGET bytes, so a large model costs
# bounded memory and time. Values lost this way are reported as assumptions.
REAL_LIMIT = 1 << 22
REAL_BUDGET = 64 << 20

_FACTORIES = {torch.ones, torch.zeros, torch.empty, torch.full, torch.rand, torch.randn, torch.randint,
              torch.arange, torch.eye, torch.linspace, torch.tril_indices, torch.triu_indices}


@dataclass(eq=False)
class Node:
    """One graph node: an op call or an input, with the properties discovery reads."""

    name: str
    op: str  # "aten.linear", "input", "parameter", "buffer", "constant", "python.getitem", "output"
    overload: str | None = None
    args: list = field(default_factory=list)  # full positional args in schema order: Node | constant
    arg_names: list = field(default_factory=list)
    shape: tuple | None = None
    dtype: str | None = None
    stride: tuple | None = None
    users: list = field(default_factory=list)
    source: str | None = None  # "file.py:12" of the user code that made it
    fqn: str | None = None  # for parameters and buffers: "attn.bias"
    value: torch.Tensor | None = None  # known contents (small buffers), else None
    # for an op inlined from a higher-order op's body whose value the wrapper returns: the
    # exported program's node that carries it out (the getitem), which composition can read
    outer: str | None = None

    def arg(self, name: str, default=None):
        return self.args[self.arg_names.index(name)] if name in self.arg_names else default

    @property
    def is_call(self) -> bool:
        return self.op.startswith("aten.") or self.op.startswith("python.")

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape or ():
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=getattr(torch, self.dtype)).element_size() if self.dtype else 0

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize if self.shape is not None else 0

    def tensor_inputs(self) -> list:
        seen, out = set(), []
        for a in _flatten(self.args):
            if isinstance(a, Node) and id(a) not in seen:
                seen.add(id(a))
                out.append(a)
        return out

    def __repr__(self):
        return f"Node({self.name}: {self.op} {list(self.shape) if self.shape is not None else ''} {self.dtype or ''})"


def _flatten(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x


@dataclass
class Graph:
    """A traced model: nodes in topological order."""

    nodes: list
    name: str = "model"
    partial: bool = False  # True when only part of the model could be traced
    note: str = ""
    # (node name, op, reason) of calls discovery could not look inside (higher-order ops
    # other than the autocast/grad-mode wrappers it inlines); discovery lists them as uncovered.
    opaque: list = field(default_factory=list)
    # The torch.export ExportedProgram the nodes were read from (node names are its FX node
    # names). Composition rewrites it; discovery itself never needs it.
    program: object = field(default=None, repr=False, compare=False)

    def calls(self) -> list:
        return [n for n in self.nodes if n.is_call]

    def __getitem__(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


@dataclass
class Problem:
    """Something to trace: how to build the model and its example inputs."""

    name: str
    make_model: object  # () -> nn.Module
    make_inputs: object  # () -> list of tensors
    source: str | None = None  # file the user wrote, for error messages


# ------------------------------------------------------------------ loading problems

def load_problem(spec: str, *, eval_mode: bool = False) -> Problem:
    """A KernelBench-format file (`Model`, `get_inputs`, `get_init_inputs`), or an import
    spec: `package.module` (a KernelBench-format module) or `package.module:factory`
    (a callable returning `(module, example_inputs)`). `eval_mode`: the model is built and
    then put in eval mode (inference: BatchNorm on its running statistics, so it folds into
    the convolution before it; dropout off), where a problem file builds it in training mode.
    """
    problem = _load_problem(spec)
    if eval_mode:
        build = problem.make_model
        problem = replace(problem, make_model=lambda: build().eval())
    return problem


def _load_problem(spec: str) -> Problem:
    text = str(spec)
    path = problem_file(text)
    if path is not None:
        mod = _import_file(path)
        return _kernelbench(mod, path.stem, str(path))
    modname, _, factory = text.partition(":")
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        raise ProblemError(f"cannot import `{modname}` from `{text}`: {e}; pass a .py path or an importable `package.module:factory`") from None
    except Exception as e:
        raise ProblemError(f"importing `{modname}` raised {type(e).__name__}: {first_line(e, None)}") from None
    if not factory:
        return _kernelbench(mod, modname, getattr(mod, "__file__", None))
    fn = getattr(mod, factory, None)
    if not callable(fn):
        raise ProblemError(f"`{modname}` has no callable `{factory}`; an import spec is `package.module:factory` where factory() returns (module, example_inputs)")
    made = {}

    def build():
        out = fn()
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
            raise ProblemError(f"`{text}` must return (nn.Module, example_inputs), got {type(out).__name__}")
        made["inputs"] = out[1]
        return out[0]

    def inputs():
        if "inputs" not in made:
            build()
        v = made["inputs"]
        return list(v) if isinstance(v, (list, tuple)) else [v]
    return Problem(text, build, inputs, getattr(mod, "__file__", None))


def _import_file(path: Path):
    name = f"_factdb_problem_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise ProblemError(f"`{path}` has a syntax error at line {e.lineno}: {e.msg}") from None
    except Exception as e:
        raise ProblemError(f"importing `{path}` raised {type(e).__name__}: {e}{_where(e, str(path))}") from e
    return mod


def _kernelbench(mod, name: str, source: str | None) -> Problem:
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        what = " and ".join(f"`{m}`" if m == "Model" else f"`{m}()`" for m in missing)
        raise ProblemError(f"`{source or name}` defines no {what}; a KernelBench problem defines `Model`, `get_inputs()` and `get_init_inputs()`")

    def build():
        return mod.Model(*mod.get_init_inputs())
    return Problem(name, build, lambda: list(mod.get_inputs()), source)


def _where(exc: BaseException, source: str | None) -> str:
    """' at file.py:12' for the innermost frame of the user's file in a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if source:
        mine = [f for f in frames if Path(f.filename).resolve() == Path(source).resolve()]
        if mine:
            f = mine[-1]
            return f" at {Path(f.filename).name}:{f.lineno} (`{(f.line or '').strip()}`)"
    return ""


# ------------------------------------------------------------------ tracing

class _SmallReal(TorchFunctionMode):
    """Factory calls without a device build small tensors for real and large ones on meta."""

    def __init__(self):
        super().__init__()
        self.left = REAL_BUDGET

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("device") is None:
            probe = func(*args, **{**kwargs, "device": "meta"})
            if not isinstance(probe, torch.Tensor):
                return probe
            size = probe.numel() * probe.element_size()
            if probe.numel() > REAL_LIMIT or size > self.left:
                return probe
            self.left -= size
            return func(*args, **{**kwargs, "device": "cpu"})
        return func(*args, **kwargs)


def _to_meta(model: torch.nn.Module) -> dict:
    """Move everything to meta; return the real values of buffers we could keep."""
    known = {}
    for name, buf in model.named_buffers():
        if buf is not None and buf.device.type != "meta":
            known[name] = buf.detach().clone()
    for mod_name, mod in model.named_modules():
        for attr, v in list(vars(mod).items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and v.device.type != "meta":
                if v.numel() <= REAL_LIMIT:
                    known[f"{mod_name}.{attr}" if mod_name else attr] = v.detach().clone()
                setattr(mod, attr, v.to("meta"))
    model.to("meta")
    return known


def build_on_meta(problem: Problem):
    """(model, inputs, known buffer values), nothing allocated at full size."""
    err = None
    for mode in ("small-real", "meta"):
        try:
            ctx = _SmallReal() if mode == "small-real" else torch.device("meta")
            with ctx:
                model = problem.make_model()
            break
        except ProblemError:
            raise
        except Exception as e:  # retried on plain meta; reported if that fails too
            err = e
    else:
        raise ProblemError(f"building the model raised {type(err).__name__}: {first_line(err, None)}{_where(err, problem.source)}") from err
    if not isinstance(model, torch.nn.Module):
        raise ProblemError(f"`{problem.name}` built a {type(model).__name__}, not an nn.Module")
    # left in the mode the file builds it in (training, for `Model()`), as optimize runs it
    known = _to_meta(model)
    try:
        with torch.device("meta"):
            inputs = problem.make_inputs()
    except ProblemError:
        raise
    except Exception as e:
        raise ProblemError(f"get_inputs() raised {type(e).__name__}: {first_line(e, None)}{_where(e, problem.source)}") from e
    inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs]
    return model, inputs, known


def trace_problem(problem: Problem) -> Graph:
    """The problem's model traced as it builds it; a model built in training mode whose forward
    depends on the mode (BatchNorm, dropout) says so in the graph's note."""
    model, inputs, known = build_on_meta(problem)
    graph = trace_module(model, inputs, name=problem.name, source=problem.source, known=known)
    moded = mode_dependent(model) if model.training else ""
    if moded and not graph.note:
        graph.note = (f"traced in training mode, as the problem builds it: its {moded} run as in training (batch "
                      "statistics, dropout draws); --eval traces it for inference, where BatchNorm folds into "
                      "the convolution before it")
    return graph


def mode_dependent(module) -> str:
    """The kinds of submodule whose forward differs between training and eval mode, named
    (e.g. "BatchNorm2d, Dropout"); empty where the mode changes nothing."""
    import torch.nn as nn
    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.Dropout, nn.Dropout1d,
             nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
    found = []
    for m in module.modules():
        if not isinstance(m, kinds) or isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0:
            continue
        if isinstance(m, nn.modules.instancenorm._InstanceNorm) and not m.track_running_stats:
            continue
        if type(m).__name__ not in found:
            found.append(type(m).__name__)
    return ", ".join(found)


def trace_module(model: torch.nn.Module, example_inputs, *, name: str = "model", source: str | None = None,
                 known: dict | None = None) -> Graph:
    """Trace with torch.export (non-strict, on fake tensors) into a Graph.

    Raises TraceError (with `partial` set to what did trace, where anything did) when
    export fails.
    """
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    if known is None:
        known = {k: v for k, v in model.named_buffers() if v is not None and v.device.type != "meta" and v.numel() <= REAL_LIMIT}
    try:
        with _quiet():
            ep = torch.export.export(model, args, strict=False)
    except Exception as e:
        raise _trace_error(e, model, args, name, source) from e
    return _from_fx(ep, name, source, known)


@contextmanager
def _quiet():
    import logging
    import warnings
    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes",
                                               "torch._subclasses.fake_tensor", "torch._functorch", "torch._inductor")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    import contextlib
    import io
    try:
        # torch prints the partial graph of a failed export to stdout; the user gets our one sentence instead.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


_DATA_DEP = ("data-dependent", "data dependent", "GuardOnDataDependentSymNode", "Could not guard on",
             "Cannot access data pointer", "meta tensors", "Could not extract specialized integer")


def _trace_error(e: Exception, model, args, name, source) -> TraceError:
    msg = str(e)
    where = _where(e, source)
    if not where:
        where = _where_in_model(e, model)
    if any(s in msg or s in type(e).__name__ for s in _DATA_DEP) or "item()" in msg or "bool" in msg and "Tensor" in msg:
        partial = _partial_trace(model, args, name, source)
        text = (f"cannot trace `{name}`: forward has data-dependent control flow{where}, which torch.export cannot capture "
                f"in one graph; make the branch static (a constructor flag or a shape check) or use torch.cond")
        if partial is not None:
            text += f"; the {len(partial.calls())} ops before it were traced and are shown as a partial result"
        return TraceError(text, partial)
    return TraceError(f"forward of `{name}` raised {type(e).__name__}: {first_line(e, None)}{where}")


def _where_in_model(e: BaseException, model) -> str:
    try:
        src = Path(sys.modules[type(model).__module__].__file__)
    except (KeyError, AttributeError, TypeError):
        return ""
    return _where(e, str(src))


def _partial_trace(model, args, name, source) -> Graph | None:
    """The graphs torch.compile captures before the first graph break, exported on their own."""
    captured = []

    def backend(gm, example_inputs):
        captured.append(gm)
        return gm.forward
    import torch._dynamo
    torch._dynamo.reset()
    try:
        with _quiet():
            torch.compile(model, backend=backend, fullgraph=False, dynamic=False)(*args)
    except Exception:
        pass
    finally:
        torch._dynamo.reset()
    if not captured:
        return None
    gm = captured[0]
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        fake_args = []
        for n in ph:
            v = n.meta.get("example_value")
            fake_args.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v)
        with _quiet():
            ep = torch.export.export(gm, tuple(fake_args), strict=False)
        g = _from_fx(ep, name, source, {})
    except Exception:
        return None
    g.partial = True
    g.note = "only the part of forward before the first data-dependent branch was traced"
    return g


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _source_of(fx_node, source: str | None) -> str | None:
    st = fx_node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', st)
    if not frames:
        return None
    if source:
        mine = [f for f in frames if Path(f[0]).name == Path(source).name]
        if mine:
            return f"{Path(mine[-1][0]).name}:{mine[-1][1]}"
    f = frames[-1]
    return f"{Path(f[0]).name}:{f[1]}"


def _normalize_dims(names: list, args: list):
    """Write `dim` arguments as negative indices (dim=3 of a rank-4 tensor is -1), so that
    a rule's `{const: -1}` means "the last dimension" however the model wrote it."""
    if "dim" not in names or not args or not isinstance(args[0], Node) or args[0].shape is None:
        return
    rank = len(args[0].shape)
    i = names.index("dim")
    d = args[i]
    if isinstance(d, int) and not isinstance(d, bool) and d >= 0 and rank:
        args[i] = d - rank
    elif isinstance(d, list) and rank and all(isinstance(x, int) for x in d):
        args[i] = [x - rank if x >= 0 else x for x in d]


# Higher-order ops whose body discovery walks in place: torch.export wraps code under
# torch.autocast / torch.no_grad (the rotary embedding of Llama-family layers) in them.
_INLINED_HOPS = {"wrap_with_autocast", "wrap_with_set_grad_enabled", "wrap"}


class _HopResult:
    """The outputs of an inlined higher-order op, indexed by the getitem nodes that read it."""

    def __init__(self, items):
        self.items = list(items)


def _is_getitem(target) -> bool:
    import operator
    return target is operator.getitem


def _from_fx(ep, name: str, source: str | None, known: dict) -> Graph:
    from torch.export.graph_signature import InputKind
    kinds = {}
    for spec in ep.graph_signature.input_specs:
        kind = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant",
                InputKind.USER_INPUT: "input"}.get(spec.kind, "input")
        kinds[spec.arg.name] = (kind, spec.target)
    made: dict = {}
    nodes = []
    opaque = []  # (node name, op, reason): calls discovery could not look inside
    scope = {"prefix": "", "env": None}

    def conv(a):
        if isinstance(a, torch.fx.Node):
            key = scope["prefix"] + a.name
            if key not in made:
                raise TraceError(f"node `{a.name}` reads `{a.target}`, which the graph never defined "
                                 f"(an op fact-db cannot follow); report this with the model file")
            return made[key]
        if isinstance(a, (list, tuple)):
            return [conv(x) for x in a]
        if isinstance(a, torch.dtype):
            return _dtype_name(a)
        if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
            return str(a)
        return a

    root = ep.graph_module

    def walk(graph, prefix: str, inputs: list | None):
        """Convert `graph`; a higher-order op's body is walked in place with its operands."""
        ph_i = 0
        for n in graph.nodes:
            key = prefix + n.name
            if prefix and n.op == "placeholder":
                made[key] = inputs[ph_i] if inputs is not None and ph_i < len(inputs) else None
                ph_i += 1
                continue
            if prefix and n.op == "output":
                return [conv_in(a, prefix) for a in (n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]])]
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
                _hop(n, prefix)
                continue
            if n.op == "call_function" and _is_getitem(n.target) and isinstance(made.get(prefix + n.args[0].name), _HopResult):
                made[key] = made[prefix + n.args[0].name].items[n.args[1]]
                if not prefix and isinstance(made[key], Node) and made[key].outer is None:
                    made[key].outer = key
                continue
            node = one(n, prefix)
            if node is not None:
                made[key] = node
                nodes.append(node)
        return None

    def conv_in(a, prefix):
        old = scope["prefix"]
        scope["prefix"] = prefix
        try:
            return conv(a)
        finally:
            scope["prefix"] = old

    def _hop(n, prefix):
        name = getattr(n.target, "_name", None) or getattr(n.target, "__name__", str(n.target))
        subs = [a for a in n.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
        if name in _INLINED_HOPS and len(subs) == 1:
            gm = getattr(root, subs[0].target, None) if root is not None else None
            if isinstance(gm, torch.fx.GraphModule):
                i = n.args.index(subs[0])
                operands = [conv_in(a, prefix) for a in n.args[i + 1:]]
                outs = walk(gm.graph, f"{prefix}{n.name}.", operands)
                made[prefix + n.name] = _HopResult(outs or [])
                return
        reason = (f"torch.export wrapped this part of forward in the higher-order op `{name}`, which discovery does not "
                  f"look inside; its ops stay in eager PyTorch")
        opaque.append((prefix + n.name, f"hop.{name}", reason))
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        outs = []
        for j, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                nd = Node(f"{prefix}{n.name}.out{j}", "opaque", shape=tuple(int(s) for s in v.shape), dtype=_dtype_name(v.dtype),
                          source=_source_of(n, source))
                nodes.append(nd)
                outs.append(nd)
            else:
                outs.append(None)
        made[prefix + n.name] = _HopResult(outs) if isinstance(val, (list, tuple)) else (outs[0] if outs else None)

    def one(n, prefix):
        old = scope["prefix"]
        scope["prefix"] = prefix
        try:
            return _one(n, prefix)
        finally:
            scope["prefix"] = old

    def _one(n, prefix):
        val = n.meta.get("val")
        shape = dtype = stride = None
        if isinstance(val, torch.Tensor):
            shape = tuple(int(s) for s in val.shape)
            dtype = _dtype_name(val.dtype)
            try:
                stride = tuple(int(s) for s in val.stride())
            except Exception:
                stride = None
        if n.op == "placeholder":
            kind, fqn = kinds.get(n.name, ("input", None))
            node = Node(n.name, kind, shape=shape, dtype=dtype, stride=stride, fqn=fqn, value=known.get(fqn) if fqn else None)
        elif n.op == "call_function":
            packet, overload = aten.target_name(n.target)
            if packet.startswith("aten._assert") or packet.startswith("aten.sym_constrain"):
                return None  # runtime checks with no value (from .to() and friends): not part of the dataflow
            schema = aten.schema_args(n.target)
            if schema:
                names = [s[0] for s in schema]
                full = []
                for i, (an, default, _) in enumerate(schema):
                    if i < len(n.args):
                        full.append(conv(n.args[i]))
                    elif an in n.kwargs:
                        full.append(conv(n.kwargs[an]))
                    else:
                        full.append(default)
            else:
                names = [f"arg{i}" for i in range(len(n.args))]
                full = [conv(a) for a in n.args]
            _normalize_dims(names, full)
            node = Node(n.name, packet, overload, full, names, shape, dtype, stride, source=_source_of(n, source))
        elif n.op == "output":
            node = Node(n.name, "output", args=[conv(a) for a in n.args[0]] if n.args and isinstance(n.args[0], (list, tuple)) else [conv(a) for a in n.args])
        else:
            return None
        if prefix:
            node.name = prefix + node.name
        return node

    walk(ep.graph, "", None)
    for node in nodes:
        for a in node.tensor_inputs():
            a.users.append(node)
    return Graph(nodes, name, program=ep, opaque=opaque)
