"""Fixture for gemm-bias-gelu: exact (erf) GELU after a biased GEMM, against tanh GELU and wrong constants."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-gelu
# no-match: gemm-bias-gelu-tanh
class LinearFunctionalGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.gelu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-gelu
class SequentialGeluModule(nn.Module):
    """nn.Sequential(nn.Linear, nn.GELU()) on a 3-D activation."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU())

    def forward(self, x):
        return self.mlp(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-bias-gelu
class HandWrittenErfDiv(nn.Module):
    """x @ w + b, then 0.5 * x * (1 + erf(x / sqrt(2)))."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))
        self.b = nn.Parameter(torch.randn(64))

    def forward(self, x):
        h = x @ self.w + self.b
        return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-gelu
class HandWrittenErfMul(nn.Module):
    """Linear, then x * 0.5 * (1 + erf(x * 0.7071067811865476)) (the BERT form, multiplied)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        h = self.fc(x)
        return h * 0.5 * (1.0 + torch.erf(h * 0.7071067811865476))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The tanh approximation is a different function (gemm-bias-gelu-tanh).
# no-match: gemm-bias-gelu
# match: gemm-bias-gelu-tanh
class LinearTanhGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")

    def example_inputs(self):
        return (torch.randn(8, 32),)


# erf(x / 2) is not erf(x / sqrt(2)): the wrong constant is not GELU.
# no-match: gemm-bias-gelu
class WrongErfConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.erf(h / 2.0))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The pre-activation is also returned, so the GEMM output must be written: no fusion.
# no-match: gemm-bias-gelu
class PreActivationEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        h = self.fc(x)
        return F.gelu(h), h

    def example_inputs(self):
        return (torch.randn(8, 32),)


# GELU of a bias-free GEMM: the rule's epilogue is bias + GELU.
# no-match: gemm-bias-gelu
class NoBiasGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64))

    def forward(self, x):
        return F.gelu(x @ self.w)

    def example_inputs(self):
        return (torch.randn(8, 32),)
