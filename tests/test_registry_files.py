"""Files that are not a fact-db database are refused, in one sentence, and left exactly as they were."""
import os
import sqlite3

import duckdb
import pytest

from fact_db.store.registry import NotARegistry, Registry


def snapshot(path):
    """Bytes, mtime and the directory's listing (no .wal or other file created beside it)."""
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns, sorted(os.listdir(path.parent))


def refused(url, path, *words):
    before = snapshot(path)
    with pytest.raises(NotARegistry) as ei:
        Registry.open(url, seed=False)
    msg = str(ei.value)
    assert str(path) in msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    assert snapshot(path) == before
    return msg


def test_random_bytes(tmp_path):
    p = tmp_path / "fact.duckdb"
    p.write_bytes(os.urandom(8192))
    refused(str(p), p, "is not a DuckDB database", "left untouched", "--db/FACTDB_DB")


def test_text_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("these are my notes\n" * 50)
    refused(f"duckdb:///{p}", p, "is not a DuckDB database")


def test_duckdb_file_with_other_tables(tmp_path):
    p = tmp_path / "shop.duckdb"
    con = duckdb.connect(str(p))
    con.execute("create table orders (id int, total double)")
    con.execute("create table kernels (name varchar)")   # a name fact-db uses, but not fact-db's
    con.execute("insert into orders values (1, 9.5)")
    con.close()
    msg = refused(str(p), p, "holds objects that fact-db did not create (kernels, orders)", "no factdb_meta table",
                  "left untouched")
    assert msg.endswith("point --db/FACTDB_DB at a fact-db database or at a new file name")


def test_sqlite_file_given_as_a_duckdb_path(tmp_path):
    p = tmp_path / "fact.duckdb"
    con = sqlite3.connect(p)
    con.execute("create table t (x)")
    con.commit()
    con.close()
    refused(str(p), p, "is a SQLite file, not a fact-db DuckDB database", f"sqlite:///{p}")


def test_sqlite_url_to_other_files(tmp_path):
    p = tmp_path / "other.db"
    con = sqlite3.connect(p)
    con.execute("create table users (name text)")
    con.commit()
    con.close()
    refused(f"sqlite:///{p}", p, "holds objects that fact-db did not create (users)")
    q = tmp_path / "garbage.db"
    q.write_bytes(b"\x00\x01" * 3000)
    refused(f"sqlite:///{q}", q, "is not a SQLite database")


@pytest.mark.parametrize("backend", ["duckdb", "sqlite"])
def test_newer_schema_version(tmp_path, backend):
    p = tmp_path / f"new.{backend}"
    url = f"{backend}:///{p}"
    Registry.open(url, seed=False).close()
    if backend == "duckdb":
        con = duckdb.connect(str(p))
        con.execute("update factdb_meta set value = '99' where key = 'schema_version'")
        con.execute("checkpoint")
        con.close()
    else:
        con = sqlite3.connect(p)
        con.execute("update factdb_meta set value = '99' where key = 'schema_version'")
        con.commit()
        con.close()
    msg = refused(url, p, f"schema version 99, newer than this fact-db understands ({__import__('fact_db.store.db', fromlist=['db']).SCHEMA_VERSION})", "upgrade fact-db")
    assert msg.count(";") == 1


def test_meta_table_without_a_schema_version(tmp_path):
    p = tmp_path / "odd.duckdb"
    con = duckdb.connect(str(p))
    con.execute("create table factdb_meta (key varchar, value varchar)")
    con.close()
    refused(str(p), p, "factdb_meta table without a valid schema_version")


def test_directory(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(NotARegistry, match="is a directory"):
        Registry.open(str(d), seed=False)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.duckdb"
    p.write_bytes(b"")
    refused(str(p), p, "is an empty file, which DuckDB cannot open", "delete it")
    q = tmp_path / "empty.sqlite"   # SQLite treats an empty file as a new database
    q.write_bytes(b"")
    with Registry.open(f"sqlite:///{q}", seed=False) as reg:
        assert reg.meta()["schema_version"] == str(__import__("fact_db.store.db", fromlist=["db"]).SCHEMA_VERSION)


def test_index_only_database_is_initialised(tmp_path):
    q = tmp_path / "index.duckdb"
    con = duckdb.connect(str(q))
    con.execute("create table index_chunks (id int)")
    con.execute("create view index_docs as select * from index_chunks")
    con.close()
    with Registry.open(str(q), seed=False) as reg:
        assert reg.count() == 0
