"""Causal self-attention with ReLU in place of softmax, in the shape of KernelBench L3-50
(minGPT's attention, 16 sequences of 1024 tokens, 768 wide, 12 heads), written out by hand:
one fused Q/K/V projection, scores scaled by 1/sqrt(head_dim), future positions masked to
-inf before the ReLU (so they become 0), the weighted sum of V, and the heads put back side
by side. No softmax, so no attention rule matches it: the projection is a GEMM region, the
two matmuls batched-GEMM regions, and the mask and the ReLU between them glue for Inductor
to fuse. (L3-50 also builds an output projection it never calls; this has none.) The row of
issue 25's table where the composed module under torch.compile was fastest at fp32 (H100,
torch 2.11: eager 5.02 ms, torch.compile 3.21, fact-db 4.35, composed then torch.compile 2.53).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
seq_len = 1024
width = 768
heads = 12


class Model(nn.Module):
    def __init__(self, width: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        future = torch.triu(torch.ones(max_len, max_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("future", future.view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in self.qkv(x).split(c, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        weights = F.relu(scores.masked_fill(self.future[:, :, :t, :t], float("-inf")))
        return (weights @ v).transpose(1, 2).reshape(b, t, c)


def get_inputs():
    return [torch.rand(batch_size, seq_len, width)]


def get_init_inputs():
    return [width, heads, seq_len]
