"""Impl: how one region runs in a composed module -- the hand-off from realization (which
decides it) to composition (which puts its op into the graph) and the artifact (which
records it and loads it again).

    >>> Impl.eager("no candidate verified").kind
    'eager'
    >>> Impl("gemm", "library: cuBLAS addmm", op, {"library": "cublas"}).library
    True

Kinds: `eager` (the region's own nodes stay), `gemm` (a GEMM-family kernel's op
`(a, b, bias, c, alpha, beta) -> d`), `attention` (an op `(q, k, v, scale, causal) -> o` in
SDPA's layout: a CUTLASS kernel or an SDPA backend forced), `sdpa`
(`aten.scaled_dot_product_attention` itself, PyTorch choosing the backend), `norm` (add_norm's
op `(x, r, weight, bias) -> (y, sum)`), `conv` (a convolution kernel's op `(x, w, bias, vecs,
residual) -> y`, y channels-last, see fact_db/kernels/conv/kernel.py) and `region` (a kernel the agent proposed: `op([inputs])
-> out`). `record` holds what an artifact needs to load it again.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Impl:
    """How one region runs in the composed module."""

    kind: str                  # eager | gemm | attention | sdpa | norm | conv | region
    label: str = ""            # what runs, for the report
    op: object = None          # the torch op for gemm / attention
    record: dict = field(default_factory=dict)  # what an artifact needs to load it again
    note: str = ""
    # A GEMM kernel that can take B's lo parts made once (kernel.GemmKernel.takes_b_lo): the op
    # `(a, b, b_lo, bias, c, alpha, beta) -> d` and `split_lo(b) -> b_lo`. Where B is a weight,
    # the rewrite splits it once into a buffer, and no call splits it again.
    op_lo: object = None
    split_lo: object = None

    @classmethod
    def eager(cls, note: str = "") -> Impl:
        return cls("eager", "eager PyTorch", note=note)

    @classmethod
    def gemm_kernel(cls, kernel, label: str, record: dict) -> Impl:
        """The Impl of a loaded kernel.GemmKernel (as tuned, or as an artifact loads it)."""
        lo = kernel.takes_b_lo
        return cls("gemm", label, kernel.as_op(), record, op_lo=kernel.as_op(b_lo=True) if lo else None,
                   split_lo=kernel.split_lo if lo else None)

    @property
    def library(self) -> bool:
        """The region runs a library path (cuBLAS, an SDPA backend), not a fact-db kernel."""
        return self.kind == "sdpa" or bool(self.record.get("library"))

    @property
    def kernel(self) -> bool:
        """The region runs a kernel fact-db built (CUTLASS, its own, or the agent's)."""
        return self.kind != "eager" and not self.library


def stored(record: dict) -> dict:
    """An artifact's implementation entry without what the Impl holds itself (kind, label,
    note): the record a loaded Impl carries, and saves again."""
    return {x: record[x] for x in record if x not in ("kind", "label", "note")}
