"""Precision policies: the one table (DESIGN.md, "Precision policy"), and the dtype names
every stage spells the same way.

    >>> check("bf16")
    'bf16'
    >>> POLICY_DTYPE["tf32x3"], HALF_POLICIES.get("fp32")
    ('float32', None)

A policy applies to the whole model: `bf16`/`fp16` run it in that dtype, `tf32` turns TF32
on for what stays in PyTorch, `fp32` and `tf32x3` keep IEEE float32 there. Importing this
module does not import torch; `policy_mode` and `torch_dtype` do, when called.
"""
from __future__ import annotations

import contextlib

from fact_db.core.errors import FactError

POLICIES = ("fp32", "tf32x3", "tf32", "bf16", "fp16")
# What each policy lets a kernel do, for help texts and reports.
DESCRIPTIONS = {
    "fp32": "IEEE-fp32-class results (3xTF32 with promotion on tensor cores); within 4x of eager fp32's error",
    "tf32x3": "error-compensated TF32 (three products); at most a tenth of eager tf32's error",
    "tf32": "TF32 tensor cores, fp32 accumulate; within 4x of eager with allow_tf32",
    "bf16": "the model in bfloat16, fp32 accumulate; within 4x of eager under autocast",
    "fp16": "the model in float16, fp32 accumulate; within 4x of eager under autocast",
}
# The operand dtype each policy runs.
POLICY_DTYPE = {"fp32": "float32", "tf32x3": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# The policies that run the whole model in a half-precision dtype (model.to(dtype)).
HALF_POLICIES = {"bf16": "bfloat16", "fp16": "float16"}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "float32": "float32",
                 "fp16": "float16", "half": "float16", "f16": "float16", "float16": "float16",
                 "bf16": "bfloat16", "bfloat16": "bfloat16"}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class PolicyError(FactError, ValueError):
    """A policy name that is not one of POLICIES."""


def check(policy: str) -> str:
    """`policy` itself, or PolicyError naming the policies there are."""
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy '{policy}': use one of {', '.join(POLICIES)}")
    return policy


def torch_dtype(policy: str):
    """The torch dtype a half policy runs the model in; None for the float32 policies."""
    if policy not in HALF_POLICIES:
        return None
    import torch
    return getattr(torch, HALF_POLICIES[policy])


_FLAGS: list = []  # [(get cuBLAS, get cuDNN, set cuBLAS, set cuDNN, frozen, compiling)] once looked up, or [None]


def _flag_functions():
    if not _FLAGS:
        import torch
        c = torch._C
        fs = tuple(getattr(c, f"_{op}_{lib}_allow_tf32", None) for op in ("get", "set") for lib in ("cublas", "cudnn"))
        frozen = getattr(torch.backends, "flags_frozen", None)
        _FLAGS.append(fs + (frozen, torch.compiler.is_compiling) if None not in fs and frozen is not None else None)
    return _FLAGS[0]


def call_in_mode(policy: str, fn, args=(), kwargs=None):
    """`fn(*args, **kwargs)` under `policy_mode(policy)`, the flags read and set straight through
    torch._C: a composed module at a float32 policy enters this on every call, and PyTorch's
    defaults (cuDNN's TF32 on, cuBLAS's off) never match fp32's, so the flags are set and
    restored each time. Through the context manager that cost 2.5 us of host time a call (a
    0.12 ms model timed from an idle GPU pays it in full); here about a tenth of it."""
    fs = _flag_functions()
    # a torch without them, flags frozen, or traced by Dynamo (which follows torch.backends'
    # flags, not torch._C's): as torch.backends sets them
    if fs is None or fs[5]() or fs[4]():
        with policy_mode(policy):
            return fn(*args, **(kwargs or {}))
    get_blas, get_dnn, set_blas, set_dnn, _, _ = fs
    tf32 = policy == "tf32"
    old = get_blas(), get_dnn()
    if old == (tf32, tf32):
        return fn(*args, **(kwargs or {}))
    set_blas(tf32)
    set_dnn(tf32)
    try:
        return fn(*args, **(kwargs or {}))
    finally:
        set_blas(old[0])
        set_dnn(old[1])


@contextlib.contextmanager
def policy_mode(policy: str):
    """torch's matmul precision set for `policy` (fp32 and tf32x3: IEEE fp32; tf32: TF32).
    Flags that already match are only read: a composed module enters this on every call."""
    import torch
    mm, dnn = torch.backends.cuda.matmul, torch.backends.cudnn
    old = (mm.allow_tf32, dnn.allow_tf32)
    tf32 = policy == "tf32"
    if old == (tf32, tf32):
        yield
        return
    mm.allow_tf32 = dnn.allow_tf32 = tf32
    try:
        yield
    finally:
        mm.allow_tf32, dnn.allow_tf32 = old
