"""GemmKernel's call plans (fact_db/kernels/gemm/kernel.py), on the CPU with a stand-in for the compiled
launch function: a repeated call launches with exactly the arguments the full checks worked
out the first time, and a call that needed a copy or cast is never planned."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fact_db.kernels.gemm import kernel as kmod
from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec, KernelError


class Launch:
    """Records each launch's arguments: pointers as `ptr:<which tensor>`, the rest as given."""

    def __init__(self, rc: int = 0):
        self.rc, self.calls, self.names = rc, [], {}

    def __call__(self, *args):
        self.calls.append(tuple(self.names.get(x, "ptr:?") if isinstance(x, int) and x > 1 << 20 else x
                                for x in args))
        return self.rc


def _kernel(spec: GemmSpec, launch: Launch, ws: int = 0) -> GemmKernel:
    k = GemmKernel.__new__(GemmKernel)
    k.path, k.template, k.spec, k.options, k.build_key = Path("/nowhere/k.so"), "stand_in", spec, None, "b"
    k._launch, k._ws, k._has_ex, k._opts = launch, (lambda m, n, kk, batch: ws), False, None
    k._launch_blo = None
    k._op = k._op_blo = None
    k._plans = {}
    return k


@pytest.fixture(autouse=True)
def _no_cuda_stream(monkeypatch):
    monkeypatch.setattr(kmod, "raw_stream", lambda device: 7)


def _named(launch: Launch, **tensors):
    launch.names = {t.data_ptr(): f"ptr:{name}" for name, t in tensors.items() if t is not None}


SPEC = GemmSpec(dtype="float32", layout_a="row", layout_b="col", epilogue="residual")


def _operands(m=64, n=32, k=16):
    return (torch.randn(m, k), torch.randn(n, k).t(), torch.randn(n), torch.randn(m, n))


def test_a_repeated_call_launches_as_the_first_did():
    launch = Launch()
    k = _kernel(SPEC, launch, ws=256)
    for _ in range(3):
        a, b, bias, c = _operands()
        _named(launch, a=a, b=b, bias=bias, c=c)
        k(a, b, bias=bias, c=c, alpha=0.5, beta=1.0)
    assert len(k._plans) == 1
    first, *rest = launch.calls
    # a, b, c, bias by name; out and the workspace are fresh each call; then the integers and scalars
    assert first[:4] == ("ptr:a", "ptr:b", "ptr:c", "ptr:bias")
    assert first[5:] == (64, 32, 16, 1, 16, 16, 32, 32, 0, 0, 0, 0, 0, 0.5, 1.0, first[20], 7)
    assert all(r[:4] == first[:4] and r[5:20] == first[5:20] for r in rest)


def test_a_plan_serves_only_its_geometry():
    launch = Launch()
    k = _kernel(SPEC, launch)
    a, b, bias, c = _operands()
    k(a, b, bias=bias, c=c)
    a2, b2, bias2, c2 = _operands(m=128)
    k(a2, b2, bias=bias2, c=c2)
    assert len(k._plans) == 2 and launch.calls[1][5] == 128  # M of the second geometry
    k(a, b, bias=bias, c=c, alpha=2.0)
    assert len(k._plans) == 2 and launch.calls[2][5:9] == (64, 32, 16, 1)


@pytest.mark.parametrize("change", ["a_col", "b_row", "c_strided", "bias_half"])
def test_a_call_that_needed_a_copy_or_cast_is_not_planned(change):
    launch = Launch()
    k = _kernel(SPEC, launch)
    a, b, bias, c = _operands()
    if change == "a_col":
        a = a.t().contiguous().t()
    elif change == "b_row":
        b = b.contiguous()
    elif change == "c_strided":
        c = torch.randn(32, 64).t()
    else:
        bias = bias.half()
    for _ in range(2):
        y = k(a, b, bias=bias, c=c)
    assert k._plans == {} and y.shape == (64, 32) and len(launch.calls) == 2


def test_a_failed_launch_on_the_planned_path_names_the_problem():
    launch = Launch()
    k = _kernel(SPEC, launch)
    a, b, bias, c = _operands()
    k(a, b, bias=bias, c=c)
    launch.rc = 1
    with pytest.raises(KernelError, match=r"misaligned operand \(M=64 N=32 K=16 batch=1\)"):
        k(a, b, bias=bias, c=c)


def test_a_wrong_dtype_is_refused_before_any_plan():
    k = _kernel(SPEC, Launch())
    a, b, bias, c = _operands()
    with pytest.raises(KernelError, match="float32 operands"):
        k(a.half(), b, bias=bias, c=c)
    assert k._plans == {}
