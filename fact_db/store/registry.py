"""The kernel registry: every tuned kernel (winner) and every candidate tried, of every family,
by (family, key fields), with the environment it was measured in.

    >>> reg = Registry.open()                     # $FACTDB_DB, else $FACTDB_HOME/fact.duckdb
    >>> key = GemmKey(rule="gemm", arch="sm90a", gpu="h100", dtype_in="float32",
    ...               dtype_acc="float32", dtype_out="float32", layout_a="row", layout_b="col",
    ...               m=4096, n=4096, k=4096, batch=1, epilogue="none", policy="tf32")
    >>> reg.put(KernelRecord(key=key, template="gemm_sm90", config={"tile_m": 128},
    ...                      time_ms=1.9, baseline="torch eager", baseline_ms=2.4).stamped())
    'inserted'
    >>> hit = reg.lookup(key.with_(m=3968))       # exact, else the nearest compatible shape
    >>> hit.exact, round(hit.distance, 3), hit.stale
    (False, 0.046, False)
    >>> reg.lookup(AttentionKey(...), nearest=False)   # any family: exact only, if asked

Keys: fact_db.store.keys (one digest scheme for every family). Records, staleness and merge
rules: fact_db.store.records. The nearest lookup: fact_db.store.nearest. JSONL (export, import,
the seed): fact_db.store.jsonl. Tables and the schema's migrations: fact_db.store.tables,
fact_db.store.migrations.

Every method takes the environment to judge rows against as `env` (default: this process's,
fact_db.core.environment.current()) and `template_hashes` (template -> hash; default: hashed
from kernels_cpp/): tests and benchmarks pass both.

A server URL (`postgresql+psycopg://...`) opens a team registry: the server, read through a
local DuckDB cache that keeps fact-db working while the server is away (fact_db.store.shared);
`claim(key)` holds a workload's lease there while this host tunes it (fact_db.store.lease).
The API is the same; on a file database a claim is a no-op.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO

import sqlalchemy as sa

from fact_db.core import paths

# Many names below are re-exported: callers import the registry's whole vocabulary from here.
from fact_db.core.device import canonical_gpu
from fact_db.core.environment import Environment
from fact_db.store import jsonl
from fact_db.store import shared
from fact_db.store.bulk import insert_rows
from fact_db.store.db import (  # noqa: F401  (re-exported: callers catch these from here)
    Database,
    NotARegistry,
    RegistryBusy,
    RegistryError,
    ServerUnreachable,
    lock_keys,
    read_meta,
    resolve_timeout,
    resolve_url,
    write_meta,
)
from fact_db.store.jsonl import ImportError_
from fact_db.store.lease import Claim, Leases, no_claim  # noqa: F401
from fact_db.store.merge import merge_into
from fact_db.store.keys import (  # noqa: F401
    DTYPE_ALIASES,
    AttentionKey,
    GemmKey,
    KernelKey,
    Key,
    NormKey,
    RegionKey,
)
from fact_db.store.nearest import find as nearest_find
from fact_db.store.records import (  # noqa: F401
    TRIAL_FAILURES,
    Change,
    Current,
    ExampleRecord,
    GcReport,
    ImportReport,
    KernelRecord,
    Lookup,
    MergeResult,
    RuleRecord,
    TrialRecord,
    carried_over,
    config_hash,
    merge_decision,
    utcnow,
)
from fact_db.store.shared import ServerOfflineWarning, SyncReport, TeamCache  # noqa: F401
from fact_db.store.synthetic import SYNTHETIC_ENV, synthetic_records, synthetic_rows  # noqa: F401
from fact_db.store.tables import (  # noqa: F401
    BINARIES,
    ENV_COLUMNS,
    METADATA,
    TR,
    ExampleRow,
    K,
    KernelRow,
    RuleRow,
    TrialRow,
    env_of,
    export_dict,
    kernel_record,
    kernel_row,
    key_of,
    trial_record,
    trial_row,
)

FILTERS = ("family", "rule", "arch", "gpu", "policy", "status", "dtype", "provenance", "template")


def seed_path() -> Path | None:
    """The seed registry imported into a new database: $FACTDB_SEED (empty: none), else index/kernels.jsonl."""
    return paths.seed_file()


_BINARY_WARNED: set[str] = set()  # registries whose host role may not write kernel_binaries: said once


def _digest(key_or_digest: Key | str) -> str:
    return key_or_digest.digest() if isinstance(key_or_digest, Key) else key_or_digest


def _filters(filters: dict) -> list:
    bad = sorted(set(filters) - set(FILTERS))
    if bad:
        raise RegistryError(f"cannot filter kernels by {', '.join(bad)}; filters are {', '.join(FILTERS)}")
    conds = []
    for name, value in filters.items():
        if value is None:
            continue
        if name == "family":
            Key.family_class(value)   # an unknown family is a typo, not an empty answer
        elif name == "gpu":
            value = canonical_gpu(value)
        elif name == "dtype":
            value = DTYPE_ALIASES.get(value, value)
        elif name == "arch":
            value = value.replace("_", "")
        conds.append(K.c[name] == value)
    return conds


def _order(rec: KernelRecord) -> tuple:
    return rec.family, rec.key.rule_name, tuple(rec.key.dims().values()), rec.digest


class Registry:
    """The kernel registry over a fact-db database (DuckDB file by default, any SQLAlchemy URL).

    Every method opens a connection for one transaction and closes it, so other processes
    can use the file in between; see fact_db.store.db for locking and timeouts.

    >>> with Registry.open("memory") as reg:
    ...     reg.put(record)
    'inserted'
    """

    def __init__(self, db: Database, team: TeamCache | None = None):
        self.db = db            # the database: a file, or a team registry's server
        self.team = team        # a team registry's cache and its server's state, or None
        self.leases = team.leases if team is not None else Leases(db) if db.server else None

    def _cur(self, env, template_hashes) -> Current:
        return Current(env, template_hashes)

    def _read(self, fn):
        """fn(conn) on a read transaction: the database, or (team registry) the server, else the cache."""
        if self.team is not None:
            return self.team.read(fn)
        with self.db.begin(write=False) as conn:
            return fn(conn)

    def _write(self):
        """A write transaction on the database (team registry: the server, which must answer)."""
        return self.team.transaction(write=True) if self.team is not None else self.db.begin()

    # ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, timeout: float | None = None,
             seed: str | os.PathLike | bool | None = None, cache: str | os.PathLike | bool | None = None) -> Registry:
        """Open the registry at `url` (None: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb; "memory": in-memory).

        A new database is created and migrated; the seed file (`seed`, default seed_path(),
        not for in-memory databases; False: none) is imported whenever its content differs
        from the last one imported. `timeout` (default $FACTDB_DB_TIMEOUT, else 30 s) bounds
        the wait for another process's lock. A server URL opens a team registry with its local
        cache (`cache`: a path, or False for none; default $FACTDB_CACHE, else one file per
        server under $FACTDB_HOME/cache: fact_db.store.shared); an unreachable server is said
        once, and the cache serves meanwhile.
        """
        url = resolve_url(url)
        path = shared.cache_path(url, cache)
        if path is None:
            db, team = Database.open(url, timeout=timeout), None
        else:
            team = TeamCache.open(url, path, resolve_timeout(timeout))
            db = team.server
        reg = cls(db, team)
        try:
            if seed is None and not db.memory:
                seed = seed_path()
            if seed and (team is None or team.online):
                reg._maybe_seed(Path(seed))
        except BaseException:
            db.close()
            raise
        return reg

    @classmethod
    def memory(cls, *, seed: str | os.PathLike | bool | None = None) -> Registry:
        """A fresh in-memory registry (tests, dry runs)."""
        return cls.open("memory", seed=seed)

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def where(self) -> str:
        """Where the registry is, for messages: a file path, or a server URL with its password masked."""
        return self.db.where

    def close(self) -> None:
        if self.team is not None:
            self.team.close()
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def transaction(self, write: bool = True):
        """A short SQLAlchemy transaction on this database (for fact_db.store.index's own tables;
        a team registry's reads use its cache while the server is away)."""
        return self.team.transaction(write) if self.team is not None else self.db.begin(write=write)

    def pinned(self, write: bool = False):
        """Hold one connection for a batch of calls (e.g. a lookup per region), then release it.

        Calls inside reuse it: no reopening, warm caches. Meanwhile no other process can
        write the DuckDB file (with write=True, nor read it), so keep the block short.

        >>> with reg.pinned():
        ...     hits = [reg.lookup(k) for k in keys]
        """
        return (self.team.cache if self.team is not None else self.db).pinned(write)

    def meta(self) -> dict[str, str]:
        return self._read(read_meta)

    # ----------------------------------------------------------------------------------
    # the team registry: claims, sync, status
    def claim(self, key: Key, *, wait: bool = True):
        """Hold `key`'s lease while this host tunes it (a context manager yielding a Claim): on a
        server, another host claiming it waits (wait=False: gets a Claim with held False) until
        this one leaves the block, or its lease expires; on a file database, a no-op.

        >>> with reg.claim(key) as c:
        ...     hit = reg.lookup(key) if c.coordinated else None   # stored meanwhile by another host?
        """
        if self.leases is None or (self.team is not None and not self.team.ready()):
            return no_claim(key)   # a file database, or the server away: nothing to share
        return self.leases.claim(key, wait=wait)

    @property
    def coordinated(self) -> bool:
        """Whether claims coordinate hosts (a server database), rather than being no-ops."""
        return self.leases is not None

    def sync(self, env: Environment | None = None, template_hashes: dict | None = None) -> SyncReport:
        """Team registry: push the rows and trials the cache holds for the server, then pull every
        row other hosts added or changed. Raises ServerUnreachable when the server does not answer."""
        if self.team is None:
            raise RegistryError(f"{self.where} is not a team registry (no server and cache): there is nothing to sync; "
                                "set FACTDB_DB to the team's postgresql+psycopg:// URL")
        return self.team.sync(self._cur(env, template_hashes))

    # ----------------------------------------------------------------------------------
    # built kernels shared by a team registry (opt-in: FACTDB_SHARE_BINARIES)
    def shares_binaries(self) -> bool:
        """Whether built kernels go through this registry: a server database, with
        FACTDB_SHARE_BINARIES=1 on this host. Every host that loads them then runs code any host
        that may write the registry stored (docs/registry.md: who may write them)."""
        flag = os.environ.get("FACTDB_SHARE_BINARIES", "").strip().lower()
        return self.coordinated and flag in ("1", "true", "yes", "on")

    def _on_server(self, fn, write: bool = False):
        if self.team is not None:
            return self.team.on_server(fn, write=write)
        with self.db.begin(write=write) as conn:
            return fn(conn)

    def put_binary(self, build_key: str, data: bytes, *, arch: str) -> bool:
        """Share the kernel built from `build_key` (its .so bytes); True where this call stored it,
        False where it was there already, sharing is off, or the server does not answer (a shared
        binary saves others a compile; nothing waits for it)."""
        if not self.shares_binaries() or not data:
            return False
        import socket
        row = {"build_key": build_key, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "arch": arch,
               "host": socket.gethostname()[:200], "created_at": datetime.now(timezone.utc).isoformat(), "data": data}

        def put(conn):
            if conn.execute(sa.select(BINARIES.c.build_key).where(BINARIES.c.build_key == build_key)).first():
                return False
            conn.execute(sa.insert(BINARIES).values(**row))
            return True
        try:
            return self._on_server(put, write=True)
        except ServerUnreachable:
            return False
        except sa.exc.IntegrityError:  # another host stored the same build at the same moment
            return False
        except sa.exc.SQLAlchemyError as e:  # a role that may read shared kernels, not write them
            if self.where not in _BINARY_WARNED:
                _BINARY_WARNED.add(self.where)
                first = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
                warnings.warn(f"fact-db: this host cannot share the kernels it builds on {self.where} ({first}); "
                              "it still loads what others share, and tuning goes on (docs/registry.md: grants)",
                              stacklevel=2)
            return False

    def get_binary(self, build_key: str) -> bytes | None:
        """The shared kernel built from `build_key`, or None: not shared, sharing off, the server
        away, or bytes that do not match their digest (never returned)."""
        if not self.shares_binaries():
            return None

        def get(conn):
            return conn.execute(sa.select(BINARIES.c.data, BINARIES.c.sha256)
                                .where(BINARIES.c.build_key == build_key)).first()
        try:
            row = self._on_server(get)
        except ServerUnreachable:
            return None
        if row is None:
            return None
        data = bytes(row[0])
        return data if hashlib.sha256(data).hexdigest() == row[1] else None

    def status(self) -> dict:
        """Where the registry is (a server URL with its password masked), its schema and row count;
        for a team registry also whether the server answers, its cache and what waits there, and
        the leases held now."""
        if self.team is not None:
            out = {"kind": "team", "where": self.where, **self.team.status()}
        else:
            out = {"kind": self.db.backend, "where": self.where, "reachable": True, "kernels": self.count()}
            if self.leases is not None:
                out["leases"] = self.leases.held()
        out["schema_version"] = self.meta().get("schema_version", "")
        if self.coordinated:  # built kernels the server shares, and whether this host takes part
            out["share_binaries"] = self.shares_binaries()
            try:
                out["shared_binaries"] = self._on_server(
                    lambda c: c.execute(sa.select(sa.func.count()).select_from(BINARIES)).scalar())
            except ServerUnreachable:
                out["shared_binaries"] = None
        return out

    def _maybe_seed(self, path: Path) -> None:
        if not path.is_file():
            return
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if self.db.meta.get("seed_sha256") == sha:
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RegistryError(f"seed file {path} is not UTF-8 text ({e.reason} at byte {e.start}); fix it, or set "
                                "FACTDB_SEED to another file (empty: no seed)") from None
        try:
            records, _ = jsonl.parse(io.StringIO(text), str(path), provenance="seed")
        except ImportError_ as e:
            raise ImportError_(e.path, e.problems, "fix the seed file, or set FACTDB_SEED to another file (empty: "
                               "no seed)") from None
        with self._write() as conn:
            if read_meta(conn).get("seed_sha256") == sha:  # another process seeded it meanwhile
                return
            lock_keys(conn)   # before the merge's own locks: two seeders never wait on each other
            merge_into(conn, records, self._cur(None, None))
            write_meta(conn, seed_sha256=sha, seed_path=str(path), seeded_at=utcnow())
        self.db.meta["seed_sha256"] = sha

    # ----------------------------------------------------------------------------------
    # kernel rows
    def put(self, rec: KernelRecord, *, env: Environment | None = None, template_hashes: dict | None = None) -> str:
        """Merge one row by key: 'inserted', 'replaced' or 'kept' (fact_db.store.records' merge rules)."""
        return self.put_many([rec], env=env, template_hashes=template_hashes).outcomes[0]

    def put_many(self, recs: Iterable[KernelRecord], *, env: Environment | None = None,
                 template_hashes: dict | None = None) -> MergeResult:
        """Merge many rows in one transaction; counts and per-row outcomes (later rows see earlier ones)."""
        recs = list(recs)
        for r in recs:
            if not isinstance(r, KernelRecord):
                raise RegistryError(f"put takes KernelRecord, got {type(r).__name__}")
        cur = self._cur(env, template_hashes)
        if self.team is not None:
            return self.team.put_many(recs, cur)
        with self.db.begin() as conn:
            return merge_into(conn, recs, cur)

    def get(self, key_or_digest: Key | str) -> KernelRecord | None:
        """The row stored for exactly this key (or digest), whatever its status."""
        if self.team is not None:
            return self.team.get(_digest(key_or_digest))
        with self.db.begin(write=False) as conn:
            row = conn.execute(sa.select(K).where(K.c.digest == _digest(key_or_digest))).first()
        return kernel_record(row) if row else None

    def find_digest(self, prefix: str) -> list[str]:
        """Digests starting with `prefix` (like a short git hash)."""
        rows = self._read(lambda conn: conn.execute(
            sa.select(K.c.digest).where(K.c.digest.startswith(prefix, autoescape=True)).order_by(K.c.digest)
            .limit(20)).all())
        return [r[0] for r in rows]

    def lookup(self, key: Key, env: Environment | None = None, template_hashes: dict | None = None, *,
               max_distance: float | None = None, nearest: bool = True) -> Lookup | None:
        """The registry's answer for `key`: the exact row, else (for a family with SHAPE fields,
        unless nearest=False) the nearest compatible row, else None (fact_db.store.nearest).

        A usable row is preferred to a stale one; a stale row is returned flagged with the
        reason, never as usable. Failed rows are never returned.
        """
        if not isinstance(key, Key):
            raise RegistryError(f"lookup takes a family's key (GemmKey, AttentionKey, ...), got {type(key).__name__}")
        cur = self._cur(env, template_hashes)
        if self.team is not None:
            found = self.team.find(key, cur, max_distance, nearest)
        else:
            with self.db.begin(write=False) as conn:
                found = nearest_find(conn, key, cur, max_distance, nearest=nearest)
        if found is None:
            return None
        rec, d = found
        why = cur.staleness(rec)
        return Lookup(rec, d, d == 0.0, bool(why), why)

    def rows(self, family: str | None = None, **filters) -> Iterator[KernelRecord]:
        """Rows, optionally filtered by equality on family, rule, arch, gpu, policy, status, dtype,
        provenance, template; ordered by family, rule, shape and digest.

        >>> [r.key.shape for r in reg.rows("gemm", gpu="h100", status="verified")]
        """
        q = sa.select(K).where(*_filters({"family": family, **filters}))
        rows = self._read(lambda conn: conn.execute(q).all())
        return iter(sorted((kernel_record(r) for r in rows), key=_order))

    def count(self, **filters) -> int:
        q = sa.select(sa.func.count()).select_from(K).where(*_filters(filters))
        return self._read(lambda conn: conn.execute(q).scalar())

    # ----------------------------------------------------------------------------------
    # trials
    def add_trials(self, trials: Iterable[TrialRecord]) -> int:
        """Record tried candidates (failures included). Returns how many were written."""
        rows = []
        for t in trials:
            if not isinstance(t, TrialRecord):
                raise RegistryError(f"add_trials takes TrialRecord, got {type(t).__name__}")
            rows.append(trial_row(t))
        if rows and self.team is not None:
            self.team.add_trials(rows)
        elif rows:
            with self.db.begin() as conn:
                insert_rows(conn, TR, rows)
        return len(rows)

    def trials(self, key_or_digest: Key | str) -> list[TrialRecord]:
        """Every trial recorded for a key, oldest first."""
        q = sa.select(TR).where(TR.c.digest == _digest(key_or_digest)).order_by(TR.c.created_at, TR.c.id)
        return [trial_record(r) for r in self._read(lambda conn: conn.execute(q).all())]

    def failed_configs(self, key: Key, env: Environment | None = None, template_hashes: dict | None = None) -> set[str]:
        """Config hashes that failed for this key in this same environment (do not try them again).

        Failures are every trial status but ok and skipped. A failure in another environment
        (another nvcc, driver, torch, ...) or under another template version does not count:
        the change may fix it.
        """
        cur = self._cur(env, template_hashes)
        cols = [TR.c.config_hash, TR.c.template, TR.c.template_hash, *(TR.c[c] for c in ENV_COLUMNS.values())]
        q = sa.select(*cols).where(TR.c.digest == key.digest(), TR.c.status.in_(sorted(TRIAL_FAILURES)))
        rows = self._read(lambda conn: conn.execute(q).all())
        return {r.config_hash for r in rows if not cur.mismatch(r.template, r.template_hash, env_of(r))}

    # ----------------------------------------------------------------------------------
    # files
    def export_jsonl(self, path_or_file: str | os.PathLike | IO[str], **filters) -> int:
        """Write rows (filtered as in rows()) as JSON lines, sorted by digest. Returns the count.

        "-" writes to stdout. The format is what import_jsonl and the seed file read.
        """
        q = sa.select(K).where(*_filters(filters)).order_by(K.c.digest)
        rows = self._read(lambda conn: conn.execute(q).all())
        lines = "".join(jsonl.dumps(export_dict(r)) for r in rows)
        if hasattr(path_or_file, "write"):
            path_or_file.write(lines)
        elif str(path_or_file) == "-":
            sys.stdout.write(lines)
        else:
            p = Path(path_or_file)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(lines)
            os.replace(tmp, p)
        return len(rows)

    def import_jsonl(self, path: str | os.PathLike | IO[str], *, env: Environment | None = None,
                     template_hashes: dict | None = None) -> ImportReport:
        """Merge the rows of a JSONL file, all or nothing (fact_db.store.jsonl).

        If any line is malformed, ImportError_ lists every bad line and nothing is applied.
        Rows without provenance get "import". Lines in the schema-4 format (no `family`) are
        GEMM rows from before the environment key: they import as stale (`carried` counts them).
        """
        records, carried, name = jsonl.read(path)
        res = self.put_many(records, env=env, template_hashes=template_hashes)
        return ImportReport(res.inserted, res.replaced, res.kept, name, carried)

    # ----------------------------------------------------------------------------------
    # upkeep
    def revalidate(self, env: Environment | None = None, *, template_hashes: dict | None = None,
                   recheck: Callable[[KernelRecord, str], KernelRecord | None] | None = None,
                   dry_run: bool = False) -> list[Change]:
        """Mark rows stale whose environment or template hash differs from `env`'s (default: here).

        A stale row whose environment and template match again becomes verified again, unless
        it was carried over from schema 4 (records.CARRIED_OVER: its environment is unknown).
        `recheck(record, reason)`, when given (e.g. GPU re-verification), is called for every
        stale row; a KernelRecord it returns (same key) replaces the row as is, None leaves it
        stale. Returns what changed.
        """
        if self.team is not None and not dry_run:
            self.team.require("revalidate")
        cur = self._cur(env, template_hashes)
        changes: list[Change] = []
        updates: dict[tuple[str, str], list[str]] = {}   # (new status, reason) -> digests
        replacements: list[KernelRecord] = []
        cols = [K.c.digest, K.c.family, K.c.key, K.c.rule, K.c.status, K.c.stale_reason, K.c.template,
                K.c.template_hash, *(K.c[c] for c in ENV_COLUMNS.values())]
        rows = self._read(lambda conn: conn.execute(sa.select(*cols).where(K.c.status != "failed")
                                                    .order_by(K.c.digest)).all())
        for r in rows:
            why = cur.mismatch(r.template, r.template_hash, env_of(r))
            if not why and r.status == "verified":
                continue
            shape = key_of(r).shape
            carried = carried_over(r)
            if not why and recheck is None and not carried:   # stale, and its environment matches again
                updates.setdefault(("verified", ""), []).append(r.digest)
                changes.append(Change(r.digest, r.rule, shape, "stale", "verified",
                                      "its environment and template match again"))
                continue
            why = why or r.stale_reason or "marked stale"
            if recheck is not None and not dry_run:
                rec = self.get(r.digest)
                new = recheck(rec, why)
                if new is not None:
                    if new.digest != rec.digest:
                        raise RegistryError(f"recheck returned a row for key {new.digest}, not {rec.digest}; "
                                            "return a record with the same key")
                    replacements.append(new.replace(updated_at=utcnow()))
                    changes.append(Change(r.digest, r.rule, shape, r.status, new.status, f"rechecked: {why}"))
                    continue
            if r.status == "verified":
                updates.setdefault(("stale", why), []).append(r.digest)
                changes.append(Change(r.digest, r.rule, shape, "verified", "stale", why))
        if not dry_run and (updates or replacements):
            now = utcnow()
            with self._write() as conn:
                for (status, reason), digests in updates.items():
                    for i in range(0, len(digests), 500):
                        conn.execute(sa.update(K).where(K.c.digest.in_(digests[i:i + 500]))
                                     .values(status=status, stale_reason=reason, updated_at=now))
                done = [n.digest for n in replacements]
                for i in range(0, len(done), 500):
                    conn.execute(sa.delete(K).where(K.c.digest.in_(done[i:i + 500])))
                insert_rows(conn, K, [kernel_row(n) for n in replacements])
            if self.team is not None:
                self.team.pull()
        return changes

    def gc(self, older_than_days: float = 30.0, *, dry_run: bool = False, now: datetime | None = None) -> GcReport:
        """Delete failed and stale rows not updated for `older_than_days`, and trials older than that
        whose key has no row left. `dry_run` only reports what would go."""
        if older_than_days < 0:
            raise RegistryError(f"--older-than {older_than_days:g}: use a number of days >= 0")
        cutoff = ((now or datetime.now(timezone.utc)) - timedelta(days=older_than_days)) \
            .strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if self.team is not None and not dry_run:
            self.team.require("gc")
        rep = GcReport(dry_run=dry_run)
        with (self._write() if not dry_run else self.transaction(write=False)) as conn:
            doomed = K.c.status.in_(("failed", "stale")) & (K.c.updated_at < cutoff)
            rep.kernels = [r[0] for r in conn.execute(sa.select(K.c.digest).where(doomed).order_by(K.c.digest))]
            if not dry_run and rep.kernels:
                conn.execute(sa.delete(K).where(doomed))
            # after the delete above, the kept rows are all there are
            orphan = (TR.c.created_at < cutoff) & TR.c.digest.not_in(sa.select(K.c.digest).where(~doomed))
            rep.trials = conn.execute(sa.select(sa.func.count()).select_from(TR).where(orphan)).scalar()
            if not dry_run and rep.trials:
                conn.execute(sa.delete(TR).where(orphan))
        if self.team is not None and not dry_run:
            self.team.pull()
        return rep

    # ----------------------------------------------------------------------------------
    # the index's tables: rules and vetted examples
    def put_rules(self, recs: Iterable[RuleRecord], *, replace_all: bool = False) -> int:
        """Upsert rule rows by id (replace_all: drop rows not given). Returns how many were written."""
        return self._upsert(RuleRow.__table__, [dataclasses.asdict(r) for r in recs], replace_all)

    def put_examples(self, recs: Iterable[ExampleRecord], *, replace_all: bool = False) -> int:
        """Upsert vetted-example rows by id (replace_all: drop rows not given)."""
        return self._upsert(ExampleRow.__table__, [dataclasses.asdict(r) for r in recs], replace_all)

    def rules(self) -> list[RuleRecord]:
        t = RuleRow.__table__
        rows = self._read(lambda conn: conn.execute(sa.select(t).order_by(t.c.id)).all())
        return [RuleRecord(**{f.name: r._mapping[f.name] for f in dataclasses.fields(RuleRecord)}) for r in rows]

    def examples(self) -> list[ExampleRecord]:
        t = ExampleRow.__table__
        rows = self._read(lambda conn: conn.execute(sa.select(t).order_by(t.c.id)).all())
        return [ExampleRecord(**{f.name: r._mapping[f.name] for f in dataclasses.fields(ExampleRecord)}) for r in rows]

    def sync_rules(self, ruleset=None) -> int:
        """Mirror the shipped rules (fact_db.discovery.rules.load_rules()) into the rules table."""
        from fact_db.discovery import rules as rules_mod
        rs = ruleset if ruleset is not None else rules_mod.load_rules()
        recs = [RuleRecord(id=r.id, family=r.family, title=r.title, path=str(r.path),
                           hash=hashlib.sha256(Path(r.path).read_bytes()).hexdigest()[:16],
                           template=str(r.realize.get("template", "")), status=str(r.status)) for r in rs]
        return self.put_rules(recs, replace_all=True)

    def _upsert(self, table: sa.Table, rows: list[dict], replace_all: bool) -> int:
        now = utcnow()
        for r in rows:
            r["updated_at"] = now
        with self._write() as conn:
            lock_keys(conn)
            if replace_all:
                conn.execute(sa.delete(table))
            elif rows:
                ids = [r["id"] for r in rows]
                for i in range(0, len(ids), 500):
                    conn.execute(sa.delete(table).where(table.c.id.in_(ids[i:i + 500])))
            if rows:
                conn.execute(sa.insert(table), rows)
        return len(rows)

    # ----------------------------------------------------------------------------------
    # fixtures and benchmarks
    def bulk_insert(self, recs: Iterable[KernelRecord]) -> int:
        """Insert rows whose keys are not in the registry yet, without merging (fixtures, benchmarks)."""
        return self.bulk_insert_rows(kernel_row(r) for r in recs)

    def bulk_insert_rows(self, rows: Iterable[dict], *, chunk: int = 50000) -> int:
        """Insert rows already in storage form (synthetic_rows' output), unchecked and unmerged.

        DuckDB gets them through a temporary CSV file and one INSERT ... SELECT from read_csv
        (100,000 rows in seconds); other backends through executemany.
        """
        n = 0
        batch: list[dict] = []
        for r in rows:
            batch.append(r)
            if len(batch) >= chunk:
                n += self._insert_rows(batch)
                batch = []
        if batch:
            n += self._insert_rows(batch)
        return n

    def _insert_rows(self, rows: list[dict]) -> int:
        with self._write() as conn:
            insert_rows(conn, K, rows)
        return len(rows)
