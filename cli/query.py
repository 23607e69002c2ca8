"""`factdb query`: hybrid search over rules, CUTLASS examples and kernels, or a structured registry lookup."""
from __future__ import annotations

import json

import click

from .common import POLICIES, cli, handle_errors, jdump


def _ms(v) -> str:
    return "-" if v is None else f"{v:.4g} ms"


@cli.command()
@click.argument("text", required=False)
@click.option("--kind", type=click.Choice(["rule", "example", "kernel"]), help="Only this kind of document.")
@click.option("--arch", help="Only documents for this architecture (sm80, sm90a, sm100, hopper, ...); "
                             "documents with no arch tag (utilities, tutorials) are kept.")
@click.option("--dtype", help="Only documents with this data type (f16, bf16, tf32, f32, fp8, fp4, int8, ...).")
@click.option("--op", help="Only documents for this rule id (gemm-bias-relu) or rule family (gemm_epilogue); "
                           "with --shape, the rules to look up.")
@click.option("--shape", help="MxNxK[xB]: look the kernel up in the registry (exact, else the nearest shape); needs --op.")
@click.option("--gpu", help="With --shape: only kernels tuned on this GPU (h100, a100, ...).")
@click.option("--policy", type=click.Choice(POLICIES),
              help="With --shape: only kernels tuned under this precision policy.")
@click.option("-n", "n", type=click.IntRange(min=1), default=10, show_default=True, help="How many results.")
@click.option("--mode", type=click.Choice(["hybrid", "lexical", "vector"]), default="hybrid", show_default=True,
              help="Ranking: BM25 and embeddings fused, or one of them alone.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--db", "db_url", envvar="FACTDB_DB", metavar="URL",
              help="Registry database (default $FACTDB_DB, else $FACTDB_HOME/fact.duckdb).")
@handle_errors
def query(text, kind, arch, dtype, op, shape, gpu, policy, n, mode, as_json, db_url):
    """Search rules, vetted CUTLASS examples and tuned kernels, or look a kernel up.

    With TEXT: a hybrid search (BM25 and embedding rankings fused) with optional filters;
    each result says why it ranked. The index builds itself on first use. Without the
    embedding model the search is lexical, with a warning.

    With --op and --shape (no TEXT): a structured registry lookup: the exact key, else the
    nearest compatible shape with its distance; stale kernels are flagged.

    \b
    Example:
      factdb query "hopper fp8 gemm with blockwise scaling"
      factdb query "fused epilogue" --arch sm80 --kind example -n 5
      factdb query --op gemm --shape 4096x4096x4096 --arch sm90
    """
    if shape:
        if text:
            raise click.UsageError("give either TEXT (a search) or --op with --shape (a registry lookup), not both")
        if not op:
            raise click.UsageError("a registry lookup needs --op (a rule id such as gemm, or a family) with --shape")
        if kind not in (None, "kernel"):
            raise click.UsageError(f"--shape looks kernels up in the registry; --kind {kind} does not apply")
        _lookup(op, shape, arch, gpu, dtype, policy, n, as_json, db_url)
        return
    if gpu or policy:
        raise click.UsageError("--gpu and --policy apply to a registry lookup (with --op and --shape); "
                               "to filter a search use --arch and --dtype")
    if not text:
        raise click.UsageError('give TEXT to search for (e.g. factdb query "split-k gemm"), '
                               "or --op and --shape to look a kernel up")
    from fact_db.store import index
    if not index.search_path(index.store_path(db_url)).exists():
        click.echo("building the index on first use (rules, CUTLASS examples, registry kernels)...", err=True)
    res = index.search(text, kind=kind, arch=arch, dtype=dtype, op=op, n=n, url=db_url, mode=mode)
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(jdump(res.as_dict(), indent=2, default=str))
        return
    if not res.hits:
        shown = ", ".join(f"{k} {v}" for k, v in res.filters.items())
        click.echo(f"no results for {text!r}" + (f" with {shown}" if shown else ""))
        return
    if res.weak:
        click.echo(f"nothing matches {text!r} well (no similarity of {index.RELEVANCE_FLOOR} or more): "
                   "the nearest documents follow")
    for i, h in enumerate(res.hits, 1):
        tags = " ".join(h.archs) or "any arch"
        click.echo(f"{i:2}. [{h.kind}] {h.id}  ({tags})")
        if h.meta.get("path") and h.kind != "kernel":
            click.echo(f"    {h.meta['path']}")
        if h.kind == "kernel":
            m = h.meta
            more = (f" (fastest of {h.group} kernels with this description)" if h.group > 1 and kind != "kernel"
                    else f" ({h.group} kernels with this description)" if h.group > 1 else "")
            speed = f", {m['speedup']:.2f}x vs baseline" if m.get("speedup") else ""
            click.echo(f"    {m['rule']} {m['shape']} {m['dtype_in']}->{m['dtype_out']} policy {m['policy']} "
                       f"epilogue {m['epilogue']}: {_ms(m.get('time_ms'))} on {m.get('device_name') or m['gpu']}"
                       f"{speed}; {m['status']}{more}")
        else:
            click.echo(f"    {h.title}")
        click.echo(f"    why: {h.why}")
    click.echo(f"{len(res.hits)} results, {res.mode} ranking, {res.seconds * 1e3:.0f} ms", err=True)


def _lookup(op, shape, arch, gpu, dtype, policy, n, as_json, db_url):
    from fact_db.store import index
    matches = index.lookup(op, shape, arch=arch, gpu=gpu, dtype=dtype, policy=policy, n=n, url=db_url)
    if as_json:
        click.echo(jdump({"mode": "lookup", "op": op, "shape": shape,
                               "filters": {k: v for k, v in (("arch", arch), ("gpu", gpu), ("dtype", dtype),
                                                             ("policy", policy)) if v},
                               "results": [m.as_dict() for m in matches]}, indent=2, default=str))
        return
    if not matches:
        click.echo(f"no kernel in the registry for {op} {shape}"
                   + "".join(f" {k} {v}" for k, v in (("arch", arch), ("gpu", gpu), ("dtype", dtype),
                                                      ("policy", policy)) if v)
                   + "; `factdb tune` builds one")
        return
    for i, m in enumerate(matches, 1):
        r = m.record
        how = "exact" if m.exact else f"nearest (distance {m.distance:.2f})"
        speed = f", {r['speedup']:.2f}x vs {r.get('baseline') or 'baseline'}" if r.get("speedup") else ""
        click.echo(f"{i:2}. {how}: {r['digest']} {r['rule']} {r['shape']} on {r['gpu']} ({r['arch']}) "
                   f"{r['dtype_in']}->{r['dtype_out']} policy {r['policy']} epilogue {r['epilogue']}")
        click.echo(f"    {_ms(r.get('time_ms'))} on {r.get('device_name') or r['gpu']}{speed}; template {r['template']}")
        if m.stale:
            click.echo(f"    STALE: {m.stale_reason}")
