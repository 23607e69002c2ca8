"""Verify: does a candidate compute the workload's function, to its precision policy?

Per DESIGN.md ("Realization contract", "Precision policy"): fresh random inputs every
trial (never zeros, never one fixed seed), drawn both all-positive (`torch.rand`, which
hides downcasts) and zero-mean (`torch.randn`, which hides accumulation bias); the output
is poisoned with NaN before the run, so an element the kernel never wrote fails; the
inputs are checked unmodified afterwards; the error ‖out − ref‖ / ‖ref‖ against a float64
reference is compared with eager PyTorch's error on the same inputs under the same policy:

| policy  | accepted when                                                              |
| fp32    | err <= 4 x eager fp32's                                                     |
| tf32x3  | zero-mean: err <= eager tf32's / 10; all-positive: err <= eager tf32's      |
| tf32    | err <= 4 x eager tf32's                                                     |
| bf16/16 | err <= 4 x eager's (same dtype) and err <= 1e-2 (KernelBench's tolerance)   |
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from fact_db.core.errors import first_line

# Below this, an error is rounding of the reference itself (fp32's unit roundoff is 6e-8).
ERR_FLOOR = 1e-7


@dataclass
class Trial:
    dist: str
    err: float
    eager_err: float
    bound: float
    ok: bool
    reason: str = ""


@dataclass
class Verdict:
    ok: bool
    err: float          # worst relative error over the trials
    eager_err: float    # eager's error on the same trial
    reason: str = ""
    trials: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "err": self.err, "eager_err": self.eager_err, "reason": self.reason,
                "trials": [t.__dict__ for t in self.trials]}


def rel_err(out, ref) -> float:
    import torch
    out64 = out.to(torch.float64)
    if not torch.isfinite(out64).all():
        return float("nan")
    den = torch.linalg.vector_norm(ref).item()
    return torch.linalg.vector_norm(out64 - ref).item() / (den if den > 0 else 1.0)


def bound_for(policy: str, dist: str, eager_err: float, eager_tf32_err: float) -> float:
    if policy == "tf32x3":
        base = max(eager_tf32_err, ERR_FLOOR)
        return base / 10 if dist == "randn" else base
    if policy in ("bf16", "fp16"):
        return min(4 * max(eager_err, ERR_FLOOR), 1e-2)
    return 4 * max(eager_err, ERR_FLOOR)


def verify(run, workload, trials: int = 5, device="cuda") -> Verdict:
    """Check `run(inputs, out)` (writes the result into `out`) against the workload.

    Trials alternate zero-mean and all-positive inputs, starting with zero-mean, each from
    a fresh seed.
    """
    import torch
    trials = max(trials, 2)
    on_cuda = torch.device(device).type == "cuda"
    results: list[Trial] = []
    worst, worst_eager = 0.0, 0.0
    for t in range(trials):
        dist = "randn" if t % 2 == 0 else "rand"
        gen = torch.Generator(device=device if on_cuda else "cpu")
        gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))
        inputs = workload.make_inputs(dist, device=device, generator=gen)
        before = {k: v.clone() for k, v in inputs.items()}
        ref = workload.reference(inputs)
        eager = workload.eager(inputs)
        eager_err = rel_err(eager, ref)
        eager_tf32_err = rel_err(workload.eager(inputs, policy="tf32"), ref) if workload.policy == "tf32x3" else 0.0
        out = torch.full(ref.shape, float("nan"), dtype=eager.dtype, device=device)
        try:
            run(inputs, out)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001  (a refused launch is a verification failure, with its message)
            return Verdict(False, float("nan"), eager_err, f"launch failed: {e}", results)
        bound = bound_for(workload.policy, dist, eager_err, eager_tf32_err)
        changed = [k for k in inputs if not torch.equal(inputs[k], before[k])]
        if changed:
            results.append(Trial(dist, float("nan"), eager_err, bound, False, f"modified its inputs: {changed}"))
            return Verdict(False, float("nan"), eager_err, f"the kernel modified its inputs ({', '.join(changed)})", results)
        if torch.isnan(out).any():
            n = int(torch.isnan(out).sum())
            results.append(Trial(dist, float("nan"), eager_err, bound, False, f"{n} outputs NaN"))
            return Verdict(False, float("nan"), eager_err,
                           f"{n} of {out.numel()} outputs are NaN (unwritten, or NaN computed) on {dist} inputs", results)
        err = rel_err(out, ref)
        ok = err <= bound
        results.append(Trial(dist, err, eager_err, bound, ok, "" if ok else f"error {err:.3g} > bound {bound:.3g}"))
        if err > worst:
            worst, worst_eager = err, eager_err
        if not ok:
            return Verdict(False, err, eager_err,
                           f"error {err:.3g} on {dist} inputs exceeds the {workload.policy} bound {bound:.3g} "
                           f"(eager {workload.policy}: {eager_err:.3g})", results)
    return Verdict(True, worst, worst_eager, "", results)


# ------------------------------------------------------------------------------------------
# A whole model (composition's end-to-end check).

# KernelBench's own correctness check: torch.allclose(out, ref, atol=tol, rtol=tol) with the
# tolerance of the output dtype (1e-4 for float32, 1e-2 for half precision).
KERNELBENCH_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
# The tf32 policy computes with a 10-bit mantissa, fp16's: its output is float32, but two
# TF32 computations of one model (cuBLAS's and a kernel's, SDPA and explicit attention) differ
# at TF32's precision, not fp32's, so KernelBench's check uses the half-precision tolerance.
# The policy's bound against the float64 model applies as for every policy.
KERNELBENCH_TOL_POLICY = {"tf32": 1e-2}


@dataclass
class ModelTrial:
    dist: str           # `like` (drawn like the problem's inputs) or `randn` (zero-mean)
    err: float          # composed model vs the float64 model
    eager_err: float    # eager under the same policy vs the float64 model
    bound: float
    allclose: bool      # KernelBench's check of composed against eager
    max_abs_diff: float
    ok: bool
    reason: str = ""
    rounding: str = ""  # why a failed allclose was taken as the output format's rounding (half outputs only)


@dataclass
class ModelVerdict:
    ok: bool
    err: float
    eager_err: float
    reason: str = ""
    trials: list = field(default_factory=list)
    kernelbench_tol: float = 0.0

    def as_dict(self) -> dict:
        return {"ok": self.ok, "err": self.err, "eager_err": self.eager_err, "reason": self.reason,
                "kernelbench_tol": self.kernelbench_tol, "trials": [t.__dict__ for t in self.trials]}


def _leaves(out):
    import torch
    from torch.utils._pytree import tree_flatten
    return [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]


MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


def ulp(x, dtype: str):
    """The spacing of `dtype` numbers at |x| (x in float64; its normal range only)."""
    import torch
    _, e = torch.frexp(x.abs().clamp_min(torch.finfo(getattr(torch, dtype)).tiny))
    return torch.ldexp(torch.ones_like(x), e - 1 - MANTISSA_BITS[dtype])


def _rounding_only(cf, ef, tol: float, out_dtype: str, err: float, eager_err: float) -> str:
    """For half-precision outputs: a reason to take a failed KernelBench allclose as rounding,
    or "". Two models that both round to bf16 can differ by an ulp or two wherever their
    accumulation orders differ, which at |x| > ~4 already exceeds 1e-2 + 1e-2 |x| (an ulp of
    bf16 there is 0.03). Taken as rounding only when every element outside the tolerance is
    within 2 ulps of the output format of eager's value AND the composed output is at least
    as close to the float64 model as eager's is; the report keeps the failed check."""
    import torch
    if out_dtype not in MANTISSA_BITS or not err <= eager_err:
        return ""
    bad = ~torch.isclose(cf, ef, atol=tol, rtol=tol)
    d, u = (cf[bad] - ef[bad]).abs(), ulp(ef[bad], out_dtype)
    if not bool((d <= 2 * u).all()):
        return ""
    return (f"KernelBench's allclose at {tol:g} fails at {int(bad.sum())} of {cf.numel()} outputs, each within "
            f"{int(torch.ceil((d / u).max()))} {out_dtype} ulp of eager's, and the composed output is closer to "
            f"float64 ({err:.3g}) than eager's ({eager_err:.3g}): taken as the format's rounding")


def _eagers_own_error(cf, ef, ref, tol: float, err: float, eager_err: float) -> str:
    """A reason to take a failed KernelBench allclose (composed against eager) as eager's own
    error, or "": every element outside the tolerance is at least as close to the float64
    model as eager's, or within the tolerance of it, and the whole output is at least as
    close as eager's. KernelBench measures agreement with the library; a kernel more
    accurate than the library (3xTF32 with promotion against cuBLAS SGEMM at large K)
    disagrees with it by the library's error."""
    import torch
    if not err <= eager_err:
        return ""
    bad = ~torch.isclose(cf, ef, atol=tol, rtol=tol)
    c_err, e_err = (cf[bad] - ref[bad]).abs(), (ef[bad] - ref[bad]).abs()
    if not bool(((c_err <= e_err) | (c_err <= tol + tol * ref[bad].abs())).all()):
        return ""
    return (f"KernelBench's allclose at {tol:g} against eager fails at {int(bad.sum())} of {cf.numel()} outputs, "
            f"where the composed output is as close to float64 as eager's or within {tol:g} of it, and it is closer "
            f"overall ({err:.3g} against eager's {eager_err:.3g}): the difference is eager's own error")


def _flat(out):
    import torch
    xs = [x.detach().reshape(-1).to(torch.float64) for x in _leaves(out) if x.is_floating_point()]
    return torch.cat(xs) if xs else torch.zeros(0, dtype=torch.float64)


def _clone(tree):
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _same_tensors(a, b) -> bool:
    import torch
    la, lb = _leaves(a), _leaves(b)
    return len(la) == len(lb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(la, lb))


def verify_model(composed, eager, reference, draw, policy: str, *, trials: int = 5, eager_tf32=None,
                 out_dtype: str = "float32") -> ModelVerdict:
    """Check a composed model end to end (DESIGN.md, "Composition contract").

    `composed`, `eager` (the model under the same policy) and `reference` (the model in
    float64, given float64 inputs) are called as `f(*inputs)`; `draw(t) -> (inputs, dist)`
    gives fresh inputs for trial t (`like` the problem's, or zero-mean `randn`). Each trial
    measures both errors against the float64 model, applies the policy's bound (the table in
    this module's docstring; tf32x3 needs `eager_tf32`), runs KernelBench's allclose of the
    composed output against eager at `out_dtype`'s tolerance (the tf32 policy's: 1e-2, see
    KERNELBENCH_TOL_POLICY), and checks that the composed
    model leaves its inputs as eager does. At least 5 trials.
    """
    import torch
    trials = max(trials, 5)
    tol = KERNELBENCH_TOL_POLICY.get(policy) or KERNELBENCH_TOL.get(out_dtype, 1e-4)
    results, worst, worst_eager = [], 0.0, 0.0
    for t in range(trials):
        inputs, dist = draw(t)
        ins_eager, ins_comp = _clone(inputs), _clone(inputs)
        ref = _flat(reference(*[x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                for x in _clone(inputs)]))
        e_out = eager(*ins_eager)
        try:
            c_out = composed(*ins_comp)
        except Exception as ex:  # noqa: BLE001  (a composed model that raises fails verification, saying how)
            reason = f"the composed model raised {first_line(ex, None, typed=True)}"
            results.append(ModelTrial(dist, float("nan"), float("nan"), float("nan"), False, float("nan"), False, reason))
            return ModelVerdict(False, float("nan"), float("nan"), reason, results, tol)
        ef, cf = _flat(e_out), _flat(c_out)
        if cf.shape != ref.shape or ef.shape != ref.shape:
            reason = f"output of {cf.numel()} values, the float64 model gives {ref.numel()}"
            results.append(ModelTrial(dist, float("nan"), float("nan"), float("nan"), False, float("nan"), False, reason))
            return ModelVerdict(False, float("nan"), float("nan"), reason, results, tol)
        err, eager_err = rel_err(cf, ref), rel_err(ef, ref)
        tf32_err = rel_err(_flat(eager_tf32(*_clone(inputs))), ref) if policy == "tf32x3" and eager_tf32 else 0.0
        bound = bound_for(policy, "randn" if dist == "randn" else "rand", eager_err, tf32_err)
        close = bool(torch.allclose(cf, ef, atol=tol, rtol=tol)) if cf.numel() else True
        diff = float((cf - ef).abs().max()) if cf.numel() else 0.0
        rounding = "" if close else (_rounding_only(cf, ef, tol, out_dtype, err, eager_err)
                                     or _eagers_own_error(cf, ef, ref, tol, err, eager_err))
        reason = ""
        if not _same_tensors(ins_comp, ins_eager):
            reason = "the composed model left its inputs different from what eager leaves"
        elif not err <= bound:
            reason = f"error {err:.3g} on {dist} inputs exceeds the {policy} bound {bound:.3g} (eager: {eager_err:.3g})"
        elif not close and not rounding:
            reason = f"KernelBench's allclose at {tol:g} against eager fails (max abs difference {diff:.3g})"
        ok = not reason
        results.append(ModelTrial(dist, err, eager_err, bound, close, diff, ok, reason, rounding))
        if err > worst or err != err:
            worst, worst_eager = err, eager_err
        if not ok:
            return ModelVerdict(False, err, eager_err, reason, results, tol)
    return ModelVerdict(True, worst, worst_eager, "", results, tol)
