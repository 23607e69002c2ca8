"""The fmha_fp32wg family module (FMHA_ABI, wgmma): which workloads it serves, its configs per
policy and their shared memory, labels, and the rendered source (no GPU needed)."""
from __future__ import annotations

import re

import pytest

from fact_db.kernels.attention import fmha_fp32wg
from fact_db.kernels.attention.workload import AttentionWorkload

MINGPT = AttentionWorkload(128, 8, 8, 512, 512, 96, 96, causal=True)
LLAMA = AttentionWorkload(4, 16, 4, 2048, 2048, 128, 128, causal=True)


@pytest.mark.parametrize("policy", ["fp32", "tf32x3", "tf32"])
def test_applies_to_the_fp32_class_policies_on_sm90a(policy):
    assert fmha_fp32wg.applies(MINGPT.with_(policy=policy), "sm90a") is None
    assert fmha_fp32wg.applies(LLAMA.with_(policy=policy), "sm90a") is None


@pytest.mark.parametrize("w,arch,why", [
    (MINGPT.with_(policy="bf16", dtype=""), "sm90a", "bf16"),
    (MINGPT, "sm80", "wgmma"),
    (MINGPT, "sm90", "wgmma"),
    (MINGPT.with_(d=160, dv=160), "sm90a", "160"),
    (MINGPT.with_(lk=1), "sm90a", "sequence length 1"),
    (MINGPT.with_(batch=70000), "sm90a", "65535"),
])
def test_refuses_with_a_reason(w, arch, why):
    reason = fmha_fp32wg.applies(w, arch)
    assert reason and why in reason


def test_fp32_always_promotes_and_tf32_makes_one_product():
    fp32 = fmha_fp32wg.configs(MINGPT, 99)
    assert fp32[0] == {"head_dim": 96, "head_dim_v": 96, "block_m": 128, "block_n": 64, "promote_k": 32, "terms": 3,
                       "split_in_smem": 1, "warp_specialized": 1, "kv_stages": 1, "tma_kv": 1, "v_direct": 1}
    assert {c["split_in_smem"] for c in fp32} == {0, 1}
    assert {c["promote_k"] for c in fp32} == {32} and {c["terms"] for c in fp32} == {3}
    tf32x3 = fmha_fp32wg.configs(MINGPT.with_(policy="tf32x3"), 99)
    assert tf32x3[0]["promote_k"] == 0 and {c["promote_k"] for c in tf32x3} == {0, 32}
    tf32 = fmha_fp32wg.configs(MINGPT.with_(policy="tf32"), 99)
    assert tf32 and all(c["terms"] == 1 and c["promote_k"] == 0 and not c["split_in_smem"] for c in tf32)
    assert len(fmha_fp32wg.configs(MINGPT, 1)) == 1 and fmha_fp32wg.configs(MINGPT, 0) == []


def test_configs_fit_shared_memory_and_leave_out_those_that_do_not():
    """Two stages of K/V raw and low parts beside every warpgroup's Q: at head dim 128 three
    products fit 32-key tiles only, 128 rows only with the low parts split in shared memory; one
    product (tf32) fits every tile."""
    for w in (MINGPT, LLAMA, MINGPT.with_(d=64, dv=64)):
        for policy in fmha_fp32wg.POLICIES:
            for c in fmha_fp32wg.configs(w.with_(policy=policy), 99):
                assert fmha_fp32wg.smem_bytes(c) <= fmha_fp32wg.SMEM_LIMIT
    plain = [c for c in fmha_fp32wg.configs(LLAMA, 99) if not c.get("warp_specialized")]
    assert [(c["block_m"], c["block_n"], c["split_in_smem"]) for c in plain] == [(128, 32, 1), (64, 32, 1), (64, 32, 0)]
    assert len(fmha_fp32wg.configs(LLAMA.with_(policy="tf32"), 99)) == len(fmha_fp32wg.TILES)
    # the template's sums: 2 parts x (128 x 96 Q + 2 stages x (32 x 96 K + 96 x 32 V)) floats + 1 KB;
    # split in shared memory: the stages raw only, and one tile of low parts
    c = [c for c in fmha_fp32wg.configs(MINGPT, 99) if not c.get("warp_specialized")]
    assert fmha_fp32wg.smem_bytes(c[1]) == 4 * 2 * (128 * 96 + 2 * 2 * 32 * 96) + 1024
    assert fmha_fp32wg.smem_bytes(c[0]) == 4 * (2 * 128 * 96 + 2 * 2 * 32 * 96 + 2 * 32 * 96) + 1024


def test_head_dims_pad_up_to_whole_128_byte_rows():
    c = fmha_fp32wg.configs(MINGPT.with_(d=80, dv=40), 1)[0]
    assert (c["head_dim"], c["head_dim_v"]) == (96, 64)


def test_labels_are_distinct():
    """Distinct configs, distinct labels (fp32's promoted configs are also tf32x3's: the same kernel)."""
    configs = [c for p in fmha_fp32wg.POLICIES for c in fmha_fp32wg.configs(MINGPT.with_(policy=p), 99)]
    distinct = {tuple(sorted(c.items())) for c in configs}
    assert len({fmha_fp32wg.label(c) for c in configs}) == len(distinct) > 6
    assert fmha_fp32wg.label(fmha_fp32wg.configs(MINGPT, 1)[0]) == "fmha_fp32wg q128 k64 hd96 p32 smemsplit ws kv1 tma vd"


def test_source_renders_the_abi_with_the_config():
    c = next(c for c in fmha_fp32wg.configs(LLAMA.with_(policy="tf32x3"), 99) if not c.get("warp_specialized"))
    src = fmha_fp32wg.source(LLAMA, c)
    assert src.template == "fmha_fp32wg_sm90" and src.arch == "sm90a"
    assert re.search(r"\bint fact_fmha_fp32wg_sm90_launch\(", src.code)
    assert "size_t fact_fmha_fp32wg_sm90_workspace_size(" in src.code
    assert "kHeadDim = 128;" in src.code and "kBlockM = 128;" in src.code and "kBlockN = 32;" in src.code
    assert "kSmemSplit = true &&" in src.code
    assert "kPromoteK = 0;" in src.code and "kOneTerm = false;" in src.code
    assert "ss_op_selector" in src.code and "rs_op_selector" in src.code, "S from shared memory, P V with P in registers"
    tf32 = fmha_fp32wg.source(LLAMA, fmha_fp32wg.configs(LLAMA.with_(policy="tf32"), 1)[0])
    assert "kOneTerm = true;" in tf32.code


def test_warp_specialized_configs_fit_shared_memory_and_come_first():
    """The warp-specialized configs (each stage its own low parts, eight mbarriers): first among
    `configs` for three products (measured fastest at head dims 64, 96 and 128), split_in_smem
    only, two K/V stages where they fit, else one (64-key tiles at head dim 96, 128 rows at 128),
    the template told so; with two consumers with turns (pingpong) and without, both offered
    (`_turns_first`'s order) as `warp_specialized` lists them for the checks."""
    offered = fmha_fp32wg.configs(MINGPT, 99)
    assert offered[0]["warp_specialized"] and not offered[0].get("pingpong") and offered[2]["pingpong"]
    assert all(c.get("tma_kv") for c in offered[:4])   # K and V by TMA first: the tests below
    assert not any(c.get("warp_specialized") for c in fmha_fp32wg.configs(MINGPT.with_(policy="tf32"), 99))
    ws = [c for c in fmha_fp32wg.warp_specialized(MINGPT, 9) if not c.get("tma_kv")]   # tma_kv: the test below
    assert ws and all(c["warp_specialized"] and c["split_in_smem"] for c in ws)
    assert all(fmha_fp32wg.smem_bytes(c) <= fmha_fp32wg.SMEM_LIMIT for c in ws)
    # 2 parts x 128 x 96 of Q, and one stage of 64 x 96 K and 96 x 64 V, raw and low parts
    assert (ws[0]["block_n"], ws[0]["kv_stages"]) == (64, 1)
    assert fmha_fp32wg.smem_bytes(ws[0]) == 4 * (2 * 128 * 96 + 2 * 2 * 64 * 96) + 1024 + 96
    k32 = next(c for c in ws if c["block_n"] == 32 and c["block_m"] == 128)
    assert k32["kv_stages"] == 2 and fmha_fp32wg.smem_bytes(k32) == 4 * (2 * 128 * 96 + 2 * 2 * 2 * 32 * 96) + 1024 + 96
    assert fmha_fp32wg.smem_bytes(dict(ws[0], kv_stages=2)) > fmha_fp32wg.SMEM_LIMIT
    assert [(c["block_m"], c["block_n"], c["kv_stages"]) for c in fmha_fp32wg.warp_specialized(LLAMA, 9)
            if not c.get("tma_kv")] == [(128, 32, 1), (128, 32, 1), (64, 64, 1), (64, 32, 2)]
    # two consumers (block_m 128): with turns at the tensor cores first, then without; one
    # consumer (64 rows) has no one to take turns with
    assert [fmha_fp32wg.label(c) for c in ws[:4]] == ["fmha_fp32wg q128 k64 hd96 p32 smemsplit ws kv1 pp",
                                                     "fmha_fp32wg q128 k64 hd96 p32 smemsplit ws kv1",
                                                     "fmha_fp32wg q128 k32 hd96 p32 smemsplit ws pp",
                                                     "fmha_fp32wg q128 k32 hd96 p32 smemsplit ws"]
    assert [c.get("pingpong", 0) for c in fmha_fp32wg.warp_specialized(MINGPT, 1) if not c.get("tma_kv")] == [1, 0]
    assert not any(c.get("pingpong") for c in fmha_fp32wg.warp_specialized(LLAMA, 9) if c["block_m"] == 64)
    src = fmha_fp32wg.source(MINGPT, ws[0])
    plain = next(c for c in offered if not c.get("warp_specialized"))
    assert "kWS = true;" in src.code and "kWS = false;" in fmha_fp32wg.source(MINGPT, plain).code
    assert "kPingPongAsked = true;" in src.code and "kPingPongAsked = false;" in fmha_fp32wg.source(MINGPT, ws[1]).code
    assert "kKVStagesAsked = 1;" in src.code and "kKVStagesAsked = 2;" in fmha_fp32wg.source(MINGPT, k32).code
    checked = [c for c in fmha_fp32wg.warp_specialized(MINGPT, 9) if not c.get("k_early")]   # not offered yet
    assert sorted(map(fmha_fp32wg.label, checked)) == \
        sorted(fmha_fp32wg.label(c) for c in offered if c.get("warp_specialized")), \
        "the tuner gets those with turns and without where there are two consumers, with TMA (V direct or not) and without"


def test_64_key_tiles_come_first_where_they_fit():
    """Measured at head dim 64 (128 rows): 64-key tiles 1.090 ms against 1.282 for 32 keys. Where
    they do not fit (128 rows at head dim 96), the 32-key tile keeps its place."""
    hd64 = [c for c in fmha_fp32wg.configs(MINGPT.with_(d=64, dv=64), 99) if not c.get("warp_specialized")][:4]
    assert [(c["block_m"], c["block_n"]) for c in hd64] == [(128, 64), (128, 64), (128, 32), (128, 32)]
    plain = next(c for c in fmha_fp32wg.configs(MINGPT, 99) if not c.get("warp_specialized"))
    assert (plain["block_m"], plain["block_n"]) == (128, 32)


def test_every_config_renders_the_lean_softmax():
    """The softmax measured faster on an H200 (s18a: 1.199 against 1.227 ms at minGPT's shape) is
    the only one: boundary tiles alone masked, exponentials as ex2 of one FFMA, and P's raw bits
    as its high part with three products, P rounded to TF32 with one (the tf32 policy)."""
    for policy in fmha_fp32wg.POLICIES:
        for c in fmha_fp32wg.configs(MINGPT.with_(policy=policy), 99):
            code = fmha_fp32wg.source(MINGPT, c).code
            assert "ex2_ftz(fmaf(s[e], kLog2e" in code and "expf(" not in code, fmha_fp32wg.label(c)
            assert "scores(cute::false_type{})" in code
            assert f"kOneTerm = {'true' if c['terms'] == 1 else 'false'};" in code
            assert "lean" not in fmha_fp32wg.label(c) and "k_prefetch" not in c


def test_turns_come_first_only_where_they_measured_faster():
    """Two consumers with turns (pingpong) and without are both offered: without first where K
    and V have one stage (minGPT's and the Llama decoder's shapes), with first where two
    (head dim 64), as five H200 runs measured."""
    for w, first_turns in ((MINGPT, False), (LLAMA, False), (MINGPT.with_(d=64, dv=64), True)):
        ws = [c for c in fmha_fp32wg.configs(w, 99) if c.get("warp_specialized") and c["block_m"] == 128]
        ws = [c for c in ws if bool(c.get("v_direct")) == bool(ws[0].get("v_direct"))]   # V direct or not, as ranked
        first, second = ws[0], ws[1]
        assert {k: v for k, v in first.items() if k != "pingpong"} == {k: v for k, v in second.items() if k != "pingpong"}
        assert bool(first.get("pingpong")) == first_turns and bool(second.get("pingpong")) != first_turns
        assert (first.get("kv_stages", 2) == 2) == first_turns


def test_tma_kv_comes_first_with_both_turns():
    """K and V by TMA (`tma_kv`, measured faster at every head dim on an H200: 0.940 ms against
    1.206 at minGPT's shape) is offered to the tuner before the same configs without it, with
    and without turns in `_turns_first`'s order, under both three-product policies; the checks
    get both turns for every tile; the template is told so. Before those without TMA, V as v
    stores it (`v_direct`) where its staging tile fits, in the same order: after the TMA configs,
    or alternating with them, first, where each V tile has few readers."""
    for w in (MINGPT, LLAMA, MINGPT.with_(d=64, dv=64), MINGPT.with_(policy="tf32x3")):
        ws = [c for c in fmha_fp32wg.configs(w, 99) if c.get("warp_specialized")]
        tiles = {(c["block_m"], c["block_n"], c["promote_k"]) for c in ws}
        for t in tiles:
            same = [c for c in ws if (c["block_m"], c["block_n"], c["promote_k"]) == t]
            plain = [c for c in same if not c.get("tma_kv")]
            tma = [c for c in same if c.get("tma_kv") and not c.get("v_direct")]
            vd = [c for c in same if c.get("v_direct")]
            few = vd and fmha_fp32wg.v_readers(w, t[0]) <= fmha_fp32wg.VD_MAX_READERS   # then they alternate
            assert plain and same == ([x for p in zip(vd, tma) for x in p] if few else tma + vd) + plain
            assert [{k: v for k, v in c.items() if k != "tma_kv"} for c in tma] == plain
            assert [{k: v for k, v in c.items() if k != "v_direct"} for c in vd] == tma[:len(vd)]
        assert ws[0].get("tma_kv")
    tma = [c for c in fmha_fp32wg.warp_specialized(MINGPT, 9) if c.get("tma_kv")]
    assert not tma[0].get("pingpong") and tma[1].get("pingpong") and tma[0]["kv_stages"] == 1
    assert "kTmaKVAsked = true;" in fmha_fp32wg.source(MINGPT, tma[0]).code
    assert "kTmaKVAsked = false;" in fmha_fp32wg.source(MINGPT, dict(tma[0], tma_kv=0)).code
    assert fmha_fp32wg.label(tma[0]).endswith(" tma")
    assert not any(c.get("tma_kv") for c in fmha_fp32wg.configs(MINGPT.with_(policy="tf32"), 99))


def test_v_direct_is_checked_and_offered_beside_tma_kv_where_its_staging_tile_fits():
    """`v_direct` (V by TMA as v stores it into a staging tile of block_n x head_dim_v, transposed
    and split by the producer: no pass over V) comes in the check list after the TMA configs of
    each tile, both turns, where the staging tile still fits, and to the tuner beside them; its
    shared memory is tma_kv's plus that tile and one more mbarrier (16 bytes with the rounding);
    the template is told so."""
    for w in (MINGPT, LLAMA, MINGPT.with_(d=64, dv=64)):
        checked = fmha_fp32wg.warp_specialized(w, 9)
        vd = [c for c in checked if c.get("v_direct") and not c.get("k_early")]   # k_early: its own test
        assert vd and all(c["tma_kv"] and fmha_fp32wg.smem_bytes(c) <= fmha_fp32wg.SMEM_LIMIT for c in vd)
        for c in vd:
            base = {k: v for k, v in c.items() if k != "v_direct"}
            assert base in checked and checked.index(base) < checked.index(c)
            assert fmha_fp32wg.smem_bytes(c) == fmha_fp32wg.smem_bytes(base) + 4 * c["block_n"] * c["head_dim_v"] + 16
            assert fmha_fp32wg.label(c) == fmha_fp32wg.label(base) + " vd"
    # offered to the tuner with the tile's TMA configs: alternating with them, first, where each V
    # tile has few readers (minGPT's shape: four query blocks, measured faster), after them where
    # it has many (the Llama decoder's: 4 query heads a KV head x 16 blocks, measured slower)
    assert [fmha_fp32wg.label(c)[len("fmha_fp32wg q128 k64 hd96 p32 smemsplit ws kv1"):]
            for c in fmha_fp32wg.configs(MINGPT, 4)] == [" tma vd", " tma", " pp tma vd", " pp tma"]
    assert fmha_fp32wg.v_readers(MINGPT, 128) == 4 and fmha_fp32wg.v_readers(LLAMA, 128) == 64
    assert [fmha_fp32wg.label(c)[len("fmha_fp32wg q128 k32 hd128 p32 smemsplit ws kv1"):]
            for c in fmha_fp32wg.configs(LLAMA, 4)] == [" tma", " pp tma", " tma vd", " pp tma vd"]
    assert not fmha_fp32wg.configs(MINGPT.with_(lq=1024, lk=1024), 1)[0].get("v_direct")   # 8 readers
    first = next(c for c in fmha_fp32wg.warp_specialized(MINGPT, 1) if c.get("v_direct"))
    assert (first["block_n"], first["kv_stages"]) == (64, 1)
    assert fmha_fp32wg.smem_bytes(first) == 4 * (2 * 128 * 96 + 2 * 2 * 64 * 96 + 64 * 96) + 1024 + 112
    assert "kVDirectAsked = true;" in fmha_fp32wg.source(MINGPT, first).code
    assert "kVDirectAsked = false;" in fmha_fp32wg.source(MINGPT, dict(first, v_direct=0)).code


def test_k_early_is_checked_and_not_yet_offered():
    """`k_early` (the issuing thread copies the next tile's K as soon as its stage is consumed,
    testing for it during V's split, instead of after it): in the check list and the GPU tests
    for every TMA config, V direct or not, both turns; not offered to the tuner until a GPU run
    has timed it; the same shared memory; the template is told so."""
    for w in (MINGPT, LLAMA, MINGPT.with_(d=64, dv=64)):
        checked = fmha_fp32wg.warp_specialized(w, 9)
        early = [c for c in checked if c.get("k_early")]
        tma = [c for c in checked if c.get("tma_kv") and not c.get("k_early")]
        assert sorted(map(fmha_fp32wg.label, early)) == sorted(fmha_fp32wg.label(c) + " ke" for c in tma)
        assert all(fmha_fp32wg.smem_bytes(c) == fmha_fp32wg.smem_bytes(dict(c, k_early=0)) for c in early)
        assert not any(c.get("k_early") for c in fmha_fp32wg.configs(w, 99))
    c = next(c for c in fmha_fp32wg.warp_specialized(MINGPT, 1) if c.get("k_early"))
    assert "kKEarlyAsked = true;" in fmha_fp32wg.source(MINGPT, c).code
    assert "kKEarlyAsked = false;" in fmha_fp32wg.source(MINGPT, dict(c, k_early=0)).code
