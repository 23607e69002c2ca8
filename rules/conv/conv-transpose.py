"""Fixture for conv-transpose: transposed convolutions, alone and with a chain; against
forward and grouped ones."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: conv-transpose
class ConvTranspose2dStrided(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# KernelBench L2-5: ConvTranspose2d, subtract a per-channel bias, tanh.
# match: conv-transpose
class ConvTransposeSubTanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.bias = nn.Parameter(torch.randn(8, 1, 1))

    def forward(self, x):
        return torch.tanh(self.c(x) - self.bias)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv-transpose
class ConvTranspose3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ConvTranspose3d(8, 4, 3)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(1, 8, 4, 4, 4),)


# A forward convolution is conv's.
# no-match: conv-transpose
class Forward(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 8, 3)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# Grouped transposed convolution: stays with cuDNN.
# no-match: conv-transpose
class GroupedTransposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ConvTranspose2d(16, 8, 3, groups=4)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)
