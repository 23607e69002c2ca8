"""The rule cache: the shipped rules as load_rules built them (parsed, checked, their patterns
built), kept in `$FACTDB_HOME/cache/rules-<root>.pickle` so that a fresh process, a
`torch.compile(backend="factdb")` above all, does not parse and check every rule file again.

    >>> cache = RuleCache(paths.rules_dir())
    >>> rules = cache.get()          # None on a miss: load_rules loads and checks, then cache.put(rules)

The key is a digest of everything the load read or checked: every file under the rules
directory (a rule or fragment file's bytes, any other file's name, as fixtures are checked to
exist), the schema (with the PyYAML and jsonschema installs, as SchemaCache salts it), the
kernel templates' names, the CUTLASS examples directory the references are checked against,
the source of the code that builds and defines a RuleSet (fact_db/discovery/*.py, so an edit
in a source tree is a miss, where fact-db's version would not change) and the Python version. Any change is a new digest and a full load; only a
load without faults is kept. The file is written atomically (a temporary file, then a
rename); an unreadable, corrupt or foreign file is ignored and replaced. It is fact-db's own
file in fact-db's state directory, the same trust as the build cache's libraries beside it.
Clear it with `rm $FACTDB_HOME/cache/rules-*.pickle`.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path

from fact_db.core import paths

RULE_CACHE_VERSION = 1


def _code() -> bytes:
    """sha256 of the code that builds a RuleSet and defines what it holds (this package: rules,
    patterns, expressions, ATen names; and the errors): a source tree's edit changes it, where
    fact-db's version would not."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for p in sorted(here.glob("*.py")) + [here.parent / "core" / "errors.py"]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.digest()


def _digest(root: Path, salt: bytes) -> str:
    h = hashlib.sha256(f"v{RULE_CACHE_VERSION}\0python {sys.version_info[:3]}\0{root}\0{root.resolve()}\0".encode())
    h.update(salt + _code())  # Rule.path is under `root` as given
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts or not p.is_file():
            continue
        rel = p.relative_to(root).as_posix()
        h.update(b"\0file\0" + rel.encode() + b"\0")
        if p.suffix in (".yaml", ".yml"):
            h.update(p.read_bytes())
    h.update(b"\0templates\0" + "\0".join(sorted(p.name for p in paths.templates_dir().glob("*.cu.j2"))).encode())
    ex = paths.cutlass_examples_dir()
    h.update(b"\0examples\0" + (f"{ex} {ex.stat().st_mtime_ns}" if ex is not None else "").encode())
    return h.hexdigest()


class RuleCache:
    """One rules directory's cache file (see the module docstring); every failure is a miss."""

    def __init__(self, root: Path, salt: bytes, home: Path | None = None):
        self.root = Path(root)
        name = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        self.path = (home or paths.home()) / "cache" / f"rules-{name}.pickle"
        try:
            self.digest = _digest(self.root, salt)
        except OSError:
            self.digest = ""

    def get(self):
        """What was cached for this digest (a RuleSet), or None."""
        if not self.digest:
            return None
        try:
            with open(self.path, "rb") as f:
                doc = pickle.load(f)
        except Exception:  # noqa: BLE001  (missing, truncated, corrupt or from another fact-db: a miss)
            return None
        if not isinstance(doc, dict) or doc.get("version") != RULE_CACHE_VERSION or doc.get("digest") != self.digest:
            return None
        return doc.get("rules")  # load_rules checks it is a RuleSet

    def put(self, rules) -> None:
        """Keep `rules` for this digest (atomically); errors are ignored."""
        if not self.digest:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                pickle.dump({"version": RULE_CACHE_VERSION, "digest": self.digest, "rules": rules}, f,
                            protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path)
        except Exception:  # noqa: BLE001  (unwritable, or a rule that does not pickle: no cache)
            try:
                tmp.unlink()
            except OSError:
                pass
