"""Merging kernel rows into a database's kernels table, by key, on an open transaction.

    >>> with db.begin() as conn:
    ...     merge_into(conn, [rec], Current()).outcomes
    ['inserted']

Which row stays is fact_db.store.records' merge_decision; here rows are read, decided and
written. On a server database the transaction first becomes the only writer of those keys
(fact_db.store.db.lock_keys): two hosts storing the same new key at once would otherwise both
insert it. The registry (put, put_many, imports, the seed) and the team registry's cache and
sync (fact_db.store.shared) all merge through here.
"""
from __future__ import annotations

import sqlalchemy as sa

from fact_db.store.bulk import insert_rows
from fact_db.store.db import lock_keys
from fact_db.store.records import Current, KernelRecord, MergeResult, merge_decision, utcnow
from fact_db.store.tables import K, kernel_record, kernel_row


def merge_into(conn: sa.Connection, recs: list[KernelRecord], cur: Current) -> MergeResult:
    """Merge `recs` into the kernels table on an open transaction (later rows see earlier ones)."""
    res = MergeResult()
    now = utcnow()
    digests = sorted({r.digest for r in recs})
    lock_keys(conn, digests)
    existing = stored_records(conn, digests)
    stored = set(existing)
    final: dict[str, KernelRecord] = {}
    for rec in recs:
        old = final.get(rec.digest, existing.get(rec.digest))
        outcome = merge_decision(old, rec, cur)
        res.outcomes.append(outcome)
        setattr(res, outcome, getattr(res, outcome) + 1)
        if outcome != "kept":
            final[rec.digest] = rec.replace(updated_at=now)
    replaced = sorted(d for d in final if d in stored)
    delete(conn, replaced)
    insert_rows(conn, K, [kernel_row(r) for r in final.values()])
    return res


def stored_records(conn: sa.Connection, digests: list[str]) -> dict[str, KernelRecord]:
    """{digest: record} of the rows stored for these digests."""
    out: dict[str, KernelRecord] = {}
    for i in range(0, len(digests), 500):
        for row in conn.execute(sa.select(K).where(K.c.digest.in_(digests[i:i + 500]))):
            rec = kernel_record(row)
            out[rec.digest] = rec
    return out


def delete(conn: sa.Connection, digests: list[str]) -> None:
    for i in range(0, len(digests), 500):
        conn.execute(sa.delete(K).where(K.c.digest.in_(digests[i:i + 500])))


def mirror(conn: sa.Connection, recs: list[KernelRecord]) -> None:
    """Store `recs` exactly as they are (no merge), replacing any row of the same key: a copy of
    what another database decided (the team registry's cache takes the server's rows so)."""
    digests = sorted({r.digest for r in recs})
    lock_keys(conn, digests)
    delete(conn, digests)
    insert_rows(conn, K, [kernel_row(r) for r in {r.digest: r for r in recs}.values()])
