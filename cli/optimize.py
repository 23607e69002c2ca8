"""`factdb optimize PROBLEM` (all three stages: a faster model, its artifact, its report) and
`factdb bench [PROBLEM...]` (optimize over the benchmark problems, results as JSON)."""
from __future__ import annotations

import math
import time
from datetime import date
from pathlib import Path

import click

from .common import cli, handle_errors, jdump, no_gpu, problem_sandbox
from .common import POLICIES, consult_rules, gpu_list, max_held_of, open_registry

PEERS = ("compile", "max-autotune")
MORE_PEERS = ("reduce-overhead",)  # torch.compile's CUDA-graph mode, asked for by name


def _peers(spec: str) -> tuple:
    if spec in ("", "none"):
        return ()
    out = tuple(p.strip() for p in spec.split(",") if p.strip())
    bad = [p for p in out if p not in PEERS + MORE_PEERS]
    if bad:
        raise click.BadParameter(f"unknown peer {', '.join(bad)}: use compile, max-autotune, reduce-overhead, "
                                 "a comma-separated list of them, or none", param_hint="--peers")
    return out


def _f(x, fmt="{:.3f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _plan_table(report) -> str:
    rows = [("#", "RULE", "PROBLEM", "REGISTRY", "WOULD", "EST GAIN")]
    for z in report.regions:
        r = z.region
        if z.how == "planned":
            would = "use the registry's kernel" if z.registry == "hit" else "tune"
        else:
            would = "eager: " + ("; ".join(n for n in z.notes if n) or "no kernel for this region yet")
        rows.append((str(z.index + 1), r.rule, r.shape, z.registry, would,
                     f"{max(r.estimate.gain_s, 0) * 1e3:.3f} ms"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _common(fn):
    for opt in reversed([
        click.option("--policy", type=click.Choice(POLICIES), default="fp32", show_default=True,
                     help="Precision policy for the whole model (DESIGN.md's table); baselines run at the same policy."),
        click.option("--max-candidates", type=click.IntRange(1, 512), default=12, show_default=True,
                     help="Candidates per region, eager included."),
        click.option("--budget", type=click.FloatRange(0, None), default=None,
                     help="Minutes of tuning; regions left after it use the registry or stay eager (listed)."),
        click.option("--gpus", default=None, help="GPUs that verify and time candidates: all, or 0,1 (default: current)."),
        click.option("--peers", default="compile,max-autotune", show_default=True,
                     help="torch.compile variants timed beside fact-db, and (compile, max-autotune) candidates for "
                          "what optimize returns: compile, max-autotune, reduce-overhead, a list, or none."),
        click.option("--max-held", default="eager", show_default=True,
                     help="Most memory the returned module may hold between calls: eager (eager's per-call "
                          "peak), a number of MiB, or none."),
        click.option("--strict-allclose", is_flag=True,
                     help="Every candidate must pass KernelBench's allclose against eager on each trial, as "
                          "KernelBench's check does: an output closer to float64 than eager's is not exempted."),
        click.option("--no-bench", is_flag=True, help="Verify but do not time the variants end to end."),
        click.option("--no-cuda-graph", is_flag=True,
                     help="No CUDA graph among the candidates: eager and the composed graph run op by op."),
        click.option("--no-split-weights", is_flag=True,
                     help="Split weights into their TF32 parts per call instead of holding the parts "
                          "(fp32/tf32x3 presplit kernels): less memory held, slower calls."),
        click.option("--force", is_flag=True, help="Tune again even where the registry has a kernel."),
        click.option("--db", default=None, help="Registry URL (default: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb)."),
        click.option("--no-registry", is_flag=True, help="Neither read nor write the registry."),
    ]):
        fn = opt(fn)
    return fn


@cli.command()
@click.argument("problem")
@_common
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Artifact directory (default: $FACTDB_HOME/artifacts/<problem>-<policy>-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--llm", "use_llm", is_flag=True, help="Ask the configured language model about regions no rule fuses (see README, The agent).")
@click.option("--offline", is_flag=True, help="Never open a socket for the language model.")
@click.option("--eval", "eval_mode", is_flag=True,
              help="Optimize the model in eval mode (inference: BatchNorm folds into the convolution before it, "
                   "dropout off); a problem file builds it in training mode.")
@handle_errors
@problem_sandbox(when=no_gpu)  # the plan builds the model here; with a GPU it is built on it, in this process
def optimize(problem, policy, max_candidates, budget, gpus, peers, max_held, strict_allclose, no_bench, no_cuda_graph,
             no_split_weights, force, db, no_registry, out, as_json, use_llm, offline, eval_mode):
    """Discover, realize and compose PROBLEM into a faster model; verify it end to end,
    time it against eager PyTorch and torch.compile, save it as an artifact and report.

    PROBLEM is anything `factdb discover` takes; its file is Python that runs. With a GPU the
    model is built in this process (on the GPU); without one, optimize stops after discovery
    and the registry lookup and prints the plan (which regions have a registry row, which
    would be tuned), building the model in a child process under a memory and a time limit
    ($FACTDB_PROBLEM_MAX_MEMORY MiB, default 8192; $FACTDB_PROBLEM_TIMEOUT s, default 300).
    Load the result with `fact_db.load(DIR)`: nothing is tuned again.

    What it returns is the fastest verified of eager, torch.compile of the model, the composed
    module and the composed module under torch.compile (the compile modes --peers names),
    holding no more memory between calls than --max-held; the report says which won and why.

    \b
    Example:
      factdb optimize benchmarks/problems/mingpt_block.py --policy fp32 --out out/mingpt-fp32
      factdb optimize benchmarks/problems/llama_block.py --policy bf16 --budget 5 --peers compile
      factdb optimize benchmarks/problems/hf_llama_decoder_4x2048.py --policy bf16 --max-held none
      factdb optimize my_resnet.py --policy fp32 --eval
    """
    import torch

    from fact_db.pipeline import optimize_problem, plan_problem
    from fact_db.composition.report import markdown, report_dict
    held = max_held_of(max_held)
    reg = open_registry(db, not no_registry)
    try:
        rules = consult_rules(problem, policy, offline, as_json, reg) if use_llm else None
        if not torch.cuda.is_available():
            report = plan_problem(problem, policy=policy, registry=reg, rules=rules, eval_mode=eval_mode)
            if as_json:
                click.echo(jdump(report_dict(report), indent=1))
                return
            click.echo(f"{report.problem}: no CUDA GPU here, so this is the plan (nothing tuned or run), "
                       f"policy {policy}")
            click.echo(_plan_table(report))
            for n in report.notes:
                click.echo(f"note: {n}")
            return
        fast = optimize_problem(problem, policy=policy, registry=reg, max_candidates=max_candidates, budget=budget,
                                gpus=gpu_list(gpus), out=out, bench=not no_bench, peers=_peers(peers), force=force,
                                progress=not as_json, cuda_graph=not no_cuda_graph, rules=rules,
                                split_weights=not no_split_weights, max_held=held, eval_mode=eval_mode,
                                strict_allclose=strict_allclose)
    finally:
        if reg is not None:
            reg.close()
    report = fast.report
    if as_json:
        click.echo(jdump({**report_dict(report), "artifact": str(fast.artifact)}, indent=1))
    else:
        click.echo(markdown(report))
        click.echo(f"artifact: {fast.artifact}  (load it with fact_db.load('{fast.artifact}'))")
    if report.fallback:
        raise click.ClickException(f"{report.fallback}; the artifact runs eager PyTorch")
    if report.verification is not None and not report.verification.ok:
        raise click.ClickException(f"end-to-end verification failed: {report.verification.reason}; the artifact "
                                   "runs eager PyTorch")


def bench_row(problem: str, fast, wall_s: float) -> dict:
    """One row of the e2e results: the GEMM results' fields plus compile_ms, max_autotune_ms,
    peak_mib and eager_peak_mib (fact-db's peak_mib counts held_mib in: the memory its module
    keeps between calls, its buffers and CUDA graph pool); per variant its time, error, peak
    and held memory and compile time (`variants`); what optimize returned and every
    candidate it chose among (`returned`, `choice`)."""
    from fact_db.composition.report import clean, speedups
    r = fast.report
    v = {x.name: x for x in r.variants}
    fdb, base, fp32 = v.get("fact-db"), v.get(f"eager {r.policy}") or v.get("eager fp32"), v.get("eager fp32")
    comp, mat = v.get("torch.compile"), v.get("torch.compile max-autotune-no-cudagraphs")
    ro, nograph = v.get("torch.compile reduce-overhead"), v.get("fact-db, no CUDA graph")
    ver = r.verification
    kernels = [z for z in r.regions if z.impl.kernel]
    return clean({
        "problem": problem, "policy": r.policy, "factdb_ms": fdb.ms if fdb else None,
        "baseline": base.name if base else None, "baseline_ms": base.ms if base else None,
        "speedup": speedups(r)["vs_eager_policy"], "vs_fp32": speedups(r)["vs_eager_fp32"],
        "eager_fp32_ms": fp32.ms if fp32 else None,
        "rel_err": ver.err if ver else None, "baseline_rel_err": ver.eager_err if ver else None,
        "verified": bool(ver and ver.ok), "verify_reason": ver.reason if ver else "",
        "reference": ver.reference if ver else None, "fallback": r.fallback or None,
        "compile_ms": comp.ms if comp else None, "compile_s": comp.compile_s if comp else None,
        "max_autotune_ms": mat.ms if mat else None, "max_autotune_compile_s": mat.compile_s if mat else None,
        "vs_compile": speedups(r)["vs_compile"], "vs_max_autotune": speedups(r)["vs_max_autotune"],
        "reduce_overhead_ms": ro.ms if ro else None, "no_cuda_graph_ms": nograph.ms if nograph else None,
        "cuda_graph": bool(nograph) and not getattr(fast, "graph_note", ""),
        "peak_mib": fdb.peak_mib if fdb else None, "eager_peak_mib": base.peak_mib if base else None,
        "held_mib": fdb.held_mib if fdb else None, "split_weights": bool(getattr(fast, "split_weights", True)),
        "regions": len(r.regions), "kernels": len(kernels),
        "from_registry": sum(1 for z in r.regions if z.how == "registry"),
        "region_rows": [{"rule": z.region.rule, "shape": z.region.shape, "runs": z.impl.label, "how": z.how,
                         "eager_ms": z.eager_ms, "ms": z.ms} for z in r.regions],
        "stages_s": r.stages_s, "wall_s": wall_s, "notes": r.notes, "artifact": str(fast.artifact),
        "variants": [x.as_dict() for x in r.variants],
        "returned": getattr(fast, "choice", None),
        "choice": r.choice.as_dict() if getattr(r, "choice", None) is not None else None,
    })


@cli.command()
@click.argument("problems", nargs=-1)
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES),
              help="Policies to run (repeatable; default: fp32 and bf16; with --kernelbench, fp32).")
@click.option("--max-candidates", type=click.IntRange(1, 512), default=12, show_default=True)
@click.option("--budget", type=click.FloatRange(0, None), default=None, help="Minutes of tuning per problem.")
@click.option("--gpus", default=None, help="GPUs for verification and timing: all, or 0,1.")
@click.option("--peers", default="compile,max-autotune", show_default=True, help="torch.compile variants to time.")
@click.option("--max-held", default="eager", show_default=True,
              help="Most memory a returned module may hold between calls: eager, none, or MiB.")
@click.option("--strict-allclose", is_flag=True,
              help="KernelBench's allclose against eager with no exemption for every candidate (see optimize).")
@click.option("--no-cuda-graph", is_flag=True, help="No CUDA graph among the candidates (op by op only).")
@click.option("--no-split-weights", is_flag=True, help="Split weights into their TF32 parts per call, not once.")
@click.option("--db", default=None, help="Registry URL.")
@click.option("--out", "--results", "results", type=click.Path(dir_okay=False), default=None,
              help="Results file (default: benchmarks/results/<gpu>-<date>-e2e.json in the source tree; with "
                   "--kernelbench, <gpu or cpu>-<date>-kernelbench-<policies>.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the results JSON too.")
@click.option("--kernelbench", type=click.Path(exists=True, file_okay=False), default=None,
              help="A clone of ScalingIntelligence/KernelBench: run its problems as they are (the scoreboard).")
@click.option("--level", default=None, help="--kernelbench: levels to run, comma-separated (default 1,2,3); with "
              "--problems, the part of that selection in these levels.")
@click.option("--problems", "problem_list", default=None,
              help="--kernelbench: problems (L1-19, 19_ReLU, level1/19_ReLU.py), comma-separated, or a file of "
                   "them such as benchmarks/kernelbench_gpu_set.txt (default: every problem of the levels).")
@click.option("--budget-per-problem", type=click.FloatRange(1, None), default=None,
              help="--kernelbench: seconds a problem may take in all, its child stopped after them (default 300); "
                   "half of it for tuning.")
@click.option("--max-memory", type=click.IntRange(256, None), default=None,
              help="--kernelbench: MiB of resident memory a problem's processes may use together (default 32768).")
@click.option("--resume", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--kernelbench: a scoreboard JSON written before; its problems are skipped, new rows added to it "
                   "(with a larger --budget-per-problem, the rows a smaller budget stopped run again).")
@handle_errors
def bench(problems, policies, max_candidates, budget, gpus, peers, max_held, strict_allclose, no_cuda_graph,
          no_split_weights, db, results, as_json, kernelbench, level, problem_list, budget_per_problem, max_memory,
          resume):
    """Run `optimize` over benchmark problems (default: every file in benchmarks/problems/)
    under each policy, and write one results JSON: a row per problem and policy with
    fact-db, eager, torch.compile and max-autotune times, errors and peak memory, plus the
    device, date and commit. A problem that fails is a row with its error; the rest go on.

    With --kernelbench DIR, the KernelBench scoreboard: DIR's problems as they are, each in
    its own process under --budget-per-problem and --max-memory; per problem whether
    fact-db's module passes KernelBench's own check, and eager, torch.compile and fact-db
    times; per level KernelBench's fast_p (p = 0, 1, 1.5, 2) against eager and torch.compile.
    One line per problem as it ends; --resume FILE goes on where an earlier run stopped.
    Without a GPU it runs each problem's plan and says it cannot time anything.

    \b
    Example:
      factdb bench benchmarks/problems/mingpt_block.py --policy fp32 --policy bf16
      factdb bench --policy bf16 --peers compile --results /tmp/e2e.json
      factdb bench --kernelbench ~/KernelBench --problems benchmarks/kernelbench_gpu_set.txt --policy fp32
      factdb bench --kernelbench ~/KernelBench --level 1 --resume benchmarks/results/h100-2026-12-01-kernelbench-fp32.json
      factdb bench --kernelbench ~/KernelBench --problems L3-9,L3-20 --max-held none   # CUDA graphs past eager's peak
      factdb bench --kernelbench ~/KernelBench --level 2 --policy bf16 --strict-allclose
    """
    if kernelbench:
        if problems:
            raise click.UsageError("give problem files or --kernelbench DIR (with --problems), not both")
        from fact_db.pipeline import scoreboard as sb
        from . import scoreboard
        max_held_of(max_held)  # a bad bound is answered here, before any child runs
        scoreboard.run(kernelbench, level, problem_list, policies, budget_per_problem or sb.DEFAULT_BUDGET_S,
                       max_memory or sb.DEFAULT_MEMORY_MB, max_candidates, gpus, db, results, resume, as_json,
                       budget_given=budget_per_problem is not None, max_held=max_held, strict=strict_allclose)
        return
    if level or problem_list or budget_per_problem or max_memory or resume:
        raise click.UsageError("--level, --problems, --budget-per-problem, --max-memory and --resume go with "
                               "--kernelbench DIR")
    from fact_db.core.paths import problem_file
    for p in problems:  # a mistyped path is answered before torch is imported
        problem_file(p)
    import torch

    from fact_db.core import paths
    from fact_db.core.environment import device_info, toolchain_info
    from fact_db.pipeline import optimize_problem
    held = max_held_of(max_held)
    if not torch.cuda.is_available():
        raise click.ClickException("no CUDA GPU is visible: `factdb bench` times models on an H100/H200; "
                                   "`factdb optimize PROBLEM` prints the plan without one")
    probs = list(problems) or sorted(str(p) for p in (paths.ROOT / "benchmarks" / "problems").glob("*.py"))
    pols = list(policies) or ["fp32", "bf16"]
    info = device_info(torch.device("cuda"))
    out = Path(results) if results else paths.ROOT / "benchmarks" / "results" / \
        f"{info['gpu']}-{date.today().isoformat()}-e2e.json"
    import sys
    sys.path.insert(0, str(paths.ROOT / "benchmarks"))
    from _provenance import commit
    rows = []
    doc = {"device": info["name"], "gpu": info["gpu"], "date": date.today().isoformat(), "commit": commit(),
           "toolchain": toolchain_info(), "max_candidates": max_candidates, "budget_min": budget,
           **({"allclose": "strict"} if strict_allclose else {}), "results": rows}

    def write():  # after every row, atomically: a run cut short keeps the rows it finished
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(jdump(doc, indent=1))
        tmp.replace(out)

    reg = open_registry(db, True)
    try:
        for prob in probs:
            for pol in pols:
                t0 = time.perf_counter()
                click.echo(f"== {prob} {pol}", err=True)
                try:
                    fast = optimize_problem(prob, policy=pol, registry=reg, max_candidates=max_candidates,
                                            budget=budget, gpus=gpu_list(gpus), peers=_peers(peers),
                                            cuda_graph=not no_cuda_graph, split_weights=not no_split_weights,
                                            max_held=held, strict_allclose=strict_allclose)
                    rows.append(bench_row(Path(prob).stem, fast, time.perf_counter() - t0))
                    r = rows[-1]
                    click.echo(f"   fact-db {_f(r['factdb_ms'])} ms ({r['returned']}), {_f(r['speedup'], '{:.2f}')}x "
                               f"over {r['baseline']}, verified {r['verified']}", err=True)
                except Exception as e:  # noqa: BLE001  (one failing problem must not lose the others' rows)
                    rows.append({"problem": Path(prob).stem, "policy": pol, "error": f"{type(e).__name__}: {e}",
                                 "wall_s": time.perf_counter() - t0})
                    click.echo(f"   failed: {type(e).__name__}: {e}", err=True)
                    torch.cuda.empty_cache()
                write()
    finally:
        if reg is not None:
            reg.close()
    write()
    click.echo(f"wrote {out}")
    if as_json:
        click.echo(jdump(doc, indent=1))
