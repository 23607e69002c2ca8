"""The Inductor and dynamo features fact-db's torch.compile backend relies on, in one module:
they are private APIs, so a torch upgrade that moves them fails tests/test_backend.py (which
calls `missing()`), not a user.

    >>> compiled = compile_graph(gm, example_inputs, key="...")   # Inductor, with fact-db's pass in its cache key
    >>> missing()                                                  # [] where every feature is there
    []

TESTED lists the torch versions tests/test_backend.py passed on: 2.13 (CPU, CI) and 2.11 (the
H200 host, 2026-11-26). A new torch gets added once the backend's tests pass on it (test_backend fails on a torch not
listed, so an untried version is found by a test, not by a user). The features:

- `torch._inductor.compile_fx.compile_fx(gm, example_inputs, config_patches=...)`: compiles
  the graph fact-db rewrote; Inductor fuses everything around the kernels' ops.
- `torch._inductor.custom_graph_pass.CustomGraphPass` installed as the config's
  `post_grad_custom_post_pass`: its `uuid()` enters the FX graph cache key (a pass without one
  makes the cache bypass the graph), so a cached graph is never served across fact-db
  versions, rules, registry rows or policies.
- `torch._inductor.list_mode_options(mode)`: a torch.compile mode as Inductor config.
- custom ops with fake implementations and the `needs_exact_strides` tag (fact_db/kernels/ops.py):
  Inductor runs them as fallback kernels and plans the memory around their outputs.
- `torch._dynamo.utils.counters["graph_break"]`: the graph breaks a compile report lists.
- dynamo's backend registry: the `torch_dynamo_backends` entry point group and
  `torch._dynamo.register_backend`; a backend is called as `backend(gm, example_inputs,
  options=..., mode=...)` with the graph's inputs (parameters included) as real tensors and
  SymInts where shapes are dynamic, and its graph arguments carry `meta["grapharg"].source`.
"""
from __future__ import annotations

TESTED = ("2.11", "2.13")  # torch versions tests/test_backend.py passed on: 2.11 on the H200 host (2026-11-26), 2.13 in CI

_FEATURES = (
    ("torch._inductor.compile_fx", "compile_fx"),
    ("torch._inductor.custom_graph_pass", "CustomGraphPass"),
    ("torch._inductor", "list_mode_options"),
    ("torch._inductor.config", "post_grad_custom_post_pass"),
    ("torch._dynamo.utils", "counters"),
    ("torch._dynamo", "register_backend"),
    ("torch._dynamo.backends.registry", "lookup_backend"),
    ("torch._dynamo.source", "ParamBufferSource"),
)


def missing() -> list[str]:
    """The features above that this torch lacks, as `module.name`; [] where all are there.
    (That dynamo's graph arguments carry `meta["grapharg"].source` needs a compile to see:
    tests/test_backend.py checks it.)"""
    import importlib
    out = []
    for mod, name in _FEATURES:
        try:
            if not hasattr(importlib.import_module(mod), name):
                out.append(f"{mod}.{name}")
        except ImportError:
            out.append(f"{mod}.{name}")
    import torch

    from fact_db.kernels.ops import STRIDE_TAGS  # the layout tag kernel ops carry
    if not any(hasattr(torch.Tag, t) for t in STRIDE_TAGS):
        out.append("torch.Tag." + " or ".join(STRIDE_TAGS))
    return out


def _key_pass(key: str):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class FactdbKey(CustomGraphPass):
        """Lists the fact-db kernel ops that reached Inductor's post-grad graph; its uuid is
        what fact-db's rewrite depended on, part of the FX graph cache key."""

        def __init__(self):
            self.ops: list = []

        def __call__(self, graph) -> None:
            self.ops = sorted({str(n.target) for n in graph.nodes
                               if n.op == "call_function" and str(n.target).startswith("factdb.")})

        def uuid(self):
            return key
    return FactdbKey()


def compile_graph(gm, example_inputs, *, key: str | None = None, mode: str | None = None, patches=None):
    """`gm` compiled by Inductor for `example_inputs` (a callable taking them positionally),
    under torch.compile `mode` and Inductor config `patches`; `key` (fact-db's cache key, see
    backend.cache_key) goes into Inductor's FX graph cache key through a post-grad pass."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    config = dict(list_mode_options(mode)) if mode and mode != "default" else {}
    config.update(patches or {})
    if key is not None:
        config["post_grad_custom_post_pass"] = _key_pass(key)
    return compile_fx(gm, list(example_inputs), config_patches=config)


def graph_breaks() -> dict:
    """Reason -> count of every graph break dynamo has recorded in this process."""
    from torch._dynamo.utils import counters
    return dict(counters["graph_break"])


def source_name(node) -> str:
    """The dynamo source of a graph input (`L['self']._modules['fc']._parameters['weight']`), or ""."""
    arg = node.meta.get("grapharg")
    src = getattr(arg, "source", None)
    name = getattr(src, "name", "") if src is not None else ""
    return name() if callable(name) else str(name or "")
