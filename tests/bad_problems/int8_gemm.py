"""Bad problem: an int8 GEMM, which no rule covers yet."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randint(-8, 8, (256, 256), dtype=torch.int8), torch.randint(-8, 8, (256, 256), dtype=torch.int8)]


def get_init_inputs():
    return []
