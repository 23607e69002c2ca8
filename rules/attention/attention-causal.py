"""Fixture for attention-causal: minGPT-style masked attention, against non-causal masks, fill values and escapes."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# match: attention-causal
# no-match: attention
class MinGptCausalSelfAttention(nn.Module):
    """minGPT's CausalSelfAttention: registered tril buffer, masked_fill(-inf), softmax, dropout p=0."""

    def __init__(self):
        super().__init__()
        self.n_head = 4
        self.c_attn = nn.Linear(32, 96)
        self.c_proj = nn.Linear(32, 32)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: attention-causal
class DivSqrtShorterSequence(nn.Module):
    """Scores / math.sqrt(d); the sequence (8) is shorter than the buffer (16), so the mask is a slice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return att @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8))


# match: attention-causal
class TwoDimMaskHalf(nn.Module):
    """float16, torch.matmul / torch.softmax, a 2-D tril buffer of exactly the sequence length."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(16, 16)))

    def forward(self, q, k, v):
        att = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        att = att.masked_fill(self.mask == 0, float("-inf"))
        return torch.matmul(torch.softmax(att, dim=-1), v)

    def example_inputs(self):
        return tuple(torch.randn(1, 2, 16, 64, dtype=torch.float16) for _ in range(3))


# match: attention-causal
class FinfoMinFill(nn.Module):
    """masked_fill with torch.finfo(float32).min, as Hugging Face models write it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(8, 8, dtype=torch.bool)).view(1, 1, 8, 8))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias == 0, torch.finfo(torch.float32).min)
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16))


# The buffer is upper-triangular (torch.triu): this masks the past, not the future.
# no-match: attention-causal
class TriuBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.triu(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# An all-ones buffer masks nothing: not causal.
# no-match: attention-causal
class OnesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.ones(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# Filling with 0.0 leaves the masked scores in the softmax (weight exp(0)): not a causal mask.
# no-match: attention-causal
class FillWithZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, 0.0)
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# `== 1` masks the lower triangle (the visible positions) instead of the future.
# no-match: attention-causal
class MaskWhereOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 1, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# The attention probabilities are also returned, so the score matrix must reach memory.
# no-match: attention-causal
class ProbabilitiesEscape(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return att @ v, att

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# Cross-attention with 8 queries over 16 keys: the score matrix is not square, so a
# tril mask over it is not the causal mask the kernel applies.
# no-match: attention-causal
class NonSquareScores(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :8, :16] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    def example_inputs(self):
        return (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# the mask is triu(ones) computed in forward: it masks the past, not the future
# no-match: attention-causal
class TriuInForward(nn.Module):
    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * 0.25
        m = torch.triu(torch.ones(T, T))
        att = att.masked_fill(m == 0, float('-inf'))
        return F.softmax(att, dim=-1) @ v
    def example_inputs(self): return (torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
