"""Fixture for gemm-bias-silu: F.silu, nn.SiLU and x * sigmoid(x) after a biased GEMM, against near misses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-silu, gemm-bias
class LinearFunctionalSilu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.silu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-silu
class SequentialSiluModule(nn.Module):
    """nn.Sequential(nn.Linear, nn.SiLU()) on a 3-D activation."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.SiLU())

    def forward(self, x):
        return self.mlp(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-bias-silu
class MatmulBiasHandWrittenSwish(nn.Module):
    """x @ w + b, then h * torch.sigmoid(h)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))
        self.b = nn.Parameter(torch.randn(64))

    def forward(self, x):
        h = x @ self.w + self.b
        return h * torch.sigmoid(h)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-silu
class AddmmSigmoidFirst(nn.Module):
    """addmm, then torch.sigmoid(h) * h (the multiply's operands swapped)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))
        self.b = nn.Parameter(torch.randn(64))

    def forward(self, x):
        h = torch.addmm(self.b, x, self.w.t())
        return torch.sigmoid(h) * h

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Sigmoid alone, without the multiply, is not SiLU.
# no-match: gemm-bias-silu
class SigmoidOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# h * sigmoid(g) gates one product by another (GLU-like): not SiLU of h.
# no-match: gemm-bias-silu
class SigmoidOfOtherTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x, g):
        return self.fc(x) * torch.sigmoid(g)

    def example_inputs(self):
        return (torch.randn(8, 32), torch.randn(8, 64))


# The pre-activation is also returned, so the GEMM output must be written: no fusion.
# no-match: gemm-bias-silu
class PreActivationEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        h = self.fc(x)
        return F.silu(h), h

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The sigmoid is also returned, so the hand-written SiLU cannot be fused away.
# no-match: gemm-bias-silu
class SigmoidEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        h = self.fc(x)
        s = torch.sigmoid(h)
        return h * s, s

    def example_inputs(self):
        return (torch.randn(8, 32),)
