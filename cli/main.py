"""The `factdb` command: noun then verb (`factdb rules validate`), thin over fact_db."""
from __future__ import annotations

import functools
import sys
import traceback

import click

from fact_db.errors import FactError, RuleError


class Ctx:
    debug = False


def handle_errors(fn):
    """Turn fact-db's user errors into one-sentence ClickExceptions (tracebacks with --debug)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (FactError, KeyError, ValueError) as e:
            if Ctx.debug:
                traceback.print_exc()
            if isinstance(e, RuleError):
                for f in e.faults:
                    click.echo(str(f), err=True)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            if isinstance(e, KeyError) and not isinstance(e, FactError):
                msg = f"internal error: no entry {msg!r} (rerun with --debug for the traceback, and report it)"
            raise click.ClickException(msg) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001  (the last line of defence: one sentence, never a bare traceback)
            if Ctx.debug:
                traceback.print_exc()
            raise click.ClickException(_one_sentence(e)) from None
    return wrapper


def _one_sentence(e: Exception) -> str:
    """An unexpected exception as one sentence: files that cannot be written (a read-only
    $FACTDB_HOME) named with what to do, anything else as an internal error."""
    import os
    first = str(e).splitlines()[0] if str(e) else ""
    home = os.environ.get("FACTDB_HOME", "~/.factdb")
    if isinstance(e, OSError):
        where = e.filename or home
        return (f"cannot use {where}: {e.strerror or first}; point FACTDB_HOME (now {home}) or --db at a writable "
                "directory")
    if type(e).__module__.startswith("duckdb") and type(e).__name__ in ("IOException", "PermissionException"):
        return f"a database file cannot be opened or written ({first}); check that FACTDB_HOME ({home}) is writable"
    return f"internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback, and report it)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(package_name="fact-db")
def cli(debug):
    """fact-db: turn PyTorch modules into tuned CUTLASS kernels, and remember every kernel.

    \b
    Example:
      factdb discover benchmarks/problems/mingpt_block.py --explain
      factdb rules list
    """
    Ctx.debug = debug


def main():
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


from . import discover as _discover, index as _index, optimize as _optimize, query as _query, registry as _registry, rules as _rules, tune as _tune  # noqa: E402,F401,I001  (registers the commands)
