"""conv_sm90 kernels on a GPU: each policy's kernel (bf16, tf32, the fp32 split3) verifies against
float64 with its epilogue chain (bias, scalars, per-channel tensors, a residual), 1-D, 2-D, 3-D
and a stride-1 transposed convolution; the op works under torch.compile and in a CUDA graph;
a composed three-convolution model equals eager with one layout conversion; the cooperative
kernel (schedule `coop`) in five of the cases, the persistent one in two, the ping-pong one in
two (not yet run on a GPU); the pointwise fp32 GEMM kernel (schedule `gemm`, conv_gemm_sm90) in
four, two of them ping-pong. Skips without a GPU or nvcc. Last run on an H200, 2026-11-27
(thirteenth session, before the ping-pong cases): 25 passed, the unpromoted fp32 case failing as
expected (benchmarks/results/raw/h200x4-2026-11-27-s13a-logs.txt).

    pytest tests/test_conv_gpu.py -x
"""
from __future__ import annotations

import pytest
import torch

from fact_db.kernels.conv.kernel import ConvConfig, ConvKernel, prepare_weight, source
from fact_db.kernels.conv.tune import evaluate_one
from fact_db.kernels.conv.workload import ConvWorkload, canonical_chain

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHAIN = canonical_chain([{"op": "sub", "scalar": 0.5}, {"op": "hardswish"}, {"op": "mul", "kind": "channel"},
                         {"op": "add", "kind": "full"}, {"op": "mish"}])
# the chain without its residual: a strided transposed convolution takes none (kernel.why_not)
NO_RESIDUAL = canonical_chain([{"op": "sub", "scalar": 0.5}, {"op": "hardswish"}, {"op": "mul", "kind": "channel"},
                               {"op": "mish"}])
CASES = [
    (ConvWorkload(4, 64, 128, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(128, 128, 64)),
    (ConvWorkload(4, 64, 64, (30, 30), (3, 3), stride=(2, 2), chain=CHAIN, dtype="float32", policy="tf32"),
     ConvConfig(128, 64, 32)),
    (ConvWorkload(4, 64, 64, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 64, 32, split3=True)),
    (ConvWorkload(4, 64, 64, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 64, 32, split3=True, promote=1)),
    (ConvWorkload(2, 32, 64, (8, 16, 16), (3, 3, 3), chain=canonical_chain([{"op": "tanh"}]), dtype="float16",
                  policy="fp16"), ConvConfig(64, 64, 64, 2, 1)),
    (ConvWorkload(8, 64, 128, (512,), (5,), dilation=(2,), dtype="float32", policy="tf32x3"),
     ConvConfig(128, 128, 32, split3=True)),
    (ConvWorkload(4, 64, 32, (16, 16), (3, 3), padding=(1, 1), transposed=True, dtype="bfloat16", policy="bf16"),
     ConvConfig(64, 64, 64)),
    # the cooperative kernel (two consumer warpgroups): both halves of the tile, ragged M and N
    # edges (M = 4*31*31, K = 96), a residual read by the epilogue, clusters, 3-D, and the
    # promoted fp32 split3 mainloop on it
    (ConvWorkload(4, 64, 96, (33, 33), (3, 3), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(256, 128, 64, schedule="coop")),
    (ConvWorkload(4, 64, 128, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(128, 256, 64, 2, 1, schedule="coop")),
    (ConvWorkload(2, 32, 64, (8, 16, 16), (3, 3, 3), chain=canonical_chain([{"op": "tanh"}]), dtype="float16",
                  policy="fp16"), ConvConfig(256, 64, 64, 1, 1, schedule="coop")),
    (ConvWorkload(4, 64, 64, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 128, 32, split3=True, promote=1, schedule="coop")),
    (ConvWorkload(4, 64, 64, (30, 30), (3, 3), stride=(2, 2), chain=CHAIN, dtype="float32", policy="tf32"),
     ConvConfig(256, 64, 32, schedule="coop")),
    # the persistent kernel (the cooperative one, a CTA an SM): about two tiles a CTA on a 132-SM
    # part, ragged M and N (16*63*63 pixels, K = 96), the residual loaded by its own warp, a 2 x 1
    # cluster; the promoted fp32 split3 mainloop on it
    (ConvWorkload(16, 64, 96, (65, 65), (3, 3), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(256, 128, 64, 2, 1, schedule="persistent")),
    (ConvWorkload(16, 64, 64, (64, 64), (3, 3), padding=(1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 128, 32, split3=True, promote=1, schedule="persistent")),
    # the ping-pong kernel (two consumer warpgroups a tile each in turn, a CTA an SM): bf16 over
    # several tiles a CTA with ragged edges, the residual and a 2 x 1 cluster; the promoted fp32
    # split3 mainloop on it (64 x 128, as a promoted warpgroup holds at most)
    (ConvWorkload(16, 64, 96, (65, 65), (3, 3), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(128, 128, 64, 2, 1, schedule="pingpong")),
    (ConvWorkload(16, 64, 64, (64, 64), (3, 3), padding=(1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(64, 128, 32, split3=True, promote=1, schedule="pingpong")),
    # the pointwise fp32 kernel (schedule `gemm`, conv_gemm_sm90): a 1x1 convolution as a GEMM with
    # A split in registers; ragged M and N (4*33*33 pixels, K = 96) with the whole chain and a
    # residual, a 3-D one at tf32x3, a 1-D one arriving channels-last, cooperative (tile_m 128) and
    # ping-pong (64), both tile widths and depths
    (ConvWorkload(4, 64, 96, (33, 33), (1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 128, 16, split3=True, promote=1, schedule="gemm")),
    (ConvWorkload(2, 256, 64, (8, 16, 16), (1, 1, 1), chain=canonical_chain([{"op": "relu"}]), dtype="float32",
                  policy="tf32x3"), ConvConfig(64, 64, 32, split3=True, promote=2, schedule="gemm")),
    (ConvWorkload(8, 64, 256, (500,), (1,), chain=canonical_chain([{"op": "add", "kind": "full"}, {"op": "relu"}]),
                  dtype="float32", policy="fp32", layout="nhwc"),
     ConvConfig(64, 128, 16, split3=True, promote=1, schedule="gemm")),
    (ConvWorkload(4, 128, 128, (20, 20), (1, 1), chain=CHAIN, dtype="float32", policy="fp32"),
     ConvConfig(128, 128, 32, split3=True, promote=1, schedule="gemm")),
    # three input channels (a network's first convolution), run with zero channels added
    # (kernel.channels): a ResNet stem at fp32, a 3-D one on the cooperative kernel, bf16 with the chain
    (ConvWorkload(2, 3, 64, (64, 64), (7, 7), stride=(2, 2), padding=(3, 3), chain=CHAIN, dtype="float32",
                  policy="fp32"), ConvConfig(128, 64, 32, split3=True, promote=1)),
    (ConvWorkload(2, 3, 64, (8, 16, 16), (3, 5, 7), chain=canonical_chain([{"op": "tanh"}]), dtype="float32",
                  policy="fp32"), ConvConfig(128, 128, 32, split3=True, promote=1, schedule="coop")),
    (ConvWorkload(4, 3, 128, (32, 32), (3, 3), padding=(1, 1), chain=CHAIN, dtype="bfloat16", policy="bf16"),
     ConvConfig(128, 128, 64)),
    # strided transposed convolutions, run as phases (phases.py): a decoder's 2-D upsampling with
    # an output padding and the chain, a 3-D one on the cooperative kernel (KernelBench L1-73's
    # geometry, smaller), a 1-D one whose dilation leaves every other pixel to the bias alone
    (ConvWorkload(2, 64, 32, (15, 17), (3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1),
                  transposed=True, chain=NO_RESIDUAL, dtype="float32", policy="fp32"),
     ConvConfig(128, 64, 32, split3=True, promote=1)),
    (ConvWorkload(2, 32, 32, (8, 16, 16), (3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1), transposed=True,
                  dtype="float32", policy="fp32"), ConvConfig(128, 128, 32, split3=True, promote=1, schedule="coop")),
    (ConvWorkload(4, 32, 64, (300,), (3,), stride=(2,), padding=(1,), dilation=(2,), transposed=True,
                  dtype="bfloat16", policy="bf16"), ConvConfig(128, 64, 64)),
]


@pytest.fixture(scope="module")
def built():
    from fact_db.kernels import build
    srcs = [source(w, c) for w, c in CASES]
    res = build.build(srcs, jobs=16, progress=False)
    for b in res:
        assert b.ok, b.error
    return res


# The fp32 split3 kernel keeps its partial sums in the tensor cores' accumulators (no promotion
# into fp32 registers, as the GEMM family's mainloop does): on the H200 it missed the fp32
# bound by 2.6x here (2.47e-6 against 9.45e-7, 2026-11-26), so the tuner keeps cuDNN under fp32.
# The promoted kernel (the case after it) is what the fp32 candidates are now.
FP32_SPLIT3 = pytest.mark.xfail(strict=True, reason="split3 without promotion misses the fp32 bound (docs/kernels.md)")


@pytest.mark.parametrize("i", [pytest.param(i, marks=FP32_SPLIT3) if w.policy == "fp32" and not c.promote else i
                               for i, (w, c) in enumerate(CASES)])
def test_kernel_verifies_against_float64_at_its_policy(built, i):
    w, c = CASES[i]
    res = evaluate_one(w, str(built[i].path), c, trials=6, reps=20)
    assert res["status"] == "ok", res["error"]
    eager = evaluate_one(w, None, None, trials=2, reps=20)
    print(f"{w.describe()} {c.label}: {res['time_ms']:.4f} ms (err {res['err']:.2e}); cuDNN {eager['time_ms']:.4f} ms "
          f"(err {eager['err']:.2e})")


def test_op_under_torch_compile_and_cuda_graph(built):
    w, c = CASES[0]
    k = ConvKernel(built[0].path, w, c, built[0].key)
    inp = w.make_inputs("randn")
    wt = prepare_weight(inp["w"], w, c)
    op = k.as_op()
    args = (inp["x"], wt, inp["bias"], [inp["v0"]], inp["r"])
    y = op(*args)
    assert y.stride(1) == 1 and torch.equal(y, k(*args))
    fn = torch.compile(lambda *a: op(*a) + 1.0, fullgraph=True)
    assert torch.equal(fn(*args), y + 1.0)
    g = torch.cuda.CUDAGraph()
    op(*args)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = op(*args)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


def test_composed_three_conv_model_on_the_gpu():
    """fact_db.optimize on Chain3 at bf16 with the real tuner: verified end to end."""
    from tests.test_conv import Chain3

    import fact_db
    model = Chain3().cuda().eval()
    x = torch.randn(8, 8, 32, 32, device="cuda")
    fast = fact_db.optimize(model, (x,), policy="bf16", max_candidates=2, progress=False, save=False)
    assert fast.report.verification.ok, fast.report.verification.reason
    print("\n".join(fast.report.notes))
