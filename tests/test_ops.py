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
