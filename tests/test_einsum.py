"""discovery.einsum: which einsums are one GEMM, the lowering to it (checked against torch.einsum
on random inputs), and what the others cost."""
import pytest
import torch

from fact_db.discovery import einsum


def _run_lowered(low, xs):
    """What composition computes: each operand permuted and reshaped, one (batched) matmul,
    the result reshaped and permuted to the einsum's output."""
    a = xs[0].permute(*low.a.perm).reshape(low.a.shape)
    b = xs[1].permute(*low.b.perm).reshape(low.b.shape)
    return torch.matmul(a, b).reshape(low.out_shape).permute(*low.out_perm)


CASES = [
    ("ij,jk->ik", [(5, 3), (3, 4)], {"M": 5, "N": 4, "K": 3, "batch": 1}),
    ("ij,jk", [(5, 3), (3, 4)], {"M": 5, "N": 4, "K": 3, "batch": 1}),  # implicit output
    ("ki,kj->ij", [(5, 3), (5, 4)], {"M": 3, "N": 4, "K": 5, "batch": 1}),
    ("bik,bkj->bij", [(2, 3, 4), (2, 4, 5)], {"M": 3, "N": 5, "K": 4, "batch": 2}),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], {"M": 4, "N": 6, "K": 5, "batch": 6}),
    ("bijl,lk->bijk", [(2, 3, 4, 5), (5, 6)], {"M": 24, "N": 6, "K": 5, "batch": 1}),
    ("ikb,kjb->bji", [(3, 4, 2), (4, 5, 2)], {"M": 3, "N": 5, "K": 4, "batch": 2}),
    ("abcd,cdef->abef", [(2, 3, 4, 5), (4, 5, 6, 7)], {"M": 6, "N": 42, "K": 20, "batch": 1}),
    ("xkym,kn->ymnx", [(2, 3, 4, 5), (3, 6)], {"M": 40, "N": 6, "K": 3, "batch": 1}),
    ("bhzc,bchpn->bzhpn", [(2, 8, 3, 3), (2, 3, 8, 6, 4)], {"M": 3, "N": 24, "K": 3, "batch": 16}),
    ("bik,bk->bi", [(2, 3, 4), (2, 4)], {"M": 3, "N": 1, "K": 4, "batch": 2}),
    ("...ij,jk->...ik", [(2, 5, 3), (3, 4)], {"M": 10, "N": 4, "K": 3, "batch": 1}),
]


@pytest.mark.parametrize("eq, shapes, problem", CASES, ids=[c[0] for c in CASES])
def test_a_gemm_einsum_lowers_to_a_gemm_that_computes_it(eq, shapes, problem):
    low, why = einsum.lower(eq, shapes)
    assert why == "" and low.problem == problem
    torch.manual_seed(0)
    xs = [torch.randn(s, dtype=torch.float64) for s in shapes]
    torch.testing.assert_close(_run_lowered(low, xs), torch.einsum(eq, *xs))


def test_layouts_follow_the_operands_strides_and_a_copy_is_said():
    # q @ k^T per head: K read in place, column-major.
    low, _ = einsum.lower("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)])
    assert (low.a.layout, low.b.layout) == ("row", "col") and not low.a.copies and not low.b.copies
    # ki,kj: A is K x M in memory, read as M x K column-major.
    low, _ = einsum.lower("ki,kj->ij", [(5, 3), (5, 4)])
    assert low.a.layout == "col" and low.a.perm == [1, 0]
    # A [B, T, H, D] viewed as [B, H, T, D] (strides of a transpose): b and h cannot merge.
    shape, stride = (2, 3, 4, 5), (60, 5, 15, 1)  # torch.empty(2, 4, 3, 5).transpose(1, 2)
    low, _ = einsum.lower("bhqd,bhkd->bhqk", [shape, (2, 3, 6, 5)], [stride, None])
    assert low.a.copies and low.a.layout == "row"
    x = torch.randn(2, 4, 3, 5).transpose(1, 2)
    k = torch.randn(2, 3, 6, 5)
    torch.testing.assert_close(_run_lowered(low, [x, k]), torch.einsum("bhqd,bhkd->bhqk", x, k))


@pytest.mark.parametrize("eq, shapes, says", [
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "has 3 operands; one GEMM has two"),
    ("ij->ji", [(2, 3)], "has 1 operand; one GEMM has two"),
    ("bi,bi->bi", [(2, 3), (2, 3)], "contracts no index"),
    ("i,j->ij", [(2,), (3,)], "contracts no index"),
    ("ii,ij->j", [(3, 3), (3, 4)], "repeats index `i` in operand 1"),
    ("bij,bj->b", [(2, 3, 4), (2, 4)], "sums index `i` over one operand alone"),
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)], "broadcasts index `b` (1 against 2)"),
])
def test_an_einsum_that_is_not_one_gemm_says_why(eq, shapes, says):
    low, why = einsum.lower(eq, shapes)
    assert low is None and says in why


def test_flops_of_a_chain_are_its_pairwise_contractions_left_to_right():
    # (ij,jk) -> ik: 2*2*3*4 = 48; (ik,kl) -> il: 2*2*4*5 = 80
    assert einsum.flops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == 48 + 80
    assert einsum.intermediates("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == 2 * 4
    # Mamba2's four-operand einsum: b c l h n, then with s, then with the mask, then with p
    sh = [(2, 2, 4, 3, 5), (2, 2, 4, 3, 5), (2, 3, 2, 4, 4), (2, 2, 4, 3, 6)]
    b, c, l, h, n, s, p = 2, 2, 4, 3, 5, 4, 6
    assert einsum.flops("bclhn,bcshn,bhcls,bcshp->bclhp", sh) == (
        2 * b * c * l * h * n * s      # bclhn,bcshn -> bclhs (n summed)
        + 2 * b * c * l * h * s        # with bhcls -> bclhs
        + 2 * b * c * l * h * s * p)   # with bcshp -> bclhp (s summed)
    assert einsum.flops("ij->j", [(3, 4)]) == 12


def test_parse_spells_out_the_ellipsis_and_the_implicit_output():
    assert einsum.parse("...ij,jk", [3, 2]) == (["0ij", "jk"], "0ik")
    assert einsum.parse("ba,ac", [2, 2]) == (["ba", "ac"], "bc")
    with pytest.raises(einsum.EinsumError, match="names 2 operands, the call passes 1"):
        einsum.parse("ij,jk->ik", [2])
