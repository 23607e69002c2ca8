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
