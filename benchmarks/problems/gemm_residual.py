"""GEMM + bias + residual add: y = (x @ W^T + b) + residual with
nn.Linear(4096 -> 4096, bias=True), where x and residual are both (4096, 4096)
float32 inputs (the output-projection-plus-skip pattern of a transformer
block). FLOPs = 2 * M * K * N for the GEMM (= 2 * 4096^3, about 137.4 GFLOP),
plus 2 * M * N for the bias and residual adds. Written in the style of
KernelBench level 2 (GEMM + elementwise epilogue, e.g. "Gemm_Add")."""

import torch
import torch.nn as nn

batch_size = 4096
in_features = 4096
out_features = 4096


class Model(nn.Module):
    """Linear layer (with bias) plus a residual tensor."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + residual


def get_inputs():
    x = torch.randn(batch_size, in_features)
    residual = torch.randn(batch_size, out_features)
    return [x, residual]


def get_init_inputs():
    return [in_features, out_features]
