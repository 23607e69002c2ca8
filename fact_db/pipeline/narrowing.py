"""Narrowing: when the composed module fails end-to-end verification with every region on its
kernel, the largest part of it that verifies, instead of giving all of it up.

A model can have one region whose kernel passes its own check and still moves the model's
output past the bound (a bf16 convolution before a normalization, whose error the norm
amplifies) beside regions that are fine, and giving up the whole composition throws their gain
away too. Narrowing composes again with the regions added one at a time, the one saving the
most first, keeping each that still verifies; the rest stay as the model wrote them. Measured
on KernelBench rows in docs/results.md (fifteenth session): EfficientNetB0 at bf16 went from
eager to a narrowed module 1.05x over it; L2-34 found no part that verifies.

    >>> kept, found = narrow(realized, attempt)   # attempt(indices) -> what verified, or None
    >>> found, note = narrow_composition(realized, compose, verify)   # optimize: (module, verdict) or None
"""
from __future__ import annotations

import dataclasses

from fact_db.kernels.impl import Impl

# Compositions tried at most (each is a rewrite and an end-to-end verification, against the
# reference already built); regions past it stay eager.
MAX_TRIES = 8


def saved_ms(z) -> float:
    """What a realized region saves against eager, as tuning measured it (0 where unmeasured)."""
    return (z.eager_ms - z.ms) if z.eager_ms is not None and z.ms is not None else 0.0


def narrow(realized, attempt, limit: int = MAX_TRIES):
    """(the indices of the regions kept on kernels, what `attempt` returned for them) for the
    greedy narrowing, or None where no part with a region on a kernel verifies (or fewer than
    two regions run kernels: leaving the one out is eager itself). `attempt(indices)` composes
    with only those regions on their kernels and returns what verified, or None. The regions
    are added in the order of the time they save, most first (ties by index); the whole set is
    never tried again (it failed already)."""
    on = sorted((z for z in realized if z.impl.kind != "eager"), key=lambda z: (-saved_ms(z), z.index))
    if len(on) < 2:
        return None
    every = {z.index for z in on}
    kept: list[int] = []
    found = None
    tries = 0
    for z in on:
        trial = kept + [z.index]
        if set(trial) == every or tries >= limit:  # the whole composition failed already
            continue
        tries += 1
        got = attempt(sorted(trial))
        if got is not None:
            kept, found = trial, got
    return (sorted(kept), found) if found is not None else None


def narrow_composition(realized, compose, verify):
    """After the composed module failed end-to-end verification: ((module, verdict) or None, note).
    The pair is the largest part of it that verifies (`narrow`), the regions left out marked
    eager in `realized` with the reason; None where no part verifies. The note says what was
    tried (each composition's regions and, where it failed, why), for the report either way.
    `compose(impls)` -> (module, notes); `verify(module)` -> ModelVerdict."""
    eager = {z.index: Impl.eager("left out: the composed module failed end-to-end verification with it")
             for z in realized if z.impl.kind != "eager"}
    tried = []

    def attempt(keep):  # regions eager already keep their own impl (and its note)
        impls = {z.index: (z.impl if z.index in keep or z.index not in eager else eager[z.index]) for z in realized}
        # a copy of each kept impl: the rewrite may mark one eager (not composable) in place
        impls = {i: dataclasses.replace(m) for i, m in impls.items()}
        fast, _ = compose(impls)
        verdict = verify(fast)
        regions = "+".join(str(i + 1) for i in keep)
        tried.append(f"regions {regions}: " + ("verified" if verdict.ok else f"failed ({verdict.reason})"))
        return (fast, verdict) if verdict.ok else None
    got = narrow(realized, attempt)
    what = "; ".join(tried)
    if got is None:
        return None, (f"narrowing found no part of the composition that verifies ({what})" if tried else "")
    keep, (fast, verdict) = got
    left = [z for z in realized if z.impl.kind != "eager" and z.index not in keep]
    for z in left:
        z.notes.append(f"left eager ({z.impl.label}): the composed module failed end-to-end verification with it")
        z.impl = eager[z.index]
    names = ", ".join(f"region {z.index + 1} {z.region.rule}" for z in left)
    return (fast, verdict), (f"end-to-end verification failed with every region on its kernel; with {names} left "
                             f"as the model wrote {'them' if len(left) > 1 else 'it'}, the composed module "
                             f"verified ({len(keep)} region(s) on kernels; tried {what})")
