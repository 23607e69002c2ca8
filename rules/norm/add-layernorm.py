"""Fixture for add-layernorm: a residual add feeding LayerNorm, against broadcast adds and RMSNorm."""
import torch
import torch.nn as nn


# match: add-layernorm
# match: layernorm
class AddLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x, y):
        return self.ln(x + y)

    def example_inputs(self):
        return (torch.randn(2, 8, 32), torch.randn(2, 8, 32))


# match: add-layernorm
class AddLayerNormBf16(nn.Module):
    """bfloat16, no bias."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32, bias=False, dtype=torch.bfloat16)

    def forward(self, x, y):
        return self.ln(y + x)

    def example_inputs(self):
        return (torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16))


# A broadcast add (a bias row) is not a residual of the same shape.
# no-match: add-layernorm
# match: layernorm
class BroadcastAddLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.b = nn.Parameter(torch.randn(32))

    def forward(self, x):
        return self.ln(x + self.b)

    def example_inputs(self):
        return (torch.randn(4, 32),)


# An add followed by RMSNorm is not LayerNorm.
# no-match: add-layernorm
class AddRmsNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.n = nn.RMSNorm(32)

    def forward(self, x, y):
        return self.n(x + y)

    def example_inputs(self):
        return (torch.randn(4, 32), torch.randn(4, 32))


# A scaled add (alpha=2) is not a plain residual add.
# no-match: add-layernorm
class ScaledAddLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x, y):
        return self.ln(torch.add(x, y, alpha=2))

    def example_inputs(self):
        return (torch.randn(4, 32), torch.randn(4, 32))


# The sum also feeds the next residual (minGPT: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))):
# the region exposes it as a second output.
# match: add-layernorm
class SumUsedLater(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x, y):
        s = x + y
        return s + torch.tanh(self.ln(s))

    def example_inputs(self):
        return (torch.randn(4, 32), torch.randn(4, 32))
