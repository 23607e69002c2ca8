"""pipeline/narrowing.py: the largest part of a composition that verifies, greedy by the time
each region saves, on the CPU with stand-in regions (a set verifies unless it holds a broken one)."""
from __future__ import annotations

from dataclasses import dataclass

from fact_db.kernels.impl import Impl
from fact_db.pipeline.narrowing import MAX_TRIES, narrow, saved_ms


@dataclass
class Region:
    index: int
    impl: Impl
    eager_ms: float | None = None
    ms: float | None = None


def regions(gains, eager=()):
    return [Region(i, Impl.eager() if i in eager else Impl("gemm", f"k{i}"), 1.0 + g, 1.0)
            for i, g in enumerate(gains)]


def attempts(broken):
    tried = []

    def attempt(keep):
        tried.append(tuple(keep))
        return None if set(keep) & set(broken) else f"ok {keep}"
    return attempt, tried


def test_one_broken_region_is_left_out_and_the_rest_kept_most_saving_first():
    rs = regions([0.5, 3.0, 1.0, 2.0])
    attempt, tried = attempts(broken={2})
    kept, found = narrow(rs, attempt)
    assert kept == [0, 1, 3] and found == "ok [0, 1, 3]"
    # added in the order of the time saved: 1 (3.0), 3 (2.0), 2 (1.0, broken), 0 (0.5)
    assert tried == [(1,), (1, 3), (1, 2, 3), (0, 1, 3)]


def test_two_broken_regions_are_both_left_out():
    attempt, tried = attempts(broken={1, 3})
    kept, _ = narrow(regions([0.5, 3.0, 1.0, 2.0]), attempt)
    assert kept == [0, 2]


def test_the_whole_set_is_never_tried_again():
    """Every region fine on its own (the whole set failed for another reason): the last step,
    which would be the whole set, is skipped."""
    attempt, tried = attempts(broken=set())
    kept, _ = narrow(regions([1.0, 2.0, 3.0]), attempt)
    assert kept == [1, 2] and (0, 1, 2) not in tried and len(tried) == 2


def test_nothing_to_narrow_with_fewer_than_two_kernels_or_when_none_verifies():
    attempt, tried = attempts(broken={0})
    assert narrow(regions([1.0, 2.0], eager={1}), attempt) is None and tried == []
    attempt, tried = attempts(broken={0, 1, 2})
    assert narrow(regions([1.0, 2.0, 3.0]), attempt) is None and tried == [(2,), (1,), (0,)]


def test_tries_are_bounded_and_unmeasured_regions_count_as_saving_nothing():
    rs = regions([float(i) for i in range(MAX_TRIES + 4)])
    rs[0].eager_ms = None
    assert saved_ms(rs[0]) == 0.0 and saved_ms(rs[1]) == 1.0
    attempt, tried = attempts(broken=set())
    kept, _ = narrow(rs, attempt)
    assert len(tried) == MAX_TRIES and len(kept) == MAX_TRIES


def test_narrow_composition_marks_the_regions_left_out_and_says_which():
    """optimize's use: the kept regions' impls composed (copies: the rewrite may change one in
    place), the others eager; the left-out regions' impls become eager in the report with the
    kernel they had, and the note names them."""
    from types import SimpleNamespace

    from fact_db.pipeline.narrowing import narrow_composition

    @dataclass
    class Realized:
        index: int
        impl: Impl
        region: object
        eager_ms: float | None = None
        ms: float | None = None
        notes: list = None

    rs = [Realized(i, Impl("conv", f"kernel {i}"), SimpleNamespace(rule=rule), 1.0 + g, 1.0, [])
          for i, (rule, g) in enumerate([("conv", 0.5), ("layernorm", 3.0), ("conv", 1.0)])]
    cudnn = Realized(3, Impl.eager("cudnn: 0.024 ms"), SimpleNamespace(rule="conv"), None, None, [])
    composed = []

    def compose(impls):
        composed.append({i: m.kind for i, m in impls.items() if i < 3})
        assert all(impls[z.index] is not z.impl for z in rs + [cudnn])  # copies
        assert impls[3].note == "cudnn: 0.024 ms"  # a region eager already keeps its own impl
        return SimpleNamespace(impls=impls), []

    def verify(module):  # region 2 (a conv) breaks the model
        return SimpleNamespace(ok=module.impls[2].kind == "eager", trials=[], reason="bound")
    (fast, verdict), note = narrow_composition(rs + [cudnn], compose, verify)
    assert verdict.ok and fast.impls[1].kind == "conv" and fast.impls[0].kind == "conv"
    assert composed == [{0: "eager", 1: "conv", 2: "eager"}, {0: "eager", 1: "conv", 2: "conv"},
                        {0: "conv", 1: "conv", 2: "eager"}]
    assert rs[2].impl.kind == "eager" and rs[2].notes and "kernel 2" in rs[2].notes[0]
    assert [z.impl.kind for z in rs[:2]] == ["conv", "conv"] and cudnn.impl.note == "cudnn: 0.024 ms" and not cudnn.notes
    assert "region 3 conv left as the model wrote it" in note and "(2 region(s) on kernels;" in note
    assert "tried regions 2: verified; regions 2+3: failed (bound); regions 1+2: verified" in note

    def never(module):
        return SimpleNamespace(ok=False, trials=[], reason="bound")
    for z in rs:
        z.impl = Impl("conv", f"kernel {z.index}")
    got, note = narrow_composition(rs + [cudnn], compose, never)
    assert got is None and note.startswith("narrowing found no part of the composition that verifies (regions 2:")
    assert all(z.impl.kind == "conv" for z in rs)  # nothing marked where nothing was kept
