"""Causal attention through the fused PyTorch op
F.scaled_dot_product_attention(q, k, v, is_causal=True) with q, k, v of shape
(batch 32, heads 16, seq 1024, head_dim 64) float32 (default scale
1/sqrt(head_dim), no dropout). Same math as causal_attention.py, but expressed
as one op that backends may lower to a flash / memory-efficient kernel.
FLOPs = 4 * B * H * T^2 * D (= 4 * 32 * 16 * 1024^2 * 64, about 137.4 GFLOP,
counting the full square; a causal-aware kernel does about half), plus
O(B * H * T^2) for softmax. In the style of KernelBench level 1 attention
problems (e.g. "ScaledDotProductAttention")."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
n_head = 16
seq_len = 1024
head_dim = 64


class Model(nn.Module):
    """Causal F.scaled_dot_product_attention."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    q = torch.randn(batch_size, n_head, seq_len, head_dim)
    k = torch.randn(batch_size, n_head, seq_len, head_dim)
    v = torch.randn(batch_size, n_head, seq_len, head_dim)
    return [q, k, v]


def get_init_inputs():
    return []
