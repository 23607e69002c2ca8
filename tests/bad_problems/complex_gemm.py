"""Bad problem: a complex-valued GEMM, which no rule covers."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(256, 256, dtype=torch.complex64), torch.randn(256, 256, dtype=torch.complex64)]


def get_init_inputs():
    return []
