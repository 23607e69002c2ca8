"""Kernels as PyTorch custom ops: `torch.ops.factdb.<name>`, registered once per process.

Every kernel class (GEMM, attention, norm, region) exposes `as_op()` through `factdb_op`:
an op named from the kernel's build key (never its path), so an artifact loaded twice, or a
kernel tuned and then loaded, reuses the first registration. Each op has a fake
implementation giving the real output's shape, dtype and strides, so torch.compile
(Inductor included) and torch.export trace through it and plan the memory around it;
tests/test_ops.py runs `torch.library.opcheck` on every schema in SCHEMAS.

    >>> op = factdb_op("k_0123abcd", SCHEMAS["gemm"], run, gemm_fake(torch.float32))

The ops are defined with `torch.library.Library` and a CUDA implementation, not with
`torch.library.custom_op`: a composed module calls them on every forward, and custom_op's
wrapper (its autograd layer and an aliasing check on every call) cost 19.6 us a call
against 4.9 us on the H200 machine's host (benchmarks/op_dispatch.py). The kernels have no
backward: composed modules are inference only.
"""
from __future__ import annotations

_LIBS: list = []  # the Library objects: an op lives as long as its Library

# The schema of each kind of kernel op (the kernel modules register theirs with these).
SCHEMAS = {
    "gemm": "(Tensor a, Tensor b, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor",
    "gemm_blo": "(Tensor a, Tensor b, Tensor b_lo, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor",
    "swiglu": "(Tensor a, Tensor b, Tensor? b_lo, SymInt n) -> Tensor",
    "attention": "(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> Tensor",
    "norm": "(Tensor x, Tensor? r, Tensor weight, Tensor? bias) -> (Tensor, Tensor)",
    "region": "(Tensor[] inputs) -> Tensor",
}


# The layout tag kernel ops carry, by the names torch has had for it: the first this torch has
# (needs_fixed_stride_order before torch 2.7). pipeline/inductor.py checks one of them exists.
STRIDE_TAGS = ("needs_exact_strides", "needs_fixed_stride_order")


def layout_tags() -> tuple:
    """The tag every kernel op carries: Inductor passes its inputs with exactly the strides
    they had when traced. A kernel was tuned and verified for the operand layouts its
    registry key names; an input in a layout Inductor chose instead would cost a copy inside
    the op, or a launch the kernel refuses."""
    import torch
    return (next(getattr(torch.Tag, t) for t in STRIDE_TAGS if hasattr(torch.Tag, t)),)


def factdb_op(name: str, schema: str, impl, fake, *, dispatch: str = "CUDA"):
    """`torch.ops.factdb.<name>`: the op registered earlier under that name, or `impl` (a
    function of the schema's arguments, `(Tensor a, ...) -> Tensor`, that returns new tensors,
    never its inputs) registered now for the `dispatch` key (the kernels run on CUDA; an op
    that only calls other ops registers for CompositeExplicitAutograd, every device) with
    `fake` (same arguments, returns empty tensors of the outputs' shapes, dtypes and strides)."""
    import torch
    existing = getattr(torch.ops.factdb, name, None)
    if existing is not None:
        return existing
    lib = torch.library.Library("factdb", "FRAGMENT")
    lib.define(name + schema, tags=layout_tags())
    lib.impl(name, impl, dispatch)
    torch.library.register_fake(f"factdb::{name}", fake, lib=lib)
    _LIBS.append(lib)
    return getattr(torch.ops.factdb, name)
