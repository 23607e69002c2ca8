"""Bad problem: forward multiplies operands whose shapes do not agree."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.rand(64, 32), torch.rand(64, 32)]


def get_init_inputs():
    return []
