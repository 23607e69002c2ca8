"""One HF transformers LlamaDecoderLayer at 4 x 2048 tokens: hidden 2048, grouped-query
attention with 16 query heads and 4 KV heads (head_dim 128), SwiGLU intermediate 5632, with
its rotary embedding, built from a LlamaConfig with random weights (nothing is downloaded).
Attention goes through SDPA (causal, no mask). The row of issue 25's table where the
composed module under torch.compile was the fastest (H100, torch 2.11, bf16: eager 2.24 ms,
torch.compile 1.38, fact-db composed 2.20, composed then torch.compile 1.35).

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_llama_decoder_4x2048.py needs transformers (pip install transformers): {e}") from None

batch_size = 4
seq_len = 2048
hidden = 2048


def config():
    return LlamaConfig(hidden_size=hidden, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4,
                       num_hidden_layers=1, max_position_embeddings=seq_len, rms_norm_eps=1e-5,
                       attn_implementation="sdpa")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = config()
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos, sin = self.rotary(x, pos)
        out = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return []
