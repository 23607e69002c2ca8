"""Fixture for gemm-bias-silu-scale (a scripted proposal in the agent tests)."""
import torch
import torch.nn as nn


# match: gemm-bias-silu-scale
class LinearSwishScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        y = self.fc(x)
        return y * torch.sigmoid(y) * 2.0

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Scaled by a tensor, not a constant.
# no-match: gemm-bias-silu-scale
class LinearSwishScaleTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x, s):
        y = self.fc(x)
        return y * torch.sigmoid(y) * s

    def example_inputs(self):
        return (torch.randn(8, 32), torch.rand(8, 16))
