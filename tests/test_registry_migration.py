"""Schema 5 (m005_families): a registry of schema 4, built by running m001-m004 and holding a
row of every old family, is carried over whole when this fact-db opens it; and one digest
scheme holds on every backend."""
import json

import pytest
import sqlalchemy as sa
from test_registry import ENV, GPU_ENV, SPEC, TH, attn_key, make_key, make_rec, norm_key

from fact_db.store import db as db_mod
from fact_db.store import migrations as M
from fact_db.store.records import CARRIED_OVER, carried_over
from fact_db.store.registry import (
    GemmKey,
    KernelRecord,
    RegionKey,
    Registry,
    TrialRecord,
)

NOT_RECORDED = "driver, CUDA runtime, torch, cuBLAS, cuDNN not recorded"
OLD_GEMM = make_key(m=2048)
OLD_FAILED = make_key(m=1024, policy="fp32")
WHEN = "2026-11-20T10:00:00.000000Z"


def _insert(conn, table: str, row: dict) -> None:
    t = sa.table(table, *(sa.column(c) for c in row))
    conn.execute(sa.insert(t), [row])


def _gemm_row(key: GemmKey, **kw) -> dict:
    divs = key.div_classes
    return {"digest": f"old{key.m:013d}", **key.as_dict(), "m_div": divs[0], "n_div": divs[1], "k_div": divs[2],
            "family": "oldfamily", "template": "gemm_sm90", "config": '{"tile_m":128}', "source_hash": "s1",
            "template_hash": "aaaa", "cutlass_version": "4.2.0.0", "nvcc_version": "13.0.88", "factdb_version": "0.1.0",
            "time_ms": 1.25, "baseline": "torch eager", "baseline_ms": 2.5, "rel_err": 1e-6, "baseline_rel_err": 2e-6,
            "device_name": "NVIDIA H100 80GB HBM3", "provenance": "rule", "status": "verified", "stale_reason": "",
            "error": "", "created_at": WHEN, "updated_at": WHEN, "notes": "tuned", **kw}


def build_schema4(url: str) -> None:
    """A database exactly as fact-db wrote schema 4: m001-m004, and a row of each family."""
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        for _, _, fn in M.MIGRATIONS[:4]:
            fn(conn)
        db_mod.write_meta(conn, schema_version=4, last_migration="m004_region_kernels", created_by="fact-db 0.1.0")
        _insert(conn, "kernels", _gemm_row(OLD_GEMM))
        _insert(conn, "kernels", _gemm_row(OLD_FAILED, status="failed", time_ms=None, error="nothing verified"))
        _insert(conn, "trials", {"id": "t" * 32, "digest": f"old{OLD_GEMM.m:013d}", **OLD_GEMM.as_dict(),
                                 "template": "gemm_sm90", "config": '{"tile_m":64}', "config_hash": "c" * 16,
                                 "status": "compile_error", "time_ms": None, "rel_err": None, "error": "nvcc: exit 1",
                                 "template_hash": "aaaa", "cutlass_version": "4.2.0.0", "nvcc_version": "13.0.88",
                                 "factdb_version": "0.1.0", "device_name": "NVIDIA H100 80GB HBM3", "created_at": WHEN})
        a = attn_key()
        trials = [{"label": "sdpa flash", "kind": "library", "status": "ok", "time_ms": 0.4, "err": 1e-3,
                   "eager_err": 2e-3, "error": "", "template": "", "config": {}, "so": "", "build_key": ""},
                  {"label": "fmha 128x128", "kind": "kernel", "status": "build_failed", "time_ms": float("nan"),
                   "err": None, "eager_err": None, "error": "nvcc failed", "template": "fmha_sm90",
                   "config": {"tile": 128}, "so": "", "build_key": ""}]
        _insert(conn, "attention_kernels", {
            "digest": "a" * 32, **{f: getattr(a, f) for f in ("arch", "gpu", "batch", "heads", "kv_heads", "lq", "lk",
                                                            "d", "dv", "causal", "scale", "dtype", "policy")},
            "label": "sdpa flash", "kind": "library", "template": "", "config": "{}", "time_ms": 0.4, "rel_err": 1e-3,
            "device_name": "NVIDIA H100 80GB HBM3", "trials": json.dumps(trials), "created_at": WHEN})
        n = norm_key()
        _insert(conn, "norm_kernels", {
            "digest": "n" * 32, **{f: getattr(n, f) for f in ("arch", "kind", "rows", "width", "residual", "write_sum",
                                                            "has_bias", "eps", "dtype", "policy")},
            "gpu": "", "label": "add_norm v4", "template": "add_norm", "config": '{"vec": 4}', "source_hash": "ns",
            "time_ms": 0.05, "rel_err": 1e-7, "eager_ms": 0.1, "device_name": "",
            "trials": json.dumps([{"label": "eager", "status": "ok", "time_ms": 0.1, "err": 1e-7, "error": ""},
                                  {"label": "add_norm v4", "status": "ok", "time_ms": 0.05, "err": 1e-7, "error": ""}]),
            "created_at": WHEN})
        _insert(conn, "region_kernels", {
            "digest": "r" * 32, "arch": "sm90a", "gpu": "h100", "policy": "fp32", "dtype": "float32",
            "ops": "aten.add -> aten.relu", "region": json.dumps(SPEC, sort_keys=True), "name": "add_relu",
            "source": "// the source\n", "source_hash": "rs", "build_key": "bk1", "nvcc_version": "13.0.88",
            "cutlass_version": "4.2.0.0", "time_ms": 0.002, "eager_ms": 0.005, "rel_err": 0.0, "eager_rel_err": 1e-7,
            "device_name": "NVIDIA H100 80GB HBM3", "provenance": "llm", "status": "verified", "model": "scripted",
            "explanation": "add and relu in one pass", "created_at": WHEN})
    eng.dispose()


def _tables(conn) -> set:
    return db_mod._table_names(conn)


@pytest.mark.parametrize("backend", ["duckdb", "sqlite"])
def test_m005_carries_every_row_of_every_family_over(backend, tmp_path, monkeypatch):
    monkeypatch.setattr("fact_db.core.environment.current", lambda: ENV)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: TH.get(name, ""))
    url = f"{backend}:///{tmp_path / ('old.' + backend)}"
    build_schema4(url)
    with Registry.open(url, seed=False) as reg:
        meta = reg.meta()
        assert (meta["schema_version"], meta["last_migration"]) == ("7", "m007_binaries")
        with reg.transaction(write=False) as conn:
            names = _tables(conn)
        assert not names & {"attention_kernels", "norm_kernels", "region_kernels", "kernels_s5", "trials_s5"}
        rows = {r.family + ("-failed" if r.status == "failed" else ""): r for r in reg.rows()}
        assert sorted(rows) == ["attention", "gemm", "gemm-failed", "norm", "region"]
        for r in rows.values():          # every digest recomputed under the one scheme
            assert r.digest == r.key.digest() and reg.get(r.key) == r

        g = rows["gemm"]
        assert g.key == OLD_GEMM and g.status == "stale" and carried_over(g)
        assert g.stale_reason == f"{CARRIED_OVER}: {NOT_RECORDED}"
        assert g.env == ENV.with_(gpu_sku="NVIDIA H100 80GB HBM3")
        assert (g.time_ms, g.baseline_ms, g.config, g.template_hash, g.notes, g.created_at) == \
            (1.25, 2.5, {"tile_m": 128}, "aaaa", "tuned", WHEN)
        assert rows["gemm-failed"].key == OLD_FAILED and rows["gemm-failed"].stale_reason == ""

        a = rows["attention"]
        assert a.key == attn_key() and (a.template, a.label, a.time_ms) == ("library", "sdpa flash", 0.4)
        assert a.stale_reason == f"{CARRIED_OVER}: driver, CUDA runtime, torch, cuBLAS, cuDNN, CUTLASS, nvcc not recorded"
        n = rows["norm"]
        assert n.key == norm_key(gpu="unknown")       # schema 4 kept no GPU for it
        assert (n.template, n.label, n.config, n.baseline_ms, n.source_hash) == \
            ("add_norm", "add_norm v4", {"vec": 4}, 0.1, "ns")
        assert n.stale_reason.startswith(f"{CARRIED_OVER}: GPU, driver")
        g2 = rows["region"]
        assert g2.key == RegionKey.of(SPEC, "sm90a", "h100") and g2.template == "llm_region"
        assert (g2.label, g2.source, g2.config, g2.notes, g2.provenance) == \
            ("add_relu", "// the source\n", {"build_key": "bk1", "model": "scripted"}, "add and relu in one pass", "llm")
        assert (g2.baseline_ms, g2.baseline_rel_err, g2.env.nvcc) == (0.005, 1e-7, "13.0.88")

        t = reg.trials(OLD_GEMM)
        assert [(x.id, x.status, x.error, x.config) for x in t] == [("t" * 32, "compile_error", "nvcc: exit 1",
                                                                     {"tile_m": 64})]
        at = reg.trials(attn_key())
        assert [(x.template, x.status, x.config["label"]) for x in at] == \
            [("library", "ok", "sdpa flash"), ("fmha_sm90", "build_failed", "fmha 128x128")]
        assert at[1].time_ms is None and at[1].config["tile"] == 128          # NaN in old JSON: no time
        assert [x.template for x in reg.trials(n.key)] == ["eager", "add_norm"]

        # the carried rows are shown, flagged, and never silently restored; re-tuning replaces them
        hit = reg.lookup(OLD_GEMM)
        assert hit.stale and hit.stale_reason.startswith(f"{CARRIED_OVER}: {NOT_RECORDED}")
        assert reg.revalidate() == [] and reg.get(OLD_GEMM).status == "stale"
        assert reg.revalidate(GPU_ENV) == []        # already stale, and no environment restores it
        assert reg.lookup(OLD_GEMM, env=GPU_ENV).stale_reason.startswith("driver not recorded")
        assert reg.put(make_rec(OLD_GEMM, env=GPU_ENV), env=GPU_ENV) == "replaced"
        reg.export_jsonl(tmp_path / "before.jsonl")
        exported = (tmp_path / "before.jsonl").read_text()
        trials = [reg.trials(r.key) for r in reg.rows()]
        meta = reg.meta()
    with Registry.open(url, seed=False) as reg:          # idempotent: opening again changes nothing
        reg.export_jsonl(tmp_path / "after.jsonl")
        assert (tmp_path / "after.jsonl").read_text() == exported
        assert [reg.trials(r.key) for r in reg.rows()] == trials and reg.meta() == meta


@pytest.mark.parametrize("backend", ["duckdb", "sqlite"])
def test_a_new_database_runs_every_migration_and_holds_the_new_tables(backend, tmp_path):
    url = f"{backend}:///{tmp_path / ('new.' + backend)}"
    with Registry.open(url, seed=False) as reg, reg.transaction(write=False) as conn:
        assert reg.meta()["schema_version"] == str(M.SCHEMA_VERSION) == "7"
        assert {"kernels", "trials", "rules", "examples", "factdb_meta", "leases", "outbox"} <= _tables(conn)
        assert not _tables(conn) & {"attention_kernels", "norm_kernels", "region_kernels"}


def test_the_migration_digests_like_the_keys():
    """m005 carries its own frozen copy of the scheme: it must agree with fact_db.store.keys today."""
    for key in (make_key(n=4000, batch=3), attn_key(), norm_key(), RegionKey.of(SPEC, "sm90a", "h100")):
        shape_div = M._S5_FAMILIES[key.FAMILY]
        assert shape_div == (key.SHAPE, key.DIV)
        cols = M._s5_key(key.FAMILY, key.as_dict(), key.rule_name, key.dtype_name)
        assert (cols["digest"], cols["near"], cols["div"]) == (key.digest(), key.near(), key.div)
        assert json.loads(cols["key"]) == key.as_dict() and json.loads(cols["dims"]) == key.dims()
    assert M._s5_region_key(SPEC, "sm90a", "h100")["digest"] == RegionKey.of(SPEC, "sm90a", "h100").digest()


def test_one_digest_scheme_on_every_backend(tmp_path):
    """The same key fields give the same digest, near and key columns on DuckDB and SQLite."""
    recs = [make_rec(make_key(m=512)), KernelRecord(key=attn_key(), template="library", time_ms=0.4, env=ENV),
            KernelRecord(key=norm_key(), template="eager", time_ms=0.1, env=ENV),
            KernelRecord(key=RegionKey.of(SPEC, "sm90a", "h100"), template="llm_region", time_ms=0.1, env=ENV)]
    stored = {}
    for backend in ("duckdb", "sqlite"):
        with Registry.open(f"{backend}:///{tmp_path / ('d.' + backend)}", seed=False) as reg:
            reg.put_many(recs, env=ENV, template_hashes=TH)
            reg.add_trials([TrialRecord(key=r.key, template=r.template, config={}, status="ok") for r in recs])
            with reg.transaction(write=False) as conn:
                stored[backend] = sorted(tuple(r) for r in conn.execute(sa.text(
                    "select digest, family, key, near, div, dims from kernels")))
                trial_digests = sorted(r[0] for r in conn.execute(sa.text("select digest from trials")))
            assert trial_digests == sorted(r.digest for r in recs)
    assert stored["duckdb"] == stored["sqlite"]
    assert sorted(r[0] for r in stored["duckdb"]) == sorted(r.key.digest() for r in recs)
    assert make_key(m=512).digest() == "c73e75b4b37f180d"

