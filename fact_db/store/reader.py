"""The registry read without SQLAlchemy: exact kernel lookups in a local DuckDB registry, for
the torch.compile backend, whose compile time is what importing and opening the full registry
(SQLAlchemy, sqlmodel, DuckDB's SQLAlchemy dialect: about 0.5 s on a 2-core CPU) would add to.

    >>> reader = Reader.open()          # the default registry; None where Registry.open must serve
    >>> hit = reader.lookup(key, nearest=False) if reader else Registry.open().lookup(key, nearest=False)

A Reader answers what Registry.lookup(key, nearest=False) answers: the exact row unless it
failed, flagged stale where it is not usable here. It never writes, so what needs a write is
Registry.open's, which does it: a file that does not exist yet, needs migrating, or has not
imported the current seed file. So is a server URL (the team registry and its cache), an
in-memory registry, a file that is not DuckDB's, and a file DuckDB will not open read-only now
(another process writing it: Registry.open waits for it). For those, open() returns None.
"""
from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from pathlib import Path

from fact_db.core import paths
from fact_db.store.errors import RegistryError
from fact_db.store.records import Current, Lookup
from fact_db.store.rows import SCHEMA_VERSION, kernel_record

_DUCKDB_MAGIC = b"DUCK"   # bytes 8..12 of every DuckDB database file (fact_db.store.db checks the same)
_HEX = re.compile(r"[0-9a-f]+")   # a key's digest (keys.Key.digest: sha256's first 16 hex digits)


def local_path(url: str | None = None) -> Path | None:
    """The DuckDB file `url` names as the registry resolves it (paths.registry_url: None is
    $FACTDB_DB, else the default registry), or None where it names something else: a server,
    an in-memory database, a URL with options."""
    url = paths.registry_url(url)
    if not url.startswith("duckdb:///") or "?" in url:
        return None
    path = url[len("duckdb:///"):]
    return None if path in ("", ":memory:") else Path(path).expanduser().resolve()


def _seed_sha() -> str | None:
    """sha256 of the seed file a registry imports (Registry._maybe_seed), None where there is none."""
    seed = paths.seed_file()
    if seed is None or not seed.is_file():
        return None
    return hashlib.sha256(seed.read_bytes()).hexdigest()


class Reader:
    """Read-only, exact lookups in one local DuckDB registry file (see the module docstring)."""

    team = None   # never a team registry (the backend asks)

    def __init__(self, path: Path):
        self.path = path
        self._held = None   # the connection pinned() holds

    @classmethod
    def open(cls, url: str | None = None) -> Reader | None:
        """A Reader over the registry file `url` names, or None where only Registry.open can serve it."""
        path = local_path(url)
        if path is None or not path.is_file():
            return None
        try:
            with open(path, "rb") as f:
                if f.read(16)[8:12] != _DUCKDB_MAGIC:
                    return None
        except OSError:
            return None
        reader = cls(path)
        try:
            with reader._connection() as conn:
                meta = dict(conn.execute("select key, value from factdb_meta").fetchall())
        except Exception:  # noqa: BLE001  (busy, not a registry, another layout: Registry.open says which)
            return None
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            return None
        seed = _seed_sha()
        if seed is not None and meta.get("seed_sha256") != seed:
            return None
        return reader

    @contextmanager
    def _connection(self):
        if self._held is not None:
            yield self._held
            return
        import duckdb
        try:
            conn = duckdb.connect(str(self.path), read_only=True)
        except duckdb.Error as e:
            raise RegistryError(f"the registry {self.path} cannot be read now ({str(e).splitlines()[0][:200]}); "
                                "another process may be writing it: compile again when it is done") from None
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def pinned(self, write: bool = False):
        """One read-only connection for a batch of lookups (Registry.pinned's contract: no other
        process can write the file meanwhile, so keep the block short)."""
        if write:
            raise RegistryError("the lean registry reader never writes: open the registry with Registry.open")
        if self._held is not None:
            yield self
            return
        with self._connection() as conn:
            self._held = conn
            try:
                yield self
            finally:
                self._held = None

    def lookup(self, key, env=None, template_hashes=None, *, nearest: bool = True) -> Lookup | None:
        """The exact row for `key` as Registry.lookup(key, nearest=False) answers it. A family with
        shape fields asked for its nearest row is Registry's (RegistryError here)."""
        if nearest and key.SHAPE:
            raise RegistryError("the lean registry reader answers exact lookups only: call lookup(key, nearest=False), "
                                "or open the registry with Registry.open for the nearest row")
        digest = key.digest()
        if not _HEX.fullmatch(digest):
            raise RegistryError(f"a registry key's digest must be hex digits, got {digest!r}")
        with self._connection() as conn:
            # the digest as a literal, not a bound parameter: binding a process's first parameter
            # makes DuckDB's Python client import pandas and numpy where they are installed
            # (0.26-0.72 s of a first lookup on an H200 host, 16-28 ms without; benchmarks/lookup_time.py)
            cur = conn.execute(f"select * from kernels where digest = '{digest}' and status != 'failed'")
            row = cur.fetchone()
            names = [d[0] for d in cur.description] if row is not None else []
        if row is None:
            return None
        rec = kernel_record(dict(zip(names, row)))
        if rec.key != key:
            return None
        why = Current(env, template_hashes).staleness(rec)
        return Lookup(rec, 0.0, True, bool(why), why)
