"""One HF transformers MistralDecoderLayer (Mistral-7B-like head layout at a smaller
width: hidden 1024, 16 query heads, 4 KV heads, head_dim 64, SwiGLU intermediate 3584)
with its rotary embedding, from a MistralConfig with random weights (no download);
SDPA attention, causal, no mask. Shapes: batch 2, seq 512, float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer, MistralRotaryEmbedding
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_mistral_decoder.py needs transformers (pip install transformers): {e}") from None

batch_size = 2
seq_len = 512
hidden = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = MistralConfig(hidden_size=hidden, intermediate_size=3584, num_attention_heads=16, num_key_value_heads=4,
                            head_dim=64, num_hidden_layers=1, sliding_window=None, attn_implementation="sdpa")
        self.rotary = MistralRotaryEmbedding(cfg)
        self.layer = MistralDecoderLayer(cfg, layer_idx=0)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos, sin = self.rotary(x, pos)
        out = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return []
