"""Kernels as PyTorch custom ops: `torch.ops.factdb.<name>`, registered once per process.

Every kernel class (GEMM, attention, norm, region) exposes `as_op()` through `factdb_op`:
an op named from the kernel's build key (never its path), so an artifact loaded twice, or a
kernel tuned and then loaded, reuses the first registration. Each op has a fake
implementation, so torch.compile(fullgraph=True) and torch.export trace through it.

The ops are defined with `torch.library.Library` and a CUDA implementation, not with
`torch.library.custom_op`: a composed module calls them on every forward, and custom_op's
wrapper (its autograd layer and an aliasing check on every call) cost 19.6 us a call
against 4.9 us on the H200 machine's host (benchmarks/op_dispatch.py). The kernels have no
backward: composed modules are inference only.
"""
from __future__ import annotations

_LIBS: list = []  # the Library objects: an op lives as long as its Library


def factdb_op(name: str, schema: str, impl, fake):
    """`torch.ops.factdb.<name>`: the op registered earlier under that name, or `impl` (a
    function of the schema's arguments, `(Tensor a, ...) -> Tensor`, that runs on CUDA
    tensors and returns new tensors, never its inputs) registered now with `fake` (same
    arguments, returns empty tensors of the outputs' shapes and dtypes)."""
    import torch
    existing = getattr(torch.ops.factdb, name, None)
    if existing is not None:
        return existing
    lib = torch.library.Library("factdb", "FRAGMENT")
    lib.define(name + schema)
    lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"factdb::{name}", fake, lib=lib)
    _LIBS.append(lib)
    return getattr(torch.ops.factdb, name)
