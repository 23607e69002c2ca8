"""Fused GEMM + bias + tanh-approximate GELU: nn.Linear(4096 -> 16384,
bias=True) on a (2048, 4096) float32 input followed by the hand-written tanh
GELU 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) exactly as it is
spelled in minGPT's NewGELU / KernelBench level 3 MinGPT problems (so the
epilogue appears as a chain of pointwise ops, not a single gelu op).
FLOPs = 2 * batch * in_features * out_features for the GEMM
(= 2 * 2048 * 4096 * 16384, about 274.9 GFLOP), plus roughly 9 pointwise
ops per output element. Written in the style of KernelBench level 2
(GEMM + activation epilogue) with the minGPT (karpathy) NewGELU."""

import math

import torch
import torch.nn as nn

batch_size = 2048
in_features = 4096
out_features = 16384


class Model(nn.Module):
    """Linear layer (with bias) followed by hand-written tanh GELU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
