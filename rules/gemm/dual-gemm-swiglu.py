"""Fixture for dual-gemm-swiglu: Llama-style SwiGLU MLPs, against GELU, split-input and escape near misses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


# match: dual-gemm-swiglu
class LlamaMlp(nn.Module):
    """down_proj(F.silu(gate_proj(x)) * up_proj(x)), all Linear(bias=False)."""

    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64, bias=False)
        self.up_proj = nn.Linear(32, 64, bias=False)
        self.down_proj = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def example_inputs(self):
        return (torch.randn(2, 8, 32),)


# match: dual-gemm-swiglu
class MatmulSwigluUpFirst(nn.Module):
    """Written with @, the up product on the left of the multiply, nn.SiLU as a module."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(32, 64))
        self.w3 = nn.Parameter(torch.randn(32, 64))
        self.act = nn.SiLU()

    def forward(self, x):
        return (x @ self.w3) * self.act(x @ self.w1)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# match: dual-gemm-swiglu
class HandWrittenSilu(nn.Module):
    """silu written as g * sigmoid(g)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(32, 64, bias=False)
        self.w3 = nn.Linear(32, 64, bias=False)

    def forward(self, x):
        g = self.w1(x)
        return g * torch.sigmoid(g) * self.w3(x)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# GELU instead of SiLU is GeGLU, not SwiGLU.
# no-match: dual-gemm-swiglu
class GeluGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64, bias=False)
        self.up_proj = nn.Linear(32, 64, bias=False)

    def forward(self, x):
        return F.gelu(self.gate_proj(x)) * self.up_proj(x)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# The two products have different left operands, so there is no shared x to read once.
# no-match: dual-gemm-swiglu
class DifferentLeftOperands(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64, bias=False)
        self.up_proj = nn.Linear(32, 64, bias=False)

    def forward(self, x, y):
        return F.silu(self.gate_proj(x)) * self.up_proj(y)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(16, 32))


# The gate product is also returned, so it must be written and cannot stay in the kernel.
# no-match: dual-gemm-swiglu
class GateEscapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64, bias=False)
        self.up_proj = nn.Linear(32, 64, bias=False)

    def forward(self, x):
        g = self.gate_proj(x)
        return F.silu(g) * self.up_proj(x), g

    def example_inputs(self):
        return (torch.randn(16, 32),)


# The projections carry biases: the rule's dual GEMM has no bias epilogue.
# no-match: dual-gemm-swiglu
class BiasedProjections(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64)
        self.up_proj = nn.Linear(32, 64)

    def forward(self, x):
        return F.silu(self.gate_proj(x)) * self.up_proj(x)

    def example_inputs(self):
        return (torch.randn(16, 32),)


# silu of the gate times the gate itself is one GEMM, not two.
# no-match: dual-gemm-swiglu
class SameProductTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 64, bias=False)

    def forward(self, x):
        g = self.proj(x)
        return F.silu(g) * g

    def example_inputs(self):
        return (torch.randn(16, 32),)


# match: dual-gemm-swiglu
class ViewTwice(nn.Module):
    def __init__(self):
        super().__init__(); self.w1 = nn.Parameter(torch.randn(32, 64)); self.w3 = nn.Parameter(torch.randn(32, 64))
    def forward(self, x):
        return F.silu(torch.mm(x.view(-1, 32), self.w1)) * torch.mm(x.view(-1, 32), self.w3)
    def example_inputs(self): return (torch.randn(2, 8, 32),)
