"""Fixture for conv-bn: eval-mode BatchNorm after a convolution, alone or with ReLU and a residual
(ResNet's blocks); against BatchNorm in training mode and a BatchNorm whose input is used elsewhere."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: conv-bn
class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, bias=False)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        return self.bn(self.c(x))

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv-bn
class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        return F.relu(self.bn(self.c(x)))

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# ResNet's second conv of a basic block: bn, residual add, ReLU.
# match: conv-bn
class ConvBnAddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.c(x)) + x)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# match: conv-bn
class Conv1dBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(8, 16, 3)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):
        return self.bn(self.c(x))

    def example_inputs(self):
        return (torch.randn(2, 8, 20),)


# BatchNorm in training mode normalizes by the batch's statistics: not foldable.
# no-match: conv-bn
# match: conv
class TrainingModeBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3)
        self.register_buffer("mean", torch.zeros(32))
        self.register_buffer("var", torch.ones(32))

    def forward(self, x):
        return F.batch_norm(self.c(x), self.mean, self.var, training=True)

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)


# The convolution's output is also returned: it must be written, so BatchNorm cannot fold into it.
# no-match: conv-bn
class ConvOutputEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        y = self.c(x)
        return self.bn(y), y

    def example_inputs(self):
        return (torch.randn(2, 16, 8, 8),)
