"""The `factdb` command: noun then verb (`factdb rules validate`), thin over fact_db.

`main()` is the entry point; each command lives in the module of its noun and registers
itself on the group in cli/common.py when imported here.
"""
from __future__ import annotations

import sys

import click

from . import discover, index, optimize, query, registry, rules, tune  # noqa: F401  (registers the commands)
from .common import cli


def main():
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except SystemExit as e:
        from fact_db.discovery import sandbox
        if not sandbox.quick_exit_allowed():
            raise
        # The sandboxed child of `discover` ends without the interpreter's teardown of torch
        # (sandbox.exit_child): the same exit code, 0.4-0.6 s sooner.
        code = e.code
        if code is not None and not isinstance(code, int):
            click.echo(str(code), err=True)  # what Python itself does with sys.exit("message")
            code = 1
        sandbox.exit_child(code or 0)
