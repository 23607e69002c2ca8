"""Fixture for gemm-bias-relu-div (a scripted proposal in the agent tests)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-relu-div
class LinearReluDiv(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return F.relu(self.fc(x)) / 2.0

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Divided by a tensor, not a constant.
# no-match: gemm-bias-relu-div
class LinearReluDivTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x, d):
        return F.relu(self.fc(x)) / d

    def example_inputs(self):
        return (torch.randn(8, 32), torch.rand(8, 16) + 1)
