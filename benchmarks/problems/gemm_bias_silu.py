"""Fused GEMM + bias + SiLU: y = silu(x @ W^T + b) with nn.Linear(4096 ->
11008, bias=True) on a (2048, 4096) float32 input followed by F.silu (the
Llama-7B MLP gate-projection shape). FLOPs = 2 * batch * in_features *
out_features for the GEMM (= 2 * 2048 * 4096 * 11008, about 184.7 GFLOP),
plus O(batch * out_features) for the bias add and SiLU. Written in the
style of KernelBench level 2 (GEMM + activation epilogue, e.g. "Gemm_Swish")."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2048
in_features = 4096
out_features = 11008


class Model(nn.Module):
    """Linear layer (with bias) followed by SiLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return F.silu(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
