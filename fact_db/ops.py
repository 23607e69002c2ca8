"""Kernels as PyTorch custom ops: `torch.ops.factdb.<name>`, registered once per process.

Every kernel class (GEMM, attention, norm, region) exposes `as_op()` through `factdb_op`:
an op named from the kernel's build key (never its path), so an artifact loaded twice, or a
kernel tuned and then loaded, reuses the first registration. Each op has a fake
implementation, so torch.compile(fullgraph=True) and torch.export trace through it.
"""
from __future__ import annotations


def factdb_op(name: str, schema: str, impl, fake):
    """`torch.ops.factdb.<name>`: the op registered earlier under that name, or `impl` (a
    function of the schema's arguments that runs on CUDA tensors) registered now with `fake`
    (same arguments, returns empty tensors of the outputs' shapes and dtypes)."""
    import torch
    existing = getattr(torch.ops.factdb, name, None)
    if existing is not None:
        return existing
    op = torch.library.custom_op(f"factdb::{name}", impl, mutates_args=(), device_types="cuda", schema=schema)
    op.register_fake(fake)
    return getattr(torch.ops.factdb, name)
