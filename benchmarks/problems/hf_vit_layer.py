"""One HF transformers ViTLayer (ViT-B/16 at 224x224: hidden 768, 12 heads, MLP 3072, GELU,
pre-norm), from a ViTConfig with random weights (no download). 197 tokens (196 patches and
the class token); query/key/value Linears with bias read the same input; SDPA attention,
not causal. Shapes: batch 16, seq 197, float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTLayer
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_vit_layer.py needs transformers (pip install transformers): {e}") from None

batch_size = 16
seq_len = 197


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = ViTConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=1,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
        self.layer = ViTLayer(cfg)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, 768)]


def get_init_inputs():
    return []
