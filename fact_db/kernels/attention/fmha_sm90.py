"""The bf16/fp16 attention family on Hopper: CUTLASS example 88's warp-specialized TMA FMHA
(kernels_cpp/fmha_sm90.cu.j2), a family module of the attention tuner (fact_db/kernels/attention/tune.py;
the contract in FMHA_ABI: TEMPLATE, applies, configs, label, source).

Tiles follow example 88: head dim <= 64 runs 128x64 tiles (cooperative and ping-pong),
head dims 65..128 run the 128-wide head tile (96 padded inside the kernel by TMA's zero fill),
128x128 cooperative and ping-pong.
"""
from __future__ import annotations

from fact_db.kernels.attention.workload import AttentionWorkload

TEMPLATE = "fmha_sm90"
ELEMENT = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}
COOP = "cutlass::gemm::KernelTmaWarpSpecializedCooperative"
PINGPONG = "cutlass::gemm::KernelTmaWarpSpecializedPingpong"
MAX_INT = 2 ** 31  # the kernel's strides and extents are 32-bit


def tile_d(d: int) -> int:
    return 64 if d <= 64 else 128


def applies(w: AttentionWorkload, arch: str) -> str | None:
    """None, or why this family cannot serve `w` on `arch`."""
    if arch != "sm90a":
        return f"fmha_sm90 needs Hopper (sm90a), not {arch}"
    if w.dtype not in ELEMENT:
        return f"fmha_sm90 takes bfloat16/float16 operands, not {w.dtype} (policy {w.policy})"
    if w.d != w.dv:
        return f"fmha_sm90 needs equal q/k and v head dims, got d={w.d} dv={w.dv}"
    if w.d > 128 or w.d % 8:
        return f"fmha_sm90 covers head dims that are multiples of 8 up to 128, not {w.d}"
    if w.d < 32:
        return f"fmha_sm90 covers head dims from 32, not {w.d}"
    if w.causal and w.lq > w.lk:
        return f"fmha_sm90 causal needs lq <= lk (top-left mask), got lq={w.lq} lk={w.lk}"
    if w.lq == 1 or w.lk == 1:
        return "sequence length 1: a decode step, the library serves it"
    if w.lq % 8:
        return (f"fmha_sm90 needs a query length that is a multiple of 8 (example 88's alignment "
                f"check), got lq={w.lq}")
    if w.batch * w.heads * w.lq * w.d >= MAX_INT or w.batch * w.kv_heads * w.lk * w.d >= MAX_INT:
        return "tensors past 2^31 elements (the kernel's strides are 32-bit)"
    return None


def configs(w: AttentionWorkload, max_n: int) -> list[dict]:
    """Parameter sets, best guess first (example 88's instantiations for the head tile)."""
    el = ELEMENT[w.dtype]
    td = tile_d(w.d)
    if td == 64:
        tiles = [(128, 64, COOP), (128, 64, PINGPONG)]
    else:
        tiles = [(128, 128, COOP), (128, 128, PINGPONG)]
    out = [{"element": el, "tile_q": tq, "tile_kv": tk, "tile_d": td, "schedule": s, "causal": bool(w.causal)}
           for tq, tk, s in tiles]
    return out[:max(0, max_n)]


def label(config: dict) -> str:
    sched = "pingpong" if "Pingpong" in config["schedule"] else "coop"
    return f"fmha q{config['tile_q']} k{config['tile_kv']} hd{config['tile_d']} {sched}"


def source(w: AttentionWorkload, config: dict):
    from fact_db.kernels import build, template
    return build.Source(TEMPLATE, template.render(TEMPLATE, config), "sm90a")
