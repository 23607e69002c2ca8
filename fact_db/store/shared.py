"""The team registry: a PostgreSQL server that every host shares, read through a local DuckDB cache.

    >>> reg = Registry.open("postgresql+psycopg://factdb@db.lab/factdb")    # or FACTDB_DB=...
    >>> reg.lookup(key)          # the cache first; on a miss the server, and the row is kept in the cache
    >>> reg.put(record)          # merged in the server, then copied into the cache
    >>> reg.sync()               # push what waited in the cache, pull what other hosts added
    SyncReport(pushed=2, pushed_trials=14, pulled=40, removed=0, pending=0)

A server URL opens the server and a cache of it: `$FACTDB_HOME/cache/registry-<hash>.duckdb`
(one file per server, hashed from the URL without its password), `FACTDB_CACHE=<path>` for
another file, `FACTDB_CACHE=off` for none (every call goes to the server).

Lookups answer from the cache when it holds an exact, usable row; otherwise they ask the
server, and the row it returns is kept in the cache. Writes go to the server (merged there,
fact_db.store.merge) and the server's row is copied into the cache. Listing, counting,
exporting, trials and the index read the server, so they see every host's rows.

When the server cannot be reached, fact-db says so once (a ServerOfflineWarning) and keeps
working from the cache: lookups answer from it, and new rows and trials are merged into it
and queued in its `outbox` table. It tries the server again after `retry_s` seconds; when it
answers, the queue is pushed (`factdb registry sync` does the same, and pulls). A push merges
by key and skips trials the server has, so pushing twice (a crash between the server's commit
and the queue's) stores nothing twice. Revalidate, gc and imports of many rows change the
team's registry: they need the server.
"""
from __future__ import annotations

import hashlib
import math
import os
import threading
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import sqlalchemy as sa

from fact_db.core import paths
from fact_db.store.bulk import insert_rows
from fact_db.store.db import Database, RegistryBusy, ServerUnreachable, unreachable
from fact_db.store.lease import Leases
from fact_db.store.merge import delete, merge_into, mirror, stored_records
from fact_db.store.nearest import find as nearest_find
from fact_db.store.records import Current, KernelRecord, MergeResult, utcnow
from fact_db.store.tables import OUTBOX, TR, K

RETRY_S = 30.0     # after the server failed to answer, calls use the cache this long before trying it again
LINGER_S = 2.0     # the cache's connection stays open this long after its last use (see Database)
_WARNED: set[str] = set()


class ServerOfflineWarning(UserWarning):
    """The team registry's server could not be reached; fact-db works from the local cache."""


@dataclass
class SyncReport:
    pushed: int = 0          # kernel rows the server took from the cache's queue
    pushed_trials: int = 0
    pulled: int = 0          # rows copied from the server into the cache (new or changed)
    removed: int = 0         # rows the server no longer has, removed from the cache
    pending: int = 0         # rows and trials still queued (the server went away during the sync)

    def as_dict(self) -> dict:
        return asdict(self)


def cache_path(url: str, cache: str | os.PathLike | bool | None = None) -> Path | None:
    """The cache file of the registry at `url`, or None: a file database, or the cache off
    (`cache` False or "off", else $FACTDB_CACHE, else one file per server under $FACTDB_HOME/cache)."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() not in ("postgresql",):
        return None
    if cache is None:
        cache = os.environ.get("FACTDB_CACHE") or True
    if cache is False or str(cache).lower() in ("off", "none", "0", "false", "no"):
        return None
    if cache is not True:
        return Path(cache).expanduser().resolve()
    ident = u._replace(password=None).render_as_string(hide_password=False)
    return paths.home() / "cache" / f"registry-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.duckdb"


def _rank(found, cur: Current, remote: bool) -> tuple:
    rec, d = found
    return d != 0.0, bool(cur.staleness(rec)), d, rec.time_ms if rec.time_ms is not None else math.inf, not remote


class TeamCache:
    """The server of a team registry, its local cache, and whether the server answers now."""

    def __init__(self, server: Database, cache: Database, *, retry_s: float = RETRY_S):
        self.server = server
        self.cache = cache
        self.retry_s = retry_s
        self.leases = Leases(server)
        self._ready = False
        self._down_until = 0.0
        self._pushing = threading.Lock()

    @classmethod
    def open(cls, url: str, path: Path, timeout: float) -> TeamCache:
        """The cache at `path` (created when new) and the server at `url`, tried now: when it does not
        answer, say so once and carry on from the cache."""
        cache = Database.open(f"duckdb:///{path}", timeout=timeout, linger_s=LINGER_S)
        team = cls(Database(url, timeout), cache)
        try:
            team.on_server(lambda conn: None)
        except ServerUnreachable:
            pass
        except BaseException:
            team.close()
            raise
        return team

    def close(self) -> None:
        self.server.close()
        self.cache.close()

    @property
    def online(self) -> bool:
        """Whether the server answered the last call (or is due to be tried again)."""
        return time.monotonic() >= self._down_until

    def ready(self) -> bool:
        """Whether the server answers (asked only when it has not yet, or is due to be tried again)."""
        if self._ready and self.online:
            return True
        try:
            self.on_server(lambda conn: None)
        except ServerUnreachable:
            return False
        return True

    # ----------------------------------------------------------------------------------
    # the server
    def on_server(self, fn, write: bool = False):
        """fn(conn) in one transaction on the server, preparing it on first contact and pushing the
        queue when it answers again; raises ServerUnreachable (and uses the cache for a while)."""
        if time.monotonic() < self._down_until:
            raise ServerUnreachable(f"the registry server {self.server.where} did not answer {self.retry_s:g} s ago")
        try:
            came_back = not self._ready
            if came_back:
                self.server.prepare()
                self._ready = True
            with self.server.begin(write=write) as conn:
                out = fn(conn)
        except Exception as e:
            if not unreachable(e):
                raise
            self._went_away(e)
            raise ServerUnreachable(f"the registry server {self.server.where} is unreachable") from None
        if came_back and not self._pushing.locked():
            self._push_quietly()
        return out

    def _went_away(self, e: BaseException) -> None:
        self._ready = False
        self._down_until = time.monotonic() + self.retry_s
        if self.server.where not in _WARNED:
            _WARNED.add(self.server.where)
            first = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"the registry server {self.server.where} is unreachable ({first}); working from the local "
                          f"cache {self.cache.where}: lookups answer from it, and new rows wait there until the "
                          "server is back (`factdb registry sync` pushes them)", ServerOfflineWarning, stacklevel=4)

    def _push_quietly(self) -> None:
        try:
            if self.pending():
                self.push(Current())
        except (ServerUnreachable, RegistryBusy):
            pass   # tried again at the next contact, or by `registry sync`

    def read(self, fn):
        """fn(conn) on the server when it answers, else on the cache."""
        try:
            return self.on_server(fn)
        except ServerUnreachable:
            with self.cache.begin(write=False) as conn:
                return fn(conn)

    @contextmanager
    def transaction(self, write: bool = False):
        """A transaction on the server when it answers (writes: only there), else, to read, on the cache."""
        with ExitStack() as stack:
            conn = None
            if time.monotonic() >= self._down_until:
                try:
                    if not self._ready:
                        self.server.prepare()
                        self._ready = True
                    conn = stack.enter_context(self.server.begin(write=write))
                except Exception as e:
                    if not unreachable(e):
                        raise
                    self._went_away(e)
            if conn is None:
                if write:
                    raise ServerUnreachable(f"the registry server {self.server.where} is unreachable, and this "
                                            "changes the team's registry: run it again when the server is back")
                conn = stack.enter_context(self.cache.begin(write=False))
            yield conn

    def require(self, what: str) -> None:
        """Raise ServerUnreachable, saying `what` needs the server, unless it answers."""
        if not self.ready():
            raise ServerUnreachable(f"the registry server {self.server.where} is unreachable, and {what} changes the "
                                    "team's registry: run it again when the server is back")

    # ----------------------------------------------------------------------------------
    # kernel rows
    def find(self, key, cur: Current, max_distance: float | None, nearest: bool):
        """(record, distance) for `key`: an exact, usable row of the cache, else the better of the
        cache's and the server's answers (the server's row is kept in the cache)."""
        with self.cache.begin(write=False) as conn:
            exact = nearest_find(conn, key, cur, None, nearest=False)
            if exact is not None and not cur.staleness(exact[0]):
                return exact
            local = nearest_find(conn, key, cur, max_distance, nearest=nearest) if nearest and key.SHAPE else exact
        try:
            remote = self.on_server(lambda c: nearest_find(c, key, cur, max_distance, nearest=nearest))
        except ServerUnreachable:
            return local
        if remote is None:
            return local
        self.keep([remote[0]])
        if local is None:
            return remote
        return min((local, False), (remote, True), key=lambda x: _rank(x[0], cur, x[1]))[0]

    def get(self, digest: str) -> KernelRecord | None:
        with self.cache.begin(write=False) as conn:
            found = stored_records(conn, [digest]).get(digest)
        if found is not None:
            return found
        try:
            found = self.on_server(lambda c: stored_records(c, [digest]).get(digest))
        except ServerUnreachable:
            return None
        if found is not None:
            self.keep([found])
        return found

    def put_many(self, recs: list[KernelRecord], cur: Current) -> MergeResult:
        digests = sorted({r.digest for r in recs})

        def on_server(conn):
            return merge_into(conn, recs, cur), stored_records(conn, digests)
        try:
            res, rows = self.on_server(on_server, write=True)
        except ServerUnreachable:
            with self.cache.begin() as conn:
                res = merge_into(conn, recs, cur)
                _queue(conn, "kernel", digests)
            return res
        self.keep(list(rows.values()))
        return res

    def add_trials(self, rows: list[dict]) -> None:
        try:
            self.on_server(lambda conn: insert_rows(conn, TR, rows), write=True)
        except ServerUnreachable:
            with self.cache.begin() as conn:
                insert_rows(conn, TR, rows)
                _queue(conn, "trial", [r["id"] for r in rows])
            return
        try:   # a copy for failed_configs and trials() while the server is away
            with self.cache.begin() as conn:
                insert_rows(conn, TR, rows)
        except RegistryBusy:
            pass

    def keep(self, recs: list[KernelRecord]) -> None:
        """Copy server rows into the cache, except over rows queued for the server. Best effort:
        a cache that another process holds for longer than the timeout is left as it is."""
        if not recs:
            return
        try:
            with self.cache.begin() as conn:
                queued = _queued(conn, "kernel")
                mirror(conn, [r for r in recs if r.digest not in queued])
        except RegistryBusy:
            pass

    # ----------------------------------------------------------------------------------
    # the queue, push, pull
    def pending(self) -> dict[str, int]:
        """{"kernel": n, "trial": m}: what the cache holds for the server."""
        with self.cache.begin(write=False) as conn:
            rows = conn.execute(sa.select(OUTBOX.c.kind, sa.func.count()).group_by(OUTBOX.c.kind)).all()
        return {k: n for k, n in rows}

    def push(self, cur: Current) -> tuple[int, int]:
        """Send what the cache queued to the server (kernel rows merged, trials it lacks inserted),
        then take the server's rows back and empty the queue. (kernel rows, trials) pushed."""
        with self._pushing:
            with self.cache.begin(write=False) as conn:
                digests = sorted(_queued(conn, "kernel"))
                trial_ids = sorted(_queued(conn, "trial"))
                kernels = stored_records(conn, digests)
                trials = []
                for i in range(0, len(trial_ids), 500):
                    trials += [dict(r._mapping) for r in
                               conn.execute(sa.select(TR).where(TR.c.id.in_(trial_ids[i:i + 500])))]
            if not digests and not trial_ids:
                return 0, 0

            def on_server(conn):
                if kernels:
                    merge_into(conn, list(kernels.values()), cur)
                have = set()
                ids = [t["id"] for t in trials]
                for i in range(0, len(ids), 500):
                    have |= {r[0] for r in conn.execute(sa.select(TR.c.id).where(TR.c.id.in_(ids[i:i + 500])))}
                new = [t for t in trials if t["id"] not in have]
                insert_rows(conn, TR, new)
                return stored_records(conn, digests), len(new)
            rows, n_trials = self.on_server(on_server, write=True)
            with self.cache.begin() as conn:
                mirror(conn, list(rows.values()))
                _dequeue(conn, "kernel", digests)
                _dequeue(conn, "trial", trial_ids)
            return len(kernels), n_trials

    def pull(self) -> tuple[int, int]:
        """Make the cache hold what the server holds (rows queued for the server aside): copy new and
        changed rows, drop rows the server no longer has. (copied, removed)."""
        there = self.on_server(lambda c: dict(c.execute(sa.select(K.c.digest, K.c.updated_at)).all()))
        with self.cache.begin(write=False) as conn:
            here = dict(conn.execute(sa.select(K.c.digest, K.c.updated_at)).all())
            queued = _queued(conn, "kernel")
        fetch = sorted(d for d, at in there.items() if here.get(d) != at and d not in queued)
        gone = sorted(d for d in here if d not in there and d not in queued)
        copied = 0
        for i in range(0, len(fetch), 5000):
            rows = self.on_server(lambda c: stored_records(c, fetch[i:i + 5000]))
            with self.cache.begin() as conn:
                mirror(conn, list(rows.values()))
            copied += len(rows)
        if gone:
            with self.cache.begin() as conn:
                delete(conn, gone)
        return copied, len(gone)

    def sync(self, cur: Current) -> SyncReport:
        """push, then pull; raises ServerUnreachable when the server does not answer."""
        self._down_until = 0.0   # asked for: try the server now
        rep = SyncReport()
        rep.pushed, rep.pushed_trials = self.push(cur)
        rep.pulled, rep.removed = self.pull()
        rep.pending = sum(self.pending().values())
        return rep

    def status(self) -> dict:
        """The server (its URL masked), whether it answers, its rows and leases; the cache, its rows
        and what it queued for the server."""
        self._down_until = 0.0
        out = {"server": self.server.where, "cache": self.cache.where, "reachable": False, "error": ""}
        try:
            out["server_kernels"] = self.on_server(lambda c: c.execute(sa.select(sa.func.count()).select_from(K))
                                                   .scalar())
            out["reachable"] = True
            out["leases"] = self.leases.held()
        except ServerUnreachable as e:
            out["error"] = str(e)
        with self.cache.begin(write=False) as conn:
            out["cache_kernels"] = conn.execute(sa.select(sa.func.count()).select_from(K)).scalar()
        pend = self.pending()
        out["pending_kernels"], out["pending_trials"] = pend.get("kernel", 0), pend.get("trial", 0)
        return out


def _queued(conn: sa.Connection, kind: str) -> set[str]:
    return {r[0] for r in conn.execute(sa.select(OUTBOX.c.id).where(OUTBOX.c.kind == kind))}


def _queue(conn: sa.Connection, kind: str, ids: list[str]) -> None:
    new = sorted(set(ids) - _queued(conn, kind))
    if new:
        now = utcnow()
        conn.execute(sa.insert(OUTBOX), [{"kind": kind, "id": i, "queued_at": now} for i in new])


def _dequeue(conn: sa.Connection, kind: str, ids: list[str]) -> None:
    for i in range(0, len(ids), 500):
        conn.execute(sa.delete(OUTBOX).where(OUTBOX.c.kind == kind, OUTBOX.c.id.in_(ids[i:i + 500])))
