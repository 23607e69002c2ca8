"""Fixture for gemm-bias: Linear, addmm and matmul + bias, against residual, scalar and escape near misses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias
# no-match: gemm
class LinearWithBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias
class FunctionalLinear3d(nn.Module):
    """F.linear on a 3-D activation."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return F.linear(x, self.w, self.b)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-bias
class AddmmTransposedWeight(nn.Module):
    """torch.addmm(b, x, w.t()), nn.Linear as it appears after decomposition."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w.t())

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias
class MatmulPlusBias(nn.Module):
    """x @ w + b written by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return x @ self.w + self.b

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias
class BiasPlusMm(nn.Module):
    """b + torch.mm(x, w): the add's operands the other way round."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return self.b + torch.mm(x, self.w)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The added tensor is a full M x N matrix: a residual, not a per-column bias.
# no-match: gemm-bias
# match: gemm-residual
class ResidualMatrix(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x, r):
        return x @ self.w + r

    def example_inputs(self):
        return (torch.randn(8, 32), torch.randn(8, 16))


# Adding a Python scalar is not a bias tensor.
# no-match: gemm-bias
class ScalarAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        return x @ self.w + 1.0

    def example_inputs(self):
        return (torch.randn(8, 32),)


# addmm with beta = 0.5 scales the bias: not the plain bias epilogue.
# no-match: gemm-bias
class AddmmScaledBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w, beta=0.5)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# torch.add(y, b, alpha=2) doubles the bias: not the plain bias epilogue.
# no-match: gemm-bias
class AddWithAlpha(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.add(x @ self.w, self.b, alpha=2)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The GEMM result is also returned, so it cannot stay in registers for the bias add.
# no-match: gemm-bias
class GemmEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = x @ self.w
        return y + self.b, y

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Subtracting the bias is sub, not add.
# no-match: gemm-bias
class SubtractBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return x @ self.w - self.b

    def example_inputs(self):
        return (torch.randn(8, 32),)


# bias added after a transpose is per-row of the GEMM, not per-column.
# no-match: gemm-bias
class TransposedBias(nn.Module):
    def __init__(self):
        super().__init__(); self.w = nn.Parameter(torch.randn(32, 64)); self.b = nn.Parameter(torch.randn(8))
    def forward(self, x): return (x @ self.w).t() + self.b
    def example_inputs(self): return (torch.randn(8, 32),)


# bias added after a reshape that mixes rows and columns
# no-match: gemm-bias
class ReshapedBias(nn.Module):
    def __init__(self):
        super().__init__(); self.w = nn.Parameter(torch.randn(32, 64)); self.b = nn.Parameter(torch.randn(16))
    def forward(self, x): return (x @ self.w).reshape(32, 16) + self.b
    def example_inputs(self): return (torch.randn(8, 32),)
