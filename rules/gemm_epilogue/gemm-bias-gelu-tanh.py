"""Fixture for gemm-bias-gelu-tanh: F.gelu(approximate='tanh') and the hand-written GPT-2 forms, against erf GELU."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-gelu-tanh, gemm-bias
# no-match: gemm-bias-gelu
class LinearTanhGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        return F.gelu(self.c_fc(x), approximate="tanh")

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# The hand-written minGPT NewGELU with torch.pow(x, 3.0) is tanh GELU, not erf GELU.
# match: gemm-bias-gelu-tanh
# no-match: gemm-bias-gelu
class MinGptNewGeluPow(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        h = self.c_fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-bias-gelu-tanh
class PowerOperatorCube(nn.Module):
    """x @ w + b, and the cube written as h ** 3."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 128))
        self.b = nn.Parameter(torch.randn(128))

    def forward(self, x):
        h = x @ self.w + self.b
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-gelu-tanh
class TripleProductCube(nn.Module):
    """addmm, and the cube written as h * h * h."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(128, 32))
        self.b = nn.Parameter(torch.randn(128))

    def forward(self, x):
        h = torch.addmm(self.b, x, self.w.t())
        return 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * (h * h * h))))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Exact (erf) GELU is the other rule.
# no-match: gemm-bias-gelu-tanh
# match: gemm-bias-gelu
class LinearErfGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        return F.gelu(self.c_fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# 0.05 instead of 0.044715 in the cubic term is not the GELU approximation.
# no-match: gemm-bias-gelu-tanh
class WrongCubicCoefficient(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        h = self.c_fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.05 * torch.pow(h, 3.0))))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# A square instead of a cube is not the GELU approximation.
# no-match: gemm-bias-gelu-tanh
class SquareNotCube(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        h = self.c_fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 2.0))))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The pre-activation is also returned, so the GEMM output must be written: no fusion.
# no-match: gemm-bias-gelu-tanh
class PreActivationEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(32, 128)

    def forward(self, x):
        h = self.c_fc(x)
        return F.gelu(h, approximate="tanh"), h

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-gelu-tanh
class LeftAssocCube(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(32, 64)
    def forward(self, x):
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h)))
    def example_inputs(self): return (torch.randn(8, 32),)
