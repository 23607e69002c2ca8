"""A Llama-style pre-norm decoder block (after HF transformers LlamaDecoderLayer,
TinyLlama-1.1B-like sizes): h = x + o_proj(attn(rmsnorm(x))); out = h +
down_proj(silu(gate_proj(rmsnorm(h))) * up_proj(rmsnorm(h))). RMSNorm is
hand-written (x * rsqrt(mean(x^2) + eps) * weight); attention is grouped-query
(hidden 2048, 16 query heads, 4 KV heads, head_dim 128, KV heads repeated with
expand+reshape like HF `repeat_kv`) through
F.scaled_dot_product_attention(is_causal=True); all projections are bias-free
Linears; SwiGLU MLP with intermediate size 5632. Rotary position embeddings are
deliberately skipped to keep the problem simple (they are a cheap pointwise
op on q and k and do not change the FLOP count materially). Shapes: batch 4,
seq 512, float32. FLOPs (matmuls, causal mask not exploited) =
2 * B * T * (2 * h^2 + 2 * h * h_kv) for q/k/v/o projections (42.9 GFLOP)
+ 4 * B * Hq * T^2 * D for attention (8.6 GFLOP) + 6 * B * T * h * I for the
MLP (141.7 GFLOP), about 193.3 GFLOP in total, plus O(B * T * (h + I)) for
norms, SiLU and residuals."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4
seq_len = 512
hidden_size = 2048
num_heads = 16
num_kv_heads = 4
intermediate_size = 5632
rms_norm_eps = 1e-5


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, written by hand."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GQAttention(nn.Module):
    """Grouped-query causal self-attention without rotary embeddings."""

    def __init__(self, hidden_size, num_heads, num_kv_heads):
        super().__init__()
        assert hidden_size % num_heads == 0
        assert num_heads % num_kv_heads == 0
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.n_rep = num_heads // num_kv_heads
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def repeat_kv(self, x):
        # (B, n_kv, T, D) -> (B, n_kv * n_rep, T, D), each KV head repeated n_rep times
        B, n_kv, T, D = x.shape
        if self.n_rep == 1:
            return x
        x = x[:, :, None, :, :].expand(B, n_kv, self.n_rep, T, D)
        return x.reshape(B, n_kv * self.n_rep, T, D)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k = self.repeat_kv(k)
        v = self.repeat_kv(v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, self.num_heads * self.head_dim)
        return self.o_proj(y)


class SwiGLUMLP(nn.Module):
    """Llama MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Model(nn.Module):
    """Llama-style decoder block (pre-RMSNorm, GQA attention, SwiGLU MLP)."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, intermediate_size, rms_norm_eps):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, rms_norm_eps)
        self.self_attn = GQAttention(hidden_size, num_heads, num_kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden_size, rms_norm_eps)
        self.mlp = SwiGLUMLP(hidden_size, intermediate_size)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [hidden_size, num_heads, num_kv_heads, intermediate_size, rms_norm_eps]
