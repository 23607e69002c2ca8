"""`factdb registry ...`: list, show, export, import, revalidate and gc the kernel registry."""
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
    for name, help_ in reversed((("rule", "Only this rule id, e.g. gemm-bias-gelu-tanh."),
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


@cli.group()
def registry():
    """List, inspect, move and clean the registry of tuned kernels.

    Each kernel row is keyed by rule, arch, GPU, dtypes, layouts, shape, epilogue and
    precision policy, and records its config, toolchain, timings and status.

    \b
    Example:
      factdb registry list --gpu h100 --status verified
      factdb registry export kernels.jsonl --rule gemm
    """


def _region_rows(reg, arch, gpu, policy, status) -> list[dict]:
    from fact_db.store.registry import canonical_gpu
    g = canonical_gpu(gpu) if gpu else None
    return [r for r in reg.region_kernels() if (not arch or r["arch"] == arch) and (not g or r["gpu"] == g)
            and (not policy or r["policy"] == policy) and (not status or r["status"] == status)]


def _list_llm(db_url, arch, gpu, policy, status, as_json):
    cols = ("digest", "name", "ops", "arch", "gpu", "policy", "dtype", "time_ms", "eager_ms", "rel_err",
            "eager_rel_err", "device_name", "provenance", "status", "model", "build_key", "created_at")
    with _open(db_url) as reg:
        rows = _region_rows(reg, arch, gpu, policy, status)
        where = reg.where
    if as_json:
        click.echo(jdump([{k: r[k] for k in cols} for r in rows], indent=2))
        return
    if rows:
        click.echo(f"{'DIGEST':16}  {'NAME':20} {'ARCH':6} {'GPU':6} {'POLICY':6} {'TIME_MS':>9} {'EAGER_MS':>9} "
                   f"{'SPEEDUP':>7}  {'STATUS':9} OPS")
        for r in rows:
            sp = f"{r['eager_ms'] / r['time_ms']:.2f}x" if r["time_ms"] and r["eager_ms"] else "-"
            click.echo(_safe(f"{r['digest'][:16]:16}  {r['name'][:20]:20} {r['arch']:6} {r['gpu']:6} {r['policy']:6} "
                             f"{_fmt_ms(r['time_ms']):>9} {_fmt_ms(r['eager_ms']):>9} {sp:>7}  {r['status']:9} "
                             f"{r['ops']}"))
    click.echo(f"{len(rows)} region kernels (provenance llm) in {where}", err=True)


@registry.command("list")
@_filters
@click.option("--llm", "llm", is_flag=True,
              help="List the agent's region kernels (table region_kernels, provenance llm) instead.")
@_db_option
@_json_option
@handle_errors
def list_(rule, arch, gpu, policy, status, llm, db_url, as_json):
    """List kernel rows (newest toolchain status as last revalidated); with --llm, the kernels
    the language model wrote for regions no rule covers, each verified and faster than eager
    when stored (`factdb optimize` composes them).

    \b
    Example:
      factdb registry list --rule gemm --policy tf32 --json
      factdb registry list --llm --gpu h100
    """
    if llm:
        if rule:
            raise click.UsageError("--rule does not apply to --llm: region kernels have no rule (use --policy, "
                                   "--arch, --gpu or --status)")
        return _list_llm(db_url, arch, gpu, policy, status, as_json)
    with _open(db_url) as reg:
        recs = list(reg.kernels(rule=rule, arch=arch, gpu=gpu, policy=policy, status=status))
        where = reg.where
    if as_json:
        click.echo(jdump([r.as_dict() for r in recs], indent=2))
        return
    if recs:
        w = max(len(r.key.rule) for r in recs)
        click.echo(f"{'DIGEST':16}  {'RULE':{w}}  {'ARCH':6} {'GPU':6} {'POLICY':6} {'SHAPE':20} {'EPILOGUE':14} "
                   f"{'DTYPE':8} {'TIME_MS':>9} {'BASE_MS':>9} {'SPEEDUP':>7}  STATUS")
        for r in recs:
            k = r.key
            sp = f"{r.speedup:.2f}x" if r.speedup else "-"
            click.echo(_safe(f"{r.digest:16}  {k.rule:{w}}  {k.arch:6} {k.gpu:6} {k.policy:6} {k.shape:20} "
                             f"{k.epilogue:14} {k.dtype_in:8} {_fmt_ms(r.time_ms):>9} {_fmt_ms(r.baseline_ms):>9} "
                             f"{sp:>7}  {r.status}"))
    click.echo(f"{len(recs)} kernels in {where}", err=True)


def _safe(text) -> str:
    """Text from imported rows with control characters escaped (an ESC sequence from someone
    else's registry must not drive the terminal)."""
    text = str(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@registry.command()
@click.argument("digest")
@_db_option
@_json_option
@handle_errors
def show(digest, db_url, as_json):
    """Show one kernel row and every trial recorded for its key.

    DIGEST is the key digest from `factdb registry list`; a unique prefix (4+ characters) is enough.

    \b
    Example:
      factdb registry show 75a8f287
    """
    from fact_db.store.registry import RegistryError
    with _open(db_url) as reg:
        found = reg.find_digest(digest) if len(digest) >= 4 else []
        if digest in found:
            found = [digest]
        if not found and len(digest) >= 4:  # the agent's region kernels have digests of their own
            llm = [r for r in reg.region_kernels() if r["digest"].startswith(digest)]
            if len(llm) == 1:
                return _show_llm(llm[0], as_json)
            if llm:
                found = [r["digest"] for r in llm]
        if len(found) != 1:
            what = "no kernel" if not found else f"{len(found)} kernels ({', '.join(found[:5])})"
            raise RegistryError(f"{what} with a digest starting {digest!r} in {reg.where}; run `factdb registry list` "
                                "and pass a full digest (or a unique prefix of 4+ characters)")
        rec = reg.get(found[0])
        trials = reg.trials(found[0])
    if as_json:
        click.echo(jdump({"kernel": rec.as_dict(), "trials": [t.as_dict() for t in trials]}, indent=2))
        return
    for name, value in rec.as_dict().items():
        if name == "config":
            value = json.dumps(value, sort_keys=True)
        if value not in ("", None):
            click.echo(f"{name + ':':18} {_safe(value)}")
    click.echo(f"trials: {len(trials)}")
    for t in trials:
        click.echo(_safe(f"  {t.created_at[:19]}  {t.status:13} {_fmt_ms(t.time_ms):>9} ms  {t.config_hash}  "
                         f"{json.dumps(t.config, sort_keys=True)}" + (f"  {t.error.splitlines()[0]}" if t.error else "")))


def _show_llm(row: dict, as_json: bool) -> None:
    if as_json:
        click.echo(jdump({"region_kernel": row}, indent=2))
        return
    for name, value in row.items():
        if name in ("source", "region"):
            continue
        if value not in ("", None):
            click.echo(f"{name + ':':18} {_safe(value)}")
    click.echo(f"region:            {_safe(row['region'])}")
    click.echo("source:")
    for line in row["source"].splitlines():
        click.echo("  " + _safe(line))


@registry.command()
@click.argument("file", default="-")
@_filters
@_db_option
@handle_errors
def export(file, rule, arch, gpu, policy, status, db_url):
    """Write kernel rows as JSON lines (FILE, or - for stdout), sorted by digest.

    The output is what `factdb registry import` and the seed file index/kernels.jsonl read.

    \b
    Example:
      factdb registry export h100.jsonl --gpu h100 --status verified
    """
    with _open(db_url) as reg:
        n = reg.export_jsonl(sys.stdout if file == "-" else file, rule=rule, arch=arch, gpu=gpu, policy=policy,
                             status=status)
    click.echo(f"exported {n} kernels" + ("" if file == "-" else f" to {file}"), err=True)


@registry.command("import")
@click.argument("file")
@_db_option
@_json_option
@handle_errors
def import_(file, db_url, as_json):
    """Merge kernel rows from a JSONL file (or - for stdin), all or nothing.

    Rows merge by key: a verified row is never replaced by an unverified one; among
    verified rows with the same toolchain the faster wins; a row verified under the
    current toolchain replaces one from another. Any malformed line aborts the import
    with every bad line listed, and nothing is applied.

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
    """Mark rows stale whose CUTLASS, nvcc or template hash differs from what is installed now.

    A stale row whose toolchain matches again is restored to verified. Stale rows are
    never used by lookups; re-tune them with `factdb tune`.

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
        click.echo(f"{c.digest}  {c.rule} {c.shape}: {c.old_status} -> {c.new_status} ({c.reason})")
    click.echo(f"{len(changes)} {'would change' if dry_run else 'changed'}", err=True)


@registry.command()
@click.option("--older-than", "days", type=float, default=30.0, show_default=True, metavar="DAYS",
              help="Only rows and trials older than this many days.")
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
@_db_option
@_json_option
@handle_errors
def gc(days, dry_run, db_url, as_json):
    """Delete failed and stale kernel rows, and trials whose key has no kernel row, older than DAYS.

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
