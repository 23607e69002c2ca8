"""Fixture for gemm-bias-relu-residual: x + act(Linear(y)) against near misses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-relu-residual
class LinearActResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return x + F.relu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(16, 32),)


# match: gemm-bias-relu-residual
class ResidualFromAnotherTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x, r):
        return F.relu(self.fc(x)) + r

    def example_inputs(self):
        return (torch.randn(2, 8, 32), torch.randn(2, 8, 64))


# The residual is broadcast (a row), not a tensor of the output's shape.
# no-match: gemm-bias-relu-residual
class BroadcastResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x, r):
        return F.relu(self.fc(x)) + r

    def example_inputs(self):
        return (torch.randn(16, 64 // 2), torch.randn(1, 64))


# No bias: the rule's epilogue adds one.
# no-match: gemm-bias-relu-residual
class NoBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32, bias=False)

    def forward(self, x):
        return x + F.relu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(16, 32),)
