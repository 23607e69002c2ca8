"""fact-db as a torch.compile backend: the registry's kernels in the regions they win, Inductor
for everything else (DESIGN.md, "fact-db and torch.compile").

    >>> fast = torch.compile(model, backend="factdb", options={"policy": "bf16"})
    >>> with torch.no_grad():
    ...     y = fast(x)
    >>> print(fact_db.pipeline.backend.report())     # per graph: kernels put in, regions left, graph breaks

"factdb" is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so no
import is needed; `register()` does the same for a source tree that is not installed. For each
graph dynamo captures, the backend traces it to ATen, matches fact-db's rules, looks up the
kernels the registry already holds for each region, its shapes and the policy (lookup only:
compiling never tunes, unless the `tune` option asks), puts their ops in (composition's
rewrite), and hands the graph to Inductor, which fuses everything else. Regions without a
kernel stay with Inductor; they are listed once, with the `factdb` command that would tune
them. A graph break only splits the model into more graphs: each is rewritten on its own.

What the rewrite depended on (fact-db's version, the rules, the registry rows used, the
policy) goes into Inductor's FX graph cache key (`cache_key`), so a cached graph is never
served stale. A graph with dynamic shapes runs fact-db's kernels only for input shapes they
were verified for: each new shape, up to the `shapes` option, is looked up once and compiled
with the kernels found; any other runs Inductor's code for the dynamic graph; dynamo never
recompiles because of fact-db. Kernels have no backward: a graph that autograd records
(grad enabled and a tensor requiring grad) is Inductor's alone. The Inductor features this
relies on are listed, with the torch versions tested, in fact_db/pipeline/inductor.py.

Options (`options={...}`): see OPTIONS.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import time
import warnings
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from fact_db.core.errors import FactError, first_line
from fact_db.core.policy import POLICIES, POLICY_DTYPE
from fact_db.pipeline import inductor

OPTIONS = {
    "policy": "precision policy the kernels were verified under; default: bf16 or fp16 for a graph in that dtype, "
              "else fp32",
    "registry": "a Registry, or its URL; default: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb",
    "gpu": "the GPU whose registry rows serve (h100, h200); default: the current one",
    "tune": "tune the regions the registry lacks, on this GPU, before compiling; default False (lookup only)",
    "shapes": "how many input shapes a graph with dynamic shapes looks kernels up for; default 8",
    "rules": "the RuleSet to match; default: the shipped rules",
    "mode": "torch.compile's mode for Inductor's part (default, reduce-overhead, max-autotune, "
            "max-autotune-no-cudagraphs): torch.compile takes mode= or options=, not both, so it goes here",
    "inductor": "Inductor config patches (a dict, as torch.compile's options take them for Inductor)",
    "split_weights": "the fp32/tf32x3 kernels' weights split into TF32 lo parts once and held (one more copy of "
                     "each weight), or False: split per call, holding nothing; default True",
    "lookup": "lookup(region, workload, policy) -> Impl or None, in place of the registry (tests on the CPU)",
}


MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class BackendError(FactError, ValueError):
    """torch.compile(backend="factdb") was given an option it does not take, or a bad value."""


@dataclass
class Options:
    policy: str | None = None
    registry: object = None
    gpu: str | None = None
    tune: bool = False
    shapes: int = 8
    rules: object = None
    mode: str | None = None
    inductor: dict = field(default_factory=dict)
    split_weights: bool = True
    lookup: object = None


def options_from(options: dict | None) -> Options:
    """Options from torch.compile's `options=` dict; BackendError naming a bad one."""
    options = dict(options or {})
    for name in options:
        if name not in OPTIONS:
            near = difflib.get_close_matches(name, list(OPTIONS), n=1)
            raise BackendError(f"torch.compile(backend='factdb') has no option {name!r}"
                               + (f" (did you mean {near[0]!r}?)" if near else "")
                               + f"; it accepts: {', '.join(OPTIONS)}")
    opts = Options(**options)
    if opts.policy is not None and opts.policy not in POLICIES:
        raise BackendError(f"option policy={opts.policy!r} is not a policy: use one of {', '.join(POLICIES)}")
    if not isinstance(opts.shapes, int) or isinstance(opts.shapes, bool) or opts.shapes < 0:
        raise BackendError(f"option shapes={opts.shapes!r} must be a whole number of input shapes (0 or more)")
    if opts.mode is not None and opts.mode not in MODES:
        raise BackendError(f"option mode={opts.mode!r} is not a torch.compile mode: use one of {', '.join(MODES)}")
    if not isinstance(opts.inductor, dict):
        raise BackendError(f"option inductor={opts.inductor!r} must be a dict of Inductor config patches")
    if not isinstance(opts.split_weights, bool):
        raise BackendError(f"option split_weights={opts.split_weights!r} must be True or False")
    if opts.lookup is not None and not callable(opts.lookup):
        raise BackendError("option lookup must be callable as lookup(region, workload, policy)")
    return opts


# ------------------------------------------------------------------------------------------
# The report: what the backend did, per graph, and the graph breaks.

@dataclass
class GraphReport:
    """One compiled graph (or, for a graph with dynamic shapes, one input shape of it)."""

    index: int
    policy: str = ""
    shapes: str = ""                               # the call's input shapes it was compiled for
    dynamic: bool = False                          # one input shape of a graph with dynamic shapes
    kernels: list = field(default_factory=list)    # (rule, shape, what runs)
    left: list = field(default_factory=list)       # (rule, shape, why, the factdb command that would tune it)
    rows: list = field(default_factory=list)       # the registry rows used
    key: str = ""                                  # cache_key
    note: str = ""
    seconds: dict = field(default_factory=dict)    # compile time by phase: discover, lookup, rewrite, inductor

    @contextmanager
    def timed(self, phase: str):
        """Add the time the block takes to `phase`'s (an exception included)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


@dataclass
class CompileReport:
    graphs: list = field(default_factory=list)
    _breaks_before: dict = field(default_factory=dict)

    @property
    def breaks(self) -> dict:
        """Reason -> count of the graph breaks since the report was reset."""
        now = inductor.graph_breaks()
        return {k: n - self._breaks_before.get(k, 0) for k, n in now.items() if n > self._breaks_before.get(k, 0)}

    def __str__(self) -> str:
        lines = [f"fact-db backend: {len(self.graphs)} graph(s) compiled, {len(self.breaks)} graph break reason(s)"]
        for g in self.graphs:
            took = ", ".join(f"{k} {v:.2f} s" for k, v in g.seconds.items())
            lines.append(f"graph {g.index} ({g.shapes}{', dynamic graph' if g.dynamic else ''}, {g.policy or '-'}): "
                         f"{len(g.kernels)} kernel(s)"
                         + (f"; {g.note}" if g.note else "") + (f"; compile time: {took}" if took else ""))
            lines += [f"  kernel  {rule} {shape}: {what}" for rule, shape, what in g.kernels]
            lines += [f"  inductor {rule} {shape}: {why}" + (f" (`{cmd}`)" if cmd else "")
                      for rule, shape, why, cmd in g.left]
        lines += [f"break: {reason} (x{n})" for reason, n in self.breaks.items()]
        return "\n".join(lines)


_REPORT = CompileReport()
_LISTED: set = set()   # (rule, shape, policy) of regions already listed as left to Inductor


def report() -> CompileReport:
    """What the backend did since the last reset_report() (or since the process began)."""
    return _REPORT


def reset_report() -> None:
    global _REPORT
    _REPORT = CompileReport(_breaks_before=inductor.graph_breaks())


def _announce(entry: GraphReport) -> None:
    """List, once per process, the regions left to Inductor that a tuned kernel could serve."""
    new = list(dict.fromkeys((r, s, cmd) for r, s, _, cmd in entry.left if cmd and (r, s, entry.policy) not in _LISTED))
    _LISTED.update((r, s, entry.policy) for r, s, _ in new)
    if new:
        warnings.warn(f"fact-db: {len(new)} region(s) have no kernel in the registry under {entry.policy} and stay "
                      "with Inductor: " + "; ".join(f"{r} {s} (`{cmd}`)" for r, s, cmd in new), stacklevel=2)


# ------------------------------------------------------------------------------------------
# The cache key.

# The digest of each rule set seen, by id() with a weak reference that says the set is still the
# one that had that id (a freed set's address can be reused by a new one), and of the shipped
# rules (None), per process.
_RULES_DIGEST: dict = {}
_SHIPPED_DIGEST: list = []


def rules_digest(rules) -> str:
    """sha256 of the rule files' bytes (the shipped rules where `rules` is None)."""
    if rules is None and _SHIPPED_DIGEST:
        return _SHIPPED_DIGEST[0]
    seen = _RULES_DIGEST.get(id(rules)) if rules is not None else None
    if seen is not None and seen[0]() is rules:
        return seen[1]
    from pathlib import Path

    from fact_db.discovery.rules import load_rules
    ruleset = rules or load_rules()
    h = hashlib.sha256()
    for r in sorted(ruleset, key=lambda r: r.id):
        path = Path(str(getattr(r, "path", "")))
        h.update(r.id.encode() + b"\0" + (path.read_bytes() if path.is_file() else repr(r).encode()))
    for name in sorted(getattr(ruleset, "fragments", {}) or {}):
        h.update(b"fragment\0" + name.encode() + repr(ruleset.fragments[name]).encode())
    digest = h.hexdigest()
    if rules is None:
        _SHIPPED_DIGEST.append(digest)
    else:
        try:
            _RULES_DIGEST[id(rules)] = (weakref.ref(rules), digest)
        except TypeError:  # not weakly referable (a plain list of rules): computed every time
            pass
    return digest


def cache_key(policy: str, rows: list, rules=None, split_weights: bool = True) -> str:
    """What a rewritten graph depends on besides its own text: fact-db's version, the rules
    digest, the registry rows used, the policy, and whether weights are split once or per call.
    Inductor's FX graph cache key includes it."""
    import fact_db
    what = {"factdb": fact_db.__version__, "rules": rules_digest(rules), "policy": policy, "rows": sorted(rows)}
    if not split_weights:  # (the default leaves the key as it was: caches already filled stay valid)
        what["split_weights"] = False
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------
# The graph rewrite.

def _sources(gm) -> list[str]:
    """Each graph input's dynamo source, read when dynamo hands the graph over (it drops them after)."""
    return [inductor.source_name(n) for n in gm.graph.nodes if n.op == "placeholder"]


def _state(source: str, value) -> bool:
    """Whether a graph input is module state (a parameter or a buffer), not a call's input."""
    import torch
    if not isinstance(value, torch.Tensor):
        return False
    return isinstance(value, torch.nn.Parameter) or "_parameters[" in source or "_buffers[" in source


def _fold_scalars(gm, args: list, sources: list):
    """(a copy of `gm` with module and global floats folded in, {input position: value}).
    Under dynamic shapes dynamo passes floats such as a LayerNorm's eps, a dropout's p or
    math.pi as 0-d tensors read with .item(); a graph compiled for one input shape takes them
    as the constants they are (each call checks they still are)."""
    import copy

    import torch
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    folded = {}
    for i, (n, a, src) in enumerate(zip(phs, args, sources)):
        items = [u for u in n.users if u.op == "call_method" and u.target == "item"]
        if (isinstance(a, torch.Tensor) and a.dim() == 0 and not a.is_cuda and (src.startswith("L['self']")
                                                                             or src.startswith("G["))
                and items and len(items) == len(n.users)):
            folded[i] = a.item()
    if not folded:
        return gm, folded
    gm = copy.deepcopy(gm)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, value in folded.items():
        for item in list(phs[i].users):
            for user in list(item.users):
                user.args = torch.fx.node.map_arg(user.args, lambda x, it=item, v=value: v if x is it else x)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x, it=item, v=value: v if x is it else x)
            gm.graph.erase_node(item)
    gm.recompile()
    return gm, folded


def _policy_of(tensors) -> str:
    import torch
    dts = {t.dtype for t in tensors if t.is_floating_point()}
    return "bf16" if torch.bfloat16 in dts else "fp16" if torch.float16 in dts else "fp32"


def _lifted(gm, state: dict, total: int):
    """`gm` as a module whose parameters and buffers are its own (so discovery and composition
    see weights, not inputs), called with the other inputs only."""
    import torch

    class Lifted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.graph_module = gm
            for i, t in state.items():
                if isinstance(t, torch.nn.Parameter):
                    self.register_parameter(f"state_{i}", t)
                else:
                    self.register_buffer(f"state_{i}", t)

        def forward(self, *user):
            it = iter(user)
            return self.graph_module(*[getattr(self, f"state_{i}") if i in state else next(it) for i in range(total)])
    return Lifted()


def _find(opts: Options, region, workload, policy: str, gpu: str | None):
    """lookup.Found for one region: the test hook, else the registry; a kernel that fails to
    load leaves the region with Inductor, with a warning."""
    from fact_db.pipeline.lookup import Found, kernel_for
    try:
        if opts.lookup is not None:
            impl = opts.lookup(region, workload, policy)
            return Found(impl, f"{impl.record.get('build_key') or impl.label}") if impl is not None else \
                Found(why="no kernel in the registry")
        _open_registry(opts)
        return kernel_for(opts.registry, region, workload, arch="sm90a", gpu=gpu or "h100", tune=opts.tune)
    except Exception as e:  # noqa: BLE001  (a row whose kernel will not load: the region is Inductor's)
        why = f"its registry kernel failed to load ({first_line(e, 200, typed=True)})"
        warnings.warn(f"fact-db: region {region.rule} {region.shape}: {why}; it stays with Inductor", stacklevel=3)
        return Found(why=why)


def _open_registry(opts: Options):
    """opts.registry opened once, from the option's URL or the default: the lean reader
    (fact_db.store.reader: no SQLAlchemy to import, a compile's fixed cost) where the registry is
    a local DuckDB file it can read as it is, else the Registry (which creates, migrates, seeds,
    waits for a busy file, serves a team registry, and takes the `tune` option's writes)."""
    if opts.registry is None or isinstance(opts.registry, str):
        from fact_db.store.reader import Reader
        reg = None if opts.tune else Reader.open(opts.registry)
        if reg is None:
            from fact_db.store.registry import Registry
            reg = Registry.open(opts.registry)
        opts.registry = reg
    return opts.registry


def _hold(opts: Options, held: ExitStack) -> None:
    """Keep one read connection to a local registry for the graph's lookups (one per lookup
    cost 10 ms each); a registry that does not open is left to _find, which says why per region."""
    if opts.lookup is not None or opts.tune:  # the test hook; tuning writes
        return
    try:
        reg = _open_registry(opts)
        if getattr(reg, "team", None) is None and hasattr(reg, "pinned"):
            held.enter_context(reg.pinned())
    except Exception:  # noqa: BLE001  (_find reports it for each region)
        pass


def _kernels(disc, policy: str, gpu: str | None, opts: Options, entry: GraphReport) -> tuple[dict, list]:
    """({region index: Impl}, [registry row]) for the regions of `disc` the registry has a kernel
    for; each other region goes into entry.left with why (and the command that would tune it)."""
    from fact_db.pipeline.lookup import tune_command
    from fact_db.realization.realize import plan, workload_of
    impls, rows = {}, []
    want = POLICY_DTYPE[policy]
    asked = False
    with ExitStack() as held:
        for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy))):
            w, why = workload_of(r, p, disc.graph, policy)
            if r.composable or w is None:
                entry.left.append((r.rule, r.shape, r.composable or why or "no kernel family realizes it", ""))
                continue
            if any(d != want for d in r.dtypes):
                entry.left.append((r.rule, r.shape, f"dtype {'/'.join(r.dtypes)} under the {policy} policy ({want})", ""))
                continue
            if not asked:  # the first region the registry is asked about
                asked = True
                _hold(opts, held)
            found = _find(opts, r, w, policy, gpu)
            if found.impl is None:
                entry.left.append((r.rule, r.shape, found.why, tune_command(w, policy)))
                continue
            impls[i] = found.impl
            rows.append(found.row)
    return impls, rows


def _on_gpu(tensors) -> bool:
    """Whether a graph's tensors are all on a CUDA GPU, where fact-db's kernels run
    (benchmarks/backend_overhead.py says yes on the CPU, to time the backend's GPU path)."""
    return bool(tensors) and all(t.is_cuda for t in tensors)


def _rewrite(gm, args: list, sources: list, opts: Options, entry: GraphReport):
    """(graph module with the kernels' ops, the positions of the call inputs it takes, the
    module state it holds, the floats it folded in) for concrete `args`, or None where no
    kernel goes in (entry.note says why)."""
    import torch

    from fact_db.composition.compose import rewrite
    from fact_db.core.environment import device_info
    from fact_db.discovery.discover import discover
    gm, folded = _fold_scalars(gm, args, sources)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    state = {i: a for i, (src, a) in enumerate(zip(sources, args)) if _state(src, a) or i in folded}
    users = [i for i in range(len(args)) if i not in state]
    entry.shapes = _shapes([args[i] for i in users])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        entry.note = "autograd records this graph (grad enabled, a tensor requires grad): fact-db's kernels have no " \
                     "backward, so Inductor compiles all of it; call the model under torch.no_grad()"
        return None
    if opts.lookup is None and not _on_gpu(tensors):
        entry.note = "its tensors are not all on a CUDA GPU, where fact-db's kernels run"
        return None
    policy = entry.policy = opts.policy or _policy_of(tensors)
    gpu = opts.gpu or (device_info(torch.device("cuda")).get("gpu") if torch.cuda.is_available() else None)
    try:
        with entry.timed("discover"):
            disc = discover(_lifted(gm, state, len(args)), tuple(args[i] for i in users), arch="sm90", gpu=gpu,
                            policy=policy, rules=opts.rules)
    except Exception as e:  # noqa: BLE001  (what discovery cannot trace is Inductor's, as without fact-db)
        entry.note = f"discovery could not trace it ({first_line(e, 200, typed=True)})"
        return None
    with entry.timed("lookup"):  # the registry, and loading each kernel
        impls, rows = _kernels(disc, policy, gpu, opts, entry)
    if not impls:
        entry.note = entry.note or "no region has a kernel in the registry"
        return None
    with entry.timed("rewrite"):
        gm2, notes = rewrite(disc.graph.program, disc.regions, impls, split_weights=opts.split_weights)
    for i, impl in impls.items():
        r = disc.regions[i]
        if impl.kind == "eager":  # the rewrite could not take it
            entry.left.append((r.rule, r.shape, impl.note, ""))
        else:
            entry.kernels.append((r.rule, r.shape, impl.label))
    if not entry.kernels:
        entry.note = "; ".join(notes)
        return None
    entry.rows = sorted(rows)
    gm2.graph._codegen = torch.fx.graph.CodeGen()  # positional in and out, as Inductor takes a graph
    gm2 = torch.fx.GraphModule(gm2, gm2.graph)     # and nothing of the exported program's module around it
    if sum(n.op == "placeholder" for n in gm2.graph.nodes) != len(users):
        entry.note = "the rewritten graph's inputs differ from the captured graph's"
        entry.kernels = []
        return None
    return gm2, users, state, folded


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (as it was after it). What fact-db
    allocates while it discovers and looks up (imports, the trace) sets off a full collection
    over the heap torch and dynamo hold (0.22 s on the CPU, benchmarks/backend_overhead.py).
    Paused here, that collection mostly falls inside Inductor instead, so on most graphs this
    moves it rather than saves it (docs/torch_compile.md). Nothing is frozen: the next
    collection after the block sees everything as before."""
    import gc
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _compile_with_kernels(gm, args: list, sources: list, opts: Options, mode, entry: GraphReport, fallback=None):
    """Inductor on the graph with the registry's kernels put in, called like `gm`; None where
    no kernel goes in, or Inductor fails on it (with a warning). A call whose module state
    changed since runs `fallback` (default: Inductor on `gm`, compiled then)."""
    with _collector_paused():
        got = _rewrite(gm, args, sources, opts, entry)
    _announce(entry)
    if got is None:
        return None
    gm2, users, state, folded = got
    entry.key = cache_key(entry.policy, entry.rows, opts.rules, opts.split_weights)
    try:
        with entry.timed("inductor"):
            compiled = inductor.compile_graph(gm2, [args[i] for i in users], key=entry.key, mode=mode,
                                              patches=opts.inductor)
    except Exception as e:  # noqa: BLE001  (Inductor failing on the rewritten graph: it compiles the model's own)
        entry.note = f"Inductor failed on the graph with fact-db's kernels ({first_line(e, 200, typed=True)})"
        entry.kernels = []
        warnings.warn(f"fact-db: {entry.note}; Inductor compiles the graph without them", stacklevel=3)
        return None
    # Composition made buffers from the weights (concatenated, transposed, split): a weight
    # replaced or changed in place since makes them stale, and the call runs Inductor's own code.
    held = [(i, t, t._version) for i, t in state.items() if i not in folded]
    plain = [fallback] if fallback is not None else []

    def inductors(a, why: str):
        if not warned:
            warned.append(why)
            warnings.warn(f"fact-db: {why} since torch.compile(backend='factdb') compiled this graph; it runs "
                          "Inductor's code without fact-db's kernels (torch._dynamo.reset() compiles again)",
                          stacklevel=3)
        if not plain:
            plain.append(inductor.compile_graph(gm, list(a), mode=mode, patches=opts.inductor))
        return plain[0](*a)
    warned: list = []

    def run(*a):
        for i, t, v in held:
            if a[i] is not t or t._version != v:
                return inductors(a, "a weight changed")
        for i, value in folded.items():
            if a[i].item() != value:
                return inductors(a, "a float the graph reads from the model changed")
        return compiled(*[a[i] for i in users])
    return run


def _shapes(args) -> str:
    import torch
    return ", ".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))


def _dynamic(gm, example_inputs) -> bool:
    import torch
    if any(isinstance(a, torch.SymInt) for a in example_inputs):
        return True
    for n in gm.graph.nodes:
        v = n.meta.get("example_value") if n.op == "placeholder" else None
        if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
            return True
    return False


class _PerShape:
    """A graph with dynamic shapes: Inductor's code for it, and for each input shape seen (up to
    `opts.shapes`) the graph compiled for exactly those shapes with the kernels the registry
    has for them, where it has any. Shapes are looked up on their first call, outside dynamo,
    so nothing here makes dynamo recompile."""

    def __init__(self, gm, example_inputs, opts: Options, mode):
        self.gm, self.opts, self.mode, self.sources = gm, opts, mode, _sources(gm)
        self.general = inductor.compile_graph(gm, example_inputs, mode=mode, patches=opts.inductor)
        self.special: dict = {}
        self.warned = False

    def __call__(self, *args):
        import torch
        sig = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.special.get(sig, False)
        if fn is False:
            fn = self.special[sig] = self._prepare(args)
        return (fn or self.general)(*args)

    def _prepare(self, args):
        if len(self.special) >= self.opts.shapes:
            if not self.warned:
                self.warned = True
                warnings.warn(f"fact-db: a graph with dynamic shapes has been called with {self.opts.shapes} input "
                              "shapes; further shapes run Inductor's code without looking for fact-db kernels (the "
                              "`shapes` option raises the limit)", stacklevel=3)
            return None
        entry = GraphReport(len(_REPORT.graphs) + 1, dynamic=True)
        _REPORT.graphs.append(entry)
        try:
            return _compile_with_kernels(self.gm, list(args), self.sources, self.opts, self.mode, entry,
                                         fallback=self.general)
        except Exception as e:  # noqa: BLE001  (a shape that cannot be prepared runs Inductor's code)
            entry.note = f"not prepared ({first_line(e, 200, typed=True)})"
            return None


def factdb(gm, example_inputs, *, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend (see the module docstring): called by dynamo per captured graph."""
    opts = options_from(options)
    mode = opts.mode or mode
    if _dynamic(gm, example_inputs):
        return _PerShape(gm, list(example_inputs), opts, mode)
    entry = GraphReport(len(_REPORT.graphs) + 1)
    _REPORT.graphs.append(entry)
    fn = _compile_with_kernels(gm, list(example_inputs), _sources(gm), opts, mode, entry)
    if fn is not None:
        return fn
    with entry.timed("inductor"):  # Inductor on the graph as captured: its time is the graph's too
        return inductor.compile_graph(gm, example_inputs, mode=mode, patches=opts.inductor)


def register() -> None:
    """Register the backend with dynamo as "factdb", as the torch_dynamo_backends entry point
    does for an installed fact-db (a source tree that is not installed has no entry point).

        >>> register(); torch.compile(model, backend="factdb")
    """
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    try:
        torch._dynamo.register_backend(factdb, name="factdb")
    except AssertionError:  # registered already: by this function, or by the entry point
        if lookup_backend("factdb") is not factdb:
            raise BackendError("another backend is registered with dynamo as 'factdb' (an installed fact-db from "
                               "another source tree?); import torch.compile's backend from one fact-db") from None
