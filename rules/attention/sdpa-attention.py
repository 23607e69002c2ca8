"""Fixture for sdpa-attention: F.scaled_dot_product_attention without dropout, against dropout and hand-written forms."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# match: sdpa-attention
# no-match: attention, attention-causal
class SdpaPlain(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# match: sdpa-attention
class SdpaCausalExplicitDropout(nn.Module):
    """is_causal=True and dropout_p=0.0 spelled out, as Llama-style models call it."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# match: sdpa-attention
class SdpaFromProjection(nn.Module):
    """minGPT's flash path: qkv from one Linear, heads split, sdpa, heads merged."""

    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(32, 96)
        self.c_proj = nn.Linear(32, 32)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, 4, 8).transpose(1, 2)
        k = k.view(B, T, 4, 8).transpose(1, 2)
        v = v.view(B, T, 4, 8).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def example_inputs(self):
        return (torch.randn(2, 16, 32),)


# match: sdpa-attention
class SdpaExplicitScaleHalf(nn.Module):
    """An explicit scale= keyword, in float16."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(8))

    def example_inputs(self):
        return tuple(torch.randn(2, 4, 16, 8, dtype=torch.float16) for _ in range(3))


# Attention dropout with p > 0 is applied even at inference by sdpa: the kernel has no dropout.
# no-match: sdpa-attention
class SdpaWithDropout(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# Attention written out by hand has no sdpa op (it is the attention rule's).
# no-match: sdpa-attention
# match: attention
class HandWritten(nn.Module):
    def forward(self, q, k, v):
        att = F.softmax((q @ k.transpose(-2, -1)) / math.sqrt(8), dim=-1)
        return att @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# float64 is outside the rule's dtypes.
# no-match: sdpa-attention
class SdpaFloat64(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def example_inputs(self):
        return tuple(torch.randn(2, 4, 16, 8, dtype=torch.float64) for _ in range(3))


# an arbitrary attn_mask is not a causal mask; the realization has no general mask input
# no-match: sdpa-attention
class SdpaArbitraryMask(nn.Module):
    def forward(self, q, k, v, m): return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    def example_inputs(self): return (torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(8, 8))
