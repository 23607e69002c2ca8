"""Inserting many rows at once: DuckDB's executemany costs milliseconds a row, so more than a
few rows go through a temporary CSV file and one INSERT ... SELECT from read_csv.

    >>> insert_rows(conn, table, rows)      # rows: dicts keyed by the table's column names

Used by the registry's writes and by the migrations (which pass their own frozen tables).
"""
from __future__ import annotations

import csv
import os
import tempfile

import sqlalchemy as sa

CSV_NULL = r"\N"


def insert_rows(conn: sa.Connection, table: sa.Table, rows: list[dict]) -> None:
    """INSERT `rows` into `table` on an open transaction (every column of the table must be keyed)."""
    if not rows:
        return
    # a literal \N would read back as NULL through the CSV: such rows take the slow path
    if conn.dialect.name != "duckdb" or len(rows) <= 8 or any(v == CSV_NULL for r in rows for v in r.values()):
        conn.execute(sa.insert(table), rows)
        return
    cols = [c.name for c in table.columns]
    with tempfile.NamedTemporaryFile("w", suffix=".csv", newline="", encoding="utf-8", delete=False) as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([CSV_NULL if r[c] is None else r[c] for c in cols])
    try:
        src = f.name.replace("'", "''")
        types = ", ".join(f"'{c}': 'VARCHAR'" for c in cols)
        conn.exec_driver_sql(f"insert into {table.name} ({', '.join(cols)}) select {', '.join(cols)} from "
                             f"read_csv('{src}', header = true, quote = '\"', escape = '\"', nullstr = '\\N', "
                             f"columns = {{{types}}})")
    finally:
        os.unlink(f.name)
