"""Fixture for conv-bias-act: a convolution and one activation, in the forms models write it."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: conv-bias-act, conv-epilogue, conv
class ConvRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3)

    def forward(self, x):
        return torch.relu(self.c(x))

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv-bias-act
class SequentialHardswish(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.Hardswish())

    def forward(self, x):
        return self.f(x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv-bias-act
class Conv1dLeakyRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(8, 16, 5)

    def forward(self, x):
        return F.leaky_relu(self.c(x), 0.2)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: conv-bias-act
class Conv3dMish(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(8, 16, 3)

    def forward(self, x):
        return F.mish(self.c(x))

    def example_inputs(self):
        return (torch.randn(1, 8, 6, 6, 6),)


# The pre-activation is also returned: the convolution's output must be written.
# no-match: conv-bias-act
# match: conv
class PreActivationEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3)

    def forward(self, x):
        y = self.c(x)
        return torch.relu(y), y

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# Softmax over channels is not element-wise.
# no-match: conv-bias-act, conv-epilogue
class ConvSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3)

    def forward(self, x):
        return torch.softmax(self.c(x), dim=1)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# Depthwise + ReLU: the convolution stays with cuDNN.
# no-match: conv-bias-act
class DepthwiseRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 16, 3, groups=16)

    def forward(self, x):
        return torch.relu(self.c(x))

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)
