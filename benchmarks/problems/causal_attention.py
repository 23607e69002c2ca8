"""Causal scaled-dot-product attention core with no projections, written out
explicitly as in minGPT / KernelBench level 3 MinGPT problems:
att = (q @ k^T) * 1/sqrt(head_dim); att.masked_fill(tril_buffer == 0, -inf);
softmax(dim=-1); dropout(p=0.0); y = att @ v. Inputs q, k, v are
(batch 32, heads 16, seq 1024, head_dim 64) float32; the full (B, H, T, T)
score matrix is materialized (2 GiB in fp32), which is what a fused
(flash-style) kernel avoids. FLOPs = 4 * B * H * T^2 * D
(= 4 * 32 * 16 * 1024^2 * 64, about 137.4 GFLOP, causal mask not exploited),
plus O(B * H * T^2) for mask and softmax. Explicit-attention companion to
sdpa_attention.py."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
n_head = 16
seq_len = 1024
head_dim = 64
max_seqlen = 1024
attn_pdrop = 0.0


class Model(nn.Module):
    """Explicit causal attention softmax(mask(q k^T / sqrt(d))) v."""

    def __init__(self, max_seqlen, attn_pdrop):
        super().__init__()
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen),
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        return att @ v


def get_inputs():
    q = torch.randn(batch_size, n_head, seq_len, head_dim)
    k = torch.randn(batch_size, n_head, seq_len, head_dim)
    v = torch.randn(batch_size, n_head, seq_len, head_dim)
    return [q, k, v]


def get_init_inputs():
    return [max_seqlen, attn_pdrop]
