"""Fixture for rmsnorm: nn.RMSNorm, the hand-written Llama (rsqrt) form and the division form, with and
without a weight, against LayerNorm and near misses (no square, no keepdim, sqrt as a factor, two dims)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: rmsnorm
# no-match: layernorm
class RmsNormModule(nn.Module):
    """nn.RMSNorm traces to aten.rms_norm."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(32, eps=1e-6)

    def forward(self, x):
        return self.norm(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: rmsnorm
class FunctionalRmsNormHalf(nn.Module):
    """F.rms_norm with a weight, in float16."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32, dtype=torch.float16))

    def forward(self, x):
        return F.rms_norm(x, (32,), self.weight, 1e-6)

    def example_inputs(self):
        return (torch.randn(8, 32, dtype=torch.float16),)


# match: rmsnorm
class LlamaHandWritten(nn.Module):
    """Llama's RMSNorm written out, without the dtype casts: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.ones(32))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x) * self.weight

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: rmsnorm
class WeightFirstHandWritten(nn.Module):
    """weight * (x * rsqrt(mean(x ** 2) + eps)): the weight on the left, x ** 2 for the square."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x):
        variance = (x ** 2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-5))

    def example_inputs(self):
        return (torch.randn(8, 32),)


# LayerNorm subtracts the mean: a different norm.
# no-match: rmsnorm
# match: layernorm
class LayerNormModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# The mean of squares is taken over dim 0 (across rows): the weight runs along the last
# dimension, so it is not this norm's weight. x * rsqrt(...) alone is matched, a weightless
# RMSNorm over dim 0 (which the norm family leaves eager: not a row norm); the product by
# the weight stays outside the region.
# match: rmsnorm
class MeanOverFirstDim(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6) * self.weight

    def example_inputs(self):
        return (torch.randn(8, 32),)


# Without keepdim the per-row statistic (shape 8) broadcasts along the columns of the
# 8 x 8 input, scaling column j by row j's RMS: not RMSNorm.
# no-match: rmsnorm
class MeanWithoutKeepdim(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1) + 1e-6) * self.weight

    def example_inputs(self):
        return (torch.randn(8, 8),)


# sqrt instead of rsqrt multiplies by the RMS instead of dividing by it.
# no-match: rmsnorm
class SqrtNotRsqrt(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x):
        return x * torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def example_inputs(self):
        return (torch.randn(8, 32),)


# The normalized activation is also returned, so it must be written: the weight's product
# is not fused; the norm itself is matched, weightless, with its output read twice.
# match: rmsnorm
class NormalizedEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x):
        nx = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return nx * self.weight, nx

    def example_inputs(self):
        return (torch.randn(8, 32),)


# match: rmsnorm
class LlamaRms(nn.Module):
    def __init__(self):
        super().__init__(); self.weight = nn.Parameter(torch.ones(32)); self.eps = 1e-6
    def _norm(self, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    def forward(self, x): return self._norm(x.float()).type_as(x) * self.weight
    def example_inputs(self): return (torch.randn(2, 8, 32),)


# match: rmsnorm
class HfRms(nn.Module):
    def __init__(self):
        super().__init__(); self.weight = nn.Parameter(torch.ones(32)); self.eps = 1e-6
    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(v + self.eps)
        return self.weight * h.to(dt)
    def example_inputs(self): return (torch.randn(2, 8, 32),)


# The 'weight' is a full activation, not a per-channel vector: the weightless norm is
# matched and the product by y stays outside the region.
# match: rmsnorm
class RmsTimesActivation(nn.Module):
    def forward(self, x, y):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * y
    def example_inputs(self): return (torch.randn(2, 8, 32), torch.randn(2, 8, 32))


# Weightless nn.RMSNorm: aten.rms_norm without a weight.
# match: rmsnorm
class RmsNoWeightOp(nn.Module):
    def __init__(self):
        super().__init__(); self.n = nn.RMSNorm(32, elementwise_affine=False)
    def forward(self, x): return self.n(x)
    def example_inputs(self): return (torch.randn(2, 8, 32),)


# match: rmsnorm
class DividedChannelNorm(nn.Module):
    """KernelBench L1-36's form: x / sqrt(mean(x ** 2, dim=1) + eps) over the channels of NCHW,
    no weight (matched over dim 1; the norm family leaves it eager: not the last dimension)."""

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)
        return x / rms

    def example_inputs(self):
        return (torch.rand(2, 4, 6, 6),)


# match: rmsnorm
class DividedLastDimWeighted(nn.Module):
    """The division form over the last dimension with a per-channel weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# The mean of x, not of its square: not a root mean square.
# no-match: rmsnorm
class DividedByMeanNotSquare(nn.Module):
    def forward(self, x):
        return x / torch.sqrt(x.mean(-1, keepdim=True) + 1e-6)

    def example_inputs(self):
        return (torch.rand(8, 32),)


# The mean of squares over two dimensions at once is not matched (a norm over one dimension).
# no-match: rmsnorm
class DividedOverTwoDims(nn.Module):
    def forward(self, x):
        return x / torch.sqrt((x ** 2).mean((-2, -1), keepdim=True) + 1e-6)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# x divided by the RMS of another tensor y: a scale, not a norm of x.
# no-match: rmsnorm
class DividedByOthersRms(nn.Module):
    def forward(self, x, y):
        return x / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)

    def example_inputs(self):
        return (torch.randn(8, 32), torch.randn(8, 32))
