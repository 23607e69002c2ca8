"""Fixture for gemm-bias-relu: Linear/addmm/matmul + bias + ReLU forms, against other activations and escapes."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-bias-relu, gemm-bias
class LinearTorchRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return torch.relu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-relu
class SequentialReluModule(nn.Module):
    """nn.Sequential(nn.Linear, nn.ReLU()) on a 3-D activation."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(32, 16), nn.ReLU())

    def forward(self, x):
        return self.mlp(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-bias-relu
class AddmmFunctionalRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return F.relu(torch.addmm(self.b, x, self.w.t()))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-relu
class MatmulBiasClampMin(nn.Module):
    """x @ w + b, then clamp_min(0)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.clamp_min(x @ self.w + self.b, 0.0)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Sigmoid is not ReLU.
# no-match: gemm-bias-relu
# match: gemm-bias
class LinearSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The pre-activation is also returned, so the GEMM output must be written: no fusion.
# no-match: gemm-bias-relu
# match: gemm-bias
class PreActivationEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y), y

    def example_inputs(self):
        return (torch.randn(8, 32),)


# clamp_min(x, 0.1) is a shifted threshold, not ReLU.
# no-match: gemm-bias-relu
class ClampMinNonZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x):
        return torch.clamp_min(self.fc(x), 0.1)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Adding a full matrix before the ReLU is a residual, not a bias.
# no-match: gemm-bias-relu
class ResidualThenRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))

    def forward(self, x, r):
        return torch.relu(x @ self.w + r)

    def example_inputs(self):
        return (torch.randn(8, 32), torch.randn(8, 16))


# No bias at all: the rule's epilogue is bias + ReLU.
# no-match: gemm-bias-relu
class LinearNoBiasRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return torch.relu(self.fc(x))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: gemm-bias-relu
class InplaceRelu(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(32, 64); self.act = nn.ReLU(inplace=True)
    def forward(self, x): return self.act(self.fc(x))
    def example_inputs(self): return (torch.randn(8, 32),)


# slicing between gemm and relu: only part of the output
# no-match: gemm-bias-relu
class SlicedRelu(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(32, 64)
    def forward(self, x): return torch.relu(self.fc(x)[:, :16])
    def example_inputs(self): return (torch.randn(8, 32),)
