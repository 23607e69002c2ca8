"""Fused GEMM + bias + ReLU: y = relu(x @ W^T + b) with nn.Linear(8192 -> 8192,
bias=True) applied to a (1024, 8192) float32 input, followed by torch.relu.
FLOPs = 2 * batch * in_features * out_features for the GEMM
(= 2 * 1024 * 8192 * 8192, about 137.4 GFLOP), plus batch * out_features
each for the bias add and the ReLU. Written in the style of KernelBench
level 2 (GEMM + elementwise epilogue, e.g. "Gemm_Add_ReLU")."""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 8192
out_features = 8192


class Model(nn.Module):
    """Linear layer (with bias) followed by ReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
