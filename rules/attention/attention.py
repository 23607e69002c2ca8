"""Fixture for attention: unmasked softmax((q @ k^T) * scale) @ v, against masked, unscaled and escape near misses."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# match: attention
# no-match: attention-causal
class MulScale4d(nn.Module):
    """(B, H, T, D) heads, scores * (1 / sqrt(d)), F.softmax, dropout at p=0."""

    def __init__(self):
        super().__init__()
        self.attn_dropout = nn.Dropout(0.0)

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        return att @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# match: attention
class DivSqrt3d(nn.Module):
    """(B*H, T, D) heads, scores / sqrt(d), torch.softmax, torch.matmul."""

    def forward(self, q, k, v):
        att = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(16)
        return torch.matmul(torch.softmax(att, dim=-1), v)

    def example_inputs(self):
        return (torch.randn(8, 32, 16), torch.randn(8, 32, 16), torch.randn(8, 32, 16))


# match: attention
class CrossAttentionFromProjections(nn.Module):
    """Queries and keys of different lengths (cross-attention), heads split by view/transpose."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 64)

    def forward(self, x, mem):
        B, T, C = x.shape
        S = mem.size(1)
        q = self.q(x).view(B, T, 4, 8).transpose(1, 2)
        k, v = self.kv(mem).split(32, dim=2)
        k = k.view(B, S, 4, 8).transpose(1, 2)
        v = v.view(B, S, 4, 8).transpose(1, 2)
        att = F.softmax((q @ k.transpose(-2, -1)) * 0.125, dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)

    def example_inputs(self):
        return (torch.randn(2, 8, 32), torch.randn(2, 24, 32))


# A causal mask between the scale and the softmax makes it attention-causal's, not this rule's.
# no-match: attention
# match: attention-causal
class CausalMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# Without a scale the pattern is incomplete (the kernel's epilogue applies one).
# no-match: attention
class Unscaled(nn.Module):
    def forward(self, q, k, v):
        return F.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# A softmax over the query dimension (-2) is not attention's row softmax.
# no-match: attention
class SoftmaxOverQueries(nn.Module):
    def forward(self, q, k, v):
        return F.softmax((q @ k.transpose(-2, -1)) * 0.25, dim=-2) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# The attention probabilities are also returned (output_attentions), so the score matrix
# must reach memory: no fused kernel.
# no-match: attention
class ProbabilitiesEscape(nn.Module):
    def forward(self, q, k, v):
        att = F.softmax((q @ k.transpose(-2, -1)) * 0.25, dim=-1)
        return att @ v, att

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# The scores are scaled by a tensor (a learned temperature), not a constant.
# no-match: attention
class TensorScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(4, 1, 1))

    def forward(self, q, k, v):
        att = F.softmax((q @ k.transpose(-2, -1)) * self.temperature, dim=-1)
        return att @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# dim=3 of rank-4 scores is the last dimension (dims are normalized to negative)
# match: attention
class SoftmaxDim3(nn.Module):
    def forward(self, q, k, v):
        return F.softmax((q @ k.transpose(-2, -1)) * 0.25, dim=3) @ v
    def example_inputs(self): return (torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))


# softmax over the transposed scores normalizes the other axis: not attention
# no-match: attention
class TransposedScoresSoftmax(nn.Module):
    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * 0.25
        return F.softmax(s.transpose(-2, -1), dim=-1) @ v
    def example_inputs(self): return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))
