"""The fmha_fp32tc family module (FMHA_ABI): which workloads it serves, its configs per
policy, labels, and the rendered source (no GPU needed)."""
from __future__ import annotations

import re

import pytest

from fact_db.kernels.attention import fmha_fp32tc
from fact_db.kernels.attention.workload import AttentionWorkload

MINGPT = AttentionWorkload(128, 8, 8, 512, 512, 96, 96, causal=True)


def test_applies_to_fp32_tf32x3_and_tf32_on_sm90():
    assert fmha_fp32tc.applies(MINGPT, "sm90a") is None
    assert fmha_fp32tc.applies(MINGPT.with_(policy="tf32x3"), "sm90a") is None
    assert fmha_fp32tc.applies(MINGPT.with_(policy="tf32"), "sm90a") is None


def test_tf32_makes_one_tf32_product_and_never_presplits():
    tf = fmha_fp32tc.configs(MINGPT.with_(policy="tf32"), 99)
    assert tf and all(c["terms"] == 1 and c["presplit"] == 0 and c["promote_k"] == 0 for c in tf)
    assert len(tf) == len(fmha_fp32tc.TILES)
    assert fmha_fp32tc.label(tf[0]) == "fmha_fp32tc q128 k32 hd96 p0 1xTF32"
    code = fmha_fp32tc.source(MINGPT.with_(policy="tf32"), tf[0]).code
    assert "kOneTerm = true;" in code
    assert "kOneTerm = false;" in fmha_fp32tc.source(MINGPT, fmha_fp32tc.configs(MINGPT, 1)[0]).code
    assert all("terms" not in c for c in fmha_fp32tc.configs(MINGPT, 99)), "3xTF32 configs render as before"


@pytest.mark.parametrize("w,arch,why", [
    (MINGPT.with_(policy="bf16", dtype=""), "sm90a", "bf16"),
    (MINGPT, "sm75", "sm75"),
    (MINGPT.with_(d=256, dv=256), "sm90a", "256"),
    (MINGPT.with_(lq=1), "sm90a", "sequence length 1"),
    (MINGPT.with_(batch=70000), "sm90a", "65535"),
])
def test_refuses_with_a_reason(w, arch, why):
    reason = fmha_fp32tc.applies(w, arch)
    assert reason and why in reason


def test_configs_follow_the_policy_promotion():
    fp32 = fmha_fp32tc.configs(MINGPT, 8)
    assert fp32[0] == {"head_dim": 96, "head_dim_v": 96, "block_m": 128, "block_n": 32, "presplit": 0,
                       "promote_k": 32}
    assert {(c["block_m"], c["block_n"]) for c in fp32} == set(fmha_fp32tc.TILES)
    assert {c["presplit"] for c in fp32} == {0, 1}
    assert {c["promote_k"] for c in fp32} <= {32, 16}, "the fp32 policy always promotes"
    tf = fmha_fp32tc.configs(MINGPT.with_(policy="tf32x3"), 99)
    assert tf[0]["promote_k"] == 64 and 0 in {c["promote_k"] for c in tf}
    assert len(fmha_fp32tc.configs(MINGPT, 1)) == 1 and fmha_fp32tc.configs(MINGPT, 0) == []


def test_head_dims_pad_up_inside_the_kernel():
    c = fmha_fp32tc.configs(MINGPT.with_(d=80, dv=40), 1)[0]
    assert (c["head_dim"], c["head_dim_v"]) == (96, 64)


def test_labels_are_distinct():
    labels = [fmha_fp32tc.label(c) for c in fmha_fp32tc.configs(MINGPT.with_(policy="tf32x3"), 8)]
    assert len(set(labels)) == len(labels)
    assert labels[0] == "fmha_fp32tc q128 k32 hd96 p64"


def test_source_renders_the_abi_with_the_config():
    src = fmha_fp32tc.source(MINGPT, {"head_dim": 128, "head_dim_v": 64, "block_n": 32, "promote_k": 0})
    assert src.template == "fmha_fp32tc_sm90" and src.arch == "sm90a"
    assert re.search(r"\bint fact_fmha_fp32tc_sm90_launch\(", src.code)
    assert "size_t fact_fmha_fp32tc_sm90_workspace_size(" in src.code
    assert "kHeadDim = 128;" in src.code and "kHeadDimV = 64;" in src.code
    assert "kBlockN = 32;" in src.code and "kPromoteK = 0;" in src.code
    assert "kBlockM = 64;" in src.code, "configs stored before block_m existed render the 64-row tile"
    assert "kBlockM = 128;" in fmha_fp32tc.source(MINGPT, fmha_fp32tc.configs(MINGPT, 1)[0]).code
    assert "cp.async.cg.shared.global" in src.code, "K/V tiles are pipelined with cp.async"
    assert "+ 0x1000u) & 0xffffe000u" in src.code, "operands are rounded to TF32 (ties away), not truncated"
    assert "kPresplit = false;" in src.code


def test_configs_fit_shared_memory():
    """hd128 with 128-row tiles, 64-key tiles and presplit needs 270 KB: left out, its per-warp
    split sibling kept; the byte count is the template's."""
    big = fmha_fp32tc.configs(MINGPT.with_(d=128, dv=128), 99)
    assert all(fmha_fp32tc.smem_bytes(c) <= fmha_fp32tc.SMEM_LIMIT for c in big)
    assert {"block_m": 128, "block_n": 64, "presplit": 0} in [
        {k: c[k] for k in ("block_m", "block_n", "presplit")} for c in big]
    c = {"head_dim": 128, "head_dim_v": 128, "block_m": 128, "block_n": 64, "presplit": 1, "promote_k": 32}
    assert fmha_fp32tc.smem_bytes(c) == 4 * (128 * 132 + 3 * 64 * 264) > fmha_fp32tc.SMEM_LIMIT
    src = fmha_fp32tc.source(MINGPT, next(c for c in fmha_fp32tc.configs(MINGPT, 99) if c["presplit"])).code
    assert "kPresplit = true;" in src
