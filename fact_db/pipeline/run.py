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

import dataclasses
import os
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from fact_db.core.environment import device_info, toolchain_info
from fact_db.core.errors import first_line
from fact_db.core.policy import POLICIES
from fact_db.kernels.pool import close_shared
from fact_db.pipeline.choice import choose
from fact_db.pipeline.measure import PEERS, measure
from fact_db.pipeline.results import OptimizeError, OptimizeReport
from fact_db.pipeline.variants import variant_factory


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


def at_policy(module, policy: str, *, build=None, example_inputs=None, notes: list | None = None):
    """The model as `policy` runs it: for the half policies a copy in bf16/fp16 built the way
    its problem builds it (`build()`, else a deep copy; recast.py), with plain tensor
    attributes converted and closures over the copy's submodules, whose forward also converts
    what it draws or reads from outside the model where `example_inputs` show it does
    (dtype_modes.policy_forward); else `module` itself. What was done goes to `notes`."""
    from fact_db.composition.module import cast_floats, policy_dtype
    from fact_db.pipeline.dtype_modes import policy_forward
    from fact_db.pipeline.recast import recast
    dt = policy_dtype(policy)
    if dt is None:
        return module
    made = recast(module, dt, build=build)
    said = list(made.notes)
    if example_inputs is not None:
        cast = policy_forward(made.model, dt, cast_floats(tuple(example_inputs), dt))
        if cast:
            said.append(f"forward makes or reads tensors outside the model in another dtype ({'; '.join(cast[:3])}): "
                        f"the {policy} model converts them to {str(dt).replace('torch.', '')} as it runs")
    if notes is not None:
        notes += said
    return made.model


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
             cuda_graph: bool = True, rules=None, region_kernels=None, split_weights: bool = True,
             max_held="eager", build=None, strict_allclose: bool = False):
    """Optimize `module` for `example_inputs` under `policy`; returns the fastest verified way
    to run it (pipeline/choice.py: eager, torch.compile of the model, the composed module, or
    the composed module under torch.compile; compiled candidates where `peers` include
    compile / max-autotune), as a ComposedModule called like `module`, with `.report`
    (OptimizeReport; `report.choice` says what won and what each candidate measured) and
    `.artifact`.

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
    `max_held`: the most memory the returned module may hold between calls, in MiB: "eager"
    (default) for eager's own per-call peak, a number, or None for no bound. Where weights' lo
    parts split once put the composed module over it, it is composed again with them split per
    call, verified, and timed in its place (choice.within_bound).
    `strict_allclose`: every candidate (the composed module, torch.compile, ...) must pass
    KernelBench's allclose against eager on each trial drawn like the problem's inputs, with no
    exemption for an output closer to float64 than eager's (kernels/verify.py: verify_model),
    as KernelBench's own check judges; off, such an output passes (more accurate than eager).
    `build(device)`: a fresh model built as the problem builds it (optimize_problem passes
    one), from which the float64 reference and the half-policy model are made; without it
    they are deep copies (reference.py, recast.py).

    Anything that fails after discovery (out of memory included) ends with eager PyTorch at
    the policy returned, run once to check it, and the reason in `report.fallback`.
    """
    from fact_db.composition.compose import rewrite
    from fact_db.composition.module import ComposedModule, signature
    from fact_db.discovery.discover import discover
    from fact_db.pipeline.fallback import eager_module, fall_back
    from fact_db.pipeline.narrowing import narrow_composition
    from fact_db.pipeline.state import ModelState, StateError
    from fact_db.pipeline.verification import verify_end_to_end
    from fact_db.realization.realize import realize_region_kernels, realize_regions
    if policy not in POLICIES:
        raise OptimizeError(f"unknown policy '{policy}': use one of {', '.join(POLICIES)}")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    name = name or type(module).__name__
    device = _device_of(module, inputs)
    info = device_info(device) if realizer is not None else _check_gpu(device)
    report = OptimizeReport(name, policy, info, toolchain_info(), [])
    from fact_db.discovery.trace import mode_dependent
    moded = mode_dependent(module) if module.training else ""
    if moded:
        report.notes.append(f"{name} is in training mode: its {moded} run as in training (batch "
                            "statistics, dropout draws) and are optimized as such; call model.eval() first (`--eval` "
                            "on the command line) to optimize inference (then BatchNorm folds into the convolutions)")
    state = ModelState(module)  # the user's model is left as it was given, whatever forward changes
    try:
        model_p = at_policy(module, policy, build=(lambda: build(device)) if build else None, example_inputs=inputs,
                            notes=report.notes)
    except Exception as e:  # noqa: BLE001  (before any tuning: the model at the policy is what everything runs)
        raise OptimizeError(f"making the {policy} copy of {name} failed ({first_line(e, 200, typed=True)}); free "
                            "memory, or optimize under a float32 policy, which needs no copy") from e
    from fact_db.composition.module import cast_floats, policy_dtype
    inputs_p = cast_floats(inputs, policy_dtype(policy)) if policy_dtype(policy) else inputs

    with stage("discover", report, progress):
        disc = discover(model_p, inputs_p, arch="sm90", gpu=info["gpu"] or "h100", policy=policy, rules=rules)
    if disc.partial:
        raise OptimizeError(f"only part of {name} could be traced ({disc.note}); optimize needs the whole model")
    draw, ref_model, where = like_drawer(inputs, make_inputs), None, "realize"
    try:
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
            # The tuning workers go now: each keeps what its jobs left in its GPU memory (inputs,
            # float64 references, the allocator's cache: tens of GiB for KernelBench L1-63's
            # convolution), which the float64 model, placed on the CPU where it needs more than
            # half of what is free, then does not find (L1-63: verification took 329 s, where its
            # float64 convolution takes 0.05 s on the GPU). A later optimize starts them again.
            close_shared()
        where = "compose"

        def compose(impls: dict, split: bool = split_weights):  # the model with these regions' impls in
            derived: dict = {}  # the weights composition makes, shared with compositions for other shapes
            gm, notes = rewrite(disc.graph.program, disc.regions + [z.region for z in added], impls,
                                split_weights=split, derived=derived)
            ran = [dataclasses.replace(z, impl=impls[z.index]) for z in realized]
            return ComposedModule(gm, model_p, policy=policy, optimized_for=signature(inputs), name=name,
                                  regions=[(z.region.rule, z.impl) for z in ran],
                                  variants=variant_factory(model_p, policy, registry, ran, info, split, derived),
                                  also_for=[signature(inputs_p)] if inputs_p is not inputs else [],
                                  cuda_graph=cuda_graph, split_weights=split), notes
        with stage("compose", report, progress):
            fast, notes = compose({z.index: z.impl for z in realized})
            report.notes += notes
        where = "verify"
        with stage("verify", report, progress):
            verdict, ref_model, notes = verify_end_to_end(module, model_p, fast, policy, draw, inputs, trials=trials,
                                                          build=build, graph=disc.graph, strict=strict_allclose)

            def check(m, candidate=None):  # against the composed module's reference: narrowing's modules,
                return verify_end_to_end(module, model_p, m, policy, draw, inputs, trials=trials, build=build,
                                         graph=disc.graph, ref=ref_model, candidate=candidate,
                                         strict=strict_allclose)[0]

            def verify(fn):  # and each candidate of the choice (beside the module returned, narrowed or not)
                return check(fast, fn)
            report.verification = verdict
            report.notes += notes
            if not verdict.ok and "not verifiable" not in verdict.reason:
                narrowed, note = narrow_composition(realized, compose, check)
                if note:
                    report.notes.append(note)
                if narrowed is not None:
                    fast, verdict = narrowed
                    report.verification = verdict
            if getattr(fast, "graph_note", ""):
                report.notes.append(fast.graph_note)
            rounded = next((t.rounding for t in verdict.trials if t.rounding), "") if verdict.ok else ""
            if rounded:
                report.notes.append(rounded)
            if not verdict.ok:
                report.notes.append(f"end-to-end verification failed ({verdict.reason}): the composed module is "
                                    f"not returned; eager PyTorch under the {policy} policy, or torch.compile of it, is")
                fast = eager_module(model_p, policy, inputs, inputs_p, name)

        def lean():  # what the module verified is, each weight split per call (choice.within_bound)
            m, _ = compose({z.index: dataclasses.replace(z.impl) for z in realized}, split=False)
            return m, check(m)
        where = "choose"
        with stage("choose", report, progress):
            report.choice = choose(fast, model_p, policy, draw, verify, peers=peers, timer=timer, max_held=max_held,
                                   composed_ok=verdict.ok, lean=lean if split_weights else None)
            report.notes.append(report.choice.note)
            if report.choice.lean is not None:
                fast, verdict = report.choice.lean
                report.verification = verdict
        where = "benchmark"
        if bench:
            with stage("benchmark", report, progress):
                report.variants = measure(module, model_p, fast, policy, draw, ref_model, peers=peers, timer=timer,
                                          progress=progress, composed_ok=verdict.ok, choice=report.choice)
                held = report.variant("fact-db")
                if held is not None and held.held_mib:
                    report.notes.append(
                        f"fact-db's module holds {held.held_mib:.1f} MiB between calls beyond the model's parameters "
                        "(weights it concatenated or transposed"
                        + (" or split into TF32 parts" if fast.split_weights else "")
                        + (", its CUDA graph's pool" if held.held_mib > fast.held_mib(graphs=False) else "")
                        + "), counted in its peak memory")
    except Exception as e:  # noqa: BLE001  (whatever failed, out of memory included: eager, with the reason)
        ref_model = None
        # The traceback holds the failed stage's frames, and with them its locals (the choose
        # stage's input sets: tens of GiB on a large model): cleared, or falling back and
        # timing run out of memory again (KernelBench L1-45 did).
        traceback.clear_frames(e.__traceback__)
        if report.choice is not None:
            report.choice.release()
        fast = fall_back(model_p, policy, inputs, inputs_p, name, report, e, where, draw)
        if bench and where != "benchmark":
            # What was returned is still timed against its peers, so a user (and the scoreboard)
            # sees eager's and torch.compile's times whatever stage stopped.
            try:
                with stage("benchmark", report, progress):
                    report.variants = measure(module, model_p, fast, policy, draw, None, peers=peers, timer=timer,
                                              progress=progress, composed_ok=False, fell_back=report.fallback)
            except Exception as e2:  # noqa: BLE001  (the module returned stays eager; the report says why untimed)
                report.variants = []
                report.notes.append(f"the eager module returned was not timed: {first_line(e2, 200, typed=True)}")
    if report.choice is not None:
        report.choice.release()
    del ref_model
    try:
        state.restore()
    except StateError as e:
        report.notes.append(f"{e}: the model is left as its runs left it")
    fast.report = report
    fast.artifact = None
    if save:
        from fact_db.composition.artifact import default_dir, save as save_artifact
        with stage("save", report, progress):
            fast.artifact = save_artifact(Path(out) if out else default_dir(name, policy), fast, disc, report,
                                          module=model_p, example_inputs=inputs_p)
    return fast


def optimize_problem(spec: str, *, eval_mode: bool = False, **kw):
    """`optimize` on a KernelBench-format file or import spec (what `factdb discover` takes):
    the model is built on the GPU with a fixed seed, and fresh inputs come from its
    `get_inputs()`; the float64 reference and a half policy's model are built again the same
    way (`Model(*get_init_inputs())`, so closures made in `__init__` close over their own
    submodules), with the model's tensors copied in. `eval_mode`: each built model is put in
    eval mode (see load_problem)."""
    import torch

    from fact_db.discovery.sandbox import time_limit
    from fact_db.discovery.trace import load_problem
    if not torch.cuda.is_available() and kw.get("realizer") is None:
        raise OptimizeError("no CUDA GPU is visible: use plan_problem() (`factdb optimize` prints the plan)")
    dev = torch.device("cuda") if kw.get("realizer") is None else torch.device("cpu")
    timeout = kw.pop("build_timeout_s", None)
    with time_limit(spec, timeout):  # the file's code runs here: bounded in time
        problem = load_problem(spec, eval_mode=eval_mode)
        torch.manual_seed(0)
        with torch.device(dev):
            model = problem.make_model()
            inputs = problem.make_inputs()

    def make_inputs():
        with torch.device(dev):
            return problem.make_inputs()

    def build(device):
        with time_limit(spec, timeout), torch.device(device):
            return problem.make_model()
    return optimize(model, inputs, make_inputs=make_inputs, build=build, name=kw.pop("name", None) or problem.name,
                    **kw)


def plan_problem(spec: str, *, eval_mode: bool = False, **kw):
    """`plan` on a problem file or spec: built and traced on the meta device (in eval mode
    with `eval_mode`)."""
    from fact_db.discovery.trace import build_on_meta, load_problem
    problem = load_problem(spec, eval_mode=eval_mode)
    model, inputs, _ = build_on_meta(problem)
    return plan(model, inputs, name=kw.pop("name", None) or problem.name, **kw)
