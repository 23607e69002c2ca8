"""End-to-end verification of a whole model (verify.verify_model): KernelBench's allclose
against eager, and when a failure of it is the half-precision output format's rounding."""
from __future__ import annotations

import torch

from fact_db.kernels.verify import ulp, verify_model


def _draw(t):
    g = torch.Generator().manual_seed(t)
    # magnitudes up to ~12: where an ulp of bf16 (0.03-0.06) exceeds 1e-2 + 1e-2 |x| in places
    return (torch.rand(4096, generator=g) * 12 - 6,), ("randn" if t % 2 else "like")


def _bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def reference(x):
    return x * 1.0


def test_ulp_of_bf16_and_fp16():
    x = torch.tensor([1.0, 1.5, 4.0, 5.0, 8.0, -6.0], dtype=torch.float64)
    assert ulp(x, "bfloat16").tolist() == [2 ** -7, 2 ** -7, 2 ** -5, 2 ** -5, 2 ** -4, 2 ** -5]
    assert ulp(x, "float16").tolist() == [2 ** -10, 2 ** -10, 2 ** -8, 2 ** -8, 2 ** -7, 2 ** -8]


def _nudged(x, ulps: int, every: int = 2):
    """bf16 values `ulps` units of bf16 away from the correctly rounded x, on every `every`th element."""
    b = x.to(torch.bfloat16)
    step = torch.ones_like(b)
    for _ in range(ulps):
        b = torch.where(torch.arange(b.numel()) % every == 0, torch.nextafter(b, b + step * 100), b)
    return b.to(torch.float32)


def test_a_bf16_model_two_ulps_from_eager_and_closer_to_float64_passes_as_rounding():
    # eager is 2 ulps off on half the elements; the composed model rounds correctly.
    v = verify_model(lambda x: _bf16(x), lambda x: _nudged(x, 2), reference, _draw, "bf16", out_dtype="bfloat16")
    assert v.ok, v.reason
    assert all(not t.allclose for t in v.trials)               # the check itself failed, and says so
    assert all("ulp" in t.rounding and "rounding" in t.rounding for t in v.trials)


def test_a_bf16_model_further_from_float64_than_eager_fails_kernelbench():
    # the composed model is the one 2 ulps off (on few enough elements to stay within the policy's
    # bound): the same kind of differences, but it is the less accurate one
    v = verify_model(lambda x: _nudged(x, 2, every=8), lambda x: _bf16(x), reference, _draw, "bf16", out_dtype="bfloat16")
    assert not v.ok and "KernelBench's allclose at 0.01" in v.reason


def test_differences_beyond_two_ulps_are_not_rounding_but_may_be_eagers_error():
    # eager 4 ulps off on half the elements, the composed model exact: not the format's
    # rounding, but eager's own error (the composed output is the closer one everywhere)
    v = verify_model(lambda x: _bf16(x), lambda x: _nudged(x, 4), reference, _draw, "bf16", out_dtype="bfloat16")
    assert v.ok, v.reason
    assert all("ulp" not in t.rounding and "eager's own error" in t.rounding for t in v.trials)


def test_a_float32_model_more_accurate_than_eager_passes_where_eager_itself_is_off():
    # eager carries an error of 3e-4 relative on some elements (a library's large-K sum); the
    # composed model is exact: allclose(composed, eager) at 1e-4 fails, by eager's error
    def eager(x):
        y = x * 1.0
        y[::7] *= 1 + 3e-4
        return y
    v = verify_model(lambda x: x * 1.0, eager, reference, _draw, "fp32", out_dtype="float32")
    assert v.ok, v.reason
    assert all(not t.allclose and "eager's own error" in t.rounding for t in v.trials)


def test_a_float32_model_off_where_eager_is_right_still_fails():
    def composed(x):
        y = x * 1.0
        y[::7] *= 1 + 3e-4
        return y
    v = verify_model(composed, lambda x: x * 1.0, reference, _draw, "fp32", out_dtype="float32")
    assert not v.ok


def test_tf32_outputs_that_differ_at_tf32_precision_pass_under_tf32_only():
    # two TF32 computations of one model: each off by 5e-4 relative (about TF32's epsilon) on a
    # different set of elements, equally far from float64. At fp32's 1e-4 KernelBench's check
    # fails and neither is closer everywhere; under the tf32 policy its tolerance is 1e-2.
    def off(start):
        def f(x):
            y = x * 1.0
            y[start::5] *= 1 + 5e-4
            return y
        return f
    v = verify_model(off(0), off(1), reference, _draw, "tf32", out_dtype="float32")
    assert v.ok, v.reason
    assert v.kernelbench_tol == 1e-2 and all(t.allclose for t in v.trials)
    strict = verify_model(off(0), off(1), reference, _draw, "fp32", out_dtype="float32")
    assert not strict.ok and "KernelBench's allclose at 0.0001" in strict.reason


def test_on_zero_mean_trials_the_float64_bound_decides_not_kernelbenchs_allclose():
    """KernelBench checks the problem's own inputs. On a zero-mean trial, outputs near zero meet
    its absolute tolerance, where two fp32-class sums of a deep product, each within the policy's
    bound of float64, differ by more than 1e-4 (KernelBench L1-2 at K = 8192: 0.002): such a
    trial passes on the bound, saying so; the same outputs on a trial like the problem's fail."""
    def noisy(scale, seed):
        def f(x):  # x plus absolute noise of `scale`: relative ~1e-6 at |x| ~ 100, as a deep sum's
            g = torch.Generator().manual_seed(seed)
            return x * 1.0 + torch.randn(x.shape, generator=g) * scale
        return f

    def draw(dist):
        def d(t):
            g = torch.Generator().manual_seed(t)
            return (torch.randn(4096, generator=g) * 100,), dist
        return d
    eager, composed = noisy(1e-4, 1), noisy(1.5e-4, 2)  # 1.5x eager's error: within fp32's 4x, not the closer one
    v = verify_model(composed, eager, reference, draw("randn"), "fp32", out_dtype="float32")
    assert v.ok, v.reason
    assert all(not t.allclose and "zero-mean trial" in t.rounding for t in v.trials)
    like = verify_model(composed, eager, reference, draw("like"), "fp32", out_dtype="float32")
    assert not like.ok and "KernelBench's allclose at 0.0001 against eager fails" in like.reason


def test_strict_takes_no_exemption_on_the_problems_inputs_as_kernelbenchs_check():
    """`strict` (optimize's strict_allclose, --strict-allclose): KernelBench's own check compares
    with eager and nothing else, so a model closer to float64 than eager, which the default takes
    as eager's own error or the format's rounding, fails on a trial drawn like the problem's
    inputs (KernelBench L2-3, -17, -19, -21, -31 at bf16: returned so, INCORRECT by its check)."""
    for eager in (lambda x: _nudged(x, 2), lambda x: _nudged(x, 4)):  # rounding, then eager's own error
        assert verify_model(lambda x: _bf16(x), eager, reference, _draw, "bf16", out_dtype="bfloat16").ok
        v = verify_model(lambda x: _bf16(x), eager, reference, _draw, "bf16", out_dtype="bfloat16", strict=True)
        assert not v.ok and v.trials[-1].dist == "like"
        assert "KernelBench's allclose at 0.01" in v.reason and "the strict check does not exempt" in v.reason
    # models that agree within the tolerance pass strict as they do without it
    assert verify_model(lambda x: _bf16(x), lambda x: _bf16(x), reference, _draw, "bf16", out_dtype="bfloat16",
                        strict=True).ok


def test_strict_still_lets_the_float64_bound_decide_on_zero_mean_trials():
    """Zero-mean trials are not KernelBench's inputs: strict leaves that exemption as it is."""
    def noisy(scale, seed):
        def f(x):
            g = torch.Generator().manual_seed(seed)
            return x * 1.0 + torch.randn(x.shape, generator=g) * scale
        return f

    def draw(t):
        g = torch.Generator().manual_seed(t)
        return (torch.randn(4096, generator=g) * 100,), "randn"
    v = verify_model(noisy(1.5e-4, 2), noisy(1e-4, 1), reference, draw, "fp32", out_dtype="float32", strict=True)
    assert v.ok, v.reason
    assert all("zero-mean trial" in t.rounding for t in v.trials)
