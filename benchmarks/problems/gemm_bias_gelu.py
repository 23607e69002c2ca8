"""Fused GEMM + bias + exact GELU: y = gelu(x @ W^T + b) with nn.Linear(4096 ->
16384, bias=True) on a (2048, 4096) float32 input, followed by F.gelu with
the exact erf formulation (approximate='none'), as in a transformer MLP
up-projection. FLOPs = 2 * batch * in_features * out_features for the GEMM
(= 2 * 2048 * 4096 * 16384, about 274.9 GFLOP), plus O(batch * out_features)
for the bias add and GELU. Written in the style of KernelBench level 2
(GEMM + activation epilogue, e.g. "Gemm_GELU")."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2048
in_features = 4096
out_features = 16384


class Model(nn.Module):
    """Linear layer (with bias) followed by exact (erf) GELU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return F.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
