"""Fixture for gemm: plain 2-D products in every form, and batched or epilogue near misses."""
import torch
import torch.nn as nn


# match: gemm
class MmCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        return torch.mm(x, self.w)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm
class MatmulOperator(nn.Module):
    def forward(self, a, b):
        return a @ b

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 24))


# match: gemm
# no-match: gemm-bias
class LinearNoBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm
class TransposedWeight(nn.Module):
    """x @ w.t() with w stored N x K, as nn.Linear keeps it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32))

    def forward(self, x):
        return x @ self.w.t()

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm
class TransposedLeft(nn.Module):
    """a.T @ b: the left operand is read column-major."""

    def forward(self, a, b):
        return a.T @ b

    def example_inputs(self):
        return (torch.randn(32, 8), torch.randn(32, 16))


# match: gemm
# no-match: batched-gemm
class Activation3dTimesWeight(nn.Module):
    """A 3-D activation times a 2-D weight: the batch folds into M, so it is one GEMM."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        return torch.matmul(x, self.w)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# Both operands carry a batch of 4 independent products: batched-gemm, not gemm.
# no-match: gemm
# match: batched-gemm
class BatchedMatmul(nn.Module):
    def forward(self, a, b):
        return a @ b

    def example_inputs(self):
        return (torch.randn(4, 8, 32), torch.randn(4, 32, 16))


# torch.bmm over a batch of 4 is likewise batched, not a single GEMM.
# no-match: gemm
class BmmCall(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)

    def example_inputs(self):
        return (torch.randn(4, 8, 32), torch.randn(4, 32, 16))


# A matrix-vector product has a rank-1 output: not a GEMM the rule covers.
# no-match: gemm
class MatrixVector(nn.Module):
    def forward(self, a, v):
        return a @ v

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32))


# float64 is outside the rule's dtypes.
# no-match: gemm
class Float64Mm(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)

    def example_inputs(self):
        return (torch.randn(8, 32, dtype=torch.float64), torch.randn(32, 16, dtype=torch.float64))


# nn.Linear with a bias is aten.linear with a bias operand: gemm-bias, not a plain gemm.
# no-match: gemm
# match: gemm-bias
class LinearWithBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)
