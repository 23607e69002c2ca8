"""add_norm kernels on a GPU: every candidate kind verifies against float64, both outputs are
written, the custom op works under torch.compile, eager is a tuning candidate. Skips without
a GPU or nvcc.

    pytest tests/test_norm_gpu.py -x
"""
from __future__ import annotations

import pytest
import torch

from fact_db.kernels.norm import tune as norm_tune
from fact_db.kernels.norm import workload as norm_workload
from fact_db.kernels.norm.tune import NormCandidate
from fact_db.kernels.norm.kernel import NormKernel
from fact_db.kernels.norm.workload import NormWorkload

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [
    (NormWorkload("layernorm", 1000, 768, residual=True, write_sum=True, dtype="float32", policy="fp32"),
     [NormCandidate(64, 4, 2), NormCandidate(32, 4, 4), NormCandidate(256, 1, 1)]),
    (NormWorkload("layernorm", 999, 768, residual=True, write_sum=True, dtype="bfloat16", policy="bf16"),
     [NormCandidate(32, 8, 4), NormCandidate(96, 8, 2)]),
    (NormWorkload("layernorm", 256, 768, residual=False, dtype="float32", policy="fp32", has_bias=False),
     [NormCandidate(64, 4, 2)]),
    (NormWorkload("rmsnorm", 257, 4096, residual=True, write_sum=True, eps=1e-6, dtype="bfloat16", policy="bf16"),
     [NormCandidate(256, 8, 1), NormCandidate(512, 8, 1)]),
    (NormWorkload("rmsnorm", 64, 4096, eps=1e-6, dtype="float32", policy="fp32"), [NormCandidate(1024, 4, 1)]),
]


@pytest.fixture(scope="module")
def built():
    from fact_db.kernels import build
    srcs, keys = [], []
    for w, cands in CASES:
        for c in cands:
            srcs.append(build.Source(norm_workload.TEMPLATE, norm_tune.render(w, c), "sm90a"))
            keys.append((w, c))
    res = build.build(srcs, jobs=16, progress=False)
    for b in res:
        assert b.ok, b.error
    return dict(zip(keys, res))


@pytest.mark.parametrize("i", range(len(CASES)))
def test_candidates_verify_against_float64(built, i):
    w, cands = CASES[i]
    for c in cands:
        k = NormKernel(built[(w, c)].path, w, built[(w, c)].key)
        ok, err, eager_err, reason = norm_tune.verify(norm_tune._runner(w, k), w, trials=4)
        assert ok, f"{c.label}: {reason}"
        if w.dtype == "float32":
            assert err < 1e-6, err


def test_sum_output_equals_eager_sum_exactly(built):
    w, cands = CASES[1]
    k = NormKernel(built[(w, cands[0])].path, w)
    inp = w.make_inputs("randn")
    y, s = k(inp["x"], inp["r"], inp["weight"], inp["bias"])
    assert torch.equal(s, inp["x"] + inp["r"])


def test_wrong_width_is_refused(built):
    w, cands = CASES[0]
    k = NormKernel(built[(w, cands[0])].path, w)
    x = torch.randn(4, 512, device="cuda")
    with pytest.raises(norm_workload.NormError, match="768"):
        k(x, x, torch.ones(512, device="cuda"), torch.zeros(512, device="cuda"))


def test_op_under_torch_compile_and_named_from_the_build_key(built, tmp_path):
    import shutil
    w, cands = CASES[0]
    b = built[(w, cands[0])]
    k = NormKernel(b.path, w, b.key)
    copy = tmp_path / "kernel.so"
    shutil.copy(b.path, copy)
    assert NormKernel(copy, w, b.key).op_name == k.op_name
    op = k.as_op()
    inp = w.make_inputs("randn")
    f = torch.compile(lambda x, r, wt, bi: op(x, r, wt, bi), fullgraph=True)
    y, s = f(inp["x"], inp["r"], inp["weight"], inp["bias"])
    ey, es = w.eager(inp)
    torch.testing.assert_close(y, ey, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, es)


def test_tune_norm_has_eager_and_picks_a_verified_winner(built):
    w, cands = CASES[0]
    trials = norm_tune.tune_norm(w, cands, built={c: built[(w, c)] for c in cands}, progress=False)
    labels = {t.label for t in trials}
    assert "eager" in labels and {c.label for c in cands} <= labels
    assert trials[0].status == "ok" and trials[0].time_ms > 0
