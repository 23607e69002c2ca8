"""Where fact-db finds its shipped data and keeps its state.

`FACTDB_RULES` overrides the rules directory, `FACTDB_HOME` the state directory
(default `~/.local/share/fact-db`), `FACTDB_DB` the registry URL. Shipped data (rules,
the schema, kernel templates, index sources) lives in the source tree beside the
package, which an editable install (`pip install -e .`, as the README does) keeps.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from fact_db.core.errors import ProblemError

ROOT = Path(__file__).resolve().parents[2]


def rules_dir() -> Path:
    return Path(os.environ.get("FACTDB_RULES") or ROOT / "rules")


def schema_path() -> Path:
    return ROOT / "rules.schema.json"


def templates_dir() -> Path:
    return ROOT / "kernels_cpp"


def home() -> Path:
    return Path(os.environ.get("FACTDB_HOME") or Path.home() / ".local" / "share" / "fact-db")


def registry_file() -> Path:
    """The default registry, `$FACTDB_HOME/fact.duckdb` (registry_url's default; here so that asking
    whether it exists imports no database library)."""
    return home() / "fact.duckdb"


def registry_url(url: str | None = None) -> str:
    """The SQLAlchemy URL of the registry to open: `url`, else $FACTDB_DB, else the default DuckDB
    file (fact_db.store.db.resolve_url; here so that the lean reader resolves it alike without a
    database library). `memory` (or `:memory:`) is a fresh in-memory DuckDB; a plain path is a
    DuckDB file.

    >>> registry_url("memory")
    'duckdb:///:memory:'
    """
    url = url or os.environ.get("FACTDB_DB") or f"duckdb:///{registry_file()}"
    if url in ("memory", ":memory:"):
        return "duckdb:///:memory:"
    if "://" not in url:
        return f"duckdb:///{Path(url).expanduser().resolve()}"
    return url


def seed_file() -> Path | None:
    """The seed registry a new registry imports: $FACTDB_SEED (empty: none), else index/kernels.jsonl
    (fact_db.store.registry.seed_path; here so that the lean reader can check it without a
    database library)."""
    env = os.environ.get("FACTDB_SEED")
    if env is not None:
        return Path(env) if env else None
    return ROOT / "index" / "kernels.jsonl"


def cutlass_examples_dir() -> Path | None:
    """The `examples/` directory of the installed nvidia-cutlass package, or None if absent."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "source" / "examples"
    return path if path.is_dir() else None


def problem_file(spec: str) -> Path | None:
    """The file a PROBLEM argument names (it ends in .py, has a slash, or exists), or None for
    an import spec (`package.module[:factory]`); ProblemError where the file is missing or a
    directory. Commands call it before they start a child or import torch, so a mistyped path
    is answered at once.

    >>> problem_file("benchmarks/problems/mingpt_block.py").name
    'mingpt_block.py'
    """
    text = str(spec)
    if not (text.endswith(".py") or "/" in text or Path(text).exists()):
        return None
    path = Path(text)
    if not path.exists():
        raise ProblemError(f"problem file `{text}` does not exist")
    if not path.is_file():
        raise ProblemError(f"`{text}` is a directory, not a problem file")
    return path
