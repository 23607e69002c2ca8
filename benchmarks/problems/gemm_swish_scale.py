"""GEMM, Swish, scaling: y = silu(x @ W^T + b) * scale, KernelBench level 2 style
("Matmul_Swish_Scaling"). nn.Linear(8192 -> 8192) on a (1024, 8192) float32 input, scale 2.
No shipped rule fuses the scaling: discovery fuses GEMM + bias + SiLU (gemm-bias-silu) and
leaves the multiplication to eager."""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 8192
out_features = 8192
scaling_factor = 2.0


class Model(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        x = x * torch.sigmoid(x)
        return x * self.scaling_factor


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
