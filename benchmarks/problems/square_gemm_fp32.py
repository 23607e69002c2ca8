"""Square single-precision matrix multiplication C = A @ B with A and B both
4096x4096 float32, computed with torch.matmul. FLOPs = 2 * N^3 (N = 4096,
about 137.4 GFLOP). Written in the style of KernelBench level 1 problem 1
("Square matrix multiplication")."""

import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    """Single square matrix multiplication C = A @ B."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    A = torch.rand(N, N)
    B = torch.rand(N, N)
    return [A, B]


def get_init_inputs():
    return []
