"""fact_db/kernels/ops.py: kernels as torch custom ops, registered once per process, traceable."""
from __future__ import annotations

import torch

from fact_db.kernels.ops import factdb_op

SCHEMA = "(Tensor a, Tensor b, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor"


def _fake(a, b, bias, c, alpha, beta):
    return a.new_empty((a.shape[-2], b.shape[-1]))


def test_a_name_is_registered_once_and_served_again():
    calls = []

    def first(a, b, bias, c, alpha, beta):
        calls.append("first")
        return a @ b

    def second(a, b, bias, c, alpha, beta):
        calls.append("second")
        return a @ b

    op = factdb_op("test_ops_once", SCHEMA, first, _fake)
    assert op is torch.ops.factdb.test_ops_once
    assert factdb_op("test_ops_once", SCHEMA, second, _fake) is op  # the same kernel loaded again


def test_the_fake_gives_shapes_without_running_the_kernel():
    def never(a, b, bias, c, alpha, beta):
        raise AssertionError("the kernel ran")

    op = factdb_op("test_ops_fake", SCHEMA, never, _fake)
    a, b = torch.empty(16, 32, device="meta"), torch.empty(32, 8, device="meta")
    assert op(a, b, None, None, 1.0, 0.0).shape == (16, 8)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        y = op(mode.from_tensor(torch.empty(4, 32)), mode.from_tensor(torch.empty(32, 8)), None, None, 1.0, 0.0)
    assert tuple(y.shape) == (4, 8)


def test_a_cuda_op_refuses_cpu_tensors_with_the_dispatchers_error():
    op = factdb_op("test_ops_cuda_only", SCHEMA, lambda a, b, bias, c, alpha, beta: a @ b, _fake)
    try:
        op(torch.ones(2, 2), torch.ones(2, 2), None, None, 1.0, 0.0)
    except NotImplementedError as e:
        assert "CPU" in str(e)
    else:
        raise AssertionError("a CUDA-only kernel op ran on CPU tensors")


# ------------------------------------------------------------------------------------------
# Every kind of kernel op, as torch.compile sees it: its real schema and fake implementation,
# with a CPU stand-in for the kernel, through torch.library.opcheck (schema, fake tensors
# against the real outputs' shapes, dtypes and strides, AOT dispatch with dynamic shapes).

import torch.nn.functional as F  # noqa: E402

from fact_db.kernels.attention.kernel import attention_fake, empty_out  # noqa: E402
from fact_db.kernels.gemm.kernel import gemm_fake, swiglu_fake, swiglu_op  # noqa: E402
from fact_db.kernels.norm.kernel import norm_fake  # noqa: E402
from fact_db.kernels.ops import SCHEMAS, layout_tags  # noqa: E402
from fact_db.kernels.region.kernel import region_fake  # noqa: E402


def _gemm_cpu(a, b, bias, c, alpha, beta):
    y = alpha * torch.matmul(a, b)
    if c is not None:
        y = y + beta * c
    return y + bias if bias is not None else y


def _norm_cpu(write_sum):
    def run(x, r, weight, bias):
        s = x + r if r is not None else x
        y = F.layer_norm(s, (x.shape[-1],), weight, bias).contiguous()
        return y, (s.contiguous() if write_sum else x.new_empty(0))
    return run


def _cpu_ops() -> dict:
    """kind -> [(op, [args, ...])]: each kind of SCHEMAS registered with its real fake."""
    gemm = factdb_op("test_opcheck_gemm", SCHEMAS["gemm"], _gemm_cpu, gemm_fake(torch.float32), dispatch="CPU")
    gemm_blo = factdb_op("test_opcheck_gemm_blo", SCHEMAS["gemm_blo"],
                         lambda a, b, b_lo, bias, c, alpha, beta: _gemm_cpu(a, b + b_lo, bias, c, alpha, beta),
                         lambda a, b, b_lo, bias, c, alpha, beta: gemm_fake(torch.float32)(a, b, bias, c, alpha, beta),
                         dispatch="CPU")
    attention = factdb_op("test_opcheck_attention", SCHEMAS["attention"],
                          lambda q, k, v, scale, causal: empty_out(*q.shape[:3], v.shape[-1], q.dtype, q.device).copy_(
                              F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)),
                          attention_fake(None), dispatch="CPU")
    norm_sum = factdb_op("test_opcheck_norm_sum", SCHEMAS["norm"], _norm_cpu(True), norm_fake(True), dispatch="CPU")
    norm = factdb_op("test_opcheck_norm", SCHEMAS["norm"], _norm_cpu(False), norm_fake(False), dispatch="CPU")
    region = factdb_op("test_opcheck_region", SCHEMAS["region"], lambda xs: torch.relu(xs[0] @ xs[1]).contiguous(),
                       region_fake([8, 4], torch.float32), dispatch="CPU")
    r = torch.randn
    x816, w164 = r(8, 16), r(16, 4)
    return {
        "gemm": [(gemm, [(x816, w164, r(4), None, 1.0, 0.0), (r(2, 8, 16), w164, None, r(2, 8, 4), 0.5, 1.0),
                         (r(3, 8, 16), r(3, 16, 4), None, None, 1.0, 0.0), (r(16, 8).t(), r(4, 16).t(), None, None,
                                                                             1.0, 0.0)])],
        "gemm_blo": [(gemm_blo, [(x816, w164, r(4, 16).t(), r(4), None, 1.0, 0.0)])],
        "swiglu": [(swiglu_op(gemm), [(x816, r(16, 8), None, 4)]),
                   (swiglu_op(gemm, gemm_blo), [(x816, r(16, 8), r(8, 16).t(), 4)])],
        "attention": [(attention, [(r(2, 4, 8, 16), r(2, 4, 6, 16), r(2, 4, 6, 16), 0.25, False),
                                   (r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16), 0.25, True)])],
        "norm": [(norm_sum, [(r(4, 8, 16), r(4, 8, 16), r(16), r(16)), (r(16, 8, 4).transpose(0, 2), r(4, 8, 16),
                                                                       r(16), r(16))]),
                 (norm, [(r(16, 8, 4).transpose(0, 2), None, r(16), None)])],
        "region": [(region, [([x816, w164],)])],
    }


def test_every_kernel_op_kind_passes_opcheck_with_its_real_fake():
    cases = _cpu_ops()
    assert set(cases) == set(SCHEMAS)  # a new kind of op must come with its opcheck case
    for kind, entries in cases.items():
        for op, arg_sets in entries:
            assert set(layout_tags()) <= set(op.default.tags), (kind, op.default.tags)
            for args in arg_sets:
                torch.library.opcheck(op.default, args)


def test_the_swiglu_op_returns_the_strided_gate_half_and_its_fake_says_so():
    gemm = _cpu_ops()["gemm"][0][0]
    op = swiglu_op(gemm)
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    y = op(a, b, None, 4)
    full = a @ b
    torch.testing.assert_close(y, F.silu(full[:, :4]) * full[:, 4:])
    assert y.stride() == (8, 1) and y.untyped_storage().nbytes() == 8 * 8 * 4  # one M x 2N tensor, no copy
    fake = swiglu_fake(a.to("meta"), b.to("meta"), None, 4)
    assert fake.shape == y.shape and fake.stride() == y.stride()


def test_the_library_sdpa_backend_op_passes_opcheck():
    from fact_db.kernels.attention.workload import library_op
    q = torch.randn(2, 4, 8, 16)
    torch.library.opcheck(library_op("math"), (q, q.clone(), q.clone(), 0.25, True))
