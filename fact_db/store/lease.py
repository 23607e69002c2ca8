"""Claims on workloads: a host tuning a workload holds a lease on it in the team's server, so two
hosts never tune the same workload at once.

    >>> leases = Leases(server_db)                      # one per process and server
    >>> with leases.claim(key) as c:                    # waits while another host holds it
    ...     if c.coordinated:
    ...         hit = registry.lookup(key)              # that host may have stored it meanwhile
    >>> with leases.claim(key, wait=False) as c:        # or: not now, take another workload first
    ...     c.held
    False

A lease is a row of `leases` keyed by the workload's digest: its holder (`host:pid:nonce`),
and an expiry in the server's clock (never a host's, which may be off). Taking one is one
short transaction: the row is read `FOR UPDATE`, then inserted, or taken over when it has
expired, or left to its live holder. While a process holds leases, a thread renews them every
third of their time to live, so a long tuning run keeps its claim and a killed process (SIGKILL,
a lost host) lets go within one TTL (`FACTDB_LEASE_TTL` seconds, default 120). Leaving the block
deletes the row. Claims are re-entrant within a process (the realizer claims a region, the
tuner inside claims its workload again). On a file database (one host) a claim is a no-op.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from fact_db.store.db import Database, RegistryError, ServerUnreachable, unreachable
from fact_db.store.keys import Key, canonical_json

DEFAULT_TTL_S = 120.0
POLL_S = 0.25


def ttl_s(ttl: float | None = None) -> float:
    """`ttl`, else $FACTDB_LEASE_TTL, else DEFAULT_TTL_S."""
    if ttl is not None:
        return float(ttl)
    env = os.environ.get("FACTDB_LEASE_TTL")
    if not env:
        return DEFAULT_TTL_S
    try:
        value = float(env)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise RegistryError(f"FACTDB_LEASE_TTL={env!r} is not a positive number of seconds; set it to e.g. 120")
    return value


@dataclass
class Claim:
    """What claim() got: `held` (this process holds the lease; False only with wait=False, while
    another host holds it), `coordinated` (a lease in a server; False on a file database or with
    the server unreachable, where nothing is shared), how long it waited for another holder, and
    whose expired lease it took over."""

    key: Key
    held: bool
    coordinated: bool
    waited_s: float = 0.0
    took_over: str = ""
    holder: str = ""     # with held False: who holds it

    def notes(self) -> list[str]:
        """What a report should say about this claim: a wait for another host, or a lease taken over."""
        out = []
        if self.took_over:
            out.append(f"took over the lease of {self.took_over}, which expired: that host stopped tuning this "
                       "workload")
        elif self.waited_s:
            out.append(f"waited {self.waited_s:.1f} s while another host tuned this workload")
        return out


class Leases:
    """Leases held by this process in one server database."""

    def __init__(self, db: Database, ttl: float | None = None, holder: str | None = None):
        self.db = db
        self.ttl = ttl_s(ttl)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._mine: dict[str, int] = {}     # digest -> nesting depth
        self._lock = threading.Lock()
        self._beat: threading.Thread | None = None

    # ----------------------------------------------------------------------------------
    def try_take(self, key: Key) -> tuple[bool, str, str]:
        """(taken, live holder if not, expired holder taken over); one short transaction."""
        d = key.digest()
        host, pid = socket.gethostname(), os.getpid()
        params = {"d": d, "f": key.FAMILY, "k": canonical_json(key.as_dict()), "h": self.holder, "host": host,
                  "pid": pid, "ttl": self.ttl}
        with self.db.begin() as conn:
            row = conn.execute(sa.text("select holder, expires_at < clock_timestamp() as expired from leases "
                                       "where digest = :d for update"), {"d": d}).first()
            if row is None:
                n = conn.execute(sa.text(
                    "insert into leases (digest, family, key, holder, host, pid, taken_at, expires_at) values "
                    "(:d, :f, :k, :h, :host, :pid, clock_timestamp(), clock_timestamp() + make_interval(secs => :ttl)) "
                    "on conflict (digest) do nothing"), params).rowcount
                return (True, "", "") if n == 1 else (False, "another host", "")
            if row.holder != self.holder and not row.expired:
                return False, row.holder, ""
            conn.execute(sa.text(
                "update leases set holder = :h, host = :host, pid = :pid, family = :f, key = :k, "
                "taken_at = clock_timestamp(), expires_at = clock_timestamp() + make_interval(secs => :ttl) "
                "where digest = :d"), params)
            return True, "", row.holder if row.holder != self.holder else ""

    def release(self, key: Key) -> None:
        try:
            with self.db.begin() as conn:
                conn.execute(sa.text("delete from leases where digest = :d and holder = :h"),
                             {"d": key.digest(), "h": self.holder})
        except Exception as e:
            if not unreachable(e):
                raise   # unreachable: the lease expires by itself

    def renew(self) -> int:
        """Extend every lease this process holds by one TTL; how many there were."""
        with self.db.begin() as conn:
            return conn.execute(sa.text("update leases set expires_at = clock_timestamp() + make_interval(secs => :t) "
                                        "where holder = :h"), {"t": self.ttl, "h": self.holder}).rowcount

    def held(self) -> list[dict]:
        """Every lease in the server now: digest, family, key, holder, host, pid, seconds left."""
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.text(
                "select digest, family, key, holder, host, pid, "
                "extract(epoch from expires_at - clock_timestamp()) as left_s from leases order by taken_at")).all()
        return [{**r._asdict(), "left_s": round(float(r.left_s), 1)} for r in rows]

    # ----------------------------------------------------------------------------------
    @contextmanager
    def claim(self, key: Key, *, wait: bool = True, poll_s: float = POLL_S):
        """Hold the lease on `key` for the block (see the module docstring); yields a Claim."""
        d = key.digest()
        with self._lock:
            if d in self._mine:
                self._mine[d] += 1
                nested = True
            else:
                nested = False
        if nested:
            try:
                yield Claim(key, True, True)
            finally:
                with self._lock:
                    self._mine[d] -= 1
            return
        t0, tries = time.monotonic(), 0
        while True:
            try:
                taken, holder, took_over = self.try_take(key)
            except Exception as e:
                if not unreachable(e):
                    raise
                yield Claim(key, True, False)   # the server went away: nothing to coordinate with
                return
            tries += 1
            if taken or not wait:
                break
            time.sleep(poll_s)
        claim = Claim(key, taken, True, round(time.monotonic() - t0, 3) if tries > 1 else 0.0, took_over, holder)
        if not taken:
            yield claim
            return
        with self._lock:
            self._mine[d] = 1
            self._start_beat()
        try:
            yield claim
        finally:
            with self._lock:
                self._mine.pop(d, None)
            self.release(key)

    def _start_beat(self) -> None:
        if self._beat is None or not self._beat.is_alive():
            self._beat = threading.Thread(target=self._heartbeat, name="factdb-lease", daemon=True)
            self._beat.start()

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.ttl / 3)
            with self._lock:
                if not self._mine:
                    return
            try:
                self.renew()
            except Exception as e:  # noqa: BLE001  (a server away for a while: the next beat tries again)
                if not unreachable(e) and not isinstance(e, ServerUnreachable):
                    raise


@contextmanager
def no_claim(key: Key):
    """The claim of a registry that has no leases (a file database: one host): always held."""
    yield Claim(key, True, False)


def each(items: list, key_of, claim, *, poll_s: float = POLL_S):
    """Yield the items of `items` one at a time, each while its lease is held, taking first
    those no other host holds: several hosts running this over one list divide it between
    them. `key_of(item)` is its registry key (None: no lease needed), `claim(key, wait=False)`
    the registry's claim. An item another host holds is come back to later (by then usually
    done, and the caller finds its row).

    >>> for region in each(regions, lambda r: r.key, registry.claim):
    ...     realize(region)
    """
    for group in groups(items, key_of, claim, 1, poll_s=poll_s):
        yield from group


def groups(items: list, key_of, claim, size: int, *, poll_s: float = POLL_S):
    """Yield the items of `items` in groups, in order, each group while the leases on all its
    items' keys are held: up to `size` distinct keys, taken at once, with the items of a key
    the group holds already (the same workload) and those that need no lease. As in each(),
    an item another host holds is skipped and come back to. A host that takes `size` at a time
    can build their kernels in one batch.

    >>> for group in groups(regions, lambda r: r.key, registry.claim, 2):
    ...     build_together(group); [realize(r) for r in group]
    """
    if size < 1:
        raise ValueError(f"groups of {size}: give 1 or more items a group")
    pending = list(items)
    while pending:
        with ExitStack() as stack:
            group, taken = [], set()
            for item in list(pending):
                key = key_of(item)
                if key is not None and key.digest() not in taken:   # a key taken already: the same workload
                    if len(taken) >= size:
                        continue
                    if not stack.enter_context(claim(key, wait=False)).held:
                        continue
                    taken.add(key.digest())
                pending.remove(item)
                group.append(item)
            if group:
                yield group
        if pending and not group:
            time.sleep(poll_s)
