"""Bad problem: defines Model and get_init_inputs but no get_inputs."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_init_inputs():
    return []
