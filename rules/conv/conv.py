"""Fixture for conv: 1-D, 2-D and 3-D forward convolutions, strided, padded, dilated; against
grouped and depthwise ones, transposed ones and non-float dtypes."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: conv
class Conv2dPadded(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv
class Conv1dStridedDilated(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(8, 16, 3, stride=2, dilation=2, bias=False)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: conv
class Conv3dAsymmetric(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(8, 16, (3, 5, 7), stride=(2, 1, 1), padding=(1, 2, 3))

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(1, 8, 6, 10, 12),)


# match: conv
class FunctionalConv2d(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16, 1, 1))

    def forward(self, x):
        return F.conv2d(x, self.w)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# padding="same" (aten.conv2d.padding): the padding read from the filter and dilation.
# match: conv
class PaddingSame(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, (3, 5), padding="same", dilation=2)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 9, 9),)


# Depthwise (groups == channels): stays with cuDNN.
# no-match: conv
class Depthwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 16, 3, groups=16)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# Grouped: stays with cuDNN.
# no-match: conv
class Grouped(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, groups=4)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# A transposed convolution is conv-transpose's.
# no-match: conv
class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ConvTranspose2d(16, 8, 3, stride=2)

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# float64: no template takes it.
# no-match: conv
class Float64Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3).double()

    def forward(self, x):
        return self.c(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8, dtype=torch.float64),)
