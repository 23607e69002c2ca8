"""The registry's answer for a key: the exact row, else the nearest compatible shape.

    >>> rec, distance = find(conn, key, Current())     # None when nothing is compatible

Compatible rows share the key's `near` digest (its family, its non-shape fields and the
divisibility classes of its DIV fields), so one equality on one column finds every candidate,
the exact row among them at distance 0. Distance is the sum of |log2 ratio| over the SHAPE
fields. Ranking: exact first, then usable before stale, then nearer, then faster, then by
digest. Failed rows are never candidates. A family with no SHAPE fields (or nearest=False)
is answered by its exact row only.
"""
from __future__ import annotations

import json
import math

import sqlalchemy as sa

from fact_db.store.keys import Key
from fact_db.store.records import Current, KernelRecord
from fact_db.store.tables import ENV_COLUMNS, K, env_of, kernel_record


def find(conn: sa.Connection, key: Key, cur: Current, max_distance: float | None = None, *, nearest: bool = True,
         first: int = 8) -> tuple[KernelRecord, float] | None:
    """(row, distance) for `key`, or None. See the module docstring.

    A cold DuckDB file costs per column fetched from scattered rows, and `rowid IN (...)`
    scans the table while `rowid = x` does not: so the scan takes only the shapes, full rows
    are fetched one by one, nearest first, until a usable one (or the exact one) is found,
    and only when the first `first` are all stale are the rest ranked in one query.
    """
    if not nearest or not key.SHAPE:
        row = conn.execute(sa.select(K).where(K.c.digest == key.digest(), K.c.status != "failed")).first()
        rec = kernel_record(row) if row is not None else None
        return (rec, 0.0) if rec is not None and rec.key == key else None
    handle = sa.literal_column("rowid") if conn.dialect.name in ("duckdb", "sqlite") else K.c.digest
    family = [K.c.near == key.near(), K.c.status != "failed"]
    want = key.dims()
    cands = []
    for r in conn.execute(sa.select(handle.label("h"), K.c.dims).where(*family)).all():
        dims = json.loads(r.dims)
        d = sum(abs(math.log2(dims[f] / want[f])) for f in key.SHAPE)
        if max_distance is None or d <= max_distance:
            cands.append((d, r.h))
    cands.sort()
    best = None

    def consider(row):
        nonlocal best
        rec = kernel_record(row)
        if rec.key.with_(**want) != key:
            return  # a near-digest collision: never seen, but checked
        d = rec.key.distance(key)
        rank = (d != 0.0, bool(cur.staleness(rec)), d, rec.time_ms if rec.time_ms is not None else math.inf,
                rec.digest)
        if best is None or rank < best[0]:
            best = (rank, rec, d)

    i = 0
    while i < len(cands):
        j = i
        while j < len(cands) and cands[j][0] == cands[i][0]:
            j += 1
        if j > first:
            break
        for _, h in cands[i:j]:          # one distance at a time (ties are ranked by speed)
            consider(conn.execute(sa.select(K).where(handle == h)).first())
        i = j
        if best is not None and (not best[0][0] or not best[0][1]):
            return best[1], best[2]      # the exact row, or a usable one: nothing further can beat it
    if i < len(cands):   # the rest, ranked from their status, template and environment columns
        dist = {h: d for d, h in cands[i:]}
        top = None
        cols = [K.c.digest, K.c.status, K.c.time_ms, K.c.template, K.c.template_hash,
                *(K.c[c] for c in ENV_COLUMNS.values())]
        for r in conn.execute(sa.select(handle.label("h"), *cols).where(*family)):
            if r.h in dist:
                stale = r.status == "stale" or bool(cur.mismatch(r.template, r.template_hash, env_of(r)))
                rank = (True, stale, dist[r.h], r.time_ms if r.time_ms is not None else math.inf, r.digest)
                if top is None or rank < top[0]:
                    top = (rank, r.h)
        if top is not None and (best is None or top[0] < best[0]):
            consider(conn.execute(sa.select(K).where(handle == top[1])).first())
    return (best[1], best[2]) if best else None
