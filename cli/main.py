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
            if isinstance(e, KeyError):
                # A KeyError is an internal fault, never a user error: say so in a sentence, not one bare word.
                key = e.args[0] if e.args else "?"
                msg = (f"internal error in fact-db: looked up `{key}`, which is not there "
                       f"({_innermost(e)}); rerun with --debug for the traceback and report it")
            else:
                msg = str(e)
            raise click.ClickException(msg) from None
    return wrapper


def _innermost(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "no traceback"
    f = frames[-1]
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"


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
