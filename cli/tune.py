"""`factdb tune` (one GEMM workload) and `factdb realize PROBLEM` (stages 1 and 2 on a model)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import click

from .common import (
    DTYPES,
    POLICIES,
    arch_choice,
    build_arch,
    cli,
    consult_rules,
    gpu_list,
    handle_errors,
    jdump,
    no_gpu,
    open_registry,
    problem_sandbox,
)

EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh", "bias_silu", "residual")


def _ms(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _print_result(r, out=click.echo) -> None:
    w = r.workload
    out(f"{w.rule}  {w.shape}  {w.dtype}  A {w.layout_a}, B {w.layout_b}  epilogue {w.epilogue}  policy {w.policy}"
        f"  ({r.arch}, {r.gpu})")
    rows = [("#", "CANDIDATE", "TEMPLATE", "STATUS", "MS", "REL ERR", "PREDICTED MS")]
    for i, t in enumerate(r.trials, 1):
        rows.append((str(i), t.candidate.label, t.candidate.template, t.status, _ms(t.time_ms),
                     "-" if t.err is None or t.err != t.err else f"{t.err:.2e}", _ms(t.candidate.predicted_ms)))
    if len(rows) > 1:
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        for row in rows:
            out("  ".join(v.ljust(widths[c]) for c, v in enumerate(row)).rstrip())
    for t in r.trials:
        if t.status not in ("ok", "skipped", "built", "cached") and t.error:
            out(f"  {t.candidate.label}: {t.status}: {t.error.splitlines()[0][:200]}")
    built = [t for t in r.trials if t.status in ("built", "cached", "compile_error")]
    if built:  # --compile-only: what was built, found in the cache, or failed, and where
        counts = {s: sum(t.status == s for t in built) for s in ("built", "cached", "compile_error")}
        out(f"build summary: {counts['built']} built, {counts['cached']} cached, {counts['compile_error']} failed")
        for t in built:
            where = t.so or (t.error.splitlines()[-1] if t.error else "")
            out(f"  {t.status:13} {t.candidate.label}: {where}")
    if r.winner:
        sp = r.speedup
        out(f"winner: {r.winner.candidate.label} ({r.winner.candidate.template}) {_ms(r.winner.time_ms)} ms"
            + (f", {sp:.2f}x over {r.eager.candidate.label} ({_ms(r.eager.time_ms)} ms)" if sp else ""))
    for n in r.notes:
        out(f"note: {n}")
    if r.compile_s or r.bench_s:
        out(f"compile {r.compile_s:.1f} s, verify+time {r.bench_s:.1f} s")


_common = [
    click.option("--max-candidates", type=click.IntRange(1, 256), default=24, show_default=True,
                 help="Candidates to verify and time, the eager implementation included."),
    click.option("--gpus", default=None, help="'all' or device indices (0,1): one worker per GPU."),
    click.option("--compile-only", is_flag=True, help="Render and build the candidates; no GPU needed, nothing timed."),
    click.option("--force", is_flag=True, help="Tune even if the registry has a current row for this key."),
    click.option("--no-registry", is_flag=True, help="Neither read nor write the registry."),
    click.option("--db", envvar="FACTDB_DB", default=None, help="Registry URL (default $FACTDB_HOME/fact.duckdb)."),
    click.option("--jobs", type=int, default=None, help="Parallel nvcc processes (default: one per core)."),
    click.option("--json", "as_json", is_flag=True, help="Print JSON."),
]


def common(fn):
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


@cli.command()
@click.option("--op", type=click.Choice(["gemm", "attention"]), default="gemm", show_default=True,
              help="Operation family.")
@click.option("--shape", required=True, help="gemm: MxNxK or MxNxKxB (B: batch); attention: BxHxLQxLKxD "
              "(batch, query heads, query and key lengths, head dim).")
@click.option("--kv-heads", type=click.IntRange(1), default=None, help="attention: KV heads (default: the query heads; "
              "fewer is grouped-query attention).")
@click.option("--causal", is_flag=True, help="attention: top-left causal mask (SDPA's is_causal).")
@click.option("--scale", type=float, default=None, help="attention: softmax scale (default 1/sqrt(D)).")
@click.option("--policy", type=click.Choice(POLICIES), default="fp32", show_default=True,
              help="Precision policy (DESIGN.md): what the kernel may do to your numbers.")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Operand dtype; must match the policy (default: the policy's).")
@click.option("--epilogue", type=click.Choice(EPILOGUES), default="none", show_default=True)
@click.option("--layout-a", type=click.Choice(["row", "col"]), default="row", show_default=True)
@click.option("--layout-b", type=click.Choice(["row", "col"]), default="row", show_default=True,
              help="col: B is held as N x K (a Linear weight).")
@click.option("--bias-axis", type=click.Choice(["col", "row"]), default="col", show_default=True)
@click.option("--arch", type=arch_choice(), default="sm90a", show_default=True,
              help="Architecture to build for (sm90 and sm90a both build sm90a).")
@common
@handle_errors
def tune(op, shape, kv_heads, causal, scale, policy, dtype, epilogue, layout_a, layout_b, bias_axis, arch,
         max_candidates, gpus, compile_only, force, no_registry, db, jobs, as_json):
    """Tune one GEMM workload: candidates from the rule's space, built, verified, timed.

    The eager PyTorch implementation at the same policy is always a candidate, so the
    winner is never slower than what you had. The registry is asked first; the winner and
    every trial are written back.

    \b
    Example:
      factdb tune --shape 4096x4096x4096 --policy tf32x3
      factdb tune --shape 65536x3072x768 --policy bf16 --epilogue bias_gelu_tanh --layout-b col
      factdb tune --shape 4096x4096x4096 --policy bf16 --compile-only --json
      factdb tune --op attention --shape 128x8x512x512x96 --causal --policy bf16
    """
    if op == "attention":
        return _tune_attention(shape, kv_heads, causal, scale, policy, dtype, build_arch(arch), max_candidates,
                               gpus, compile_only, force, no_registry, db, jobs, as_json)
    from fact_db.kernels.gemm.tune import tune as run_tune
    from fact_db.kernels.gemm.workload import GemmWorkload, parse_shape
    m, n, k, b = parse_shape(shape)
    arch = build_arch(arch)
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    w = GemmWorkload(m, n, k, b, policy=policy, layout_a=layout_a, layout_b=layout_b, epilogue=epilogue,
                     bias_axis=bias_axis, dtype=dtype or "")
    reg = open_registry(db, not no_registry)
    try:
        r = run_tune(w, arch=arch, registry=reg, max_candidates=max_candidates, gpus=gpu_list(gpus), jobs=jobs,
                     compile_only=compile_only, force=force, progress=not as_json)
    finally:
        if reg is not None:
            reg.close()
    if as_json:
        click.echo(jdump(r.as_dict(), indent=1, default=str))
    else:
        _print_result(r)


def _tune_attention(shape, kv_heads, causal, scale, policy, dtype, arch, max_candidates, gpus, compile_only, force,
                    no_registry, db, jobs, as_json):
    """`factdb tune --op attention`: fact_db/kernels/attention/tune.py on one workload."""
    from fact_db.kernels.attention import tune as attention_tune
    from fact_db.kernels.attention.workload import AttentionWorkload
    parts = shape.lower().split("x")
    if len(parts) != 5 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(f"'{shape}' is not BxHxLQxLKxD with positive integers (e.g. 128x8x512x512x64)",
                                 param_hint="--shape")
    b, h, lq, lk, d = (int(p) for p in parts)
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    w = AttentionWorkload(b, h, kv_heads or h, lq, lk, d, d, causal=causal, scale=scale, policy=policy,
                          dtype=dtype or "")
    if compile_only:
        cands, notes = attention_tune.candidates(w, arch, max_candidates)
        failed = attention_tune.build_all(cands, jobs=jobs, progress=not as_json)
        rows = [{"label": c.label, "kind": c.kind, "so": c.so} for c in cands if c.kind == "kernel"]
        doc = {"workload": w.as_dict(), "built": rows, "failed": [f.label + ": " + f.error for f in failed],
               "notes": notes}
        click.echo(jdump(doc, indent=1, default=str) if as_json else
                   "\n".join([f"{w.shape}  {w.dtype}  policy {w.policy}"] +
                              [f"  built {r['label']}" + ("" if r["so"] else " (failed)") for r in rows] +
                              [f"  note: {n}" for n in notes]))
        return
    reg = open_registry(db, not no_registry)
    try:
        r = attention_tune.tune(w, arch=arch, registry=reg, max_candidates=max_candidates, gpus=gpu_list(gpus),
                                jobs=jobs, force=force, progress=not as_json)
    finally:
        if reg is not None:
            reg.close()
    if as_json:
        click.echo(jdump(r.as_dict(), indent=1, default=str))
        return
    click.echo(f"attention {w.shape}  {w.dtype}  policy {w.policy}")
    for t in sorted(r.trials, key=lambda t: (t.time_ms is None, t.time_ms or 0)):
        mark = "*" if r.best is not None and t is r.best else " "
        click.echo(f" {mark} {t.label:32s} {t.status:14s} {_ms(t.time_ms):>9s} ms  err {t.err if t.err is not None else '-'}"
                   + (f"  {t.error[:100]}" if t.error else ""))
    for n in r.notes:
        click.echo(f"  note: {n}")


@cli.command()
@click.argument("problem")
@click.option("--policy", type=click.Choice(POLICIES), default="fp32", show_default=True)
@click.option("--llm", "use_llm", is_flag=True, help="Ask the configured language model about regions no rule fuses (see README, The agent).")
@click.option("--offline", is_flag=True, help="Never open a socket for the language model.")
@common
@handle_errors
@problem_sandbox(when=no_gpu, gpu_unless="compile_only",  # without a GPU the model is built only to discover it
                 gpu_why="`factdb realize` verifies and times candidates on an H100/H200; --compile-only builds "
                         "them without one")
def realize(problem, policy, max_candidates, gpus, compile_only, force, no_registry, db, jobs, as_json, use_llm, offline):
    """Discover PROBLEM's regions and tune every GEMM-family one (stages 1 and 2).

    PROBLEM is a KernelBench-format file or module, as for `factdb discover`. Regions of
    other families (attention, norms) are listed with a note.

    \b
    Example:
      factdb realize benchmarks/problems/mingpt_block.py --policy bf16
      factdb realize benchmarks/problems/square_gemm_fp32.py --policy tf32x3 --compile-only
    """
    from fact_db.realization.realize import realize_problem


    def show(p, r):  # each region as soon as it is done: a model's regions take minutes each
        click.echo(f"== {p.region.rule} {p.region.shape}")
        if r is None:
            click.echo(f"  skipped: {p.note}")
            return
        if p.same_as is not None:  # a repeat of an earlier region's workload: its table is above
            win = r.winner
            click.echo(f"  {p.note}" + (f"; winner {win.candidate.label} {_ms(win.time_ms)} ms" if win else ""))
            return
        if p.note:
            click.echo(f"  {p.note}")
        _print_result(r, out=lambda s: click.echo("  " + s))

    reg = open_registry(db, not no_registry)
    try:
        rules = consult_rules(problem, policy, offline, as_json, reg) if use_llm else None
        report, results = realize_problem(problem, policy=policy, registry=reg, max_candidates=max_candidates,
                                          gpus=gpu_list(gpus), jobs=jobs, compile_only=compile_only, force=force,
                                          progress=not as_json, on_result=None if as_json else show, rules=rules)
    finally:
        if reg is not None:
            reg.close()
    if as_json:
        click.echo(jdump({"problem": problem, "policy": policy, "regions": [
            {"rule": p.region.rule, "shape": p.region.shape, "note": p.note,
             "tune": r.as_dict() if r else None} for p, r in results]}, indent=1, default=str))
