"""Fixture for einsum-gemm: einsums that are one GEMM or batched GEMM, against those that are not."""
import torch
import torch.nn as nn


# match: einsum-gemm
class EinsumMatmul(nn.Module):
    """ij,jk->ik: a plain GEMM."""

    def forward(self, a, b):
        return torch.einsum("ij,jk->ik", a, b)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 8))


# match: einsum-gemm
class EinsumBmm(nn.Module):
    def forward(self, a, b):
        return torch.einsum("bik,bkj->bij", a, b)

    def example_inputs(self):
        return (torch.randn(4, 16, 32), torch.randn(4, 32, 8))


# match: einsum-gemm
class EinsumAttentionScores(nn.Module):
    """Per-head scores q k^T written as an einsum over [B, H, T, D]."""

    def forward(self, q, k):
        return torch.einsum("bhqd,bhkd->bhqk", q, k)

    def example_inputs(self):
        return (torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8))


# match: einsum-gemm
class Einsum4dTimesMatrix(nn.Module):
    """A 4-D tensor times a matrix: the leading dims fold into M (KernelBench L1-11's form)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 12))

    def forward(self, x):
        return torch.einsum("bijl,lk->bijk", x, self.w)

    def example_inputs(self):
        return (torch.randn(2, 3, 4, 8),)


# match: einsum-gemm
class EinsumImplicitOutput(nn.Module):
    """No `->`: the output is the indices used once, in alphabetical order (ik)."""

    def forward(self, a, b):
        return torch.einsum("ij,jk", a, b)

    def example_inputs(self):
        return (torch.randn(16, 32), torch.randn(32, 8))


# Three operands: two contractions, not one GEMM.
# no-match: einsum-gemm
class EinsumChain(nn.Module):
    def forward(self, a, b, c):
        return torch.einsum("ij,jk,kl->il", a, b, c)

    def example_inputs(self):
        return (torch.randn(8, 16), torch.randn(16, 8), torch.randn(8, 4))


# An elementwise product contracts nothing.
# no-match: einsum-gemm
class EinsumHadamard(nn.Module):
    def forward(self, a, b):
        return torch.einsum("bi,bi->bi", a, b)

    def example_inputs(self):
        return (torch.randn(8, 16), torch.randn(8, 16))


# j is summed over the first operand alone before the product: a reduction, then a GEMV.
# no-match: einsum-gemm
class EinsumSumFirst(nn.Module):
    def forward(self, a, b):
        return torch.einsum("bij,bk->bk", a, b)

    def example_inputs(self):
        return (torch.randn(4, 8, 16), torch.randn(4, 8))


# A diagonal (a repeated index) is no GEMM's operand.
# no-match: einsum-gemm
class EinsumDiagonal(nn.Module):
    def forward(self, a, b):
        return torch.einsum("ii,ij->j", a, b)

    def example_inputs(self):
        return (torch.randn(8, 8), torch.randn(8, 4))


# float64 is outside the rule's dtypes.
# no-match: einsum-gemm
class EinsumFloat64(nn.Module):
    def forward(self, a, b):
        return torch.einsum("ij,jk->ik", a, b)

    def example_inputs(self):
        return (torch.randn(16, 32, dtype=torch.float64), torch.randn(32, 8, dtype=torch.float64))
