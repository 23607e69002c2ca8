"""Bad problem: forward branches on a tensor's value, which torch.export cannot trace.
The first GEMM + bias + ReLU comes before the branch and is reported as a partial result."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 256)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if h.sum() > 0:
            return self.fc2(h)
        return h[:, :256]


def get_inputs():
    return [torch.rand(128, 256)]


def get_init_inputs():
    return []
