"""A model whose code refuses anything but float32 (as code calling a float32-only kernel of
its own would): no float64 run of it exists."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError(f"this model runs in float32 only, got {x.dtype}")
        return torch.relu(self.fc(x))


batch_size, n = 8, 32


def get_inputs():
    return [torch.rand(batch_size, n)]


def get_init_inputs():
    return [n]
