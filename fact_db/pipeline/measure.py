"""Measuring what optimize returns against its peers, in the optimizing process: eager at the
policy and in fp32, torch.compile's modes, the returned module, and the composed module op by
op and under torch.compile; per variant its time, error, peak and held memory, and compile
time. (Which of them optimize returns is pipeline/choice.py's decision.)

    >>> variants = measure(model, model_p, fast, "fp32", draw, ref_model, peers=("compile",))
"""
from __future__ import annotations

import os
import statistics
import sys
import time

from fact_db.core.errors import first_line
from fact_db.core.policy import policy_mode
from fact_db.pipeline.results import OptimizeError, Variant

PEERS = ("compile", "max-autotune")  # torch.compile default, and max-autotune-no-cudagraphs
# Peers that can be asked for besides: torch.compile's CUDA-graph mode, the peer to compare
# with when the composed module replays a CUDA graph on a launch-bound model.
MORE_PEERS = ("reduce-overhead",)

BENCH_ROUNDS = 3     # timing rounds of every variant, each in a block of its runs (see measure)
MODES = {"compile": None, "max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "reduce-overhead"}


def _compiled(module, mode: str | None, fullgraph: bool = False):
    import torch
    return torch.compile(module, mode=mode, fullgraph=fullgraph) if mode else torch.compile(module, fullgraph=fullgraph)


TF32_DEFAULT = "eager fp32 (PyTorch default: TF32 on)"


def has_convolutions(module, inputs) -> bool:
    """Whether one eager call of `module` runs a convolution: under the fp32 policy those are
    what PyTorch's default runs on TF32 (torch.backends.cudnn.allow_tf32 is on by default;
    matmuls have run IEEE fp32 by default since torch 1.12)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        seen = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "convolution" in func._schema.name:
                Spy.seen = True
            return func(*args, **(kwargs or {}))
    with torch.no_grad(), Spy():
        module(*inputs)
    return Spy.seen


def pytorch_default(m):
    """`m` called under PyTorch's own defaults (cuDNN TF32 on, matmul TF32 off), whatever the
    process set: the fp32 policy's eager baseline turns cuDNN's TF32 off, and this variant
    shows a user what they had before, with its error."""
    import torch

    def run(*x):
        mm, dnn = torch.backends.cuda.matmul, torch.backends.cudnn
        old = (mm.allow_tf32, dnn.allow_tf32)
        mm.allow_tf32, dnn.allow_tf32 = False, True
        try:
            with torch.no_grad():
                return m(*x)
        finally:
            mm.allow_tf32, dnn.allow_tf32 = old
    return run


def _add_note(v: Variant, text: str) -> None:
    v.note = f"{v.note}; {text}" if v.note else text


def measure(module, model_p, fast, policy: str, draw, ref_model, *, peers=PEERS, timer=None, progress=True,
            composed_ok: bool = True, choice=None, fell_back: str = "") -> list[Variant]:
    """Time every variant end to end in this process: eager fp32, eager at the policy (under
    fp32, for a model with convolutions, also eager under PyTorch's default, cuDNN on TF32, with
    its error: what the user had), torch.compile (default, and max-autotune-no-cudagraphs), fact-db (the returned module),
    the composed module op by op where that is not what is returned, and under torch.compile;
    each on the same three input sets (cast to the policy's dtype beforehand for every variant
    at the policy, so no variant pays the cast), with its error against the reference
    (`ref_model`: the float64 model given float64 inputs, or a reference.Reference), its peak
    memory, what it holds between calls, and its compile time.

    `choice` (choice.Choice) lends the modules it compiled: a peer it has is timed as it is,
    not compiled again, and the returned module's compiled target stays the one it runs.

    Every variant, compiled or not, is timed in the same BENCH_ROUNDS rounds, each variant in a
    block of its own runs and each round starting with the next one (bench.time_cuda_blocks),
    so a GPU whose clocks drift, or a host that slows a launch-bound model for a second, does
    not fall on one variant; each one's time is the median of its rounds' medians, and
    `round_ms` keeps those for the spread. (A compiled peer used to be timed once, right after
    its compile, and the others alternating run by run: the same compiled module timed 6-21%
    apart that way, bench.time_cuda_blocks says why.)

    `ref_model` None: no errors are measured (optimize fell back to eager before it had a
    reference: `fell_back` says why, and the fact-db variant says it is eager)."""
    import torch

    from fact_db.kernels.agreement import tree_err
    from fact_db.kernels.bench import (another_round, gpu_clocks, held_mib, peak_mib, rounds_unsettled, time_round,
                                       timer_of_many)
    from fact_db.composition.module import GRAPHED, cast_floats, policy_dtype
    from fact_db.kernels.verify import for_reference
    sets = [draw(2 * i)[0] for i in range(3)]
    dt = policy_dtype(policy)
    sets_p = [cast_floats(s, dt) for s in sets] if dt else sets
    seed = int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1)  # every error run draws what the reference drew
    torch.manual_seed(seed)
    try:
        if ref_model is None:
            ref, ref_note = None, "no error: no reference (optimize fell back to eager before it made one)"
        else:
            ref, ref_note = ref_model(*for_reference(sets[0], ref_model)), ""
    except Exception as e:  # noqa: BLE001  (the errors column is then empty, and each variant says why)
        ref, ref_note = None, f"no error: the reference raised {first_line(e, 120, typed=True)}"
    many = timer_of_many(timer)

    def plain(m, pol):
        def run(*x):
            with torch.no_grad(), policy_mode(pol):
                return m(*x)
        return run

    runs = [("eager fp32", plain(module, "fp32"), sets)]
    if policy == "fp32" and has_convolutions(module, sets[0]):
        runs.append((TF32_DEFAULT, pytorch_default(module), sets))
    if policy != "fp32":
        runs.append((f"eager {policy}", plain(model_p, policy), sets_p))
    returned = getattr(fast, "choice", "composed")
    for peer in peers:
        if peer not in MODES:
            raise OptimizeError(f"unknown peer '{peer}': use compile, max-autotune or reduce-overhead")
    # Like with like: where the returned module replays a CUDA graph, torch.compile's CUDA-graph
    # mode is timed too, whichever peers were asked for.
    like = ("reduce-overhead",) if returned.endswith(GRAPHED) and "reduce-overhead" not in peers else ()
    for peer in (*peers, *like):
        label = "torch.compile" + (f" {MODES[peer]}" if MODES[peer] else "")
        runs.append((label, ("compile", MODES[peer]), sets_p))
    runs.append(("fact-db", lambda *x: fast(*x), sets_p))
    if composed_ok and returned not in ("composed", "composed, CUDA graph"):
        runs.append(("fact-db composed (not returned)", lambda *x: plain(fast.gm, policy)(*x), sets_p))
    elif returned == "composed, CUDA graph" and composed_ok and torch.cuda.is_available():
        # The same composed graph run op by op: what the CUDA graph saves in launches.
        runs.append(("fact-db, no CUDA graph", lambda *x: plain(fast.gm, policy)(*x), sets_p))
    from fact_db.pipeline.choice import unrolled_why
    unrolled = unrolled_why(getattr(fast, "gm", None)) if composed_ok else ""
    for peer in ("compile", "max-autotune"):
        if peer in peers and composed_ok:
            # The composed graph under torch.compile(fullgraph=True): Inductor fuses what the
            # regions left to PyTorch (norms, views, casts) around the kernels' ops. Not where
            # Inductor would unroll a recurrent op (choice.UNROLLED): a note says so instead.
            label = "fact-db + torch.compile" + (f" {MODES[peer]}" if MODES[peer] else "")
            runs.append((label, unrolled or ("compile-composed", MODES[peer]), sets_p))
    # The choice's candidates that compiled something, by the variant label they are timed as:
    # one that failed verification still runs, and is timed as the peer it is rather than
    # compiled again (KernelBench L2-34's torch.compile, off KernelBench's allclose at bf16, was
    # compiled twice: a second Inductor compile of the model, minutes on a large CNN). Not one
    # that failed to compile, run or time.
    chosen = choice.candidate(choice.chosen) if choice is not None else None
    lent = {}
    for c in (choice.candidates if choice is not None else []):
        if c.compiled is not None and c.run is not None and not c.why.startswith("failed to"):
            lent[c.name.replace("composed + ", "fact-db + ")] = c
    out, later = [], []  # later: (variant, fn, inputs) timed in the rounds
    bar = None
    if progress:
        from tqdm import tqdm
        n_later = sum(1 for _, fn, _ in runs if not isinstance(fn, str))
        bar = tqdm(total=len(runs) - n_later + n_later * BENCH_ROUNDS, desc="benchmark", unit="timing", leave=False)

    def finish(v, fn, xs, timings):
        medians = [getattr(t, "median_ms", t) for t in timings]
        v.ms = statistics.median(medians)
        p10 = [getattr(t, "p10_ms", None) for t in timings]
        p90 = [getattr(t, "p90_ms", None) for t in timings]
        v.p10_ms = min(p10) if None not in p10 else None
        v.p90_ms = max(p90) if None not in p90 else None
        if len(timings) > 1:
            v.round_ms = medians
        if torch.cuda.is_available() and xs[0] and any(isinstance(x, torch.Tensor) and x.is_cuda for x in xs[0]):
            v.peak_mib = peak_mib(lambda: fn(*xs[0]))
            # What a module holds between calls was allocated before the call and is invisible
            # to its peak, yet it is memory the user gives up to run it: counted in.
            if v.name == "fact-db" and chosen is not None:
                v.held_mib = chosen.held_mib
            elif v.name.startswith("fact-db") and v.name not in lent and hasattr(fast, "held_mib"):
                v.held_mib = (v.held_mib or 0.0) + fast.held_mib(graphs=v.name == "fact-db")
            v.held_mib = v.held_mib or 0.0
            v.peak_mib += v.held_mib

    for label, fn, xs in runs:
        v = Variant(label)
        if isinstance(fn, str):  # not run: why
            _add_note(v, fn)
            out.append(v)
            if bar is not None:
                bar.update(1)
            continue
        try:
            compiled_peer = isinstance(fn, tuple)
            if compiled_peer and label in lent:
                fn, v.compile_s, v.held_mib = lent[label].run, lent[label].compile_s, lent[label].held_mib
            elif compiled_peer:
                if bar is not None:  # minutes on a large model: a child stopped here says which compile
                    bar.write(f"[benchmark] {label}: compiling", file=sys.stderr)
                # No dynamo reset between compiles: it would drop the returned module's compiled
                # target too; each torch.compile keeps its own entries (dynamo guards the backend).
                compiled = _compiled(fast.gm if fn[0] == "compile-composed" else model_p, fn[1],
                                     fullgraph=fn[0] == "compile-composed")
                fn = plain(compiled, policy)
                t0 = time.perf_counter()
                if torch.cuda.is_available() and xs[0] and isinstance(xs[0][0], torch.Tensor) and xs[0][0].is_cuda:
                    v.held_mib = held_mib(lambda: fn(*xs[0]))
                else:
                    fn(*xs[0])
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                v.compile_s = time.perf_counter() - t0
            torch.manual_seed(seed)
            out_t = fn(*xs[0])
            if ref is not None:
                v.err = tree_err(out_t, ref)
            else:
                _add_note(v, ref_note)
            del out_t
            later.append((v, fn, xs))  # compiled or not, every variant is timed in the same rounds
        except Exception as e:  # noqa: BLE001  (a peer that fails, e.g. a compile error, is reported, not fatal)
            _add_note(v, first_line(e, typed=True))
            if bar is not None:
                bar.update(BENCH_ROUNDS)
        if label == "fact-db" and fell_back:
            _add_note(v, f"eager PyTorch: {fell_back}")
        elif label == "fact-db" and not composed_ok:
            _add_note(v, f"verification failed: this is {returned}")
        elif label == "fact-db":
            _add_note(v, f"returns {returned}")
        out.append(v)
    timings: dict = {id(v): [] for v, _, _ in later}
    failed: set = set()
    groups: dict = {}  # the variants timed in rounds, by the input sets they take (the policy's, or fp32's)
    for v, fn, xs in later:
        groups.setdefault(id(xs), (xs, []))[1].append((v, fn))
    done = 0

    def spread():  # each live variant's round times so far
        return [[getattr(t, "median_ms", t) for t in timings[id(v)]] for v, _, _ in later if id(v) not in failed]
    # each round times every variant, each in a block of its runs (time_round); more rounds where
    # one's rounds spread (bench.another_round)
    while another_round(spread(), done, BENCH_ROUNDS):
        done += 1
        if bar is not None and done > BENCH_ROUNDS:
            bar.total += len(later)
            bar.refresh()
        for xs, members in groups.values():
            live = [(v, fn) for v, fn in members if id(v) not in failed]
            times, bad = time_round(many, [fn for _, fn in live], xs)
            sample = gpu_clocks()
            for i, ((v, fn), t) in enumerate(zip(live, times)):
                if i in bad:
                    failed.add(id(v))
                    _add_note(v, first_line(bad[i], typed=True))
                else:
                    timings[id(v)].append(t)
                    if sample is not None:
                        v.clocks.append(sample)
        if bar is not None:
            bar.update(len(later))
    for v, fn, xs in later:
        if timings[id(v)] and id(v) not in failed:
            try:
                finish(v, fn, xs, timings[id(v)])
            except Exception as e:  # noqa: BLE001
                _add_note(v, first_line(e, typed=True))
            if unsettled := rounds_unsettled(v.round_ms):  # still spread after the last round
                _add_note(v, unsettled)
    if bar is not None:
        bar.close()
    return out
