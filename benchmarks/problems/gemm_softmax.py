"""Matmul followed by a row softmax: y = softmax(x @ W, dim=-1) via
torch.matmul, with x (4096, 1024) and W (1024, 4096) float32 inputs (the
logits-then-softmax pattern; a fused kernel can keep a row's logits on chip).
FLOPs = 2 * M * K * N for the matmul (= 2 * 4096 * 1024 * 4096, about
34.4 GFLOP), plus about 5 * M * N for softmax (max, subtract, exp, sum,
divide). Written in the style of KernelBench level 2 (matmul + reduction
epilogue, e.g. "Matmul_Softmax")."""

import torch
import torch.nn as nn

M = 4096
K = 1024
N = 4096


class Model(nn.Module):
    """torch.matmul followed by softmax over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.matmul(x, W), dim=-1)


def get_inputs():
    x = torch.randn(M, K)
    W = torch.randn(K, N)
    return [x, W]


def get_init_inputs():
    return []
