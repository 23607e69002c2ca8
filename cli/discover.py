"""`factdb discover PROBLEM`: what fact-db would build for a model, and why."""
from __future__ import annotations

import json
import time

import click

from .common import POLICIES, arch_choice, cli, handle_errors, jdump, model_arch, problem_sandbox

# The choices are spelled out here so that `factdb --help` and commands other than
# discover do not import torch (fact_db.discovery.roofline does); a test checks they match.
GPUS = ("a100", "h100", "h200")
SHARE_FLOOR_TEXT = "5%"  # fact_db.discovery.discover.SHARE_FLOOR, spelled out for the same reason


def _t(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _table(report) -> str:
    rows = [("#", "RULE", "PROBLEM", "DTYPE", "EST FUSED", "EST EAGER", "GAIN", "SHARE", "BOUND", "REGISTRY", "SOURCE")]
    for i, r in enumerate(report.regions, 1):
        e = r.estimate
        fused = _t(r.measured_s) + " (measured)" if r.measured_s else _t(e.fused_s)
        rows.append((str(i), r.rule, r.shape, ",".join(r.dtypes), fused, _t(e.eager_s), _t(max(e.gain_s, 0.0)),
                     (f"{r.share * 100:.0f}%" if r.share >= 0.01 else f"{r.share * 100:.1f}%"), e.bound, r.registry, r.source or ""))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _pct(share) -> str:
    if share is None:
        return "?"
    return f"{share * 100:.0f}%" if share >= 0.01 else f"{share * 100:.1f}%"


UNCOVERED_ROWS = 12  # rows of the uncovered table without --explain; --json lists every one


def _print_uncovered(report, explain: bool):
    """What no region covers: a table of the ops, largest share first (every one with
    --explain), why each kind stays eager, and the rest of the estimate in one line."""
    unc, rest = report.uncovered, getattr(report, "rest", None) or {}
    if unc:
        known = sum(u.share or 0.0 for u in unc)
        click.echo(f"uncovered: {len(unc)} op{'s' if len(unc) != 1 else ''} no region covers, {_pct(known)} of the "
                   f"estimate (heavy ops, and any op of {SHARE_FLOOR_TEXT} of it or more)")
        shown = unc if explain else unc[:UNCOVERED_ROWS]
        rows = [("SHARE", "EST EAGER", "OP", "NODE", "SOURCE")]
        rows += [(_pct(u.share), _t(u.est_s) if u.est_s is not None else "?", u.op, u.node, u.source or "")
                 for u in shown]
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for r in rows:
            click.echo("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        more = unc[len(shown):]
        if more:
            ops: dict = {}
            for u in more:
                ops[u.op] = ops.get(u.op, 0) + 1
            click.echo(f"  ... {len(more)} more ({', '.join(f'{n} {op}' for op, n in ops.items())}), "
                       f"{_pct(sum(u.share or 0.0 for u in more))} in all; --explain or --json lists them")
        reasons: dict = {}
        for u in unc:
            reasons.setdefault((u.op, u.reason), []).append(u.node)
        for (op, why), nodes in reasons.items():
            who = f"`{nodes[0]}`" if len(nodes) == 1 else f"{len(nodes)} nodes"
            click.echo(f"  why {op} ({who}): {why}")
    if rest.get("ops"):
        click.echo(f"rest: {rest['ops']} other op{'s' if rest['ops'] != 1 else ''} no region covers (elementwise, "
                   "reductions, copies), "
                   f"{_pct(rest['share'])} of the estimate ({_t(rest['est_s'])})")


def _print(report, explain: bool):
    head = (f"{report.problem}: {report.n_ops} ops, {len(report.regions)} regions on {report.gpu} ({report.arch}), "
            f"policy {report.policy}; whole model est. eager {_t(report.eager_s)}")
    click.echo(head + (" [PARTIAL]" if report.partial else ""))
    if report.regions:
        click.echo(_table(report))
    else:
        click.echo("no region matched any rule")
    reg = getattr(report, "registry_note", "") or "not asked"
    click.echo(f"registry: {reg}; EST columns are roofline floors unless marked measured; "
               f"trace {report.trace_s:.2f} s, match {report.match_s:.3f} s")
    for r in report.regions:
        for a in r.assumptions:
            click.echo(f"note: {r.rule} at {r.output}: {a}")
    _print_uncovered(report, explain)
    if report.note:
        click.echo(f"note: {report.note}")
    if explain:
        click.echo("")
        click.echo("explain:")
        for r in report.regions:
            line = f"  {r.rule}: matched at `{r.output}` as {r.form or 'its single form'} over {len(r.nodes)} nodes"
            if r.subsumes:
                line += f"; won over {', '.join(r.subsumes)} (larger fusion)"
            if r.composable:
                line += f"; stays eager PyTorch: {r.composable}"
            click.echo(line)
        for rid, miss in sorted(report.misses.items()):
            where = f" nearest candidate `{miss.node.name}`" + (f" ({miss.node.source})" if miss.node.source else "") + ":" if miss.node is not None else ""
            click.echo(f"  {rid}: no match;{where} {miss.reason}")


@cli.command()
@click.argument("problem")
@click.option("--arch", type=arch_choice(), default="sm90", show_default=True,
              help="Target architecture (sm90 and sm90a are the same here).")
@click.option("--gpu", type=click.Choice(GPUS), help="GPU for the roofline (default: h100 for sm90, a100 for sm80).")
@click.option("--policy", type=click.Choice(POLICIES), default="fp32", show_default=True,
              help="Precision policy the kernels may use (see DESIGN.md); eager is estimated at the same policy.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--explain", is_flag=True, help="Say, for every rule that matched nowhere, the nearest candidate and why it missed.")
@click.option("--db", default=None, help="Registry to ask (default: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb if it exists).")
@click.option("--no-registry", is_flag=True, help="Do not ask the registry.")
@click.option("--max-memory", type=click.IntRange(256, None), default=None,
              help="MiB the problem's code may allocate (default 8192, or $FACTDB_PROBLEM_MAX_MEMORY).")
@click.option("--timeout", type=click.FloatRange(1, None), default=None,
              help="Seconds building and tracing may take (default 300, or $FACTDB_PROBLEM_TIMEOUT).")
@click.option("--eval", "eval_mode", is_flag=True,
              help="Trace the model in eval mode (inference: BatchNorm folds into the convolution before it, "
                   "dropout off); a problem file builds it in training mode.")
@handle_errors
@problem_sandbox()
def discover(problem, arch, gpu, policy, as_json, explain, db, no_registry, max_memory, timeout, eval_mode):
    """Trace PROBLEM, match the rules and rank the regions worth building.

    PROBLEM is a KernelBench-format file (Model, get_inputs, get_init_inputs), a module
    `package.module` in that format, or `package.module:factory` where factory() returns
    (module, example_inputs). The model is built and traced on the meta device: nothing
    runs at full size and no GPU is needed.

    A problem file is Python that runs: building the model executes its code. It runs in a
    child process under a memory limit and a time limit (--max-memory, --timeout); a file
    that allocates, loops or exits is stopped and named, with how it ended.

    \b
    Example:
      factdb discover benchmarks/problems/mingpt_block.py --policy tf32 --explain
      factdb discover my_resnet.py --eval
    """
    _discover(problem, model_arch(arch), gpu, policy, as_json, explain, db, no_registry, eval_mode)


def _ask(report, db, no_registry) -> None:
    """The REGISTRY column: asked of the registry at --db/$FACTDB_DB, or of
    $FACTDB_HOME/fact.duckdb where one exists (discovery never creates one)."""
    import os

    from fact_db.core import paths
    from fact_db.discovery import sandbox
    report.registry_note = "not asked (--no-registry)"
    if no_registry:
        return
    url = db or os.environ.get("FACTDB_DB")
    if url is None and not paths.registry_file().exists():  # the default registry, without importing SQLAlchemy
        report.registry_note = f"none yet at {paths.registry_file()} (every region a miss)"
        return
    with sandbox.trusted_imports():
        from fact_db.realization.realize import ask_registry
        from fact_db.store.registry import Registry
        reg = Registry.open(url, seed=False)
    try:
        counts = ask_registry(report, reg)
    finally:
        reg.close()
    report.registry_note = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" in {reg.where}" \
        if counts else f"no region to ask about in {reg.where}"


def _discover(problem, arch, gpu, policy, as_json, explain, db, no_registry, eval_mode=False):
    from fact_db.discovery import sandbox
    sandbox.allow_quick_exit()  # nothing is left open at the end: the child may skip the interpreter's teardown
    with sandbox.trusted_imports():
        from fact_db.discovery.discover import analyse
        from fact_db.core.errors import TraceError
        from fact_db.discovery.rules import load_rules
        from fact_db.discovery.trace import load_problem, trace_problem
        if sandbox.in_child():
            import torch.export._trace  # noqa: F401  (torch._dynamo, which the first export would import)
        rules = load_rules()
    spec = load_problem(problem, eval_mode=eval_mode)
    t0 = time.perf_counter()
    try:
        graph = trace_problem(spec)
    except TraceError as e:
        if e.partial is None:
            raise
        report = analyse(e.partial, rules, arch=arch, gpu=gpu, policy=policy, trace_s=time.perf_counter() - t0)
        if as_json:
            d = report.as_dict()
            d["error"] = str(e)
            click.echo(jdump(d, indent=2))
        else:
            _print(report, explain)
        raise click.ClickException(str(e)) from None
    report = analyse(graph, rules, arch=arch, gpu=gpu, policy=policy, trace_s=time.perf_counter() - t0)
    _ask(report, db, no_registry)
    if as_json:
        d = report.as_dict()
        d["registry"] = report.registry_note
        click.echo(jdump(d, indent=2, default=str))
    else:
        _print(report, explain)
