"""PostgreSQL as a registry backend, against a real server (tests/pg.py): one key and digest on
both backends, migrations that hosts run at once, the least-privilege grants docs/registry.md
gives, parameterized statements, and errors that never show the password. The registry's
own suite runs on this backend too (tests/test_registry.py's `reg` fixture).
"""
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_registry import ENV, KW, TH, make_key, make_rec

from fact_db.store import db as db_mod
from fact_db.store.registry import NotARegistry, Registry, ServerUnreachable, TrialRecord

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "index" / "kernels.jsonl"
ENV_VARS = {**os.environ, "PYTHONPATH": str(ROOT), "FACTDB_SEED": ""}


def test_the_seed_has_the_same_digests_and_rows_on_both_backends(pg, tmp_path):
    """A row means the same thing wherever it lives: the shipped seed, imported into DuckDB and into
    PostgreSQL, exports byte for byte the same."""
    exports = []
    for url in (f"duckdb:///{tmp_path / 'seed.duckdb'}", pg.new_schema()):
        with Registry.open(url, seed=SEED, cache=False) as reg:
            buf = io.StringIO()
            reg.export_jsonl(buf)
            exports.append([{k: v for k, v in json.loads(line).items() if k != "updated_at"}   # the import's time
                            for line in buf.getvalue().splitlines()])
            assert reg.meta()["schema_version"] == str(db_mod.SCHEMA_VERSION)
    assert exports[0] == exports[1] and len(exports[0]) == len(SEED.read_text().splitlines())
    digests = [d["digest"] for d in exports[0]]
    with Registry.open(pg.new_schema(), seed=SEED, cache=False) as reg:
        assert all(reg.get(d).digest == d for d in digests[:5])


def test_hosts_migrating_a_new_database_at_once_run_the_migrations_once(pg):
    url = pg.new_schema()
    code = ("import sys; from fact_db.store.registry import Registry\n"
            "r = Registry.open(sys.argv[1], seed=False, cache=False); print(r.meta()['schema_version']); r.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env=ENV_VARS) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == str(db_mod.SCHEMA_VERSION), err[-2000:]
    with Registry.open(url, seed=False, cache=False) as reg, reg.transaction(write=False) as conn:
        meta = dict(conn.execute(sa.text("select key, value from factdb_meta")).all())
        assert meta["last_migration"] == db_mod.MIGRATIONS[-1][1]
        assert conn.execute(sa.text("select count(*) from factdb_meta where key = 'created_at'")).scalar() == 1


def test_a_role_with_only_the_documented_grants_is_enough(pg, tmp_path):
    """docs/registry.md's second set of grants: the owner role creates the tables once; a host role
    with USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on its tables does everything else."""
    owner_url = pg.new_schema(host_role=True)
    Registry.open(owner_url, seed=False, cache=False).close()
    host_url = owner_url.replace(f"factdb_owner:{pg_password('factdb_owner')}",
                                 f"factdb_host:{pg_password('factdb_host')}")
    with Registry.open(host_url, seed=False, cache=tmp_path / "c.duckdb") as reg:
        assert reg.put(make_rec(make_key(m=64)), **KW) == "inserted"
        assert reg.put(make_rec(make_key(m=64), time_ms=0.5), **KW) == "replaced"
        reg.add_trials([TrialRecord(key=make_key(m=64), template="gemm_sm90", config={}, status="timeout", env=ENV)])
        assert reg.lookup(make_key(m=64), **KW).exact
        with reg.claim(make_key(m=64)) as c:
            assert c.held and c.coordinated
        assert reg.sync().pending == 0
        assert reg.revalidate(ENV, template_hashes=TH) == []
        assert reg.gc(0).kernels == []
        reg.import_jsonl(io.StringIO(json.dumps(make_rec(make_key(m=256)).as_dict()) + "\n"), **KW)
        assert reg.count() == 2 and reg.lookup(make_key(m=512), **KW).record.key.m == 256
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), db_mod.Database(host_url, 5).begin() as c:
        c.execute(sa.text("create table extra (x int)"))   # and nothing more: no DDL


def test_a_host_role_that_may_only_read_shared_kernels_loads_them_and_tunes_on(pg, tmp_path, monkeypatch):
    """docs/registry.md: give the hosts' role SELECT alone on kernel_binaries and let a trusted
    builder write it. Such a host loads what is shared; its own put says once that it cannot,
    and returns False, so tuning goes on."""
    from fact_db.store import registry as reg_mod
    monkeypatch.setenv("FACTDB_SHARE_BINARIES", "1")
    reg_mod._BINARY_WARNED.clear()
    owner_url = pg.new_schema(host_role=True)
    with Registry.open(owner_url, seed=False, cache=False) as owner:
        assert owner.put_binary("b" * 24, b"\x7fELF from the builder", arch="sm90a") is True
        with owner.transaction() as conn:
            conn.execute(sa.text("REVOKE INSERT, UPDATE, DELETE ON kernel_binaries FROM factdb_host"))
    host_url = owner_url.replace(f"factdb_owner:{pg_password('factdb_owner')}",
                                 f"factdb_host:{pg_password('factdb_host')}")
    with Registry.open(host_url, seed=False, cache=tmp_path / "c.duckdb") as host:
        assert host.get_binary("b" * 24) == b"\x7fELF from the builder"
        with pytest.warns(UserWarning, match="this host cannot share the kernels it builds on .*permission denied"):
            assert host.put_binary("c" * 24, b"\x7fELF mine", arch="sm90a") is False
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert host.put_binary("d" * 24, b"\x7fELF mine", arch="sm90a") is False  # said once
        assert host.put(make_rec(make_key(m=64)), **KW) == "inserted"  # the rest of the registry still works


def pg_password(role):
    import pg as pg_mod
    return pg_mod.PASSWORDS[role]


def test_statements_are_parameterized(pg):
    """Text that would break (or inject) a statement built by string pasting is stored and read back
    as it is, and a digest prefix never acts as a pattern."""
    hostile = "x'); DROP TABLE kernels; --  \\ % _ \" ;"
    with Registry.open(pg.new_schema(), seed=False, cache=False) as reg:
        rec = make_rec(notes=hostile, error=hostile, config={"k'": hostile})
        reg.put(rec, **KW)
        reg.add_trials([TrialRecord(key=make_key(), template="gemm_sm90", config={"'": hostile}, status="timeout",
                                    error=hostile, env=ENV)])
        back = reg.get(make_key())
        assert back.notes == hostile and back.config == {"k'": hostile}
        assert reg.trials(make_key())[0].error == hostile
        assert reg.find_digest("%") == [] and reg.find_digest("_") == []
        assert list(reg.rows(rule="gemm' OR '1'='1")) == []
        assert reg.count() == 1


def test_an_unreachable_server_fails_in_one_sentence_without_the_password():
    import socket
    with socket.socket() as s:   # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://factdb:very-secret@127.0.0.1:{port}/factdb"
    with pytest.raises(ServerUnreachable) as ei:
        Registry.open(url, seed=False, cache=False)
    msg = str(ei.value)
    assert "very-secret" not in msg and "factdb:***@127.0.0.1" in msg and "\n" not in msg
    assert "check that the server is up" in msg


def test_a_schema_holding_other_tables_is_refused(pg):
    url = pg.new_schema()
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        conn.execute(sa.text("create table orders (id int)"))
    eng.dispose()
    with pytest.raises(NotARegistry, match="holds objects that fact-db did not create \\(orders\\).*schema of its own"):
        Registry.open(url, seed=False, cache=False)


def test_two_processes_storing_the_same_new_keys_at_once(pg):
    """Writers of one key take turns (an advisory lock per key): both land, none fails on the key."""
    url = pg.new_schema()
    Registry.open(url, seed=False, cache=False).close()
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from test_registry import make_rec, make_key, KW\n"
            "from fact_db.store.registry import Registry\n"
            "r = Registry.open(sys.argv[1], seed=False, cache=False)\n"
            "for i in range(30):\n"
            "    r.put_many([make_rec(make_key(m=64 * (j + 1)), time_ms=1 + float(sys.argv[2]) + i / 100) "
            "for j in range(i % 5, i % 5 + 3)], **KW)\n"
            "r.close()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(t)], stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=ENV_VARS) for t in (0, 1)]
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read()[-2000:]
    with Registry.open(url, seed=False, cache=False) as reg:
        assert reg.count() == 7 and all(r.time_ms < 2 for r in reg.rows())   # the faster writer's rows
