"""Exceptions fact-db raises for user errors.

Every exception here carries one sentence a user can act on; the CLI turns them into a
`click.ClickException` and shows the traceback only with `--debug`.
"""
from __future__ import annotations

from dataclasses import dataclass


class FactError(Exception):
    """Base class: a user-facing error with a one-sentence message."""


def first_line(e: BaseException | str, limit: int | None = 200, typed: bool = False) -> str:
    """An exception in one line, for a note or a message: the first line of its text, cut at
    `limit` characters (None: not cut), or its type's name where the text is empty; with
    `typed`, always led by the type's name (`KeyError: 'x'`). A string (a note) is its own
    first line, empty where it is empty (never its type's name, "str")."""
    lines = str(e).strip().splitlines()
    text = lines[0][:limit] if lines else ""
    if isinstance(e, str):
        return text
    if typed:
        return f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text or type(e).__name__


class ExprError(FactError):
    """An expression in a rule (a `where` constraint) does not parse or uses a forbidden construct."""


class ProblemError(FactError):
    """A problem file or import spec cannot be loaded (missing file, missing `Model`, raising `__init__`)."""


class TraceError(FactError):
    """torch.export could not trace the model. `partial` holds what did trace, if anything."""

    def __init__(self, message: str, partial=None):
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Fault:
    """One problem found in a rule file: where it is, which field, what is wrong and how to fix it."""

    path: str
    line: int | None
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{display_path(self.path)}:{self.line}" if self.line else display_path(self.path)
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        return f"{text} ({self.fix})" if self.fix else text


def display_path(path: str) -> str:
    """A path relative to the working directory when it is under it (shorter messages)."""
    import os
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


class RuleError(FactError):
    """Rule files failed validation; `faults` lists every problem found."""

    def __init__(self, faults: list[Fault]):
        self.faults = list(faults)
        first = str(self.faults[0]) if self.faults else "no faults"
        more = f" (and {len(self.faults) - 1} more)" if len(self.faults) > 1 else ""
        super().__init__(f"invalid rules: {first}{more}; run `factdb rules validate` for all of them")
