"""One HF transformers GPT2Block (GPT-2 small: hidden 768, 12 heads, MLP 3072, GELU-tanh),
from a GPT2Config with random weights (no download). GPT-2's projections are Conv1D
(addmm with a (in, out) weight); attention through SDPA, causal, no mask.
Shapes: batch 4, seq 512, float32.

Needs `transformers` (a test-only dependency of fact-db: `pip install transformers`).
"""
import torch
import torch.nn as nn

try:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
except ImportError as e:  # pragma: no cover
    raise ImportError(f"hf_gpt2_block.py needs transformers (pip install transformers): {e}") from None

batch_size = 4
seq_len = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = GPT2Config(n_embd=768, n_head=12, n_layer=1, n_positions=1024, attn_implementation="sdpa",
                         resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)
        self.block = GPT2Block(cfg, layer_idx=0)

    def forward(self, x):
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def get_inputs():
    return [torch.randn(batch_size, seq_len, 768)]


def get_init_inputs():
    return []
