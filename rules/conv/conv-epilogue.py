"""Fixture for conv-epilogue: KernelBench level-2 chains after a convolution, of any length,
with scalars, per-channel tensors and a residual; against reductions, pooling and
broadcasts that are not element-wise."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# KernelBench L2-87: subtract, subtract, Mish.
# match: conv-epilogue
class SubSubMish(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return F.mish(self.c(x) - 0.5 - 0.2)

    def example_inputs(self):
        return (torch.randn(2, 8, 10, 10),)


# KernelBench L2-7: ReLU, LeakyReLU, GELU, sigmoid, then a per-channel bias (C, 1, 1).
# match: conv-epilogue
class LongChainChannelBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(4, 8, 3)
        self.bias = nn.Parameter(torch.randn(8, 1, 1, 1))

    def forward(self, x):
        x = torch.relu(self.c(x))
        x = F.leaky_relu(x, 0.01)
        x = F.gelu(x)
        x = torch.sigmoid(x)
        return x + self.bias

    def example_inputs(self):
        return (torch.randn(1, 4, 6, 6, 6),)


# KernelBench L2-2 style: bias, clamp, scale, clamp, divide.
# match: conv-epilogue
class ClampScaleDivide(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)
        self.b = nn.Parameter(torch.randn(16, 1, 1))

    def forward(self, x):
        x = self.c(x) + self.b
        x = torch.clamp(x, min=0.0, max=1.0) * 2.0
        return torch.clamp(x, min=0.0, max=1.0) / 2.0

    def example_inputs(self):
        return (torch.randn(2, 8, 10, 10),)


# A residual add of a tensor of the output's shape, then ReLU.
# match: conv-epilogue
class ResidualRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.c(x) + x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# KernelBench L2-35: subtract and HardSwish fuse; MaxPool is not element-wise, and Mish after it is not the conv's.
# match: conv-epilogue
class SubHardswishPoolMish(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = F.hardswish(self.c(x) - 0.5)
        return F.mish(self.pool(x))

    def example_inputs(self):
        return (torch.randn(2, 8, 10, 10),)


# A mean over channels is a reduction.
# no-match: conv-epilogue
class ConvMeanChannels(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return self.c(x).mean(dim=1, keepdim=True)

    def example_inputs(self):
        return (torch.randn(2, 8, 10, 10),)


# An add that broadcasts the output up to a larger shape is not element-wise on it.
# no-match: conv-epilogue
class BroadcastGrows(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)

    def forward(self, x, y):
        return self.c(x) + y

    def example_inputs(self):
        return (torch.randn(1, 8, 10, 10), torch.randn(4, 16, 8, 8))


# Training-mode dropout between is not the identity: the chain stops at the conv.
# no-match: conv-epilogue
class ChainedAfterMaxPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return torch.relu(F.max_pool2d(self.c(x), 2))

    def example_inputs(self):
        return (torch.randn(2, 8, 10, 10),)
