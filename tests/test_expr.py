import pytest

from fact_db.core.errors import ExprError
from fact_db.discovery.expr import Expr


def test_arithmetic_and_functions():
    e = Expr.parse("K >= 8 * max(M, N) and M * N <= 1048576")
    assert e.evaluate({"M": 256, "N": 256, "K": 524288}) is True
    assert e.evaluate({"M": 4096, "N": 4096, "K": 4096}) is False
    assert e.names == {"K", "M", "N"}


def test_subscripts_slices_and_chained_compare():
    assert Expr.parse("prod(s[:-1]) == 12 and 0 < s[-1] <= 5").evaluate({"s": (3, 4, 5)}) is True
    assert Expr.parse("len(s) in (2, 3)").evaluate({"s": (3, 4, 5)}) is True


@pytest.mark.parametrize("src, fragment", [
    ("__import__('os').system('true')", "is not allowed"),
    ("x.__class__", "attribute `.__class__` is not allowed"),
    ("open('/etc/passwd')", "function `open` is not allowed"),
    ("[i for i in range(3)]", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("a if", "syntax error"),
    ("", "non-empty"),
])
def test_rejects_unsafe_or_broken(src, fragment):
    with pytest.raises(ExprError) as e:
        Expr.parse(src)
    assert fragment in str(e.value)


def test_unknown_name_is_reported():
    with pytest.raises(ExprError, match="unknown name `Q`"):
        Expr.parse("Q > 1").evaluate({"M": 1})
