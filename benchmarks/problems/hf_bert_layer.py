"""One HF transformers BertLayer (BERT-base: hidden 768, 12 heads, intermediate 3072, GELU,
post-norm LayerNorms), from a BertConfig with random weights (no download). Separate
query/key/value Linears with bias read the same input; attention through SDPA, not causal,
no mask. Shapes: batch 8, seq 384, float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_bert_layer.py needs transformers (pip install transformers): {e}") from None

batch_size = 8
seq_len = 384


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=1,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
        self.layer = BertLayer(cfg)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, 768)]


def get_init_inputs():
    return []
