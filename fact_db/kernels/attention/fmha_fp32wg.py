"""fp32-accurate attention on Hopper's TF32 wgmma: the `fmha_fp32wg_sm90` family (FMHA_ABI).

A flash-attention forward (kernels_cpp/fmha_fp32wg_sm90.cu.j2) whose products run on warpgroup
wgmma instead of `fmha_fp32tc`'s warp-level mma.sync: TF32 wgmma reads only K-major operands,
so a pass before the kernel writes V transposed (keys contiguous) into the workspace; S = Q K^T
reads both operands from shared memory (SS wgmma), P V takes P from registers (RS wgmma).
`split_in_smem` (the configs tried first) computes the TF32 low parts of Q, K and V in shared
memory and reads q and k as they are where they are 16-byte aligned; without it, or for
unaligned q and k, the pass writes padded Q and K (and their low parts) too. 3xTF32 under
`fp32` and `tf32x3` (the small products first), one rounded TF32 product under `tf32`; softmax
in fp32. Under `fp32` Q K^T is promoted every 32 of the head dim (each chunk its own
accumulator) and P V every key tile. The `warp_specialized` configs come first (`_ws`: a
producer warpgroup copies and splits each tile's K and V into its stage and hands each over on
its own mbarrier, consumer warpgroups compute with no block-wide barrier and, two of them, take
turns at the tensor cores; one K/V stage where two do not fit, which lets 64-key tiles fit at
head dim 96), K and V by TMA first (`tma_kv`: one producer thread issues a tile's 128-byte
column boxes into the swizzled stage and the producer's threads only split once the tile's
bytes have arrived; cp.async where a tensor map cannot be encoded), then V by TMA as v stores
it (`v_direct`: into a staging tile the producer's threads transpose and split, no pass over V;
the pass where v's rows are not 16-byte aligned), then the configs without a producer.

>>> w = AttentionWorkload(128, 8, 8, 512, 512, 96, 96, causal=True)
>>> applies(w, "sm90a") is None
True
>>> label(configs(w, 4)[0])
'fmha_fp32wg q128 k64 hd96 p32 smemsplit ws kv1 tma vd'
"""
from __future__ import annotations

from fact_db.kernels import template
from fact_db.kernels.attention import fp32_family
from fact_db.kernels.attention.workload import AttentionWorkload
from fact_db.kernels.build import Source

TEMPLATE = "fmha_fp32wg_sm90"
POLICIES = fp32_family.POLICIES
HEAD_DIMS = fp32_family.HEAD_DIMS
MAX_HEAD_DIM = fp32_family.MAX_HEAD_DIM
ARCHES = ("sm90a",)          # wgmma
PROMOTE = {"fp32": (32,), "tf32x3": (0, 32), "tf32": (0,)}
TERMS = {"fp32": 3, "tf32x3": 3, "tf32": 1}
# (block_m, block_n): a consumer warpgroup per 64 query rows, keys per pipelined tile; best first
# as measured at minGPT's and the Llama decoder's shapes (benchmarks/results/*-2026-11-28-fmha-fp32tc.json),
# 64-key tiles first where they fit: at head dim 64 (128 rows) 1.090 ms against 1.282 for 32 keys
# (raw/h200-2026-11-28-s17a-fmha-ws.json; Q K^T's n32 products are bound by shared-memory reads of Q)
TILES = ((128, 64), (128, 32), (64, 64), (64, 32))
SMEM_LIMIT = 227 * 1024
# v_direct ranks before tma_kv where each V tile is read by at most this many CTAs (query heads a
# KV head x query blocks): its producer transposes every tile it reads where the pass did each
# once. Measured (raw/h200-2026-11-29-s25c-fmha-ws.json): 4 readers (minGPT's shape) 6% faster,
# 8 (head dim 64, 1024 rows) 2-5% slower, 64 (the Llama decoder's) 12-19% slower.
VD_MAX_READERS = 4


def smem_bytes(config: dict) -> int:
    """The template's kSmemBytes: every warpgroup's Q rows and two K/V stages, raw and (three
    products) low parts, or with split_in_smem raw stages and one tile of low parts (with
    warp_specialized `kv_stages` stages, each its own low parts, and twelve mbarriers; with
    `v_direct` V's staging tile and a thirteenth, rounded to 16 bytes); plus 1 KB to align the
    128-byte swizzle to 1024 bytes."""
    parts = 1 if config.get("terms", 3) == 1 else 2
    smem_split = parts == 2 and config.get("split_in_smem", 0)
    ws = bool(smem_split and config.get("warp_specialized", 0))
    stages = config.get("kv_stages", 2) if ws else 2
    stage_parts = 1 if smem_split and not ws else parts
    hd, hdv, bm, bn = config["head_dim"], config["head_dim_v"], config["block_m"], config["block_n"]
    kv_tile = bn * hd + hdv * bn
    lo = kv_tile if smem_split and not ws else 0
    vs = bn * hdv if ws and config.get("v_direct") else 0
    return 4 * (parts * bm * hd + stages * stage_parts * kv_tile + lo + vs) + 1024 + ((112 if vs else 96) if ws else 0)


def _ws(plain: dict) -> dict | None:
    """The warp-specialized config of a split_in_smem config's tile (a producer warpgroup copying
    and splitting, consumers on mbarriers), with two K/V stages where they fit, else one
    (`kv_stages`: K refilled while the consumers read V), with turns at the tensor cores
    (`pingpong`) where there are two consumers (block_m 128); None where neither fits."""
    c = next((c for c in (dict(plain, warp_specialized=1, kv_stages=n) for n in (2, 1))
              if smem_bytes(c) <= SMEM_LIMIT), None)
    return dict(c, pingpong=1) if c and c["block_m"] == 128 else c


def warp_specialized(w: AttentionWorkload, max_n: int) -> list[dict]:
    """The warp-specialized configs of the first `max_n` tiles that fit, those with two consumers
    with turns (as `configs` offers them) and without, each with K and V by cp.async, by TMA, and
    with V by TMA as stored where its staging tile fits; and the TMA ones again with the next
    tile's K copied early (`k_early`, not offered to the tuner until a GPU run has timed it): for
    the check script and the GPU tests."""
    out = []
    for tile in _plain(w):
        if not tile["split_in_smem"] or len({(o["block_m"], o["block_n"]) for o in out}) >= max(0, max_n):
            continue
        c = _ws(tile)
        if c is not None:
            out += [c, {k: v for k, v in c.items() if k != "pingpong"}] if c.get("pingpong") else [c]
            tma, vd = _tma(_turns_first(c))   # both turns
            out += tma + vd + [dict(x, k_early=1) for x in tma + vd]
    return out


def applies(w: AttentionWorkload, arch: str) -> str | None:
    """None when this family can serve `w` on `arch`, else why not."""
    return fp32_family.refusal(w, arch, "fmha_fp32wg", ARCHES, "TF32 wgmma (sm90a)")


def _plain(w: AttentionWorkload) -> list[dict]:
    """The configs without a producer, whether they fit shared memory or not (a tile may fit only
    with a producer's one K/V stage): the policy's promotion, then the tiles in TILES order, the
    low parts split in shared memory first."""
    hd, hdv = fp32_family.padded(w.d), fp32_family.padded(w.dv)
    return [{"head_dim": hd, "head_dim_v": hdv, "block_m": bm, "block_n": bn, "promote_k": promote,
             "terms": TERMS[w.policy], "split_in_smem": smem_split}
            for promote in PROMOTE.get(w.policy, ()) for bm, bn in TILES
            for smem_split in ((1, 0) if TERMS[w.policy] == 3 else (0,))]


def _turns_first(ws: dict) -> list[dict]:
    """A warp-specialized config with two consumers, with and without turns (`pingpong`), the
    one measured faster first: without turns where K and V have one stage (0.3-0.8% at
    minGPT's shape, 1.5-2.7% at the Llama decoder's, in each of five H200 runs since the lean
    softmax: raw/h200-2026-11-29-s2{1c,2c,3a,3b,3c}-*.json), with them where they have two
    (0.8-1% at head dim 64, four of the five)."""
    if not ws.get("pingpong"):
        return [ws]
    without = {k: v for k, v in ws.items() if k != "pingpong"}
    return [without, ws] if ws.get("kv_stages", 2) == 1 else [ws, without]


def _tma(ws: list[dict]) -> tuple[list[dict], list[dict]]:
    """The warp-specialized configs `ws` with K and V by TMA, and with V by TMA as stored too where
    its staging tile fits."""
    tma = [dict(x, tma_kv=1) for x in ws]
    return tma, [x for x in (dict(x, v_direct=1) for x in tma) if smem_bytes(x) <= SMEM_LIMIT]


def v_readers(w: AttentionWorkload, block_m: int) -> int:
    """The CTAs that read each V tile: the query heads sharing its KV head times the query blocks."""
    return w.heads // w.kv_heads * -(-w.lq // block_m)


def configs(w: AttentionWorkload, max_n: int) -> list[dict]:
    """Parameter sets, best guess first: per promotion and tile (TILES order), the
    warp-specialized configs (three products: `_ws`) with K and V by TMA (`tma_kv`), then those
    with V by TMA as it is stored (`v_direct`) where its staging tile fits (alternating with
    them, first, where few CTAs read each V tile: `VD_MAX_READERS`), then the same
    without either, each with and without turns in the order `_turns_first` gives, then those
    without a producer. Measured on an H200 (raw/h200-2026-11-28-s18a-fmha-ws.json, the lean
    softmax), the warp-specialized config was the fastest at every head dim: 1.199 ms against
    1.355 at minGPT's shape (64-key tiles, one K/V stage), 1.197 against 1.399 at the Llama
    decoder's (128 rows, one stage), 0.900 against 1.100 at head dim 64; and with K and V by TMA
    (raw/h200-2026-11-29-s24a-fmha-ws.json) 0.940 against 1.206, 0.972 against 1.171 and 0.761
    against 0.903. V as v stores it (`v_direct`, no pass over V) was measured 0.877-0.883 ms against 0.931-0.939 at minGPT's shape, but slower at the
    Llama decoder's (1.09-1.12 against 0.98) and at head dim 64 (0.775-0.790 against
    0.752-0.761; raw/h200-2026-11-29-s25c-fmha-ws.json): every CTA transposes the V tiles it
    reads where the pass did each once, which pays only where the pass's trip through memory
    costs more (the Llama decoder's V is a quarter of its Q, four query heads a KV head), so
    it ranks first only where each V tile has few readers; the tuner times both."""
    out = []
    for c in _plain(w):
        ws = _ws(c) if c["split_in_smem"] else None
        both = _turns_first(ws) if ws is not None else []
        tma, vd = _tma(both)
        if vd and v_readers(w, c["block_m"]) <= VD_MAX_READERS:   # V direct and TMA alternate, V direct first
            tma = [x for pair in zip(vd, tma) for x in pair]
            vd = []
        out += [x for x in tma + vd + both if x not in out]
        out += [c] if smem_bytes(c) <= SMEM_LIMIT else []
    return out[:max(0, max_n)]


def label(config: dict) -> str:
    hd = f"hd{config['head_dim']}" + (f"/{config['head_dim_v']}" if config["head_dim_v"] != config["head_dim"] else "")
    terms = " 1xTF32" if config.get("terms", 3) == 1 else ""
    split = " smemsplit" if config.get("split_in_smem") else ""
    split += " ws" if config.get("warp_specialized") else ""
    split += " kv1" if config.get("warp_specialized") and config.get("kv_stages", 2) == 1 else ""
    split += " pp" if config.get("pingpong") else ""
    split += " tma" if config.get("tma_kv") else ""
    split += " vd" if config.get("v_direct") else ""
    split += " ke" if config.get("k_early") else ""
    return f"fmha_fp32wg q{config['block_m']} k{config['block_n']} {hd} p{config['promote_k']}{split}{terms}"


def source(w: AttentionWorkload, config: dict) -> Source:
    return Source(TEMPLATE, template.render(TEMPLATE, config), arch="sm90a")
