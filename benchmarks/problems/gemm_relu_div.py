"""GEMM, ReLU, division by a constant: y = relu(x @ W^T + b) / divisor, KernelBench level 2
style ("Gemm_ReLU_Divide"). nn.Linear(8192 -> 8192) on a (1024, 8192) float32 input, divisor 2.
No shipped rule fuses the division: discovery fuses GEMM + bias + ReLU (gemm-bias-relu) and
leaves the division to eager (for a positive divisor it is relu(alpha * (acc + b)), alpha = 1/2)."""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 8192
out_features = 8192
divisor = 2.0


class Model(nn.Module):
    def __init__(self, in_features, out_features, divisor):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x):
        x = self.linear(x)
        x = torch.relu(x)
        return x / self.divisor


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, divisor]
