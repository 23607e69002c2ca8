"""Fixture for gemm-softmax: a bias-free GEMM feeding a last-dim softmax, against other dims and escapes."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-softmax, gemm
class MatmulSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        return F.softmax(x @ self.w, dim=-1)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-softmax
class LinearNoBiasSoftmaxModule(nn.Module):
    """A bias-free classifier head: nn.Linear(bias=False) then nn.Softmax(dim=-1), 3-D activation."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 64, bias=False)
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.sm(self.head(x))

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-softmax
class MmTensorSoftmax(nn.Module):
    """torch.softmax(torch.mm(a, b), -1)."""

    def forward(self, a, b):
        return torch.softmax(torch.mm(a, b), -1)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 64))


# match: gemm-softmax
class BatchedScoresSoftmax(nn.Module):
    """Unscaled attention-style scores: softmax(q @ k^T) over the last dim."""

    def forward(self, q, k):
        return (q @ k.transpose(-2, -1)).softmax(dim=-1)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# A softmax over dim 0 (down the columns) is not the row softmax the epilogue computes.
# no-match: gemm-softmax
class SoftmaxDim0(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        return F.softmax(x @ self.w, dim=0)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# log_softmax is a different op.
# no-match: gemm-softmax
class LogSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        return F.log_softmax(x @ self.w, dim=-1)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The logits are also returned, so the GEMM output must be written anyway.
# no-match: gemm-softmax
class LogitsEscape(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        logits = x @ self.w
        return F.softmax(logits, dim=-1), logits

    def example_inputs(self):
        return (torch.randn(8, 32),)


# A scale between the GEMM and the softmax sits outside this rule's pattern (it is attention's).
# no-match: gemm-softmax
class ScaledBeforeSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        return F.softmax((x @ self.w) * 0.125, dim=-1)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-softmax
class SoftmaxDim1(nn.Module):
    def __init__(self):
        super().__init__(); self.w = nn.Parameter(torch.randn(32, 10))
    def forward(self, x): return F.softmax(x @ self.w, dim=1)
    def example_inputs(self): return (torch.randn(8, 32),)


# Softmax over the rows of the GEMM output (transpose then dim=-1): must not match.
# no-match: gemm-softmax
class TransposedSoftmax(nn.Module):
    def __init__(self):
        super().__init__(); self.w = nn.Parameter(torch.randn(32, 64))
    def forward(self, x): return F.softmax((x @ self.w).t(), dim=-1)
    def example_inputs(self): return (torch.randn(8, 32),)
