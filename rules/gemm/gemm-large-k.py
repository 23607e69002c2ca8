"""Fixture for gemm-large-k: a small output over a long reduction, against square and batched near misses."""
import torch
import torch.nn as nn


# match: gemm-large-k, gemm
class SmallOutputLongK(nn.Module):
    """32 x 32 output with K = 4096 (K = 128 x max(M, N))."""

    def forward(self, a, b):
        return torch.mm(a, b)

    def example_inputs(self):
        return (torch.randn(32, 4096), torch.randn(4096, 32))


# match: gemm-large-k
class LinearNoBiasLongK(nn.Module):
    """nn.Linear(4096, 32, bias=False): the weight is N x K, K = 4096."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4096, 32, bias=False)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(16, 4096),)


# match: gemm-large-k
class TransposedLeftLongK(nn.Module):
    """a.T @ b with a stored K x M, as in a weight-gradient product."""

    def forward(self, a, b):
        return a.T @ b

    def example_inputs(self):
        return (torch.randn(4096, 32), torch.randn(4096, 16))


# match: gemm-large-k
class ExactlyEightTimes(nn.Module):
    """The boundary: K = 256 = 8 x max(32, 16)."""

    def forward(self, a, b):
        return a @ b

    def example_inputs(self):
        return (torch.randn(32, 256), torch.randn(256, 16))


# Square 64 x 64 x 64: K is not large against the output.
# no-match: gemm-large-k
# match: gemm
class Square64(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)

    def example_inputs(self):
        return (torch.randn(64, 64), torch.randn(64, 64))


# K = 255 is just under 8 x max(M, N) = 256.
# no-match: gemm-large-k
class JustUnderEightTimes(nn.Module):
    def forward(self, a, b):
        return a @ b

    def example_inputs(self):
        return (torch.randn(32, 255), torch.randn(255, 16))


# A batch of 4 long-K products is batched-gemm; the rule covers a single GEMM (batch == 1).
# no-match: gemm-large-k
class BatchedLongK(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)

    def example_inputs(self):
        return (torch.randn(4, 32, 4096), torch.randn(4, 4096, 32))


# nn.Linear with a bias is gemm-bias, not the bias-free gemm the rule builds on.
# no-match: gemm-large-k
class LinearWithBiasLongK(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4096, 32)

    def forward(self, x):
        return self.proj(x)

    def example_inputs(self):
        return (torch.randn(16, 4096),)


# K = 8200 >= 8 x 1025, but the 1025 x 1024 output (1,049,600 elements) is over the
# one-million-element bound: enough tiles to fill the GPU without splitting K.
# (The operands are stride-0 expands so the case allocates almost nothing.)
# no-match: gemm-large-k
# match: gemm
class OutputTooLarge(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)

    def example_inputs(self):
        return (torch.zeros(()).expand(1025, 8200), torch.zeros(()).expand(8200, 1024))
