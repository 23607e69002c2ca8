"""A model that reads a module-level tensor in forward: no copy of the model holds it."""
import torch
import torch.nn as nn

SCALE = torch.linspace(0.5, 1.5, 32)
MIX = torch.randn(32, 32, generator=torch.Generator().manual_seed(1))


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return self.fc(x * SCALE.to(x.device)) @ MIX.to(x.device)


batch_size, n = 4, 32


def get_inputs():
    return [torch.rand(batch_size, n)]


def get_init_inputs():
    return [n]
