"""One HF transformers OPTDecoderLayer (OPT-350m-like: hidden 1024, 16 heads, FFN 4096, ReLU,
pre-norm), from an OPTConfig with random weights (no download). Query/key/value Linears
with bias read the same input; SDPA attention, causal, no mask. Shapes: batch 4, seq 512,
float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import OPTConfig
    from transformers.models.opt.modeling_opt import OPTDecoderLayer
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_opt_decoder.py needs transformers (pip install transformers): {e}") from None

batch_size = 4
seq_len = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = OPTConfig(hidden_size=1024, num_attention_heads=16, ffn_dim=4096, num_hidden_layers=1, dropout=0.0,
                        attention_dropout=0.0, do_layer_norm_before=True, activation_function="relu",
                        attn_implementation="sdpa")
        self.layer = OPTDecoderLayer(cfg, layer_idx=0)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, 1024)]


def get_init_inputs():
    return []
