"""Fixture for gemm-horizontal: projections that read one input, against inputs, weights and shapes that differ."""
import torch
import torch.nn as nn


# match: gemm-horizontal
class QkvLinears(nn.Module):
    """Llama-style q, k and v projections without bias (K and V narrower than Q)."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(32, 32, bias=False)
        self.k_proj = nn.Linear(32, 16, bias=False)
        self.v_proj = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: gemm-horizontal
class BiasedQkv(nn.Module):
    """BERT-style projections with biases, their outputs combined afterwards."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(32, 32)
        self.key = nn.Linear(32, 32)
        self.value = nn.Linear(32, 32)

    def forward(self, x):
        return self.query(x) * self.key(x) + self.value(x)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# match: gemm-horizontal
class MatmulWeights(nn.Module):
    """Written with @ against K x N parameters, one with a bias added by hand."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(32, 24))
        self.w2 = nn.Parameter(torch.randn(32, 8))
        self.b2 = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return torch.cat([x @ self.w1, x @ self.w2 + self.b2], dim=-1)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# Each projection reads its own input: there is no shared read to save.
# no-match: gemm-horizontal
class DifferentInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(32, 32, bias=False)
        self.k_proj = nn.Linear(32, 32, bias=False)

    def forward(self, x, y):
        return self.q_proj(x), self.k_proj(y)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(16, 32))


# The second projection reads a slice of x with a smaller K: a different input, not a sibling.
# no-match: gemm-horizontal
class DifferentK(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(32, 16, bias=False)
        self.k_proj = nn.Linear(16, 16, bias=False)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x[:, :16])

    def example_inputs(self):
        return (torch.randn(16, 32),)


# The second weight is an input of forward, not a parameter: nothing to concatenate ahead of time.
# no-match: gemm-horizontal
class WeightIsAnInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(32, 16, bias=False)

    def forward(self, x, w):
        return self.q_proj(x), x @ w

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 16))


# A single projection has no sibling.
# no-match: gemm-horizontal
class OneProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# Batched weights (bmm against a 3-D parameter) are not one GEMM over a concatenated weight.
# no-match: gemm-horizontal
class BatchedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, 32, 16))
        self.w2 = nn.Parameter(torch.randn(4, 32, 16))

    def forward(self, x):
        return torch.bmm(x, self.w1), torch.bmm(x, self.w2)

    def example_inputs(self):
        return (torch.randn(4, 8, 32),)
