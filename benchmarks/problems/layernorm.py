"""Layer normalization nn.LayerNorm(4096) (elementwise affine, eps 1e-5) over
the last dimension of a (8192, 4096) float32 input; a memory-bound row
reduction. FLOPs: about 8 * rows * features (mean, variance, normalize,
scale, shift; = 8 * 8192 * 4096, about 0.27 GFLOP), so bytes moved
(read 128 MiB, write 128 MiB) rather than FLOPs set the speed. Written in
the style of KernelBench level 1 problem 40 ("LayerNorm")."""

import torch
import torch.nn as nn

batch_size = 8192
features = 4096


class Model(nn.Module):
    """nn.LayerNorm over the last dimension."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
