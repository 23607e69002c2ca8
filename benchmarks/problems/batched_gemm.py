"""Batched matrix multiplication C[b] = A[b] @ B[b] via torch.bmm, with A of
shape (128, 512, 1024) and B of shape (128, 1024, 2048), float32.
FLOPs = 2 * batch * M * K * N (= 2 * 128 * 512 * 1024 * 2048, about
274.9 GFLOP). Written in the style of KernelBench level 1 problem 3
("Batched matrix multiplication")."""

import torch
import torch.nn as nn

batch_size = 128
M = 512
K = 1024
N = 2048


class Model(nn.Module):
    """Batched matrix multiplication with torch.bmm."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    A = torch.rand(batch_size, M, K)
    B = torch.rand(batch_size, K, N)
    return [A, B]


def get_init_inputs():
    return []
