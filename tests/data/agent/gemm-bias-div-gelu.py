"""Fixture for gemm-bias-div-gelu (proposed by the agent's scripted server in the tests)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-div-gelu
class LinearDivGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return F.gelu(self.fc(x) / 10.0)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Divided by a tensor, not a constant.
# no-match: gemm-bias-div-gelu
class LinearDivTensorGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x, d):
        return F.gelu(self.fc(x) / d)

    def example_inputs(self):
        return (torch.randn(8, 32), torch.rand(8, 16) + 1)


# tanh GELU is another rule.
# no-match: gemm-bias-div-gelu
class LinearDivGeluTanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return F.gelu(self.fc(x) / 10.0, approximate="tanh")

    def example_inputs(self):
        return (torch.randn(8, 32),)
