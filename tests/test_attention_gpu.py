"""GPU tests of the fmha_sm90 attention family (skip without an H100/H200 and nvcc): causal and
non-causal, head dims 64/96/128, grouped-query attention, lengths not a multiple of the tile,
a custom scale, strided (non-packed) q, the custom op under torch.compile, and a kernel built
without the causal mask failing the tuner's verification. Every kernel is built first, in
one parallel batch.

    pytest -q tests/test_attention_gpu.py
"""
from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 GPU (H100/H200)"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

from fact_db.kernels.attention import tune as attention_tune, fmha_sm90
from fact_db.kernels import build  # noqa: E402
from fact_db.kernels.attention.workload import AttentionWorkload  # noqa: E402
from fact_db.kernels.attention.kernel import AttentionKernel  # noqa: E402
from fact_db.kernels.verify import rel_err  # noqa: E402

DTYPES = ("bfloat16", "float16")


def W(**kw):
    base = dict(batch=2, heads=4, kv_heads=4, lq=256, lk=256, d=64, dv=64, causal=True, policy="bf16")
    return AttentionWorkload(**{**base, **kw})


def _configs():
    out = []
    for d in (64, 128):
        for causal in (True, False):
            for cfg in fmha_sm90.configs(W(d=d, dv=d, causal=causal), 8):
                out.append(cfg)
    return out


@pytest.fixture(scope="module")
def kernels():
    """label+causal -> AttentionKernel, all built in one batch (the head tile serves 96 too)."""
    cfgs = _configs()
    srcs = [fmha_sm90.source(W(), c) for c in cfgs]
    res = build.build(srcs, jobs=16)
    bad = [(fmha_sm90.label(c), b.error) for c, b in zip(cfgs, res) if not b.ok]
    assert not bad, bad
    return {(fmha_sm90.label(c), c["causal"]): AttentionKernel(b.path, "fmha_sm90", build_key=b.key)
            for c, b in zip(cfgs, res)}


def _check(kernel, w: AttentionWorkload, tol_factor: float = 4.0):
    for dist in ("randn", "rand"):
        x = w.make_inputs(dist)
        ref = w.reference(x)
        out = kernel(x["q"], x["k"], x["v"], scale=w.softmax_scale, causal=w.causal)
        err, eager = rel_err(out, ref), rel_err(w.eager(x), ref)
        assert err <= max(tol_factor * eager, 1e-2), (w.shape, dist, err, eager)
    return out


def _pick(kernels, w, which=0):
    cfg = fmha_sm90.configs(w, 8)[which]
    return kernels[(fmha_sm90.label(cfg), w.causal)]


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("which", [0, 1])  # cooperative, ping-pong
def test_head_dims_and_masks(kernels, d, causal, which):
    w = W(d=d, dv=d, causal=causal)
    _check(_pick(kernels, w, which), w)


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
def test_dtypes(kernels, policy):
    w = W(policy=policy)
    cfg = fmha_sm90.configs(w, 1)[0]
    b = build.build([fmha_sm90.source(w, cfg)], jobs=1)[0]
    assert b.ok, b.error
    _check(AttentionKernel(b.path, "fmha_sm90", build_key=b.key), w)


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (8, 1), (32, 8)])
def test_grouped_query_attention(kernels, heads, kv_heads):
    w = W(heads=heads, kv_heads=kv_heads, d=128, dv=128)
    _check(_pick(kernels, w), w)


# query lengths are multiples of 8 (the family refuses others: example 88's alignment check); key
# lengths are free; none is a multiple of the 128-row tile
@pytest.mark.parametrize("lq,lk,causal", [(104, 104, True), (328, 333, True), (72, 200, False), (200, 77, False),
                                          (136, 300, True)])
def test_ragged_lengths(kernels, lq, lk, causal):
    w = W(lq=lq, lk=lk, causal=causal, d=96, dv=96)
    _check(_pick(kernels, w), w)


def test_custom_scale_and_strided_q(kernels):
    w = W(scale=0.3, d=128, dv=128)
    k = _pick(kernels, w)
    x = w.make_inputs("randn")
    q = x["q"].transpose(1, 2).contiguous().transpose(1, 2)  # [b, s, h, d] memory, viewed [b, h, s, d]
    out = k(q, x["k"], x["v"], scale=0.3, causal=True)
    assert rel_err(out, w.reference(x)) <= max(4 * rel_err(w.eager(x), w.reference(x)), 1e-2)


def test_mask_ignoring_kernel_fails_verification(kernels):
    """A non-causal kernel offered for a causal workload: the tuner's check turns it away."""
    w = W(d=64, dv=64)
    wrong = next(c for c in fmha_sm90.configs(w.with_(causal=False), 8))
    built = build.build([fmha_sm90.source(w, wrong)], jobs=1)[0]
    # the launch refuses a causal flag the kernel was not built for, so call it as if non-causal
    k = AttentionKernel(built.path, "fmha_sm90", build_key=built.key)
    x = w.make_inputs("randn")
    out = k(x["q"], x["k"], x["v"], scale=w.softmax_scale, causal=False)
    assert rel_err(out, w.reference(x)) > 0.1
    c = attention_tune.AttnCandidate("wrong", "kernel", template="fmha_sm90", so=str(built.path))
    job = attention_tune.job_for(c, w, trials=2)
    res = attention_tune.run_job(job, {})
    assert res["status"] in ("launch_error", "verify_failed")  # it refuses causal=True, or computes without it


def test_custom_op_under_compile(kernels):
    w = W(d=128, dv=128)
    k = _pick(kernels, w)
    op = k.as_op()
    assert k.op_name.startswith("attn_") and getattr(torch.ops.factdb, k.op_name) is op
    assert str(k.path) not in k.op_name and AttentionKernel(k.path, "fmha_sm90", build_key=k.build_key).op_name == k.op_name
    x = w.make_inputs("randn")
    f = torch.compile(lambda q, kk, v: op(q, kk, v, w.softmax_scale, True), fullgraph=True)
    out = f(x["q"], x["k"], x["v"])
    assert rel_err(out, w.reference(x)) <= max(4 * rel_err(w.eager(x), w.reference(x)), 1e-2)


def test_tuner_end_to_end_in_the_worker(tmp_path):
    from fact_db.store.registry import Registry
    w = W(heads=8, kv_heads=2, lq=296, lk=300, d=96, dv=96)
    reg = Registry.open(f"duckdb:///{tmp_path / 'r.duckdb'}", seed=False)
    res = attention_tune.tune(w, registry=reg, jobs=16, fams=[fmha_sm90])
    kinds = {t.label: t.status for t in res.trials}
    assert all(s == "ok" for lbl, s in kinds.items() if lbl.startswith("fmha")), kinds
    from fact_db.kernels.abi import current_gpu
    gpu = current_gpu()[0]
    from fact_db.kernels.attention.tune import from_registry
    assert res.best is not None and from_registry(w, reg, "sm90a", gpu).label == res.best.label
    assert from_registry(w, reg, "sm90a", "some-other-gpu") is None  # rows are keyed by the GPU
