"""Fixture for layernorm: nn.LayerNorm / F.layer_norm over the last dim or several trailing dims,
against GroupNorm, RMSNorm and hand-written norms."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: layernorm
# no-match: rmsnorm
class LayerNormModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: layernorm
class LayerNormNoAffine(nn.Module):
    """elementwise_affine=False: no weight, no bias."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32, elementwise_affine=False)

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: layernorm
class FunctionalLayerNormWeightOnly(nn.Module):
    """F.layer_norm with a weight and no bias, in bfloat16."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32, dtype=torch.bfloat16))

    def forward(self, x):
        return F.layer_norm(x, (32,), self.weight, None, 1e-5)

    def example_inputs(self):
        return (torch.randn(4, 8, 32, dtype=torch.bfloat16),)


# match: layernorm
class PreNormBlock(nn.Module):
    """The pre-norm transformer pattern: ln_1 feeding a projection."""

    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(32, bias=False)
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return self.fc(self.ln_1(x))

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# GroupNorm normalizes over channel groups, not the last dimension.
# no-match: layernorm
class GroupNormModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 32)

    def forward(self, x):
        return self.gn(x)

    def example_inputs(self):
        return (torch.randn(2, 32, 8),)


# LayerNorm over the last two dimensions: one norm over rows of 8 x 32 = 256 elements.
# match: layernorm
class LayerNormLastTwoDims(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((8, 32))

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: layernorm
class LayerNormChannelsAndImage(nn.Module):
    """normalized_shape (C, H, W) over an image batch, as KernelBench L1-40 writes it."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((4, 6, 6))

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(2, 4, 6, 6),)


# A norm over the channel dimension of NCHW written by hand (mean and var over dim 1) is not
# aten.layer_norm: nothing here says it normalizes trailing dimensions.
# no-match: layernorm
class ChannelNormByHand(nn.Module):
    def forward(self, x):
        mu = x.mean(1, keepdim=True)
        return (x - mu) / torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)

    def example_inputs(self):
        return (torch.randn(2, 4, 6, 6),)


# RMSNorm does not subtract the mean: a different op (rmsnorm).
# no-match: layernorm
# match: rmsnorm
class RmsNormModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.n = nn.RMSNorm(32)

    def forward(self, x):
        return self.n(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# float64 is outside the rule's dtypes.
# no-match: layernorm
class LayerNormFloat64(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32, dtype=torch.float64)

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(8, 32, dtype=torch.float64),)
