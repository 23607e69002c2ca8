"""Bench: time a CUDA callable the way DESIGN.md and the device METHOD.md ask.

Warm-up first (module load, handle creation and lazy init stay out of the numbers), then
at least 20 timed runs, each bracketed by CUDA events, with the L2 cache flushed before
each (a write over a buffer twice the L2's size) and the input sets rotated (so repeated
runs do not time the cache). The result is the median, with the spread.

>>> t = time_cuda(lambda x: f(*x), [inputs1, inputs2, inputs3])
>>> t.median_ms, t.p10_ms, t.p90_ms
"""
from __future__ import annotations

import itertools
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


def time_cuda_interleaved(fns: list, input_sets: list, reps: int = 20, warmup: int = 3, flush: bool = True,
                          device="cuda", event=None) -> list[Timing]:
    """Median device time of each of `fns` (each called as `fn(inputs)`), timed in alternation:
    run i of every callable before run i + 1 of any. Whatever slows the host or the GPU for a
    while (the CPU's clock, another process) then falls on all of them alike, where timing one
    after the other gave it to one: KernelBench L3-41, launch-bound (a cuDNN GRU over 512 steps),
    timed the same eager module at 64.9 and 82.9 ms in consecutive blocks of 20 runs. Per
    callable: warm-up runs, then `reps` (at least 20), each bracketed by its own events after an
    L2 flush, the input sets rotated. `event()` makes a timing event (default a CUDA event).

    Each run starts on an idle GPU (a synchronize before its first event, as KernelBench times
    a trial): otherwise a launch-bound callable queued behind another's GPU work is timed from
    when the GPU reached it, with its first launches already queued. On an H200, L3-41's eager
    GRU timed 54 ms behind a 20 ms CUDA graph replay and 64 ms on its own."""
    import torch
    reps = max(reps, 20)
    event = event or (lambda: torch.cuda.Event(enable_timing=True))
    buf = _flush_buffer(device) if flush else None
    for fn in fns:
        for i in range(warmup):
            fn(input_sets[i % len(input_sets)])
    torch.cuda.synchronize(device)
    marks = [[(event(), event()) for _ in range(reps)] for _ in fns]
    for i in range(reps):
        for fn, mine in zip(fns, marks):
            if buf is not None:
                buf.zero_()
            torch.cuda.synchronize(device)
            mine[i][0].record()
            fn(input_sets[i % len(input_sets)])
            mine[i][1].record()
    torch.cuda.synchronize(device)
    return [summarize([a.elapsed_time(b) for a, b in mine]) for mine in marks]


def time_cuda_blocks(fns: list, input_sets: list, start: int = 0, **kw) -> list[Timing]:
    """Each of `fns` timed alone, in a block of its own runs (time_cuda_interleaved of one
    callable: warm-up, then every run from an idle GPU), one callable after another starting
    with fns[start]; the timings in the order of `fns`.

    Why blocks and not run-by-run alternation: timed from an idle GPU, a run also counts the
    host's time to its first launch, and that time depends on what the host ran just before.
    On an H200 (2026-11-27, benchmarks/results/raw/h200x2-2026-11-27-s7c2-timing.log) the same
    torch.compile module of KernelBench L2-54 timed 1.38-1.50 ms in a block of its own runs and
    1.48-1.59 ms alternating run by run with eager (or with itself, or a no-op); a peer timed in a
    block and the returned module timed alternating differed by 6-21% while they were the same
    compiled module. Every variant is now timed the same way; drift over time is what the rounds
    (each starting with the next callable) and their median are for."""
    n = len(fns)
    out: list = [None] * n
    for j in range(n):
        i = (start + j) % n
        out[i] = time_cuda_interleaved([fns[i]], input_sets, **kw)[0]
    return out


def timer_of_many(timer=None):
    """`many(fns, input_sets) -> [ms or Timing]`, each fn called like the model (`fn(*inputs)`):
    with `timer(fn, input_sets)` (a stand-in, tests on the CPU) one callable after the other;
    without one, on the GPU, each in a block of its own runs (time_cuda_blocks), each call of
    `many` (a round) starting with the next callable, so no callable is always timed first."""
    if timer is not None:
        return lambda fns, sets: [timer(fn, sets) for fn in fns]
    rounds = itertools.count()
    return lambda fns, sets: time_cuda_blocks([lambda x, fn=fn: fn(*x) for fn in fns], sets, start=next(rounds))


# Candidates are timed in interleaved rounds and keep their median round (pipeline/choice.py,
# pipeline/measure.py). Where any one's rounds spread past ROUND_SPREAD (slowest over fastest),
# every candidate gets another round, up to MAX_ROUNDS, so two slow rounds of three (a host
# busy for a second) are not a candidate's time: KernelBench L2-1 at bf16 timed the returned
# module's rounds at 1.16, 1.27 and 0.885 ms and reported 0.83x of torch.compile, while the same
# compiled module, timed as its own variant in those rounds, gave 1.17, 0.90 and 0.887.
ROUND_SPREAD = 1.15
MAX_ROUNDS = 5


def rounds_unsettled(rounds_ms) -> str:
    """A note where a variant's rounds still spread past bench.ROUND_SPREAD after every round
    the benchmark gives (a busy host, a drifting clock): how far, so that a reader takes a
    difference between variants smaller than that for the noise it is; "" where they settled."""
    r = [t for t in rounds_ms or [] if t and t > 0]
    if len(r) < 2 or max(r) / min(r) <= ROUND_SPREAD:
        return ""
    return (f"rounds unsettled: {len(r)} rounds spread {100 * (max(r) / min(r) - 1):.0f}% "
            f"({min(r):.4g}-{max(r):.4g} ms); a difference from another variant smaller than that is noise")


def another_round(rounds: list, done: int, base: int) -> bool:
    """Whether to time one more round: `done` rounds of `base` run, or fewer than MAX_ROUNDS and
    some candidate's round times (`rounds`: a list of each one's) spread past ROUND_SPREAD."""
    if done < base:
        return True
    return done < MAX_ROUNDS and any(len(r) > 1 and min(r) > 0 and max(r) / min(r) > ROUND_SPREAD for r in rounds)


def time_round(many, fns: list, sets: list) -> tuple[list, dict]:
    """One interleaved round of `many` over `fns`: (times, {index: exception}). Where the round
    raises, each callable is timed alone to tell which one failed (None for it)."""
    try:
        return list(many(fns, sets)), {}
    except Exception:  # noqa: BLE001  (whose failure it was is found below)
        out, failed = [], {}
        for i, fn in enumerate(fns):
            try:
                out.append(many([fn], sets)[0])
            except Exception as e:  # noqa: BLE001
                out.append(None)
                failed[i] = e
        return out, failed


def _emptied(device) -> None:
    """The allocator's cache emptied: dropped tensors collected, pending frees done."""
    import gc

    import torch
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's cached workspaces, one per handle and stream (the next GEMM on a stream
    allocates its own): around a CUDA graph's capture, and before eager's reserved peak."""
    import torch
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:  # a CUDA build of torch
        clear()


def peak_mib(fn, device="cuda", reserved: bool = False) -> float:
    """Peak GPU memory one call of `fn()` allocates beyond what was allocated before it, in MiB.
    `reserved`: the peak the allocator reserved for it instead, from an emptied cache (whole
    segments, as a CUDA graph's pool is counted: held_mib), which eager PyTorch's caching
    allocator keeps between calls; never less than the allocated peak. cuBLAS's workspace (32
    MiB a stream on Hopper) is cleared first, so a call that runs a GEMM counts the one it keeps
    between calls, as a CUDA graph's pool holds its own (composition/module.py: _Graphed)."""
    import torch
    if reserved:
        clear_cublas_workspaces()
        _emptied(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before[0]
    if reserved:
        # At least what the call allocated: a segment that a live tensor keeps reserved can hold
        # a call's intermediates unseen (KernelBench L1-78's 512 MiB output showed as 20 MiB).
        peak = max(peak, torch.cuda.max_memory_reserved(device) - before[1])
    del out
    return peak / 2**20


def held_mib(fn, device="cuda") -> float:
    """GPU memory `fn()` leaves reserved once its outputs are dropped and the allocator's cache
    is emptied, in MiB: what a first call sets aside for later ones (a CUDA graph's private
    pool, buffers a compiled module allocates once, the cuBLAS workspace a GEMM keeps: cleared
    first, as for eager's reserved peak, so whichever candidate is measured first or after a
    capture counts the same), which no call's own peak shows."""
    import torch

    def reserved() -> int:
        _emptied(device)
        return torch.cuda.memory_reserved(device)
    clear_cublas_workspaces()
    before = reserved()
    out = fn()
    del out
    return max(0, reserved() - before) / 2**20


# The GPU's clocks at a timing: what tells a GPU that slowed down (power, heat, another
# process) from a slower candidate. KernelBench L3-35's eager model timed 37.1 ms in the
# choice and 51.1 ms in the benchmark after it, in one process on one GPU.
_SMI_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
_SMI_REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer, older drivers
_smi = {"reasons": None, "off": False}


def _smi_id(device) -> str | None:
    """What `nvidia-smi -i` calls torch's `device`: its PCI address where torch gives it, else
    its entry in CUDA_VISIBLE_DEVICES (an index or a UUID), else its index."""
    import os

    import torch
    d = torch.device(device)
    idx = d.index if d.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[idx] if idx < len(visible) else str(idx)


def _number(text: str) -> float | None:
    """nvidia-smi's value as a number, None where it says `[N/A]` or the like."""
    try:
        return float(text)
    except ValueError:
        return None


def gpu_clocks(device="cuda") -> dict | None:
    """The GPU's SM clock now and its maximum (MHz), its power (W) and temperature (C), and the
    active clock event (throttle) reasons as nvidia-smi's bitmask; None where there is no GPU
    or nvidia-smi cannot say (asked once: it is not asked again in this process)."""
    import shutil
    import subprocess
    if _smi["off"]:
        return None
    try:
        import torch
        exe = shutil.which("nvidia-smi")
        target = _smi_id(device) if exe and torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001  (no driver, no device: no clocks)
        target = None
    if target is None:
        _smi["off"] = True
        return None
    for reasons in ([_smi["reasons"]] if _smi["reasons"] else _SMI_REASONS):
        try:
            r = subprocess.run([exe, "-i", target, f"--query-gpu={','.join((*_SMI_FIELDS, reasons))}",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            break
        vals = [v.strip() for v in r.stdout.strip().split(",")]
        if r.returncode == 0 and len(vals) == len(_SMI_FIELDS) + 1:
            _smi["reasons"] = reasons
            sm, top, watts, temp = (_number(v) for v in vals[:4])
            return {"sm_mhz": sm, "max_sm_mhz": top, "power_w": watts, "temp_c": temp, "reasons": vals[4]}
    _smi["off"] = True
    return None
