"""What the two fp32 attention families (`fmha_fp32tc`, mma.sync; `fmha_fp32wg`, wgmma) share:
the head dims they build and pad up to, and the workloads both refuse.

>>> padded(80)
96
>>> refusal(AttentionWorkload(1, 1, 1, 1, 64, 64, 64), "sm90a", "fmha_fp32wg", ("sm90a",), "TF32 wgmma (sm90a)")
'sequence length 1: the library serves it'
"""
from __future__ import annotations

from fact_db.kernels.attention.workload import AttentionWorkload

POLICIES = ("fp32", "tf32x3", "tf32")
HEAD_DIMS = (64, 96, 128)    # padded head dims the families build; smaller d pads up inside the kernel
MAX_HEAD_DIM = HEAD_DIMS[-1]


def padded(dim: int) -> int:
    """The head dim a build serves `dim` with (-1 past the largest)."""
    for hd in HEAD_DIMS:
        if dim <= hd:
            return hd
    return -1


def refusal(w: AttentionWorkload, arch: str, family: str, arches: tuple, needs: str) -> str | None:
    """None when a family built for `arches` can serve `w` on `arch`, else why not (`needs`
    names what the family needs of the GPU)."""
    if w.policy not in POLICIES:
        return f"{family} serves the {', '.join(POLICIES)} policies, not {w.policy}"
    if arch not in arches:
        return f"{family} needs {needs}, not arch {arch}"
    if w.d > MAX_HEAD_DIM or w.dv > MAX_HEAD_DIM:
        return f"head dim {w.d}/{w.dv} above {MAX_HEAD_DIM}, the largest {family} builds"
    if w.lq < 2 or w.lk < 2:
        return "sequence length 1: the library serves it"
    if w.batch * w.heads > 65535:
        return f"batch*heads={w.batch * w.heads} above the grid limit 65535"
    return None
