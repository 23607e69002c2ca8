"""One HF transformers LlamaDecoderLayer (TinyLlama-1.1B-like sizes: hidden 2048, 32 query
heads, 4 KV heads, head_dim 64, SwiGLU intermediate 5632) with its rotary embedding, built
from a LlamaConfig with random weights (nothing is downloaded). Attention goes through
SDPA (causal, no mask). torch.export wraps the rotary embedding in an autocast wrapper
(a higher-order op); discovery walks into it. Shapes: batch 2, seq 512, float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_llama_decoder.py needs transformers (pip install transformers): {e}") from None

batch_size = 2
seq_len = 512


def config():
    return LlamaConfig(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
                       num_hidden_layers=1, max_position_embeddings=2048, rms_norm_eps=1e-5,
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
    return [torch.randn(batch_size, seq_len, 2048)]


def get_init_inputs():
    return []
