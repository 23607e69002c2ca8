"""Bad problem: the constructor raises."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        if width % 64:
            raise ValueError(f"width must be a multiple of 64, got {width}")
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.rand(16, 100)]


def get_init_inputs():
    return [100]
