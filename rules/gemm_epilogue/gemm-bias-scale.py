"""Fixture for gemm-bias-scale: a Linear scaled by a constant, against scales that are not constants."""
import torch
import torch.nn as nn


# OPT / BART: the query projection scaled by head_dim ** -0.5.
# match: gemm-bias-scale
class ScaledQueryProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(64, 64)
        self.scaling = 16 ** -0.5

    def forward(self, x):
        return self.q_proj(x) * self.scaling

    def example_inputs(self):
        return (torch.randn(2, 8, 64),)


# Divided by a constant.
# match: gemm-bias-scale
class LinearDiv(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc(x) / 10.0

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The constant first: multiplication commutes.
# match: gemm-bias-scale
class ConstantTimesLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return 0.5 * self.fc(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Scaled by a tensor (a learned or per-element scale is not alpha).
# no-match: gemm-bias-scale
class LinearTimesTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
        self.s = nn.Parameter(torch.rand(16))

    def forward(self, x):
        return self.fc(x) * self.s

    def example_inputs(self):
        return (torch.randn(8, 32),)


# A constant divided by the GEMM is not a scale of it.
# no-match: gemm-bias-scale
class ConstantOverLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return 1.0 / self.fc(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Scaled after a GELU: another rule's business (the scale does not commute with it).
# no-match: gemm-bias-scale
class LinearGeluScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) * 2.0

    def example_inputs(self):
        return (torch.randn(8, 32),)
