"""Bench: time a CUDA callable the way DESIGN.md and the device METHOD.md ask.

Warm-up first (module load, handle creation and lazy init stay out of the numbers), then
at least 20 timed runs, each bracketed by CUDA events, with the L2 cache flushed before
each (a write over a buffer twice the L2's size) and the input sets rotated (so repeated
runs do not time the cache). The result is the median, with the spread.

>>> t = time_cuda(lambda x: f(*x), [inputs1, inputs2, inputs3])
>>> t.median_ms, t.p10_ms, t.p90_ms
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    p10_ms: float
    p90_ms: float
    runs: int

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(samples: list[float]) -> Timing:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731
    return Timing(statistics.median(s), s[0], q(0.1), q(0.9), len(s))


_flush_buf = {}


def _flush_buffer(device):
    import torch
    idx = torch.device(device).index or 0
    if idx not in _flush_buf:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 50 << 20) or (50 << 20)
        _flush_buf[idx] = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _flush_buf[idx]


def time_cuda(fn, input_sets: list, reps: int = 20, warmup: int = 3, flush: bool = True,
              device="cuda") -> Timing:
    """Median device time of `fn(inputs)` over `reps` runs (at least 20), rotating `input_sets`."""
    import torch
    reps = max(reps, 20)
    buf = _flush_buffer(device) if flush else None
    for i in range(warmup):
        fn(input_sets[i % len(input_sets)])
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if buf is not None:
            buf.zero_()
        starts[i].record()
        fn(input_sets[i % len(input_sets)])
        ends[i].record()
    torch.cuda.synchronize(device)
    return summarize([starts[i].elapsed_time(ends[i]) for i in range(reps)])


def peak_mib(fn, device="cuda") -> float:
    """Peak GPU memory one call of `fn()` allocates beyond what was allocated before it, in MiB."""
    import torch
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak / 2**20


def held_mib(fn, device="cuda") -> float:
    """GPU memory `fn()` leaves reserved once its outputs are dropped and the allocator's cache
    is emptied, in MiB: what a first call sets aside for later ones (a CUDA graph's private
    pool, buffers a compiled module allocates once), which no call's own peak shows."""
    import gc

    import torch

    def reserved() -> int:
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(device)
    before = reserved()
    out = fn()
    del out
    return max(0, reserved() - before) / 2**20
