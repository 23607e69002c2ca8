"""Measuring a composed module against its peers, in the optimizing process: eager at the
policy and in fp32, torch.compile's modes, the composed module with and without its CUDA
graph and under torch.compile; and the two decisions timing makes (keep the CUDA graph or not;
run eager where it is faster).

    >>> variants = measure(model, model_p, fast, "fp32", draw, ref_model, peers=("compile",))
"""
from __future__ import annotations

import os
import statistics
import time

from fact_db.core.errors import first_line
from fact_db.core.policy import policy_mode
from fact_db.pipeline.results import OptimizeError, Variant

PEERS = ("compile", "max-autotune")  # torch.compile default, and max-autotune-no-cudagraphs
# Peers that can be asked for besides: torch.compile's CUDA-graph mode, the peer to compare
# with when the composed module replays a CUDA graph on a launch-bound model.
MORE_PEERS = ("reduce-overhead",)

GRAPH_MARGIN = 0.97  # a graph is kept only where it times at least 3% faster than op by op
BENCH_ROUNDS = 3     # interleaved timing rounds of the variants that compile nothing (see measure)


def choose_graph(fast, policy: str, draw, timer=None) -> str:
    """Keep the composed module's CUDA graph only where it is faster than the graph run op by
    op, timed on three fresh input sets: a graph saves the host's launches (a launch-bound
    Llama block at bf16: 0.43 against 1.12 ms) but copies inputs in and outputs out, which a
    memory-bound model pays for (a LayerNorm: 0.31 against 0.17 ms). Within GRAPH_MARGIN the
    graph is dropped: the minGPT block at fp32 timed 12.73 against 12.79 ms here and then 13.41
    against 12.45 in the benchmark that followed, so a tie is not a win. Returns the note."""
    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.composition.compose import cast_floats, policy_dtype, run_at_policy
    dt = policy_dtype(policy)
    sets = [draw(2 * i)[0] for i in range(3)]
    sets = [cast_floats(x, dt) for x in sets] if dt else sets
    timer = timer or (lambda fn, xs: time_cuda(lambda x: fn(*x), xs))

    def ops(*x):
        with torch.no_grad():
            return run_at_policy(fast.gm, policy, x)
    def ms(fn) -> float:
        t = timer(fn, sets)
        return getattr(t, "median_ms", t)
    graph_ms = ms(lambda *x: fast(*x))
    if fast.graph_note:  # the capture, or its check against the ops, failed while timing
        return fast.graph_note
    ops_ms = ms(ops)
    if graph_ms > GRAPH_MARGIN * ops_ms:
        fast.cuda_graph = False
        fast._graphs.clear()
        return f"CUDA graph off: op by op {ops_ms:.3f} ms, replayed as a graph {graph_ms:.3f} ms"
    return f"CUDA graph on: replayed {graph_ms:.3f} ms, op by op {ops_ms:.3f} ms"


def keep_faster_than_eager(fast, model_p, policy: str, draw, timer=None, margin: float = 0.0) -> str:
    """Eager PyTorch is always a candidate: where the model at the policy, run eagerly, times
    faster than the composed module on three fresh input sets, the module runs eager for the
    signature it was optimized for (`prefer_eager`), and the note says so with both times."""
    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.composition.compose import cast_floats, policy_dtype, run_at_policy
    dt = policy_dtype(policy)
    sets = [draw(2 * i + 1)[0] for i in range(3)]
    sets = [cast_floats(x, dt) for x in sets] if dt else sets
    timer = timer or (lambda fn, xs: time_cuda(lambda x: fn(*x), xs))

    def eager(*x):
        with torch.no_grad():
            return run_at_policy(model_p, policy, x)

    def ms(fn) -> float:
        t = timer(fn, sets)
        return getattr(t, "median_ms", t)
    ours, theirs = ms(lambda *x: fast(*x)), ms(eager)
    if theirs < ours * (1 - margin):
        fast.prefer_eager = True
        return (f"eager PyTorch is faster than the composed module ({theirs:.3f} against {ours:.3f} ms): the "
                f"returned module runs eager for these inputs")
    return ""


def _compiled(module, mode: str | None):
    import torch
    return torch.compile(module, mode=mode) if mode else torch.compile(module)


def _add_note(v: Variant, text: str) -> None:
    v.note = f"{v.note}; {text}" if v.note else text


def measure(module, model_p, fast, policy: str, draw, ref_model, *, peers=PEERS, timer=None, progress=True,
            composed_ok: bool = True) -> list[Variant]:
    """Time every variant end to end in this process: eager fp32, eager at the policy,
    torch.compile (default, and max-autotune-no-cudagraphs), fact-db; each on the same three
    input sets (cast to the policy's dtype beforehand for every variant at the policy, so
    no variant pays the cast), with its error against the reference (`ref_model`: the float64
    model given float64 inputs, or a reference.Reference) and its peak memory.

    The variants that compile nothing (eager, fact-db) are timed in BENCH_ROUNDS interleaved
    rounds, so a GPU whose clocks drift under sustained load drifts for all of them alike; each
    one's time is the median of its rounds' medians, and `round_ms` keeps those for the spread.
    A compiled peer is timed right after its compile (the next compile resets dynamo's caches)."""
    import torch

    from fact_db.kernels.agreement import tree_err
    from fact_db.kernels.bench import peak_mib, time_cuda
    from fact_db.composition.compose import cast_floats, policy_dtype
    from fact_db.kernels.verify import for_reference
    sets = [draw(2 * i)[0] for i in range(3)]
    dt = policy_dtype(policy)
    sets_p = [cast_floats(s, dt) for s in sets] if dt else sets
    seed = int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1)  # every error run draws what the reference drew
    torch.manual_seed(seed)
    try:
        ref, ref_note = ref_model(*for_reference(sets[0], ref_model)), ""
    except Exception as e:  # noqa: BLE001  (the errors column is then empty, and each variant says why)
        ref, ref_note = None, f"no error: the reference raised {first_line(e, 120, typed=True)}"
    timer = timer or (lambda fn, xs: time_cuda(lambda x: fn(*x), xs))

    def plain(m, pol):
        def run(*x):
            with torch.no_grad(), policy_mode(pol):
                return m(*x)
        return run

    runs = [("eager fp32", plain(module, "fp32"), sets)]
    if policy != "fp32":
        runs.append((f"eager {policy}", plain(model_p, policy), sets_p))
    for peer in peers:
        mode = {"compile": None, "max-autotune": "max-autotune-no-cudagraphs",
                "reduce-overhead": "reduce-overhead"}.get(peer, "invalid")
        if mode == "invalid":
            raise OptimizeError(f"unknown peer '{peer}': use compile, max-autotune or reduce-overhead")
        label = "torch.compile" + (f" {mode}" if mode else "")
        runs.append((label, ("compile", mode), sets_p))
    runs.append(("fact-db", lambda *x: fast(*x), sets_p))
    if getattr(fast, "prefer_eager", False):
        runs.append(("fact-db composed (slower: not returned)", lambda *x: plain(fast.gm, policy)(*x), sets_p))
    elif getattr(fast, "cuda_graph", False) and composed_ok and torch.cuda.is_available():
        # The same composed graph run op by op: what the CUDA graph saves in launches.
        runs.append(("fact-db, no CUDA graph", lambda *x: plain(fast.gm, policy)(*x), sets_p))
    if "compile" in peers and composed_ok:
        # The composed module under torch.compile(fullgraph=True): Inductor fuses what the
        # regions left to PyTorch (norms, views, casts) around the kernels' ops.
        runs.append(("fact-db + torch.compile", ("compile-composed", None), sets_p))
    out, later = [], []  # later: (variant, fn, inputs) timed in the interleaved rounds
    bar = None
    if progress:
        from tqdm import tqdm
        n_later = sum(1 for _, fn, _ in runs if not isinstance(fn, tuple))
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
            # What fact-db's module holds between calls was allocated before the call and is
            # invisible to its peak, yet it is memory the user gives up to run it: counted in.
            if v.name.startswith("fact-db") and hasattr(fast, "held_mib"):
                v.held_mib = fast.held_mib(graphs=v.name == "fact-db")
                v.peak_mib += v.held_mib

    for label, fn, xs in runs:
        v = Variant(label)
        try:
            compiled_peer = isinstance(fn, tuple)
            if compiled_peer:
                import torch._dynamo
                torch._dynamo.reset()
                if fn[0] == "compile-composed":
                    compiled = torch.compile(fast, fullgraph=True)
                    fn = (lambda c: lambda *x: c(*x))(compiled)
                else:
                    compiled = _compiled(model_p, fn[1])
                    fn = plain(compiled, policy)
                t0 = time.perf_counter()
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
            if compiled_peer:
                finish(v, fn, xs, [timer(fn, xs)])
                if bar is not None:
                    bar.update(1)
            else:
                later.append((v, fn, xs))
        except Exception as e:  # noqa: BLE001  (a peer that fails, e.g. a compile error, is reported, not fatal)
            _add_note(v, first_line(e, typed=True))
            if bar is not None:
                bar.update(1 if compiled_peer else BENCH_ROUNDS)
        if label == "fact-db" and not composed_ok:
            _add_note(v, "verification failed: this is eager PyTorch")
        elif label == "fact-db" and getattr(fast, "prefer_eager", False):
            _add_note(v, "eager timed faster than the composed graph: this is eager")
        out.append(v)
    timings: dict = {id(v): [] for v, _, _ in later}
    failed: set = set()
    for _ in range(BENCH_ROUNDS):
        for v, fn, xs in later:
            if id(v) not in failed:
                try:
                    timings[id(v)].append(timer(fn, xs))
                except Exception as e:  # noqa: BLE001
                    failed.add(id(v))
                    _add_note(v, first_line(e, typed=True))
            if bar is not None:
                bar.update(1)
    for v, fn, xs in later:
        if timings[id(v)] and id(v) not in failed:
            try:
                finish(v, fn, xs, timings[id(v)])
            except Exception as e:  # noqa: BLE001
                _add_note(v, first_line(e, typed=True))
    if bar is not None:
        bar.close()
    return out
