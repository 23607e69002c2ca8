"""GEMM, division by a constant, exact GELU: y = gelu((x @ W^T + b) / divisor), KernelBench
level 2 style ("Matmul_Divide_GELU"). nn.Linear(8192 -> 8192) on a (1024, 8192) float32 input,
divisor 10. No shipped rule fuses the division: discovery covers the Linear alone (gemm-bias)
and leaves the division and GELU to eager; the agent's rule takes all three (the division is
the GEMM's alpha, applied to the bias too)."""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 8192
out_features = 8192
divisor = 10.0


class Model(nn.Module):
    def __init__(self, in_features, out_features, divisor):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x):
        x = self.linear(x)
        x = x / self.divisor
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, divisor]
