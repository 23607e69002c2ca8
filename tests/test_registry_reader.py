"""The lean registry reader (fact_db.store.reader): the same answers as Registry.lookup(key,
nearest=False) on the same file, None wherever only Registry.open can serve, and no database
library imported on the torch.compile backend's path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fact_db.store.reader import Reader, local_path
from fact_db.store.registry import Registry, RegistryError

from test_registry import ENV, ENV_NEW_NVCC, TH, attn_key, make_key, make_rec, norm_key

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def filled(tmp_path, monkeypatch):
    """A registry file with a verified GEMM row, a stale attention row (tuned under another nvcc),
    a failed norm row, and the path to it; the seed is this test's own file."""
    seed = tmp_path / "seed.jsonl"
    seed.write_text("")
    monkeypatch.setenv("FACTDB_SEED", str(seed))
    path = tmp_path / "fact.duckdb"
    with Registry.open(str(path)) as reg:
        reg.put(make_rec(), **KW)
        reg.put(make_rec(attn_key(), template="fmha_sm90", env=ENV_NEW_NVCC), **KW)
        reg.put(make_rec(norm_key(), template="add_norm", status="failed", error="did not verify"), **KW)
    return path


KW = {"env": ENV, "template_hashes": TH}


def test_answers_as_the_registry_does(filled):
    reader = Reader.open(str(filled))
    assert reader is not None
    with Registry.open(str(filled)) as reg:
        for key in (make_key(), attn_key(), norm_key(), make_key(m=2048)):
            want = reg.lookup(key, nearest=False, **KW)
            got = reader.lookup(key, nearest=False, **KW)
            assert got == want, key
    hit = reader.lookup(make_key(), nearest=False, **KW)
    assert hit.exact and not hit.stale and hit.record.time_ms == 1.0
    stale = reader.lookup(attn_key(), nearest=False, **KW)
    assert stale.exact and stale.stale and stale.stale_reason
    assert reader.lookup(norm_key(), nearest=False, **KW) is None      # failed rows are never answers
    assert reader.lookup(make_key(m=2048), nearest=False, **KW) is None


def test_pinned_reuses_one_connection_and_never_writes(filled):
    reader = Reader.open(str(filled))
    with reader.pinned() as r:
        held = r._held
        assert held is not None
        assert r.lookup(make_key(), nearest=False, **KW).exact
        assert r._held is held
    assert reader._held is None
    with pytest.raises(RegistryError, match="never writes"):
        with reader.pinned(write=True):
            pass


def test_nearest_lookups_are_the_registrys(filled):
    with pytest.raises(RegistryError, match="nearest=False"):
        Reader.open(str(filled)).lookup(make_key())


def test_none_where_only_registry_open_serves(filled, tmp_path, monkeypatch):
    assert Reader.open(str(tmp_path / "absent.duckdb")) is None                 # Registry.open creates it
    assert Reader.open("memory") is None
    assert Reader.open("postgresql+psycopg://u@host/db") is None                 # a team registry
    other = tmp_path / "other.duckdb"
    other.write_bytes(b"SQLite format 3\0" + bytes(100))
    assert Reader.open(str(other)) is None                                        # not DuckDB's
    with Registry.memory(seed=False) as mem:                                      # a seed with one more row
        mem.put(make_rec(make_key(n=1024)), **KW)
        mem.export_jsonl(tmp_path / "seed.jsonl")
    assert Reader.open(str(filled)) is None                                       # a new seed to import
    with Registry.open(str(filled)):                                              # which Registry.open does
        pass
    assert Reader.open(str(filled)) is not None


def test_an_older_schema_is_the_registrys(filled):
    import duckdb
    conn = duckdb.connect(str(filled))
    conn.execute("update factdb_meta set value = '6' where key = 'schema_version'")
    conn.close()
    assert Reader.open(str(filled)) is None


def test_local_path(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTDB_DB", raising=False)
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path))
    assert local_path() == (tmp_path / "fact.duckdb").resolve()
    assert local_path(f"duckdb:///{tmp_path}/x.duckdb") == (tmp_path / "x.duckdb").resolve()
    monkeypatch.setenv("FACTDB_DB", str(tmp_path / "y.duckdb"))
    assert local_path() == (tmp_path / "y.duckdb").resolve()
    assert local_path("duckdb:///:memory:") is None
    assert local_path("sqlite:///x.db") is None


def test_the_backends_lookup_imports_no_database_library(filled):
    """The backend opens the lean reader for a local registry: looking a region's kernel up
    imports neither SQLAlchemy nor sqlmodel (nor duckdb_engine's PostgreSQL dialect)."""
    fields = make_key().as_dict()
    code = f"""
import sys
from fact_db.pipeline import backend
from fact_db.store.keys import GemmKey
reg = backend._open_registry(backend.options_from({{"registry": {str(filled)!r}}}))
hit = reg.lookup(GemmKey(**{fields!r}), nearest=False)
print(type(reg).__name__, hit.exact, sorted(m for m in ("sqlalchemy", "sqlmodel", "duckdb_engine") if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Reader", "True", "[]"]


def test_a_lookup_binds_no_parameter_so_imports_no_data_frame_library(filled, tmp_path):
    """DuckDB's Python client imports pandas (and numpy) to bind a process's first query
    parameter where pandas is installed: 0.26-0.72 s of a first lookup on an H200 host. A
    stand-in pandas on the path shows whether a lookup imports it; a digest that is not hex
    (the literal the query carries) is refused."""
    (tmp_path / "fake" / "pandas").mkdir(parents=True)
    (tmp_path / "fake" / "pandas" / "__init__.py").write_text("")
    fields = make_key().as_dict()
    code = f"""
import sys
from fact_db.store.keys import GemmKey
from fact_db.store.reader import Reader
hit = Reader.open({str(filled)!r}).lookup(GemmKey(**{fields!r}), nearest=False)
print(hit.exact, "pandas" in sys.modules)
"""
    path = [str(tmp_path / "fake"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False"]
    bad = make_key()
    object.__setattr__(bad, "digest", lambda: "x' or '1'='1")
    with pytest.raises(RegistryError, match="hex digits"):
        Reader.open(str(filled)).lookup(bad, nearest=False)


def test_the_backend_opens_the_registry_where_the_reader_cannot(tmp_path, monkeypatch):
    from fact_db.pipeline import backend
    monkeypatch.setenv("FACTDB_SEED", "")
    opts = backend.options_from({"registry": str(tmp_path / "new.duckdb")})
    assert type(backend._open_registry(opts)).__name__ == "Registry"              # a new file: created
    opts = backend.options_from({"registry": str(tmp_path / "new.duckdb"), "tune": True})
    assert type(backend._open_registry(opts)).__name__ == "Registry"              # tuning writes
    opts = backend.options_from({"registry": str(tmp_path / "new.duckdb")})
    assert type(backend._open_registry(opts)).__name__ == "Reader"                # now it exists, migrated


def test_a_file_that_cannot_be_read_says_so(filled):
    reader = Reader.open(str(filled))
    filled.unlink()
    filled.write_bytes(b"\0" * 8 + b"DUCK" + b"\0" * 100)        # no longer a database DuckDB reads
    with pytest.raises(RegistryError, match="cannot be read now"):
        reader.lookup(make_key(), nearest=False, **KW)


def test_the_backends_finders_answer_through_the_reader_as_through_the_registry(tmp_path, monkeypatch):
    """pipeline.lookup.kernel_for (what the backend asks per region) over the reader and over the
    registry on one file: the same kernel, the same row for the cache key, the same reasons."""
    import types

    from fact_db.kernels.attention import tune as attention_tune
    from fact_db.kernels.attention.workload import AttentionWorkload
    from fact_db.pipeline.lookup import kernel_for
    monkeypatch.setenv("FACTDB_SEED", "")
    path = tmp_path / "fact.duckdb"
    w = AttentionWorkload(2, 4, 4, 64, 64, 32, 32, causal=True, policy="bf16")
    other = AttentionWorkload(2, 4, 4, 128, 128, 32, 32, causal=True, policy="bf16")
    trials = [attention_tune.AttnTrial("sdpa-flash", "library", "ok", 0.01, 1e-3),
              attention_tune.AttnTrial("explicit", "eager", "ok", 0.05, 1e-3)]
    with Registry.open(str(path)) as reg:
        attention_tune.record(w, attention_tune.AttnResult(w, trials, []), reg, "sm90a", "h100")
    reader = Reader.open(str(path))
    assert reader is not None
    explicit = types.SimpleNamespace(rule="attention-causal", template="fmha_sm90")
    called = types.SimpleNamespace(rule="sdpa-attention", template="fmha_sm90")
    with Registry.open(str(path)) as reg:
        for region, wl in ((explicit, w), (called, w), (explicit, other)):
            a = kernel_for(reader, region, wl, arch="sm90a", gpu="h100")
            b = kernel_for(reg, region, wl, arch="sm90a", gpu="h100")
            assert (a.row, a.why, a.impl is None) == (b.row, b.why, b.impl is None)
            assert a.impl is None or a.impl.record == b.impl.record
    assert kernel_for(reader, explicit, w, arch="sm90a", gpu="h100").row == "attention:sdpa-flash"
