"""Fixture for batched-gemm: bmm and batched matmul, against 2-D and folded-batch near misses."""
import torch
import torch.nn as nn


# match: batched-gemm
class BmmCall(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)

    def example_inputs(self):
        return (torch.randn(4, 16, 32), torch.randn(4, 32, 8))


# match: batched-gemm
class Matmul3d(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)

    def example_inputs(self):
        return (torch.randn(4, 16, 32), torch.randn(4, 32, 8))


# match: batched-gemm
class Matmul4dHeads(nn.Module):
    """Per-head products as attention writes them: (B, H, T, D) @ (B, H, D, T)."""

    def forward(self, q, k):
        return q @ k.transpose(-2, -1)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# match: batched-gemm
class BroadcastLeft(nn.Module):
    """A 2-D left operand broadcast against a batch of right operands."""

    def forward(self, a, b):
        return a @ b

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(4, 32, 8))


# A plain 2-D product has no batch.
# no-match: batched-gemm
# match: gemm
class Plain2dMm(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 8))


# A 3-D activation times a 2-D weight is one GEMM with the batch folded into M.
# no-match: batched-gemm
class ActivationTimesWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 8))

    def forward(self, x):
        return x @ self.w

    def example_inputs(self):
        return (torch.randn(4, 16, 32),)


# A batch of one is a single GEMM, not a batch.
# no-match: batched-gemm
class BatchOfOne(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)

    def example_inputs(self):
        return (torch.randn(1, 16, 32), torch.randn(1, 32, 8))


# A batched product in float64 is outside the rule's dtypes.
# no-match: batched-gemm
class Float64Bmm(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)

    def example_inputs(self):
        return (torch.randn(4, 16, 32, dtype=torch.float64), torch.randn(4, 32, 8, dtype=torch.float64))
