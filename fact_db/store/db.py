"""The fact-db database: where it is, opening it safely, locking, and numbered migrations.

One file holds the registry (tables `factdb_meta`, `kernels`, `trials`, `rules`, `examples`,
`leases`, `outbox`; fact_db.store.migrations creates and upgrades them) and the index (tables
named `index_*`, owned by fact_db.store.index; the checks and migrations here tolerate them and
never touch them).

    >>> db = Database.open("memory")             # or None: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb
    >>> with db.begin() as conn:                 # a short transaction on a short connection
    ...     conn.execute(sa.text("select count(*) from kernels")).scalar()

DuckDB lets one process at a time open a file for writing, and no other process can
open it at all meanwhile. So a connection lives for one transaction only, and opening
retries with backoff while another process holds the file, up to `timeout` seconds
(`FACTDB_DB_TIMEOUT`, default 30), then raises RegistryBusy naming the holder.

A server database (PostgreSQL: `postgresql+psycopg://user@host/db`) keeps a small pool of
connections instead, checked before each use. Two hosts opening a new or older database at
once take turns on an advisory lock, so the migrations run once; writers of the same keys
take turns the same way (lock_keys). A server that cannot be reached raises
ServerUnreachable (unreachable() tells such an error from others); its URL is shown with
the password masked (`where`).

A file that is not a fact-db database (other bytes, a SQLite file, a DuckDB file with
other tables, a newer schema) is refused before anything opens it for writing. DuckDB
is never handed a file whose header is not DuckDB's, because it would try to download
an extension to read a SQLite one.
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool, StaticPool

from fact_db.core import paths
from fact_db.store.errors import RegistryError
from fact_db.store.migrations import MIGRATIONS, SCHEMA_VERSION

# the tables a registry of any schema may hold (schema 4's per-family tables too: such a file is
# ours, and migrating); MIGRATIONS and SCHEMA_VERSION are fact_db.store.migrations'
REGISTRY_TABLES = ("factdb_meta", "kernels", "trials", "rules", "examples", "attention_kernels", "norm_kernels",
                   "region_kernels", "leases", "outbox", "kernel_binaries")
INDEX_PREFIX = "index_"
DEFAULT_TIMEOUT_S = 30.0

_DUCKDB_MAGIC = b"DUCK"          # bytes 8..12 of every DuckDB database file
_SQLITE_MAGIC = b"SQLite format 3\x00"
_BUSY = re.compile(r"could not set lock|conflicting lock|database is locked|database table is locked", re.IGNORECASE)
_PID = re.compile(r"\(PID (\d+)\)")
_IN_PROCESS = "in-process read-only connection"


_WRITE_LOCKS: dict = {}
_LOCKS_GUARD = threading.Lock()
_NOLOCK = nullcontext()


class RegistryBusy(RegistryError):
    """Another process held the database for longer than the timeout."""


class NotARegistry(RegistryError):
    """The file is not a fact-db database (or has a newer schema); it was left untouched."""


class ServerUnreachable(RegistryError):
    """The registry's server could not be reached (down, or the network between)."""


SERVER_BACKENDS = ("postgresql",)
CONNECT_TIMEOUT_S = 5   # a server that does not answer within this is unreachable (the URL's connect_timeout wins)
# pg_advisory_xact_lock(namespace, key): namespace "FACT" (0x46414354), keys apart from other users of the server's
# advisory locks; (LOCK_NS, 0) serializes migrations and bulk writes, (LOCK_NS + 1, k) the writers of one key.
LOCK_NS = 0x46414354
_BULK_KEYS = 64
# SQLSTATEs of a lost or refused connection: class 08, and the server shutting down or starting up
_GONE_STATES = ("57P01", "57P02", "57P03")


def unreachable(e: BaseException) -> bool:
    """Whether `e` says the server cannot be reached (connection refused, lost, server shutting down),
    as opposed to a fault in what was asked."""
    if isinstance(e, ServerUnreachable):
        return True
    if not isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return False
    if getattr(e, "connection_invalidated", False):
        return True
    state = getattr(getattr(e, "orig", None), "sqlstate", None)
    return state is None or state.startswith("08") or state in _GONE_STATES


def lock_keys(conn: sa.Connection, digests=None) -> None:
    """On a server database, make this transaction the only writer of these keys (all keys when
    `digests` is None or many) until it ends. File databases need nothing: their file lock
    already admits one writer."""
    if conn.dialect.name not in SERVER_BACKENDS:
        return
    digests = sorted(set(digests)) if digests is not None else None
    if digests is None or len(digests) > _BULK_KEYS:
        conn.execute(sa.text("select pg_advisory_xact_lock(:ns, 0)"), {"ns": LOCK_NS})
        return
    conn.execute(sa.text("select pg_advisory_xact_lock_shared(:ns, 0)"), {"ns": LOCK_NS})
    for d in digests:   # in sorted order: two writers of overlapping sets never deadlock
        conn.execute(sa.text("select pg_advisory_xact_lock(:ns, :k)"),
                     {"ns": LOCK_NS + 1, "k": int(d[:8], 16) - 2 ** 31})


resolve_url = paths.registry_url   # (in paths, so that the lean reader resolves it alike without SQLAlchemy)


def resolve_timeout(timeout: float | None = None) -> float:
    if timeout is not None:
        return float(timeout)
    env = os.environ.get("FACTDB_DB_TIMEOUT")
    if not env:
        return DEFAULT_TIMEOUT_S
    try:
        return float(env)
    except ValueError:
        raise RegistryError(f"FACTDB_DB_TIMEOUT={env!r} is not a number of seconds; set it to e.g. 60") from None


def connect_duckdb(path: str | os.PathLike, *, read_only: bool = False, timeout: float | None = None):
    """A raw duckdb connection to `path`, retrying while another process holds the file.

    It uses DuckDB's default configuration, as the registry's own connections do: DuckDB
    refuses a second connection to a file in the same process whose configuration differs
    (a `config=` dict, or read_only against read-write), so code sharing the file (the
    index) should open it through here, or with plain duckdb.connect(path).
    """
    import duckdb
    deadline = time.monotonic() + resolve_timeout(timeout)
    delay = 0.002
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as e:
            if not _BUSY.search(str(e)):
                raise
            if time.monotonic() >= deadline:
                raise _busy_error(str(path), str(e), resolve_timeout(timeout)) from None
            delay = _sleep(delay, deadline)


def _sleep(delay: float, deadline: float) -> float:
    time.sleep(max(0.0, min(delay * random.uniform(0.5, 1.5), deadline - time.monotonic())))
    return min(delay * 2, 0.05)


def _busy_error(where: str, message: str, timeout: float) -> RegistryBusy:
    m = _PID.search(message)
    holder = (f"process {m.group(1)} holds it" if m else
              "a read-only connection in this process holds it" if message == _IN_PROCESS else
              "another process holds it")
    return RegistryBusy(f"registry {where} is busy: {holder} and it stayed locked for {timeout:g} s; wait for that "
                        f"process to finish, or allow longer with FACTDB_DB_TIMEOUT=<seconds> "
                        f"(Registry.open(timeout=...))")


# --------------------------------------------------------------------------------------
def _table_names(conn: sa.Connection) -> set[str]:
    if conn.dialect.name == "sqlite":
        q = "select name from sqlite_master where type in ('table', 'view')"
    elif conn.dialect.name == "duckdb":
        q = "select table_name from duckdb_tables() where database_name = current_database() " \
            "and schema_name = current_schema() union all select view_name from duckdb_views() " \
            "where not internal and database_name = current_database() and schema_name = current_schema()"
    else:
        return set(sa.inspect(conn).get_table_names()) | set(sa.inspect(conn).get_view_names())
    return {r[0] for r in conn.exec_driver_sql(q)}


def _other_objects(conn: sa.Connection) -> list[str]:
    """Objects a database without factdb_meta holds outside the current schema's tables: tables
    and views in other schemas, sequences, macros, types, indexes, triggers. Any of them
    makes it someone else's file, not a new registry."""
    if conn.dialect.name == "duckdb":
        q = ("select 'table ' || schema_name || '.' || table_name from duckdb_tables() "
             "where database_name = current_database() "
             "union all select 'view ' || schema_name || '.' || view_name from duckdb_views() "
             "where not internal and database_name = current_database() "
             "union all select 'sequence ' || sequence_name from duckdb_sequences() "
             "where database_name = current_database() "
             "union all select 'macro ' || function_name from duckdb_functions() "
             "where not internal and database_name = current_database() "
             "union all select 'schema ' || schema_name from duckdb_schemas() "
             "where not internal and database_name = current_database() and schema_name <> 'main' "
             "union all select 'type ' || type_name from duckdb_types() "
             "where not internal and database_name = current_database()")
    elif conn.dialect.name == "sqlite":
        q = "select type || ' ' || name from sqlite_master"
    else:
        return []
    found = {r[0] for r in conn.exec_driver_sql(q)}
    return sorted(x for x in found if not x.split(" ", 1)[1].split(".")[-1].startswith(INDEX_PREFIX))


def read_meta(conn: sa.Connection) -> dict[str, str]:
    return {k: v for k, v in conn.exec_driver_sql("select key, value from factdb_meta")}


def write_meta(conn: sa.Connection, **values) -> None:
    t = sa.table("factdb_meta", sa.column("key"), sa.column("value"))
    lock_keys(conn)   # two hosts writing one meta key would both insert it
    for k, v in values.items():
        conn.execute(sa.delete(t).where(t.c.key == k))
        conn.execute(sa.insert(t).values(key=k, value=str(v)))


class Database:
    """An opened, checked and migrated fact-db database. Connections are per transaction.

    `linger_s` > 0 (a DuckDB file that one process uses in bursts: the team registry's local
    cache) keeps the connection open between transactions until it has been idle that long,
    so a burst of lookups costs one open, not one each; other processes wait at most that long.
    """

    def __init__(self, url: str, timeout: float, *, linger_s: float = 0.0):
        self.url = url
        self.timeout = timeout
        u = sa.engine.make_url(url)
        self.backend = u.get_backend_name()
        self.server = self.backend in SERVER_BACKENDS
        self.memory = u.database in (None, "", ":memory:") and not self.server
        self.path: Path | None = None
        if self.backend in ("duckdb", "sqlite") and not self.memory:
            self.path = Path(u.database).expanduser()
        self.where = str(self.path) if self.path else u.render_as_string(hide_password=True)
        self.meta: dict[str, str] = {}
        self._pinned: tuple[sa.Connection, bool] | None = None
        self.linger_s = linger_s if self.path is not None else 0.0
        self._held: sa.Connection | None = None
        self._last_use = 0.0
        self._closer: threading.Thread | None = None
        # writers in this process take turns (DuckDB's file lock only separates processes)
        with _LOCKS_GUARD:
            self._wlock = _WRITE_LOCKS.setdefault(self.where if self.path else id(self), threading.RLock())
        self._engine, self._ro_engine = self._make_engines(u)

    # ----------------------------------------------------------------------------------
    def _make_engines(self, u):
        if self.backend == "duckdb":
            import duckdb
            from duckdb_engine import ConnectionWrapper
            if self.memory:
                raw = duckdb.connect(":memory:")
                eng = sa.create_engine("duckdb://", creator=lambda: ConnectionWrapper(raw), poolclass=StaticPool)
                return eng, eng
            path = str(self.path)
            # no reset-on-return: the connection is closed right after, and every write commits
            rw = sa.create_engine("duckdb://", creator=lambda: ConnectionWrapper(duckdb.connect(path)),
                                  poolclass=NullPool, pool_reset_on_return=None)
            ro = sa.create_engine("duckdb://", creator=lambda: ConnectionWrapper(duckdb.connect(path, read_only=True)),
                                  poolclass=NullPool, pool_reset_on_return=None)
            return rw, ro
        if self.backend == "sqlite":
            eng = sa.create_engine(u, poolclass=StaticPool if self.memory else NullPool,
                                   connect_args={"timeout": self.timeout, "check_same_thread": False})

            @sa.event.listens_for(eng, "connect")
            def _autocommit_driver(dbapi_conn, _record):
                dbapi_conn.isolation_level = None  # SQLAlchemy's recipe: we issue BEGIN ourselves

            @sa.event.listens_for(eng, "begin")
            def _begin(conn):
                conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("factdb_write") else "BEGIN")
            return eng, eng
        if self.server:
            args = {} if "connect_timeout" in u.query else {"connect_timeout": CONNECT_TIMEOUT_S}
            # a few pooled connections, each checked before use: one lost to a server restart is replaced
            eng = sa.create_engine(u, pool_size=2, max_overflow=6, pool_pre_ping=True, connect_args=args)
            return eng, eng
        eng = sa.create_engine(u, poolclass=NullPool)
        return eng, eng

    @classmethod
    def open(cls, url: str | None = None, *, timeout: float | None = None, linger_s: float = 0.0) -> Database:
        """Open (creating and migrating when new) the database at `url`; see resolve_url."""
        db = cls(resolve_url(url), resolve_timeout(timeout), linger_s=linger_s)
        try:
            db.prepare()
        except BaseException:
            db.close()
            raise
        return db

    def prepare(self) -> None:
        """Check the database and create or migrate it when new or older (what open() does;
        the team registry calls it when its server first answers)."""
        self._check_file()
        state = self._inspect(write=False) if not self._absent() else ("new", {})
        if state[0] != "current":
            with self.begin(write=True) as conn:
                if self.server:   # a second host migrating at once waits here, then finds it done
                    conn.execute(sa.text("select pg_advisory_xact_lock(:ns, 0)"), {"ns": LOCK_NS})
                state = self._inspect_conn(conn)
                if state[0] in ("new", "old"):
                    self._migrate(conn, state[1])
                    state = ("current", read_meta(conn))
        self.meta = state[1]

    def _absent(self) -> bool:
        return self.path is not None and (not self.path.exists() or self.path.stat().st_size == 0)  # sqlite: 0 is new

    def _check_file(self) -> None:
        """Refuse, by its header and before any database library opens it, a file of another kind."""
        if self.path is None:
            return
        p = self.path
        if p.is_dir():
            raise NotARegistry(f"{p} is a directory, not a fact-db database: point --db/FACTDB_DB at a file")
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            return
        if p.stat().st_size == 0 and self.backend == "duckdb":
            raise NotARegistry(f"{p} is an empty file, which DuckDB cannot open as a database; it was left "
                               "untouched: delete it, or point --db/FACTDB_DB at a new file name")
        with open(p, "rb") as f:
            head = f.read(16)
        if self.backend == "duckdb":
            if head.startswith(_SQLITE_MAGIC):
                raise NotARegistry(f"{p} is a SQLite file, not a fact-db DuckDB database: point --db/FACTDB_DB at a "
                                   f".duckdb file, or at sqlite:///{p} if it is a fact-db SQLite registry")
            if head[8:12] != _DUCKDB_MAGIC:
                raise NotARegistry(f"{p} is not a DuckDB database (its header is not DuckDB's); it was left untouched: "
                                   "point --db/FACTDB_DB at a fact-db database or at a new file name")
        elif self.backend == "sqlite" and head and not head.startswith(_SQLITE_MAGIC):
            raise NotARegistry(f"{p} is not a SQLite database; it was left untouched: point --db/FACTDB_DB at a "
                               "fact-db database or at a new file name")

    def _inspect(self, write: bool):
        with self.begin(write=write) as conn:
            return self._inspect_conn(conn)

    def _inspect_conn(self, conn: sa.Connection):
        """('new'|'old'|'current', meta); raises NotARegistry for a foreign or newer database."""
        names = _table_names(conn)
        ours = {n for n in names if n in REGISTRY_TABLES}
        foreign = sorted(n for n in names if n not in REGISTRY_TABLES and not n.startswith(INDEX_PREFIX))
        if "factdb_meta" not in names:
            if not ours and not foreign:
                foreign = _other_objects(conn)
            if ours or foreign:
                shown = ", ".join(sorted(ours) + foreign)
                shown = shown if len(shown) <= 200 else shown[:197] + "..."
                fix = ("point --db/FACTDB_DB at an empty database, or give fact-db a schema of its own (see "
                       "docs/registry.md, Team registry)" if self.server else
                       "point --db/FACTDB_DB at a fact-db database or at a new file name")
                raise NotARegistry(f"{self.where} holds objects that fact-db did not create ({shown}) and no "
                                   f"factdb_meta table, so it is not a fact-db database; it was left untouched: {fix}")
            return "new", {}
        meta = read_meta(conn)
        try:
            version = int(meta["schema_version"])
        except (KeyError, ValueError):
            raise NotARegistry(f"{self.where} has a factdb_meta table without a valid schema_version "
                               f"({meta.get('schema_version')!r}); it was left untouched: point --db/FACTDB_DB at "
                               "another file, or restore this one from a backup") from None
        if version > SCHEMA_VERSION:
            raise NotARegistry(f"{self.where} has registry schema version {version}, newer than this fact-db "
                               f"understands ({SCHEMA_VERSION}); it was left untouched: upgrade fact-db, or point "
                               "--db/FACTDB_DB at another file")
        return ("old" if version < SCHEMA_VERSION else "current"), meta

    def _migrate(self, conn: sa.Connection, meta: dict) -> None:
        from fact_db import __version__
        have = int(meta.get("schema_version", 0))
        for version, name, fn in MIGRATIONS:
            if version > have:
                fn(conn)
                write_meta(conn, schema_version=version, last_migration=name)
        if not have:
            write_meta(conn, created_by=f"fact-db {__version__}",
                       created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    # ----------------------------------------------------------------------------------
    @contextmanager
    def begin(self, write: bool = True):
        """One transaction on a fresh connection, closed afterwards (so the file lock is released).

        Reads of a DuckDB file use a read-only connection, which other readers can share,
        and no explicit transaction (each read is one statement). Inside pinned(), the
        pinned connection is reused instead.
        """
        if self._pinned is not None:
            yield from self._begin_pinned(write)
            return
        if self.linger_s:
            yield from self._begin_held(write)
            return
        with self._wlock if write else _NOLOCK:
            conn = self._connect(write)  # with a transaction begun when writing
            try:
                yield conn
                if write:
                    conn.commit()
            except BaseException:
                if conn.in_transaction():
                    conn.rollback()
                raise
            finally:
                conn.close()

    def _begin_pinned(self, write: bool):
        conn, pin_write = self._pinned
        if write and not pin_write:
            raise RegistryError("cannot write to the registry inside pinned(write=False); pin with write=True "
                                "or write after the with-block")
        if not write:
            yield conn
            return
        if conn.in_transaction():
            conn.commit()
        conn.begin()
        try:
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def _begin_held(self, write: bool):
        """A transaction on the lingering connection (opened when none is held), one at a time."""
        with self._wlock:
            if self._held is None:
                self._held = self._connect(True)
                self._held.commit()
            conn = self._held
            try:
                if conn.in_transaction():
                    conn.commit()
                conn.begin()
                yield conn
                conn.commit()
            except BaseException:
                self._held = None
                try:
                    conn.close()   # rolls back; a connection in an unknown state is not kept
                except Exception:  # noqa: BLE001  (closing a broken connection: nothing more to do)
                    pass
                raise
            finally:
                self._last_use = time.monotonic()
                if self._held is not None and (self._closer is None or not self._closer.is_alive()):
                    self._closer = threading.Thread(target=self._close_idle, name="factdb-linger", daemon=True)
                    self._closer.start()

    def _close_idle(self) -> None:
        while True:
            time.sleep(self.linger_s / 4)
            with self._wlock:
                if self._held is None:
                    return
                if time.monotonic() - self._last_use >= self.linger_s:
                    self._held.close()
                    self._held = None
                    return

    @contextmanager
    def pinned(self, write: bool = False):
        """Hold one connection for a batch of operations (many lookups, many writes), then close it.

        Faster (no reopening, warm caches), but while it is held no other process can
        write the DuckDB file (write=True: nor read it); keep the block short.
        """
        if self._pinned is not None:
            if write and not self._pinned[1]:
                raise RegistryError("cannot pin the registry for writing inside a read-only pinned() block")
            yield
            return
        with self._wlock if write else _NOLOCK:
            conn = self._connect(write)
            self._pinned = (conn, write)
            try:
                yield
                if conn.in_transaction():
                    conn.commit()
            finally:
                self._pinned = None
                conn.close()

    def _connect(self, write: bool) -> sa.Connection:
        """A connection (in a transaction when `write`), retrying with backoff while another
        process holds the file, up to the timeout."""
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        engine = self._engine if write else self._ro_engine
        while True:
            conn = None
            try:
                conn = engine.connect()
                if write:
                    conn = conn.execution_options(factdb_write=True)
                    conn.begin()  # sqlite: BEGIN IMMEDIATE, where it reports a busy lock (not at connect)
                return conn
            except sa.exc.DBAPIError as e:
                if conn is not None:
                    conn.close()
                msg = str(e.orig) if e.orig is not None else str(e)
                if "different configuration" in msg:
                    # DuckDB: another connection in this process holds the file in the other mode
                    if engine is not self._engine:
                        engine = self._engine  # it is read-write: read through a read-write connection too
                        continue
                    msg = _IN_PROCESS  # a read-only one: wait for it to close
                elif not _BUSY.search(msg):
                    raise self._wrap(e) from None
                if time.monotonic() >= deadline:
                    raise _busy_error(self.where, msg, self.timeout) from None
                delay = _sleep(delay, deadline)

    def _wrap(self, e: sa.exc.DBAPIError) -> RegistryError:
        first = (str(e.orig) if e.orig is not None else str(e)).strip().splitlines()[0]
        if self.server and unreachable(e):
            return ServerUnreachable(f"cannot reach the registry server {self.where}: {first}; check that the server "
                                     "is up and the URL's host, port and credentials (--db/FACTDB_DB, PGPASSWORD, "
                                     "~/.pgpass or PGSERVICE)")
        if self.server:
            return RegistryError(f"the registry server {self.where} refused: {first}; check the URL's database and "
                                 "user and the user's grants (docs/registry.md, Team registry)")
        return RegistryError(f"cannot open the registry {self.where}: {first}; check the file and its permissions, "
                             "or point --db/FACTDB_DB elsewhere")

    def close(self) -> None:
        with self._wlock:
            if self._held is not None:
                self._held.close()
                self._held = None
        for eng in {id(self._engine): self._engine, id(self._ro_engine): self._ro_engine}.values():
            eng.dispose()
