"""Matrix multiplication with a very large reduction dimension: C = A @ B via
torch.matmul with A of shape (256, 524288) and B of shape (524288, 256),
float32; the output is only 256x256, so the work is dominated by the K
reduction (a split-K style problem). FLOPs = 2 * M * N * K
(= 2 * 256 * 256 * 524288, about 68.7 GFLOP). Written in the style of
KernelBench level 1 problem 6 ("Matmul with large K dimension")."""

import torch
import torch.nn as nn

M = 256
N = 256
K = 131072 * 4


class Model(nn.Module):
    """Single matrix multiplication with a large K dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    A = torch.rand(M, K)
    B = torch.rand(K, N)
    return [A, B]


def get_init_inputs():
    return []
