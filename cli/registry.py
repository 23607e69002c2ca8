"""`factdb registry ...`: list, show, export, import, revalidate, gc, sync and status of the kernel registry."""
from __future__ import annotations

import json
import sys

import click

from .common import cli, handle_errors, jdump

_db_option = click.option(
    "--db", "db_url", envvar="FACTDB_DB", metavar="URL",
    help="Registry database: a SQLAlchemy URL or a DuckDB file path (default $FACTDB_DB, "
         "else $FACTDB_HOME/fact.duckdb).")
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _filters(f):
    for name, help_ in reversed((("family", "Only this family: gemm, attention, norm, region."),
                                 ("rule", "Only this rule id, e.g. gemm-bias-gelu-tanh (for norm rows: rmsnorm)."),
                                 ("arch", "Only this arch, e.g. sm90a."),
                                 ("gpu", "Only this GPU, e.g. h100 (full device names are accepted)."),
                                 ("policy", "Only this precision policy: fp32, tf32x3, tf32, bf16, fp16."),
                                 ("status", "Only rows with this status: verified, stale, failed."))):
        f = click.option(f"--{name}", help=help_)(f)
    return f


def _open(db_url):
    from fact_db.store.registry import Registry
    return Registry.open(db_url)


def _fmt_ms(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _safe(text) -> str:
    """Text from imported rows with control characters escaped (an ESC sequence from someone
    else's registry must not drive the terminal)."""
    text = str(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@cli.group()
def registry():
    """List, inspect, move and clean the registry of tuned kernels.

    Each row is keyed by its family (gemm, attention, norm, region) and the family's key
    fields (for a GEMM: rule, arch, GPU, dtypes, layouts, shape, epilogue, policy), and records
    its config, timings, status and the environment it was measured in (GPU SKU, driver,
    CUDA runtime, torch, cuBLAS, cuDNN, CUTLASS, nvcc): a row from another environment is stale.

    \b
    Example:
      factdb registry list --gpu h100 --status verified
      factdb registry show 75a8f287
      factdb registry export kernels.jsonl --family gemm
    """


@registry.command("list")
@_filters
@click.option("--llm", "llm", is_flag=True,
              help="Only the agent's region kernels (provenance llm): the same as --family region.")
@_db_option
@_json_option
@handle_errors
def list_(family, rule, arch, gpu, policy, status, llm, db_url, as_json):
    """List the rows of every family, or of one: digest, family, key, GPU, policy, time, status.

    Statuses are as last written or revalidated; `factdb registry show` says whether a row is
    usable here now. Region kernels are the ones the language model wrote for regions no rule
    covers, each verified and faster than eager when stored.

    \b
    Example:
      factdb registry list --family gemm --policy tf32 --json
      factdb registry list --llm --gpu h100
    """
    if llm:
        if rule:
            raise click.UsageError("--rule does not apply to --llm: region kernels have no rule (use --policy, "
                                   "--arch, --gpu or --status)")
        if family not in (None, "region"):
            raise click.UsageError(f"--llm lists region kernels; it does not combine with --family {family}")
        family = "region"
    with _open(db_url) as reg:
        recs = list(reg.rows(family, rule=rule, arch=arch, gpu=gpu, policy=policy, status=status))
        where = reg.where
    if as_json:   # a region kernel's source is long: `show` prints it
        click.echo(jdump([{k: v for k, v in r.as_dict().items() if k != "source"} for r in recs], indent=2))
        return
    if recs:
        w = max(len(r.key.summary) for r in recs)
        click.echo(f"{'DIGEST':16}  {'FAMILY':9} {'KEY':{w}}  {'GPU':6} {'POLICY':6} {'TIME_MS':>9} {'SPEEDUP':>7}  "
                   "STATUS")
        for r in recs:
            sp = f"{r.speedup:.2f}x" if r.speedup else "-"
            click.echo(_safe(f"{r.digest:16}  {r.family:9} {r.key.summary:{w}}  {r.key.gpu:6} {r.key.policy:6} "
                             f"{_fmt_ms(r.time_ms):>9} {sp:>7}  {r.status}"))
    what = "region kernels (provenance llm)" if llm else "kernels"
    click.echo(f"{len(recs)} {what} in {where}", err=True)


def _resolve(reg, digest: str) -> str:
    from fact_db.store.registry import RegistryError
    found = reg.find_digest(digest) if len(digest) >= 4 else []
    if digest in found:
        found = [digest]
    if len(found) != 1:
        what = "no kernel" if not found else f"{len(found)} kernels ({', '.join(found[:5])})"
        raise RegistryError(f"{what} with a digest starting {digest!r} in {reg.where}; run `factdb registry list` "
                            "and pass a full digest (or a unique prefix of 4+ characters)")
    return found[0]


@registry.command()
@click.argument("digest")
@_db_option
@_json_option
@handle_errors
def show(digest, db_url, as_json):
    """Show one row: its key, its environment key, whether it is usable here (and if not, why),
    and every trial recorded for its key.

    DIGEST is the key digest from `factdb registry list`; a unique prefix (4+ characters) is
    enough. "Usable here" judges the row against this machine's environment and the templates
    in kernels_cpp/ now (without a GPU here, only CUTLASS and nvcc are compared).

    \b
    Example:
      factdb registry show 75a8f287
    """
    from fact_db.core.environment import FIELDS, LABELS
    from fact_db.store.registry import Current
    with _open(db_url) as reg:
        d = _resolve(reg, digest)
        rec = reg.get(d)
        trials = reg.trials(d)
    cur = Current()
    why = cur.staleness(rec)
    now_hash = cur.template_hash(rec.template)
    if as_json:
        click.echo(jdump({"kernel": rec.as_dict(), "key": rec.key.as_dict(), "environment": rec.env.as_dict(),
                          "usable": not why, "stale_reason": why, "template_hash_now": now_hash,
                          "environment_here": cur.env.as_dict(), "trials": [t.as_dict() for t in trials]}, indent=2))
        return
    line = lambda name, value, pad=18: click.echo(_safe(f"{name + ':':{pad}} {value}"))
    line("digest", rec.digest)
    line("family", rec.family)
    click.echo("key:")
    for name, value in rec.key.as_dict().items():
        line("  " + name, json.dumps(value) if isinstance(value, bool) else value)
    click.echo("environment:")
    for f in FIELDS:
        line("  " + LABELS[f], getattr(rec.env, f) or "?")
    line("template", f"{rec.template or '-'} (hash {rec.template_hash or '?'}"
                     + (f", now {now_hash or 'none'})" if rec.template_hash != now_hash else ", current)"))
    line("usable here", ("yes" if not why else f"no, stale: {why}")
         + ("" if cur.env.has_gpu else " (no GPU here: only CUTLASS and nvcc were compared)"))
    skip = {"digest", "family", "template", "template_hash", "source", *rec.key.FIELDS, *FIELDS}
    for name, value in rec.as_dict().items():
        if name in skip:
            continue
        if name == "config":
            value = json.dumps(value, sort_keys=True)
        if value not in ("", None):
            line(name, value)
    click.echo(f"trials: {len(trials)}")
    for t in trials:
        click.echo(_safe(f"  {t.created_at[:19]}  {t.status:13} {_fmt_ms(t.time_ms):>9} ms  {t.config_hash}  "
                         f"{json.dumps(t.config, sort_keys=True)}" + (f"  {t.error.splitlines()[0]}" if t.error else "")))
    if rec.source:
        click.echo("source:")
        for src_line in rec.source.splitlines():
            click.echo("  " + _safe(src_line))


@registry.command()
@click.argument("file", default="-")
@_filters
@_db_option
@handle_errors
def export(file, family, rule, arch, gpu, policy, status, db_url):
    """Write rows as JSON lines (FILE, or - for stdout), sorted by digest.

    The output is what `factdb registry import` and the seed file index/kernels.jsonl read.

    \b
    Example:
      factdb registry export h100.jsonl --gpu h100 --status verified
    """
    with _open(db_url) as reg:
        n = reg.export_jsonl(sys.stdout if file == "-" else file, family=family, rule=rule, arch=arch, gpu=gpu,
                             policy=policy, status=status)
    click.echo(f"exported {n} kernels" + ("" if file == "-" else f" to {file}"), err=True)


@registry.command("import")
@click.argument("file")
@_db_option
@_json_option
@handle_errors
def import_(file, db_url, as_json):
    """Merge rows from a JSONL file (or - for stdin), all or nothing.

    Rows merge by key: a verified row is never replaced by an unverified one; among verified
    rows measured in the same environment the faster wins; a row verified in this environment
    replaces one from another. Any malformed line aborts the import with every bad line
    listed, and nothing is applied. A file exported before the environment key (no `family`
    field) imports its rows as stale: tune them again to replace them.

    \b
    Example:
      factdb registry import h100.jsonl --json
    """
    from fact_db.store.registry import ImportError_
    try:
        with _open(db_url) as reg:
            rep = reg.import_jsonl(sys.stdin if file == "-" else file)
    except ImportError_ as e:
        for line, why in e.problems:
            click.echo(f"{e.path}:{line}: {why}", err=True)
        raise
    if rep.carried:
        click.echo(f"{rep.path}: {rep.carried} rows were exported before the environment key (no driver, CUDA, "
                   "torch, cuBLAS or cuDNN recorded): imported as stale; tune them again to replace them", err=True)
    if as_json:
        click.echo(jdump(rep.as_dict(), indent=2))
    else:
        click.echo(f"{rep.path}: {rep.inserted} inserted, {rep.replaced} replaced, {rep.kept} kept")


@registry.command()
@_db_option
@_json_option
@click.option("--dry-run", is_flag=True, help="Only report what would change.")
@handle_errors
def revalidate(db_url, as_json, dry_run):
    """Mark rows stale whose environment (GPU SKU, driver, CUDA runtime, torch, cuBLAS, cuDNN,
    CUTLASS, nvcc) or template hash differs from this machine's now.

    Without a GPU here only CUTLASS and nvcc are compared. A stale row whose environment
    matches again is restored to verified (not a row carried over from before the environment
    key: its environment is unknown). Stale rows are never used by lookups; re-tune them with
    `factdb tune`.

    \b
    Example:
      factdb registry revalidate --dry-run
    """
    with _open(db_url) as reg:
        changes = reg.revalidate(dry_run=dry_run)
    if as_json:
        click.echo(jdump([c.as_dict() for c in changes], indent=2))
        return
    for c in changes:
        click.echo(_safe(f"{c.digest}  {c.rule} {c.shape}: {c.old_status} -> {c.new_status} ({c.reason})"))
    click.echo(f"{len(changes)} {'would change' if dry_run else 'changed'}", err=True)


@registry.command()
@click.option("--older-than", "days", type=float, default=30.0, show_default=True, metavar="DAYS",
              help="Only rows and trials older than this many days.")
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
@_db_option
@_json_option
@handle_errors
def gc(days, dry_run, db_url, as_json):
    """Delete failed and stale rows, and trials whose key has no row, older than DAYS.

    \b
    Example:
      factdb registry gc --older-than 90 --dry-run
    """
    with _open(db_url) as reg:
        rep = reg.gc(days, dry_run=dry_run)
    if as_json:
        click.echo(jdump(rep.as_dict(), indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(rep.kernels)} kernel rows and {rep.trials} orphan trials")


@registry.command()
@_db_option
@_json_option
@handle_errors
def sync(db_url, as_json):
    """Team registry: push the rows and trials this host's cache kept while the server was away,
    then pull every row other hosts added or changed into the cache.

    Pushed rows merge by key on the server and trials it already has are skipped, so a sync
    repeated (or cut short and run again) stores nothing twice. Needs the server.

    \b
    Example:
      FACTDB_DB=postgresql+psycopg://factdb@db.lab/factdb factdb registry sync
    """
    with _open(db_url) as reg:
        rep = reg.sync()
        where = reg.where
    if as_json:
        click.echo(jdump(rep.as_dict(), indent=2))
        return
    click.echo(f"{where}: pushed {rep.pushed} kernels and {rep.pushed_trials} trials; pulled {rep.pulled} kernels, "
               f"removed {rep.removed}" + (f"; {rep.pending} still waiting" if rep.pending else ""))


@registry.command()
@_db_option
@_json_option
@handle_errors
def status(db_url, as_json):
    """Where the registry is and whether it answers: for a team registry the server (its
    password masked), the local cache, the rows waiting there for the server, and the
    workloads hosts are tuning now (their leases).

    \b
    Example:
      factdb registry status --json
    """
    with _open(db_url) as reg:
        st = reg.status()
    if as_json:
        click.echo(jdump(st, indent=2))
        return
    if st["kind"] != "team":
        click.echo(f"registry: {st['where']} ({st['kind']}, schema {st['schema_version']}), {st['kernels']} kernels")
    else:
        state = "reachable" if st["reachable"] else f"UNREACHABLE ({st['error']})"
        click.echo(f"server:  {st['server']}  {state}" + (f", {st['server_kernels']} kernels, schema "
                                                          f"{st['schema_version']}" if st["reachable"] else ""))
        click.echo(f"cache:   {st['cache']}  {st['cache_kernels']} kernels; waiting for the server: "
                   f"{st['pending_kernels']} kernels, {st['pending_trials']} trials")
    if "share_binaries" in st:
        n = st["shared_binaries"]
        click.echo(f"kernels: {'?' if n is None else n} built kernel(s) shared on the server; this host "
                   + ("loads and shares them (FACTDB_SHARE_BINARIES=1)" if st["share_binaries"] else
                      "does not take part (FACTDB_SHARE_BINARIES unset)"))
    for lease in st.get("leases", []):
        click.echo(_safe(f"tuning:  {lease['digest']} {lease['family']} on {lease['host']} (pid {lease['pid']}), "
                         f"lease {lease['left_s']:.0f} s left"))

