"""Fixture for gemm-residual: x + proj(y) with and without bias, against broadcast, scaled and escape near misses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: gemm-residual, gemm-bias
class LinearResidual(nn.Module):
    """The transformer's x = x + proj(y) with a biased projection."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32)

    def forward(self, x, y):
        return x + self.proj(y)

    def example_inputs(self):
        return (torch.randn(2, 8, 32), torch.randn(2, 8, 64))


# match: gemm-residual
class LinearDropoutResidual(nn.Module):
    """Dropout (an identity at inference) between the projection and the add is looked through."""

    def __init__(self):
        super().__init__()
        self.c_proj = nn.Linear(64, 32)
        self.resid_dropout = nn.Dropout(0.0)

    def forward(self, x, y):
        return x + self.resid_dropout(self.c_proj(y))

    def example_inputs(self):
        return (torch.randn(2, 8, 32), torch.randn(2, 8, 64))


# match: gemm-residual
# no-match: gemm-bias
class MatmulNoBiasResidual(nn.Module):
    """A bias-free GEMM plus a residual of the output's shape."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))

    def forward(self, x, r):
        return torch.mm(x, self.w) + r

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 32))


# match: gemm-residual
class MatmulBiasThenResidual(nn.Module):
    """x @ w + b + r: bias and residual both added by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))
        self.b = nn.Parameter(torch.randn(32))

    def forward(self, x, r):
        return x @ self.w + self.b + r

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 32))


# A per-column bias only: the added tensor is not of the output's shape.
# no-match: gemm-residual
# match: gemm-bias
class BiasOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))
        self.b = nn.Parameter(torch.randn(32))

    def forward(self, x):
        return x @ self.w + self.b

    def example_inputs(self):
        return (torch.randn(8, 64),)


# A per-row (M x 1) tensor broadcast over the columns is not a residual of the output's shape.
# no-match: gemm-residual
class RowBroadcastAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))

    def forward(self, x, r):
        return x @ self.w + r

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 1))


# torch.add(r, y, alpha=0.5) scales the GEMM result: not D = AB + C.
# no-match: gemm-residual
class ScaledAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32, bias=False)

    def forward(self, x, r):
        return torch.add(r, self.proj(x), alpha=0.5)

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 32))


# The projection is also returned, so it must be written: no fusion.
# no-match: gemm-residual
class ProjectionEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32)

    def forward(self, x, r):
        y = self.proj(x)
        return r + y, y

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 32))


# A residual multiplied in (gating) is not an add.
# no-match: gemm-residual
class MultiplyNotAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32)

    def forward(self, x, r):
        return r * self.proj(x)

    def example_inputs(self):
        return (torch.randn(8, 64), torch.randn(8, 32))


# real dropout (p=0.5, training=True) between the GEMM and the add is not the identity
# no-match: gemm-residual
class RealDropout(nn.Module):
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(32, 32)
    def forward(self, x): return x + F.dropout(self.fc(x), p=0.5, training=True)
    def example_inputs(self): return (torch.randn(8, 32),)
