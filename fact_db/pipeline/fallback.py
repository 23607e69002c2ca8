"""What optimize returns when it cannot return a composed module: eager PyTorch at the policy,
in a ComposedModule (called like the model, inputs cast as the policy casts them), checked to
run, with the reason in the report.

    >>> fast = eager_module(model_p, "fp32", (x,), (x,), "Model")          # verification failed
    >>> fast = fall_back(model_p, "fp32", (x,), (x,), "Model", report, err, "verify", draw)  # a stage raised
"""
from __future__ import annotations

from fact_db.core.errors import first_line


def eager_module(model_p, policy: str, inputs, inputs_p, name: str):
    """A ComposedModule that runs `model_p` eagerly under `policy` for every signature."""
    from fact_db.composition.module import ComposedModule, signature
    return ComposedModule(model_p, model_p, policy=policy, optimized_for=signature(inputs), name=name, regions=[],
                          variants=None, also_for=[signature(inputs_p)] if inputs_p is not inputs else [])


def why(error: BaseException, stage: str) -> str:
    """The reason a stage stopped, in one sentence part."""
    import torch
    if isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower():
        return f"the {stage} stage ran out of GPU memory ({first_line(error, 160)})"
    return f"the {stage} stage failed: {first_line(error, None, typed=True)}"


def fall_back(model_p, policy: str, inputs, inputs_p, name: str, report, error: BaseException, stage: str, draw):
    """Eager at `policy` as the result of optimize after `error` in `stage`: the reason goes to
    the report (`report.fallback` and a note), and the returned module is run once on fresh
    inputs against eager from the same random state (it must give eager's output exactly)."""
    import torch

    from fact_db.composition.module import run_at_policy
    from fact_db.kernels.verify import _clone, _same_tensors
    if torch.cuda.is_available():
        import gc
        gc.collect()  # what the failed stage's frames held (run.optimize clears them) goes before the cache
        torch.cuda.empty_cache()
    fast = eager_module(model_p, policy, inputs, inputs_p, name)
    reason = why(error, stage)
    try:
        xs = draw(1)[0]
        torch.manual_seed(0)
        with torch.no_grad():
            mine = fast(*_clone(xs))
            torch.manual_seed(0)
            theirs = run_at_policy(model_p, policy, _clone(xs))
        check = ("one run on fresh inputs gives eager's output exactly" if _same_tensors(mine, theirs) else
                 "one run on fresh inputs differs from eager's (nondeterministic ops?)")
    except Exception as e:  # noqa: BLE001  (said in the report; the module is still eager PyTorch)
        check = f"it could not be run here either: {first_line(e, 160, typed=True)}"
    report.fallback = reason
    report.notes.append(f"{reason}: the returned module runs eager PyTorch under the {policy} policy ({check})")
    return fast
