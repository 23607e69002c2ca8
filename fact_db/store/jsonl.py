"""The registry's JSONL files (`factdb registry export/import`, the seed index/kernels.jsonl):
reading them all-or-nothing within fixed limits, and the schema-4 format they used to have.

    >>> records, carried = parse(open("kernels.jsonl"), "kernels.jsonl", provenance="import")

A line is one KernelRecord.as_dict(): `digest`, `family`, the key fields, the record fields
and the environment fields, flat. Every line is checked before anything is applied; any
bad line raises ImportError_ listing every bad line with its reason.

Schema 4's lines (before the environment key) have no `family`: they are GEMM rows. Their
digest is checked under schema 4's scheme (sha256 over the key fields' values in order),
then the row is re-keyed under today's; `device_name`, `cutlass_version` and `nvcc_version`
become its environment, and since the rest of it was never recorded, a verified or stale row
imports as stale (records.CARRIED_OVER): it is kept, shown, and replaced by tuning again.

Limits on untrusted input (README): what the columns hold, and no more, so one hostile line
cannot make every later `registry list` read gigabytes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import IO

from fact_db.core.environment import FIELDS as ENV_FIELDS
from fact_db.core.environment import LABELS, Environment
from fact_db.store.db import RegistryError
from fact_db.store.keys import GemmKey, Key
from fact_db.store.records import CARRIED_OVER, MAX_SOURCE, KernelRecord

MAX_IMPORT_LINE = 1024 * 1024       # characters in one JSONL line
MAX_TEXT = {"notes": 4096, "source": MAX_SOURCE}
MAX_TEXT_DEFAULT = 16 * 1024        # any other string field (config, names, keys)
INT64 = (-(2 ** 63), 2 ** 63 - 1)   # BIGINT columns
SCHEMA4_FIELDS = ("template", "config", "time_ms", "baseline", "baseline_ms", "rel_err", "baseline_rel_err", "status",
                  "provenance", "source_hash", "template_hash", "cutlass_version", "nvcc_version", "factdb_version",
                  "device_name", "error", "stale_reason", "notes", "created_at", "updated_at")


class ImportError_(RegistryError):
    """A JSONL file had malformed lines; nothing from it was applied. `problems`: [(line, reason)]."""

    def __init__(self, path: str, problems: list[tuple[int, str]], fix: str = "fix them and import again"):
        self.path = path
        self.problems = list(problems)
        listed = "; ".join(f"line {n}: {why}" for n, why in self.problems)
        super().__init__(f"{path}: {len(self.problems)} bad line{'s' if len(self.problems) != 1 else ''}, nothing "
                         f"imported ({listed}); {fix}")


def lines(f: IO[str]):
    """(number, line or None if it was longer than MAX_IMPORT_LINE) without ever holding more
    than MAX_IMPORT_LINE characters of one line."""
    n = 0
    while True:
        line = f.readline(MAX_IMPORT_LINE + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_IMPORT_LINE and not line.endswith("\n"):
            while True:  # skip the rest of the over-long line in bounded pieces
                rest = f.readline(MAX_IMPORT_LINE)
                if not rest or rest.endswith("\n"):
                    break
            yield n, None
        else:
            yield n, line


def field_faults(d, path: str = "") -> list[str]:
    """Strings longer than their column allows and integers beyond 64 bits, by field."""
    out, stack = [], [(path, d)]
    while stack and len(out) < 5:
        where, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, str):
            limit = MAX_TEXT.get(where, MAX_TEXT_DEFAULT)
            if len(v) > limit:
                out.append(f"field `{where}` is {len(v)} characters, over its limit of {limit}")
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1]:
            out.append(f"field `{where}` is {str(v)[:20]}..., beyond the 64-bit integers the registry holds")
    return out


def carried_reason(env: Environment, where: str) -> str:
    """The stale reason of a row whose environment schema 4 did not record."""
    unknown = [LABELS[f] for f in ENV_FIELDS if not getattr(env, f)]
    return f"{CARRIED_OVER} ({where}): {', '.join(unknown)} not recorded"


def from_schema4(d: dict) -> KernelRecord:
    """A GEMM row of schema 4's JSONL, checked under that schema's digest, as today's record (stale
    unless failed: see the module docstring)."""
    unknown = sorted(set(d) - set(GemmKey.FIELDS) - set(SCHEMA4_FIELDS) - {"digest"})
    if unknown:
        raise RegistryError(f"unknown fields {', '.join(unknown)} (a newer fact-db's export, or a typo)")
    key = Key.from_dict("gemm", d)
    if "template" not in d:
        raise RegistryError("field template is missing")
    if "digest" in d:
        text = json.dumps([getattr(key, f) for f in GemmKey.FIELDS], separators=(",", ":"))
        old = hashlib.sha256(text.encode()).hexdigest()[:16]
        if d["digest"] != old:
            raise RegistryError(f"digest {d['digest']!r} does not match the key fields (schema 4 gives {old!r}); "
                                "drop the digest field or fix the key")
    env = {}
    for new, old_name in (("gpu_sku", "device_name"), ("cutlass", "cutlass_version"), ("nvcc", "nvcc_version")):
        v = d.get(old_name)
        if v is not None and not isinstance(v, str):
            raise RegistryError(f"{old_name} must be a string, got {v!r}")
        env[new] = v or ""
    own = {f.name for f in dataclasses.fields(KernelRecord)}
    rec = KernelRecord(key=key, env=Environment(**env), **{k: v for k, v in d.items() if k in own and k != "env"})
    if rec.status == "failed":
        return rec
    why = carried_reason(rec.env, "an export without the environment key")
    before = f"; before that: {rec.stale_reason}" if rec.status == "stale" and rec.stale_reason else ""
    return rec.replace(status="stale", stale_reason=why + before)


def parse(f: IO[str], name: str, provenance: str) -> tuple[list[KernelRecord], int]:
    """(records, how many were schema-4 rows) of a JSONL stream; rows without provenance get
    `provenance`. Raises ImportError_ listing every bad line, so nothing is half-applied."""
    records, problems, carried = [], [], 0
    for n, line in lines(f):
        if line is None:
            problems.append((n, f"the line is longer than {MAX_IMPORT_LINE} characters"))
            continue
        if not line.strip():
            continue
        try:
            d = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")))
        except (ValueError, RecursionError) as e:
            problems.append((n, f"not valid JSON ({e})" if isinstance(e, ValueError) else "nested too deep"))
            continue
        faults = field_faults(d)
        if faults:
            problems.append((n, "; ".join(faults)))
            continue
        try:
            if isinstance(d, dict) and not d.get("provenance"):
                d = {**d, "provenance": provenance}
            if isinstance(d, dict) and "family" not in d:
                records.append(from_schema4(d))
                carried += 1
            else:
                records.append(KernelRecord.from_dict(d))
        except RegistryError as e:
            problems.append((n, str(e)))
        except TypeError as e:
            problems.append((n, f"bad field ({e})"))
    if problems:
        raise ImportError_(name, problems)
    return records, carried


def read(path, provenance: str = "import") -> tuple[list[KernelRecord], int, str]:
    """parse() of a file path, an open text stream, or "-" (stdin), with its name for messages."""
    import sys
    if hasattr(path, "read"):
        name = str(getattr(path, "name", "<stream>"))
        return (*parse(path, name, provenance), name)
    if str(path) == "-":
        return (*parse(sys.stdin, "<stdin>", provenance), "<stdin>")
    name = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            return (*parse(f, name, provenance), name)
    except FileNotFoundError:
        raise RegistryError(f"{name} does not exist; pass a JSONL file written by `factdb registry export`") from None
    except UnicodeDecodeError as e:
        raise RegistryError(f"{name} is not UTF-8 text ({e.reason} at byte {e.start}); pass a JSONL file written by "
                            "`factdb registry export`") from None


def dumps(row: dict) -> str:
    """One line of a JSONL file (as the seed file and exports have always been spaced)."""
    return json.dumps(row, separators=(", ", ": ")) + "\n"
