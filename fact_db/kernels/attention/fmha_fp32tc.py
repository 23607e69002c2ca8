"""fp32-accurate attention on TF32 tensor cores: the `fmha_fp32tc_sm90` family (FMHA_ABI).

A flash-attention forward (kernels_cpp/fmha_fp32tc_sm90.cu.j2), K/V tiles pipelined through
shared memory with cp.async: both products on TF32 tensor cores (warp-level mma.sync m16n8k8) with each operand split into a TF32 high and low
part and three products (3xTF32), softmax in fp32 registers. As for `gemm_fp32tc_sm90`'s
`split3`, the `fp32` policy adds the tensor cores' partial sums into fp32 registers every
32 of k (`promote_k`), `tf32x3` every 64 (or never, promote_k=0, as the fastest variant).
Under the `tf32` policy the kernel makes one TF32 product (`terms=1`, no low parts), as
cuBLAS and PyTorch's explicit attention do with TF32 on; softmax stays in fp32.

>>> w = AttentionWorkload(128, 8, 8, 512, 512, 96, 96, causal=True)
>>> applies(w, "sm90a") is None
True
>>> label(configs(w, 4)[0])
'fmha_fp32tc q128 k32 hd96 p32'
"""
from __future__ import annotations

from fact_db.kernels import template
from fact_db.kernels.attention import fp32_family
from fact_db.kernels.attention.workload import AttentionWorkload
from fact_db.kernels.build import Source

TEMPLATE = "fmha_fp32tc_sm90"
POLICIES = fp32_family.POLICIES
HEAD_DIMS = fp32_family.HEAD_DIMS
MAX_HEAD_DIM = fp32_family.MAX_HEAD_DIM
ARCHES = ("sm90a", "sm90", "sm80")
# promotion every k per policy (README, gemm_fp32tc_sm90): fp32 32, tf32x3 64 or none
PROMOTE = {"fp32": (32, 16), "tf32x3": (64, 0, 32), "tf32": (0,)}
TERMS = {"fp32": 3, "tf32x3": 3, "tf32": 1}  # TF32 products per pair of operands
# (block_m, block_n): query rows per CTA (a warp per 16) and keys per pipelined tile
# best first, as measured on an H200 at minGPT's shape (benchmarks/results/h200-2026-11-25-fmha-fp32tc.json)
TILES = ((128, 32), (64, 32), (128, 64), (64, 64))


SMEM_LIMIT = 227 * 1024  # an sm90 CTA's dynamic shared memory


def smem_bytes(config: dict) -> int:
    """Shared memory of a config (the template's kSmemFloats): the Q tile, two K/V stages, and
    with presplit one more K/V tile for the low parts; rows padded by 4 floats."""
    q, k, v = config["head_dim"] + 4, config["head_dim"] + 4, config["head_dim_v"] + 4
    bm, bn = config.get("block_m", 64), config["block_n"]
    return 4 * (bm * q + (2 + (1 if config.get("presplit") else 0)) * bn * (k + v))


def applies(w: AttentionWorkload, arch: str) -> str | None:
    """None when this family can serve `w` on `arch`, else why not."""
    return fp32_family.refusal(w, arch, "fmha_fp32tc", ARCHES, "TF32 mma.sync (sm80 or newer)")


def configs(w: AttentionWorkload, max_n: int) -> list[dict]:
    """Parameter sets, best guess first: the policy's promotion first, then the tiles in TILES
    order, each split per warp and once per CTA (presplit); those past the shared memory left out."""
    hd, hdv = fp32_family.padded(w.d), fp32_family.padded(w.dv)
    out = []
    for promote in PROMOTE.get(w.policy, ()):
        for bm, bn in TILES:
            # per-warp splits measured faster: presplit halves the CTAs per SM; one term has no
            # low parts to split ahead
            for presplit in ((0, 1) if TERMS[w.policy] == 3 else (0,)):
                c = {"head_dim": hd, "head_dim_v": hdv, "block_m": bm, "block_n": bn, "presplit": presplit,
                     "promote_k": promote}
                if TERMS[w.policy] != 3:
                    c["terms"] = TERMS[w.policy]
                if smem_bytes(c) <= SMEM_LIMIT:
                    out.append(c)
    return out[:max(0, max_n)]


def label(config: dict) -> str:
    hd = f"hd{config['head_dim']}" + (f"/{config['head_dim_v']}" if config["head_dim_v"] != config["head_dim"] else "")
    split = " presplit" if config.get("presplit") else ""
    terms = " 1xTF32" if config.get("terms", 3) == 1 else ""
    return f"fmha_fp32tc q{config.get('block_m', 64)} k{config['block_n']} {hd} p{config['promote_k']}{split}{terms}"


def source(w: AttentionWorkload, config: dict) -> Source:
    arch = "sm90a"
    return Source(TEMPLATE, template.render(TEMPLATE, config), arch=arch)
