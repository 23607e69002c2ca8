"""End-to-end verification for optimize: the reference (reference.py), runs that each start
from the state the models were built with (state.py) and from one random state per trial
(verify_model), and what the report says about how it was done.

    >>> verdict, ref, notes = verify_end_to_end(module, model_p, fast, "fp32", draw, (x,), build=build, graph=g)
    >>> verdict.reference, verdict.ok, notes     # ref: the reference, for the benchmark's errors
"""
from __future__ import annotations

import dataclasses
import os

from fact_db.core.errors import first_line

OUT_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def _seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1)


def state_check(state, eager, composed, inputs, tol: float, out_dtype: str) -> tuple[str, str]:
    """(note, reason not verifiable) for a model whose forward changes its own state: fine
    where a second call on the same inputs gives the first call's output (the state does not
    reach the output) or the composed module's second call matches eager's; not verifiable
    where the output carries state from call to call and the composed module does not."""
    import torch

    from fact_db.kernels.agreement import agreement, sizes
    from fact_db.kernels.verify import _clone, _same_tensors

    def twice(fn):
        state.restore()
        seed, outs = _seed(), []
        for _ in range(2):
            torch.manual_seed(seed)
            outs.append(fn(*_clone(inputs)))
        return outs
    state.restore()
    torch.manual_seed(0)
    eager(*_clone(inputs))
    changed = state.changed()
    if not changed:
        return "", ""
    names = ", ".join(f"`{c}`" for c in changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    e1, e2 = twice(eager)
    if _same_tensors(e1, e2):
        state.restore()
        return (f"forward changes {names}, which its output does not depend on: every verification run started "
                "from the state the model was built with"), ""
    c1, c2 = twice(composed)
    state.restore()
    same = all(sizes(c) == sizes(e) and agreement(c, e, e, tol, out_dtype).n_bad == 0 for c, e in ((c1, e1), (c2, e2)))
    if same:
        return (f"forward carries {names} from one call to the next, and the composed module does as eager does; "
                "every verification run started from the state the model was built with"), ""
    return "", (f"not verifiable: forward carries {names} from one call to the next (a second call on the same "
                "inputs gives another output), which the composed module does not")


def verify_end_to_end(module, model_p, fast, policy: str, draw, inputs, *, build=None, graph=None, trials: int = 5,
                      free=None, ref=None, candidate=None, strict: bool = False):
    """verify_model on `fast` against the reference, eager at `policy` being `model_p`;
    returns (ModelVerdict, the Reference used, notes). `build(device)` builds the model as
    its problem does; `graph` is discovery's; `free(device)` (tests) replaces the GPU's
    free-memory probe. `ref` (a Reference this returned before) is used again instead of
    building one; `candidate(*x)` is verified in place of `fast` (optimize's choice checks
    each of its candidates so, against the reference the composed module was checked with).
    `strict`: KernelBench's allclose with no exemption on the problem's inputs (verify_model)."""
    import torch

    from fact_db.composition.module import run_at_policy
    from fact_db.kernels.verify import (EAGER_REFERENCE_BOUND, KERNELBENCH_TOL, KERNELBENCH_TOL_POLICY, ModelVerdict,
                                        verify_model)
    from fact_db.pipeline.reference import build_reference, free_bytes
    from fact_db.pipeline.state import ModelState, StateError

    def eager_at(model, pol, x):
        with torch.no_grad():  # the composed module keeps no autograd graph either
            return run_at_policy(model, pol, x)
    out_dtype = OUT_DTYPE.get(policy, "float32")
    tol = KERNELBENCH_TOL_POLICY.get(policy) or KERNELBENCH_TOL[out_dtype]
    if ref is None:
        ref = build_reference(module, model_p, policy, inputs, build=build, graph=graph, free=free or free_bytes)
    notes = list(ref.notes)
    state = ModelState(module, model_p, fast, ref.model)
    fresh_ref = dataclasses.replace(ref, run=state.fresh(ref.run))

    def eager(*x):
        return eager_at(model_p, policy, x)

    def composed(*x):
        return candidate(*x) if candidate is not None else fast(*x)

    def not_verifiable(reason: str):
        return ModelVerdict(False, float("nan"), float("nan"), reason, [], tol, ref.label), fresh_ref, notes
    try:
        note, reason = state_check(state, eager, composed, draw(0)[0], tol, out_dtype)
        notes += [note] if note else []
        if reason:
            return not_verifiable(reason)
        verdict = verify_model(
            state.fresh(composed), state.fresh(eager), fresh_ref, draw, policy,
            trials=trials, out_dtype=out_dtype, reference_is_eager=ref.kind == "eager", strict=strict,
            eager_tf32=state.fresh(lambda *x: eager_at(module, "tf32", x)) if policy == "tf32x3" else None)
        state.restore()
    except StateError as e:
        return not_verifiable(f"not verifiable: {first_line(e, None)}")
    if ref.kind == "eager":
        notes.append(f"checked against {ref.label}, with the stricter bound for that case: the composed output "
                     f"within {EAGER_REFERENCE_BOUND[policy]:g} of eager's (relative), and KernelBench's allclose "
                     "with no exemptions")
    return verdict, fresh_ref, notes
