"""Optimize: the three stages on one model -- discover, realize (registry first), compose --
then verify the composed model end to end, measure it against its peers, report, and save
an artifact.

    >>> fast = fact_db.optimize(model, (x,), policy="fp32")     # a module called like `model`
    >>> fast.report.speedup, fast.artifact                      # measured, same process
    >>> plan(model, (x,))                                       # no GPU: what would be done

`optimize_problem(spec, ...)` does the same for anything `factdb discover` takes.

Precision policies apply to the whole model (DESIGN.md): `bf16`/`fp16` run it in that
dtype, exactly as `model.to(dtype)` with inputs cast at entry and the output cast back,
which is also the eager baseline at that policy; `tf32` turns TF32 on for the eager
parts; `fp32`/`tf32x3` keep float32. Speedups are reported against eager at the same
policy, against eager fp32 (KernelBench's convention) and against torch.compile, all
timed in this process.
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fact_db.core.environment import device_info, toolchain_info
from fact_db.core.errors import FactError, first_line
from fact_db.core.policy import POLICIES, policy_mode

PEERS = ("compile", "max-autotune")  # torch.compile default, and max-autotune-no-cudagraphs
# Peers that can be asked for besides: torch.compile's CUDA-graph mode, the peer to compare
# with when the composed module replays a CUDA graph on a launch-bound model.
MORE_PEERS = ("reduce-overhead",)


class OptimizeError(FactError):
    """optimize cannot run: no GPU, a model that does not trace or run, an unsupported policy."""


@dataclass
class Variant:
    """One way of running the model, timed end to end in the optimizing process."""

    name: str
    ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    err: float | None = None          # against the float64 model, on the first input set
    peak_mib: float | None = None     # beyond what was allocated before the call, plus held_mib
    held_mib: float | None = None     # kept between calls beyond the model's parameters (fact-db's buffers, CUDA graph pools)
    compile_s: float | None = None    # first call (torch.compile's compile time)
    round_ms: list = field(default_factory=list)  # the median of each interleaved round (uncompiled variants)
    note: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class OptimizeReport:
    """What `optimize` did and measured; `report.py` renders it as markdown, JSON and a chart."""

    problem: str
    policy: str
    device: dict
    toolchain: dict
    regions: list                       # realize.Realized
    variants: list = field(default_factory=list)
    verification: object = None         # verify.ModelVerdict
    notes: list = field(default_factory=list)
    stages_s: dict = field(default_factory=dict)
    plan_only: bool = False
    llm_calls: int = 0

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def speedup(self) -> float | None:
        """fact-db over eager at the same policy, same process."""
        f, e = self.variant("fact-db"), self.variant(f"eager {self.policy}")
        return e.ms / f.ms if f and e and f.ms and e.ms else None

    def as_dict(self) -> dict:
        from fact_db.composition.report import report_dict
        return report_dict(self)


# ------------------------------------------------------------------------------------------

@contextmanager
def stage(name: str, report: OptimizeReport | None, progress: bool):
    t0 = time.perf_counter()
    if progress:
        print(f"[{name}] ...", file=sys.stderr, flush=True)
    yield
    dt = time.perf_counter() - t0
    if report is not None:
        report.stages_s[name] = round(dt, 3)
    if progress:
        print(f"[{name}] done in {dt:.1f} s", file=sys.stderr, flush=True)


def _device_of(module, inputs):
    import torch
    for p in list(module.parameters())[:1] + list(module.buffers())[:1]:
        return p.device
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _on_gpu(inputs) -> bool:
    import torch
    return torch.cuda.is_available() and any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


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


def at_policy(module, policy: str):
    """The model as `policy` runs it: a copy in bf16/fp16 for the half policies, else itself."""
    from fact_db.composition.compose import policy_dtype
    dt = policy_dtype(policy)
    return copy.deepcopy(module).to(dt) if dt is not None else module


def like_drawer(example_inputs, make_inputs=None):
    """draw(t) -> (inputs, dist): even trials drawn like the problem's inputs (`make_inputs()`,
    or the example inputs' own distribution: `rand` if all values are non-negative, else
    `randn`), odd trials zero-mean; a fresh seed every time. Integer inputs are kept."""
    import torch

    def fresh(x, dist):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        if dist == "like":
            f = torch.rand_like if bool((x >= 0).all()) else torch.randn_like
            return f(x)
        return torch.randn_like(x)

    def draw(t):
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1))
        dist = "like" if t % 2 == 0 else "randn"
        if dist == "like" and make_inputs is not None:
            dev = next((x.device for x in example_inputs if isinstance(x, torch.Tensor)), None)
            xs = [x.to(dev) if isinstance(x, torch.Tensor) and dev is not None else x for x in make_inputs()]
            return tuple(xs), dist
        return tuple(fresh(x, dist) for x in example_inputs), dist
    return draw


def _check_gpu(device) -> dict:
    import torch
    info = device_info(device)
    if info["gpu"] is None:
        raise OptimizeError("no CUDA GPU holds the model: optimize realizes and times kernels on an H100/H200; "
                            "move the model and its inputs to the GPU, or use fact_db.pipeline.plan() (`factdb "
                            "optimize` prints the plan on a machine without a GPU)")
    if info["capability"] != "9.0":
        raise OptimizeError(f"{info['name']} is sm_{info['capability'].replace('.', '')}: fact-db realizes sm90a "
                            "(H100, H200) kernels")
    del torch
    return info


def plan(module, example_inputs, *, policy: str = "fp32", registry=None, gpu: str = "h100", name: str | None = None,
         rules=None):
    """What optimize would do, without a GPU: discovery, then per region its workload, what
    the registry has for it (hit / near / stale / miss) and the roofline estimate. Returns
    an OptimizeReport with `plan_only` set; nothing is tuned or run. `rules`: the RuleSet to
    discover with (default: the shipped rules)."""
    from fact_db.discovery.discover import discover
    from fact_db.realization.realize import realize_regions
    if policy not in POLICIES:
        raise OptimizeError(f"unknown policy '{policy}': use one of {', '.join(POLICIES)}")
    report = OptimizeReport(name or type(module).__name__, policy, {"name": "none", "gpu": gpu, "capability": None},
                            toolchain_info(), [], plan_only=True)
    with stage("discover", report, False):
        disc = discover(module, example_inputs, arch="sm90", gpu=gpu, policy=policy, rules=rules)
    report.regions = realize_regions(disc, policy, registry=registry, gpu=gpu, plan_only=True, progress=False)
    report.notes.append(f"plan only: estimated eager time {disc.eager_s * 1e3:.3f} ms on {disc.gpu} (roofline floor)")
    report.discovery = disc
    return report


def optimize(module, example_inputs, *, policy: str = "fp32", registry=None, max_candidates: int = 24,
             budget: float | None = None, gpus: list[int] | None = None, out: str | Path | None = None,
             bench: bool = True, peers=PEERS, trials: int = 5, make_inputs=None, name: str | None = None,
             progress: bool = True, force: bool = False, save: bool = True, realizer=None, timer=None,
             cuda_graph: bool = True, rules=None, region_kernels=None, split_weights: bool = True):
    """Optimize `module` for `example_inputs` under `policy`; returns the composed module
    (an nn.Module called like `module`) with `.report` (OptimizeReport) and `.artifact`.

    `budget` is minutes of tuning; regions left when it is spent use what the registry has,
    else eager (the report lists them). `make_inputs()` draws fresh inputs like the
    problem's (default: like `example_inputs`). `realizer(discovery, policy)` and
    `timer(fn, input_sets) -> ms` replace GPU realization and timing (tests on CPU).
    `cuda_graph`: the composed module replays itself as a CUDA graph for the signature it was
    optimized for (one launch per call; checked bitwise against the graph run op by op on
    its first call, and off with a note if that fails). `rules`: the RuleSet to discover with
    (default: the shipped rules; `--llm` adds the rules the agent accepted).
    `region_kernels`: the agent's kernels the registry holds for regions no rule covers are
    composed in (realize.realize_region_kernels, no model call); False leaves them out, a
    callable `(row, spec) -> (Impl, note)` replaces their loader (tests on the CPU).
    `split_weights`: kernels that split B into hi and lo parts before the kernel (the fp32 and
    tf32x3 policies' `presplit`) get each weight's lo parts split once and held (one more copy
    of those weights, counted in the report's held memory); False splits them per call.
    """
    import torch

    from fact_db.composition.compose import ComposedModule, rewrite, run_at_policy, signature
    from fact_db.discovery.discover import discover
    from fact_db.realization.realize import realize_region_kernels, realize_regions
    from fact_db.kernels.verify import verify_model
    if policy not in POLICIES:
        raise OptimizeError(f"unknown policy '{policy}': use one of {', '.join(POLICIES)}")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    name = name or type(module).__name__
    device = _device_of(module, inputs)
    info = device_info(device) if realizer is not None else _check_gpu(device)
    report = OptimizeReport(name, policy, info, toolchain_info(), [])
    module.eval()
    model_p = at_policy(module, policy)
    from fact_db.composition.compose import cast_floats, policy_dtype
    inputs_p = cast_floats(inputs, policy_dtype(policy)) if policy_dtype(policy) else inputs

    with stage("discover", report, progress):
        disc = discover(model_p, inputs_p, arch="sm90", gpu=info["gpu"] or "h100", policy=policy, rules=rules)
    if disc.partial:
        raise OptimizeError(f"only part of {name} could be traced ({disc.note}); optimize needs the whole model")
    with stage("realize", report, progress):
        if realizer is not None:
            realized = realizer(disc, policy)
        else:
            realized = realize_regions(disc, policy, registry=registry, gpu=info["gpu"],
                                       max_candidates=max_candidates, gpus=gpus, force=force, progress=progress,
                                       budget_s=budget * 60 if budget is not None else None)
        added = []
        if region_kernels is not False:  # the agent's accepted kernels the registry holds; no model call
            added = realize_region_kernels(disc, realized, registry, gpu=info["gpu"] or "h100", rules=rules,
                                           loader=region_kernels or None)
        report.regions = realized
    with stage("compose", report, progress):
        derived: dict = {}  # the weights composition makes, shared with compositions for other shapes
        gm, notes = rewrite(disc.graph.program, disc.regions + [z.region for z in added],
                            {z.index: z.impl for z in realized}, split_weights=split_weights, derived=derived)
        report.notes += notes
        fast = ComposedModule(gm, model_p, policy=policy, optimized_for=signature(inputs), name=name,
                              regions=[(z.region.rule, z.impl) for z in realized],
                              variants=_variant_factory(model_p, policy, registry, realized, info, split_weights,
                                                        derived),
                              also_for=[signature(inputs_p)] if inputs_p is not inputs else [],
                              cuda_graph=cuda_graph, split_weights=split_weights)
    draw = like_drawer(inputs, make_inputs)
    with stage("verify", report, progress):
        ref_model = copy.deepcopy(module).to(torch.float64)
        verdict = verify_model(
            lambda *x: fast(*x), lambda *x: run_at_policy(model_p, policy, x), lambda *x: ref_model(*x), draw, policy,
            trials=trials, eager_tf32=(lambda *x: run_at_policy(module, "tf32", x)) if policy == "tf32x3" else None,
            out_dtype={"bf16": "bfloat16", "fp16": "float16"}.get(policy, "float32"))
        report.verification = verdict
        if getattr(fast, "graph_note", ""):
            report.notes.append(fast.graph_note)
        rounded = next((t.rounding for t in verdict.trials if t.rounding), "") if verdict.ok else ""
        if rounded:
            report.notes.append(rounded)
        if not verdict.ok:
            report.notes.append(f"end-to-end verification failed ({verdict.reason}): the returned module runs "
                                f"eager PyTorch under the {policy} policy")
            fast = ComposedModule(model_p, model_p, policy=policy, optimized_for=signature(inputs), name=name,
                                  regions=[], variants=None,
                                  also_for=[signature(inputs_p)] if inputs_p is not inputs else [])
    if verdict.ok and _on_gpu(inputs):
        if getattr(fast, "cuda_graph", False):
            report.notes.append(choose_graph(fast, policy, draw, timer))
        note = keep_faster_than_eager(fast, model_p, policy, draw, timer)
        if note:
            report.notes.append(note)
    if bench:
        with stage("benchmark", report, progress):
            report.variants = measure(module, model_p, fast, policy, draw, ref_model, peers=peers, timer=timer,
                                      progress=progress, composed_ok=verdict.ok)
            held = report.variant("fact-db")
            if held is not None and held.held_mib:
                report.notes.append(
                    f"fact-db's module holds {held.held_mib:.1f} MiB between calls beyond the model's parameters "
                    "(weights it concatenated or transposed" + (" or split into TF32 parts" if split_weights else "") +
                    (", its CUDA graph's pool" if held.held_mib > fast.held_mib(graphs=False) else "") +
                    "), counted in its peak memory")
    del ref_model
    fast.report = report
    fast.artifact = None
    if save:
        from fact_db.composition.artifact import default_dir, save as save_artifact
        with stage("save", report, progress):
            fast.artifact = save_artifact(Path(out) if out else default_dir(name, policy), fast, disc, report,
                                          module=model_p, example_inputs=inputs_p)
    return fast


def optimize_problem(spec: str, **kw):
    """`optimize` on a KernelBench-format file or import spec (what `factdb discover` takes):
    the model is built on the GPU with a fixed seed, and fresh inputs come from its
    `get_inputs()`."""
    import torch

    from fact_db.discovery.sandbox import time_limit
    from fact_db.discovery.trace import load_problem
    if not torch.cuda.is_available() and kw.get("realizer") is None:
        raise OptimizeError("no CUDA GPU is visible: use plan_problem() (`factdb optimize` prints the plan)")
    dev = torch.device("cuda") if kw.get("realizer") is None else torch.device("cpu")
    with time_limit(spec, kw.pop("build_timeout_s", None)):  # the file's code runs here: bounded in time
        problem = load_problem(spec)
        torch.manual_seed(0)
        with torch.device(dev):
            model = problem.make_model()
            inputs = problem.make_inputs()

    def make_inputs():
        with torch.device(dev):
            return problem.make_inputs()
    return optimize(model, inputs, make_inputs=make_inputs, name=kw.pop("name", None) or problem.name, **kw)


def plan_problem(spec: str, **kw):
    """`plan` on a problem file or spec: built and traced on the meta device."""
    from fact_db.discovery.trace import build_on_meta, load_problem
    problem = load_problem(spec)
    model, inputs, _ = build_on_meta(problem)
    return plan(model, inputs, name=kw.pop("name", None) or problem.name, **kw)


# ------------------------------------------------------------------------------------------
# Measuring the peers.

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
    no variant pays the cast), with its error against the float64 model and its peak memory.

    The variants that compile nothing (eager, fact-db) are timed in BENCH_ROUNDS interleaved
    rounds, so a GPU whose clocks drift under sustained load drifts for all of them alike; each
    one's time is the median of its rounds' medians, and `round_ms` keeps those for the spread.
    A compiled peer is timed right after its compile (the next compile resets dynamo's caches)."""
    import torch

    from fact_db.kernels.bench import peak_mib, time_cuda
    from fact_db.composition.compose import cast_floats, policy_dtype
    from fact_db.kernels.verify import _flat, rel_err
    sets = [draw(2 * i)[0] for i in range(3)]
    dt = policy_dtype(policy)
    sets_p = [cast_floats(s, dt) for s in sets] if dt else sets
    ref = _flat(ref_model(*[x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                            for x in sets[0]]))
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
            out_t = fn(*xs[0])
            back = _flat(cast_floats(out_t, torch.float64) if dt else out_t)
            v.err = rel_err(back, ref) if back.shape == ref.shape else None
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


# ------------------------------------------------------------------------------------------
# Other input shapes.

def _variant_factory(model_p, policy: str, registry, realized, info, split_weights: bool = True,
                     derived: dict | None = None):
    """variants(sig, args, kwargs) -> (module | None, why), for ComposedModule: the model
    composed again for the new input shapes from kernels the registry has for exactly those
    shapes (built already: nothing compiles during a call) and the library attention chosen
    before; everything else eager. `derived` is the first composition's (rewrite): a variant
    shares the weights it concatenated, transposed or split."""
    gpu = info.get("gpu")
    attention = {z.region.rule: z.impl for z in realized if z.impl.kind in ("sdpa", "attention")}

    def make(sig, args, kwargs):
        if registry is None or gpu is None or kwargs:
            return None, "no registry to look the new shapes up in"
        from fact_db.composition.compose import cast_floats, policy_dtype, rewrite
        from fact_db.discovery.discover import discover
        from fact_db.kernels.gemm.family import impl_of as gemm_impl
        from fact_db.realization.realize import plan
        from fact_db.kernels.gemm.tune import from_registry
        dt = policy_dtype(policy)
        xs = cast_floats(tuple(args), dt) if dt else tuple(args)
        disc = discover(model_p, xs, arch="sm90", gpu=gpu, policy=policy)
        impls, used = {}, 0
        for i, p in enumerate(plan(disc, policy)):
            if p.workload is not None and not p.region.composable:
                res = from_registry(p.workload, registry, gpu=gpu, cached_only=True)
                if res is not None and res.winner is not None:
                    impls[i] = gemm_impl(res, p.workload,
                                         library=not (p.region.template or "").startswith("dual_gemm"))
                    used += impls[i].kind != "eager"
            elif p.region.rule in attention and not p.region.composable:
                impls[i] = attention[p.region.rule]
                used += 1
        if not used:
            return None, "the registry has no built kernel for these shapes"
        gm, _ = rewrite(disc.graph.program, disc.regions, impls, split_weights=split_weights, derived=derived)
        return gm, f"{used} of {len(disc.regions)} regions from kernels the registry has for these shapes, the rest eager"
    return make
