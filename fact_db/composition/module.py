"""The composed module: the graph `compose.rewrite` made, guarded on the input signature it was
optimized for, run under the policy (as a CUDA graph per signature where asked, or under
torch.compile where that was chosen), with a variant or the eager fallback for any other
signature.

    >>> model = ComposedModule(gm, fallback, policy="fp32", optimized_for=signature((x,)))
    >>> model(x)                                                    # called like the original

`ComposedModule` guards its inputs: a call whose tensor shapes or dtypes differ from the
ones optimized for runs a variant for that signature (`variants(signature, args)`, e.g.
composed from kernels the registry has for those shapes) or the eager fallback, with a
one-time warning; never a kernel on a shape it was not verified for. Precision policies
apply to the whole model: `bf16`/`fp16` run it in that dtype (inputs cast at entry, the
output cast back), `tf32` turns TF32 on for what stays in PyTorch.
"""
from __future__ import annotations

import gc
import warnings

import torch

from fact_db.composition.compose import ComposeError
from fact_db.core.errors import first_line
from fact_db.core.policy import call_in_mode, torch_dtype
from fact_db.kernels.bench import clear_cublas_workspaces


def signature(args, kwargs=None) -> tuple:
    """What a call is guarded on: the call's structure (positional count, keyword names) and
    every tensor leaf's shape, dtype and device type; other leaves by value. Plain tuples
    and strings, so an artifact's manifest can hold it (see `signature_from_json`)."""
    from torch.utils._pytree import tree_flatten
    kwargs = dict(kwargs or {})
    leaves, _ = tree_flatten((tuple(args), kwargs))
    out = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.append(("T", tuple(int(d) for d in x.shape), str(x.dtype).replace("torch.", ""), x.device.type))
        else:
            out.append(("V", repr(x)))
    return (f"{len(args)} args; kwargs {sorted(kwargs)}", tuple(out))


def _quick_guard(sig: tuple):
    """[(shape, torch dtype, device type)] per argument of a signature of positional tensors
    only (what `signature` makes of such a call); None for any other signature."""
    head, leaves = sig
    if not head.endswith("; kwargs []") or head != f"{len(leaves)} args; kwargs []" or \
            any(leaf[0] != "T" for leaf in leaves):
        return None
    try:
        return [(torch.Size(leaf[1]), getattr(torch, leaf[2]), leaf[3]) for leaf in leaves]
    except (AttributeError, TypeError):
        return None


def signature_from_json(data) -> tuple:
    """The tuple form of a signature read back from JSON (lists become tuples)."""
    head, leaves = data
    return (head, tuple(("T", tuple(x[1]), x[2], x[3]) if x[0] == "T" else ("V", x[1]) for x in leaves))


def describe(sig: tuple) -> str:
    parts = [f"{'x'.join(map(str, leaf[1])) or 'scalar'} {leaf[2]}" if leaf[0] == "T" else leaf[1]
             for leaf in sig[1]]
    return ", ".join(parts)


def policy_dtype(policy: str):
    """The torch dtype a half policy runs the model in; None for the float32 policies."""
    return torch_dtype(policy)


def cast_floats(tree, dtype):
    """Floating tensors of a pytree cast to `dtype` (others untouched)."""
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)


class ComposedModule(torch.nn.Module):
    """The optimized model: the composed graph for the input signature it was optimized for;
    for any other, a variant (from `variants(sig, args, kwargs) -> (module | None, why)`) or
    the eager fallback, with a one-time warning."""

    def __init__(self, gm, fallback, *, policy: str, optimized_for: tuple, variants=None, regions=None,
                 name: str = "model", also_for=(), cuda_graph: bool = False, split_weights: bool = True):
        super().__init__()
        self.gm = gm
        self.split_weights = split_weights  # as rewrite() made gm: the artifact records it
        # Replay the composed graph as one CUDA graph per guarded signature (see _Graphed).
        self.cuda_graph = cuda_graph
        self._graphs: dict = {}
        self.graph_note = ""
        # Set where eager PyTorch timed faster than the composed graph for the signature it was
        # optimized for: fact-db then never returns a module slower than what the user had.
        self.prefer_eager = False
        # What runs for the signature it was optimized for (pipeline/choice.py): one of CHOICES;
        # a compiled choice's torch.compile'd module is `_chosen` (see use()).
        self.choice = "composed, CUDA graph" if cuda_graph else "composed"
        self.compile_mode: str | None = None
        object.__setattr__(self, "_chosen", None)  # see use()
        self.fallback = fallback
        self.policy = policy
        self.name = name
        self.regions = list(regions or [])  # [(rule, Impl)], for repr and the report
        self.optimized_for = optimized_for
        # Signatures that run the composed graph too: the same inputs already cast to the
        # policy's dtype (what a caller who keeps bf16 activations passes).
        self.also_for = tuple(also_for)
        self._variants: dict = {}
        self._variant_factory = variants
        self._warned: set = set()
        # The guarded signatures that are plain positional tensors, as (shape, dtype, device
        # type) per argument: a call is checked against them without building its signature.
        self._quick = [(q, sig) for sig in (optimized_for, *self.also_for) if (q := _quick_guard(sig)) is not None]

    def _target(self, args, kwargs):
        # Every call comes here first, before its first launch: a loop, not a generator, and the
        # submodules from _modules, not through nn.Module.__getattr__ (about 1 us a call less).
        sig = None
        if not kwargs:
            for q, known in self._quick:
                if len(args) != len(q):
                    continue
                for x, (shp, dt, dev) in zip(args, q):
                    if not isinstance(x, torch.Tensor) or x.shape != shp or x.dtype != dt or x.device.type != dev:
                        break
                else:
                    sig = known
                    break
        if sig is None:
            sig = signature(args, kwargs)
        if sig is self.optimized_for or sig == self.optimized_for or sig in self.also_for:
            if self._chosen is not None and not torch.compiler.is_compiling():
                return self._chosen
            if self.cuda_graph and not self.graph_note and _can_graph(args, kwargs):
                g = self._graphs.get(sig)
                if g is None:
                    g = self._graphs[sig] = _Graphed(self.gm, self)
                return g
            return self._modules["gm"] if "gm" in self._modules else self.gm
        if sig in self._variants:
            return self._variants[sig][0]
        target, why = None, "no kernels for that signature"
        if self._variant_factory is not None:
            try:
                target, why = self._variant_factory(sig, args, kwargs)
            except Exception as e:  # noqa: BLE001  (a variant that cannot be built must not break the call)
                target, why = None, f"building a variant failed: {type(e).__name__}: {e}"
        what = why if target is not None else f"eager PyTorch ({why})"
        if target is None:
            target = self.fallback
        self._variants[sig] = (target, what)
        if sig not in self._warned:
            self._warned.add(sig)
            warnings.warn(f"fact-db: {self.name} was optimized for inputs ({describe(self.optimized_for)}) and "
                          f"called with ({describe(sig)}): running {what}", stacklevel=3)
        return target

    def forward(self, *args, **kwargs):
        # Eager chosen: the model as it is runs any signature, so no guard (a 0.12 ms LayerNorm
        # timed from an idle GPU paid the guard's microseconds: 0.96x of the eager it returned).
        target = self.fallback if self.prefer_eager else self._target(args, kwargs)
        # Inference only: the kernels have no backward (their ops register none).
        if not torch.is_grad_enabled():
            return run_at_policy(target, self.policy, args, kwargs)
        with torch.no_grad():
            return run_at_policy(target, self.policy, args, kwargs)

    def use(self, choice: str, compiled=None) -> None:
        """Run `choice` (one of CHOICES) for the signature it was optimized for: eager PyTorch
        (op by op, or replayed as a CUDA graph), torch.compile of the model or of the composed
        graph (`compiled`: that torch.compile'd module, see compiled_target; or its _Graphed,
        already captured), or the composed graph op by op or as a CUDA graph.

            >>> fast.use("composed + torch.compile", compiled_target(fast.gm, None, fullgraph=True))
        """
        if choice not in CHOICES:
            raise ComposeError(f"unknown choice {choice!r}: use one of {', '.join(CHOICES)}")
        if CHOICES[choice] and compiled is None:
            raise ComposeError(f"choice {choice!r} runs a torch.compile'd module: pass it as `compiled`")
        self.choice, self.compile_mode = choice, CHOICES[choice] or None
        # A plain attribute, not a submodule: it wraps gm or the fallback, which are already
        # this module's own (a submodule would list their parameters twice).
        if choice == "eager" + GRAPHED:  # the model's own ops, replayed: bitwise what eager computes
            compiled = compiled if isinstance(compiled, _Graphed) else _Graphed(self.fallback, self, own=False)
        elif CHOICES[choice] and choice.endswith(GRAPHED) and not isinstance(compiled, _Graphed):
            compiled = _Graphed(compiled, self, own=False)  # captured on its first call
        elif not CHOICES[choice]:
            compiled = None
        object.__setattr__(self, "_chosen", compiled)
        self.prefer_eager = choice == "eager"
        if choice != "composed" + GRAPHED:
            self._graphs.clear()  # the composed graph's captures, not chosen: their pools are let go
        if choice == "composed" or not choice.startswith("composed"):
            self.cuda_graph = False
        elif choice == "composed" + GRAPHED:
            self.cuda_graph = True

    def held_mib(self, graphs: bool = True) -> float:
        """Memory this module keeps between calls beyond the model's own parameters, in MiB:
        the buffers composition made (concatenated, transposed or split weights, zero biases;
        once, however many input shapes it has been composed for) and each CUDA graph's
        input copies and private pool, which holds all of the graph's intermediates. A call's
        own peak (bench.peak_mib) does not see it: it was allocated before the call."""
        pools = list(self._graphs.values()) + ([self._chosen] if isinstance(self._chosen, _Graphed) else [])
        return (self._made_bytes("_factdb_") + (sum(g.held_bytes for g in pools) if graphs else 0)) / 2**20

    def split_mib(self) -> float:
        """Of held_mib(graphs=False): the weights' TF32 lo parts split once (compose._lo_node),
        in MiB; 0 where the weights are split per call (split_weights False) or none is split."""
        return self._made_bytes("_factdb_b_lo_") / 2**20

    def _made_bytes(self, prefix: str) -> int:
        """Bytes of the buffers composition made whose names start with `prefix`, in the graph
        and its variants for other signatures, each storage once (variants share buffers)."""
        mods = [self.gm] + [t for t, _ in self._variants.values() if isinstance(t, torch.fx.GraphModule)]
        made = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes()
                for m in mods for name, b in m.named_buffers() if name.rsplit(".", 1)[-1].startswith(prefix)}
        return sum(made.values())

    def extra_repr(self) -> str:
        replaced = sum(1 for _, impl in self.regions if impl.kind != "eager")
        kernels = sum(1 for _, impl in self.regions if impl.kernel)
        graph = ", cuda_graph" if self.cuda_graph and not self.graph_note else ""
        eager = ", runs eager (faster)" if self.prefer_eager else ""
        runs = f", runs {self.choice}" if self._chosen is not None else ""
        return (f"policy={self.policy}, regions={len(self.regions)}, replaced={replaced}, kernels={kernels}"
                f"{graph}{eager}{runs}")


# What a composed module can run for the signature it was optimized for, and the
# torch.compile mode of each compiled one ("default": torch.compile's default mode). A choice
# ending in GRAPHED replays what it names as one CUDA graph (_Graphed), for a model whose time
# is the host launching kernels: eager's own ops (bitwise eager's result, where no kernel
# verified: a training-mode CNN at bf16), the composed graph op by op, or the composed graph as
# Inductor compiled it (Inductor's fused kernels and fact-db's in one replay).
GRAPHED = ", CUDA graph"
CHOICES = {
    "eager": "", "eager" + GRAPHED: "", "composed": "", "composed" + GRAPHED: "",
    "torch.compile": "default", "torch.compile max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
    "composed + torch.compile": "default",
    "composed + torch.compile max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
    "composed + torch.compile" + GRAPHED: "default",
}


def compiled_target(module, mode: str | None, *, fullgraph: bool):
    """torch.compile(module) for the one signature a ComposedModule runs it for: static
    shapes (another signature never reaches it, so no recompile is ever needed), `mode`
    None or "default" for torch.compile's default."""
    mode = None if mode in (None, "default") else mode
    return torch.compile(module, mode=mode, dynamic=False, fullgraph=fullgraph)


def _nbytes(tree) -> int:
    from torch.utils._pytree import tree_flatten
    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


def _can_graph(args, kwargs) -> bool:
    """CUDA inputs, outside torch.compile and outside a capture the caller is making."""
    from torch.utils._pytree import tree_flatten
    if torch.compiler.is_compiling() or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return False
    leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    return bool(leaves) and all(x.is_cuda for x in leaves)


class _Graphed:
    """`fn` (eager's model, the composed graph, or it under torch.compile) captured once as a
    CUDA graph for one input signature, replayed per call: one launch instead of one per op,
    for blocks whose time is the host launching kernels. Inputs are copied into the graph's own
    buffers and outputs copied out, so a call neither keeps its caller's tensors nor hands out
    memory the next call overwrites. The first call checks one replay against `fn` run as it
    is (bitwise); any fault or difference turns the graph off, with the reason: in the owner's
    `graph_note` for its own graphs (`own`: every signature's), in `note` for a chosen one."""

    def __init__(self, fn, owner, own: bool = True):
        self.fn, self.owner, self.own, self.graph = fn, owner, own, None
        self.held_bytes = 0  # what the graph keeps between calls: its input copies and its memory pool
        self.note = ""       # why this graph is off ("" while it runs)

    def _capture(self, args, kwargs):
        from torch.utils._pytree import tree_map
        clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
        self.static_in = tree_map(clone, (tuple(args), dict(kwargs)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits, cuBLAS workspaces, kernel attributes
                self.fn(*self.static_in[0], **self.static_in[1])
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # cuBLAS keeps one workspace per handle and stream, and every capture runs on the same
        # capture stream: a workspace first allocated inside one graph's pool would be baked into
        # the next graph too, and freed under it when the first graph goes (KernelBench L3-11,
        # VGG16 at bf16: an illegal memory access after the choice let two graphs go). Cleared
        # before and after, as Inductor's CUDA-graph trees do: each graph's workspace is its own.
        # The capture allocates from a private pool that stays reserved for the graph's
        # replays: every intermediate of the graph, held between calls. (torch.cuda.graph
        # empties the allocator's cache before capturing; emptied here first, after the
        # workspaces went, the difference in reserved memory is the pool. Read before clearing
        # them, a workspace eager had left was subtracted from it: KernelBench L3-9 at fp32
        # counted -8.9 MiB for a 56 MiB pool.)
        clear_cublas_workspaces()
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
        try:
            with torch.cuda.graph(self.graph):
                self.static_out = self.fn(*self.static_in[0], **self.static_in[1])
        finally:
            clear_cublas_workspaces()
        torch.cuda.synchronize()
        self.held_bytes = (torch.cuda.memory_reserved() - reserved) + _nbytes(self.static_in)

    def __call__(self, *args, **kwargs):
        from torch.utils._pytree import tree_flatten, tree_map
        if self.note or not _can_graph(args, kwargs):  # off, or inside a capture or compile of the caller's
            return self.fn(*args, **kwargs)
        first = self.graph is None
        try:
            if first:
                self._capture(args, kwargs)
            for dst, src in zip(tree_flatten(self.static_in)[0], tree_flatten((tuple(args), dict(kwargs)))[0]):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            self.graph.replay()
            out = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.static_out)
            if first:
                direct = self.fn(*args, **kwargs)
                same = all(torch.equal(a, b) for a, b in zip(tree_flatten(out)[0], tree_flatten(direct)[0])
                           if isinstance(a, torch.Tensor))
                if not same:
                    raise RuntimeError("a replay differs from the same call run directly")
            return out
        except Exception as e:  # noqa: BLE001  (graphs are an optimization: any fault falls back to fn as is)
            self.note = f"CUDA graph off: {first_line(e, None, typed=True)}"
            self.graph, self.held_bytes = None, 0
            self.static_in = self.static_out = None
            if self.own:
                self.owner.graph_note = self.note
                self.owner._graphs.clear()
            warnings.warn(f"fact-db: {self.owner.name}: {self.note}", stacklevel=3)
            return self.fn(*args, **kwargs)


def run_at_policy(fn, policy: str, args, kwargs=None):
    """`fn(*args, **kwargs)` the way `policy` runs a float32 model: bf16/fp16 cast floating
    inputs in and the output back to the first floating input's dtype; tf32 enables TF32."""
    dt = policy_dtype(policy)
    if dt is None:
        return call_in_mode(policy, fn, args, kwargs)
    if not kwargs and all(type(x) is torch.Tensor for x in args):
        # Plain positional tensors, the common call: no pytree walk. A model timed from an idle
        # GPU pays this wrapper before its first launch; the walk cost tens of microseconds a
        # call (KernelBench L2-1 at bf16: fact-db's returned torch.compile 6% behind the same
        # compiled module called directly; benchmarks/results/raw/*-s6c3-why.log).
        floats = [x for x in args if x.is_floating_point()]
        back = floats[0].dtype if floats else torch.float32
        if any(x.dtype != dt for x in floats):
            args = tuple(x.to(dt) if x.is_floating_point() else x for x in args)
        kwargs = {}
    else:
        from torch.utils._pytree import tree_flatten
        kwargs = kwargs or {}
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor) and x.is_floating_point()]
        back = leaves[0].dtype if leaves else torch.float32
        args, kwargs = cast_floats((args, kwargs), dt)
    out = fn(*args, **kwargs)
    return cast_floats(out, back) if back != dt else out
