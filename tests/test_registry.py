"""The kernel registry: keys, records, merge, lookup, staleness, trials, JSONL, seed, gc.

Everything here runs on an in-memory or temporary database, with an explicit toolchain
and template hashes, so nothing depends on the machine's nvcc or on templates being edited.
"""
import io
import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from fact_db.store import db as db_mod
from fact_db.store import registry as R
from fact_db.store.registry import (
    Current,
    ExampleRecord,
    ImportError_,
    KernelKey,
    KernelRecord,
    Registry,
    RegistryError,
    RuleRecord,
    TrialRecord,
    canonical_gpu,
    merge_decision,
)
from fact_db.core.toolchain import Toolchain

ROOT = Path(__file__).resolve().parent.parent
TC = Toolchain(cutlass="4.2.0.0", nvcc="13.0.88", factdb="0.1.0")
TC_NEW_NVCC = Toolchain(cutlass="4.2.0.0", nvcc="13.1.10", factdb="0.1.0")
TH = {"gemm_sm90": "aaaa", "gemm_sm80": "bbbb"}
KW = {"toolchain": TC, "template_hashes": TH}


def make_key(**kw) -> KernelKey:
    base = {"rule": "gemm", "arch": "sm90a", "gpu": "h100", "dtype_in": "float32", "dtype_acc": "float32",
            "dtype_out": "float32", "layout_a": "row", "layout_b": "col", "m": 4096, "n": 4096, "k": 4096,
            "batch": 1, "epilogue": "none", "policy": "tf32"}
    return KernelKey(**{**base, **kw})


def make_rec(key=None, *, tc=TC, th="aaaa", **kw) -> KernelRecord:
    base = {"key": key or make_key(), "template": "gemm_sm90", "config": {"tile_m": 128, "tile_n": 128},
            "time_ms": 1.0, "baseline": "torch eager", "baseline_ms": 1.5, "rel_err": 1e-6, "baseline_rel_err": 1e-6,
            "device_name": "NVIDIA H100 80GB HBM3", "cutlass_version": tc.cutlass, "nvcc_version": tc.nvcc,
            "factdb_version": tc.factdb, "template_hash": th}
    return KernelRecord(**{**base, **kw})


@pytest.fixture
def reg():
    with Registry.memory() as r:
        yield r


# ---------------------------------------------------------------------------------------
# keys

@pytest.mark.parametrize("name,short", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A10G", "a10g"), ("NVIDIA L40S", "l40s"),
    ("Tesla V100-SXM2-16GB", "v100"), ("NVIDIA GH200 480GB", "gh200"), ("h100", "h100"), ("H100", "h100"),
    ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"), ("NVIDIA RTX A6000", "rtx-a6000"),
])
def test_canonical_gpu(name, short):
    assert canonical_gpu(name) == short


def test_canonical_gpu_refuses_empty():
    with pytest.raises(RegistryError, match="empty"):
        canonical_gpu("  ")


def test_key_normalises_and_digest_is_stable():
    k = make_key(gpu="NVIDIA H100 80GB HBM3", dtype_in="fp32", dtype_out="fp32")
    assert k.gpu == "h100" and k.dtype_in == "float32"
    assert k == make_key() == make_key(arch="sm_90a")
    # the digest is the primary key and the JSONL key: it must never change between versions
    assert k.digest() == "75a8f287f57efd05"
    assert make_key(m=4095).digest() != k.digest()
    assert k.shape == "4096x4096x4096" and make_key(batch=8).shape == "4096x4096x4096x8"
    assert KernelKey.from_dict(k.as_dict()) == k
    assert set(KernelKey.FIELDS) == {f.name for f in __import__("dataclasses").fields(KernelKey)}


@pytest.mark.parametrize("field,value,words", [
    ("m", 0, "m must be a positive integer"), ("k", 4096.0, "k must be a positive integer"),
    ("batch", True, "batch must be a positive integer"), ("layout_a", "rowmajor", "use row or col"),
    ("policy", "tf16", "policy is 'tf16'"), ("dtype_in", "int4", "dtype_in is 'int4'"),
    ("arch", "hopper", "compute capability"), ("rule", "Gemm Bias", "lowercase"), ("epilogue", "", "non-empty"),
])
def test_key_rejects_bad_fields(field, value, words):
    with pytest.raises(RegistryError, match=words):
        make_key(**{field: value})


def test_parse_shape():
    assert KernelKey.parse_shape("512x2048x1024") == (512, 2048, 1024, 1)
    assert KernelKey.parse_shape(" 512 X 2048 x 1024 x 8 ") == (512, 2048, 1024, 8)
    for bad in ("512x2048", "axbxc", "0x1x1", "1x2x3x4x5", ""):
        with pytest.raises(RegistryError, match="MxNxK"if bad != "0x1x1" else "at least 1"):
            KernelKey.parse_shape(bad)


def test_divisibility_classes_and_distance():
    assert make_key(m=4096, n=4000, k=24).div_classes == (128, 16, 8)
    assert make_key(m=4097).div_classes[0] == 1 and make_key(m=192).div_classes[0] == 64
    assert make_key().distance(make_key(m=2048)) == pytest.approx(1.0)
    assert make_key().distance(make_key(m=2048, n=8192, batch=2)) == pytest.approx(3.0)
    assert make_key().compatible(make_key(m=2048)) and not make_key().compatible(make_key(m=4000))
    assert not make_key().compatible(make_key(policy="fp32"))


# ---------------------------------------------------------------------------------------
# records

def test_record_validation():
    with pytest.raises(RegistryError, match="needs time_ms"):
        make_rec(time_ms=None)
    assert make_rec(time_ms=None, status="failed").time_ms is None
    for kw, words in [({"status": "ok"}, "status 'ok'"), ({"provenance": "human"}, "provenance"),
                      ({"time_ms": -1.0}, "positive"), ({"rel_err": float("nan")}, "finite"),
                      ({"config": [1]}, "JSON object"), ({"config": {"f": object()}}, "plain JSON"),
                      ({"template": "../evil"}, "template name"), ({"created_at": "yesterday"}, "ISO 8601"),
                      ({"notes": 3}, "notes must be a string")]:
        with pytest.raises(RegistryError, match=words):
            make_rec(**kw)


def test_record_times_are_normalised_to_utc():
    r = make_rec(created_at="2026-03-01T12:00:00+02:00")
    assert r.created_at == "2026-03-01T10:00:00.000000Z" and r.updated_at == r.created_at
    assert make_rec(created_at="2026-03-01T10:00:00Z").created_at == r.created_at


def test_record_dict_roundtrip_and_digest_check():
    r = make_rec()
    d = r.as_dict()
    assert d["digest"] == r.digest and d["m"] == 4096 and d["config"] == {"tile_m": 128, "tile_n": 128}
    assert KernelRecord.from_dict(d) == r
    with pytest.raises(RegistryError, match="does not match the key fields"):
        KernelRecord.from_dict({**d, "m": 2048})
    with pytest.raises(RegistryError, match="unknown fields speed"):
        KernelRecord.from_dict({**d, "speed": 3})
    with pytest.raises(RegistryError, match="key fields missing: policy"):
        KernelRecord.from_dict({k: v for k, v in d.items() if k != "policy"})


def test_stamped_fills_the_toolchain(monkeypatch):
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: "hash-of-" + name)
    r = make_rec(cutlass_version="", nvcc_version="", template_hash="").stamped(TC)
    assert (r.cutlass_version, r.nvcc_version, r.factdb_version, r.template_hash) == \
        ("4.2.0.0", "13.0.88", "0.1.0", "hash-of-gemm_sm90")
    t = TrialRecord(key=make_key(), template="gemm_sm90", config={"a": 1}, status="ok").stamped(TC, "x")
    assert t.template_hash == "x" and t.config_hash == R.config_hash({"a": 1}) and len(t.id) == 32


# ---------------------------------------------------------------------------------------
# merge

def _cur(tc=TC):
    return Current(tc, TH)


def test_merge_rules():
    cur = _cur()
    v = make_rec(time_ms=1.0)
    assert merge_decision(None, v, cur) == "inserted"
    assert merge_decision(v, v, cur) == "kept"                                   # idempotent
    assert merge_decision(v, v.replace(time_ms=0.9), cur) == "replaced"          # faster, same toolchain
    assert merge_decision(v, v.replace(time_ms=1.1), cur) == "kept"              # slower
    assert merge_decision(v, v.replace(time_ms=1.0, notes="x"), cur) == "kept"  # a tie keeps the old row
    failed = v.replace(status="failed", time_ms=None, error="verify failed")
    stale = v.replace(status="stale", time_ms=0.5)
    assert merge_decision(v, failed, cur) == "kept"     # never replaced by an unverified row
    assert merge_decision(v, stale, cur) == "kept"      # ... even a faster one
    assert merge_decision(failed, v, cur) == "replaced"
    assert merge_decision(stale, v, cur) == "replaced"
    assert merge_decision(stale, failed, cur) == "kept"
    # current toolchain beats an older one, whatever the times
    old_tc = make_rec(tc=TC_NEW_NVCC, time_ms=0.1)     # verified, but under an nvcc that is not installed
    assert merge_decision(old_tc, v, cur) == "replaced"
    assert merge_decision(v, old_tc, cur) == "kept"
    # a changed template hash makes the old row non-current too
    assert merge_decision(make_rec(th="old", time_ms=0.1), v, cur) == "replaced"
    # two rows under other toolchains: the newer one wins
    a = make_rec(tc=TC_NEW_NVCC, time_ms=0.5, created_at="2026-01-01T00:00:00Z")
    b = make_rec(tc=Toolchain("4.1.0.0", "12.8.0", "0.1.0"), time_ms=0.9, created_at="2026-02-01T00:00:00Z")
    assert merge_decision(a, b, cur) == "replaced" and merge_decision(b, a, cur) == "kept"
    # same other toolchain: the faster wins
    assert merge_decision(a, a.replace(time_ms=0.4, created_at="2025-01-01T00:00:00Z"), cur) == "replaced"
    # two failures: the newer wins
    f2 = failed.replace(created_at="2030-01-01T00:00:00Z", error="other")
    assert merge_decision(failed, f2, cur) == "replaced" and merge_decision(f2, failed, cur) == "kept"


def test_put_kernel_merges(reg):
    kw = KW
    r = make_rec()
    assert reg.put_kernel(r, **kw) == "inserted"
    assert reg.put_kernel(r, **kw) == "kept"
    assert reg.put_kernel(r.replace(time_ms=0.5), **kw) == "replaced"
    assert reg.put_kernel(r.replace(status="failed", time_ms=None), **kw) == "kept"
    got = reg.get(r.key)
    assert got.time_ms == 0.5 and got.status == "verified" and got.updated_at >= got.created_at
    assert reg.count() == 1
    res = reg.put_kernels([make_rec(make_key(m=1024)), make_rec(make_key(m=1024), time_ms=0.1), r], **kw)
    assert res.outcomes == ["inserted", "replaced", "kept"]
    assert reg.get(make_key(m=1024)).time_ms == 0.1 and reg.count() == 2
    with pytest.raises(RegistryError, match="takes KernelRecord"):
        reg.put_kernel(r.as_dict())


# ---------------------------------------------------------------------------------------
# lookup

def test_lookup_exact_nearest_and_none(reg):
    kw = KW
    for m in (1024, 2048, 8192):
        reg.put_kernel(make_rec(make_key(m=m), time_ms=m / 1000), **kw)
    hit = reg.lookup(make_key(m=2048), **kw)
    assert hit.exact and hit.distance == 0.0 and not hit.stale and hit.usable and hit.record.key.m == 2048
    near = reg.lookup(make_key(m=4096), **kw)       # 2048 and 8192 are both 1.0 away: the faster wins
    assert not near.exact and near.distance == pytest.approx(1.0) and near.record.key.m == 2048
    near = reg.lookup(make_key(m=6144), **kw)       # log2(8192/6144)=0.415 < log2(6144/2048)=1.585
    assert near.record.key.m == 8192 and near.distance == pytest.approx(0.415, abs=1e-3)
    assert reg.lookup(make_key(m=6144), max_distance=0.4, **kw) is None
    # another divisibility class (4000 is a multiple of 16, not of 64 or 128): no compatible row
    assert reg.lookup(make_key(m=4000), **kw) is None
    # nothing crosses hardware, policy, dtype, layout or epilogue
    for other in ({"gpu": "a100", "arch": "sm80"}, {"gpu": "h200"}, {"policy": "fp32"}, {"layout_b": "row"},
                  {"epilogue": "bias"}, {"rule": "gemm-bias"},
                  {"dtype_in": "bfloat16", "dtype_out": "bfloat16", "policy": "bf16"}):
        assert reg.lookup(make_key(m=2048, **other), **kw) is None, other


def test_lookup_batch_counts_in_the_distance(reg):
    kw = KW
    reg.put_kernel(make_rec(make_key(rule="batched-gemm", batch=8)), **kw)
    near = reg.lookup(make_key(rule="batched-gemm", batch=32), **kw)
    assert near.distance == pytest.approx(2.0)


def test_lookup_flags_stale_rows_and_prefers_usable_ones(reg):
    kw = KW
    reg.put_kernel(make_rec(make_key(m=2048)), **kw)
    # exact row, toolchain changed since: returned, flagged, with the reason
    hit = reg.lookup(make_key(m=2048), toolchain=TC_NEW_NVCC, template_hashes=TH)
    assert hit.exact and hit.stale and not hit.usable
    assert hit.stale_reason == "built with nvcc 13.0.88, now 13.1.10"
    hit = reg.lookup(make_key(m=2048), toolchain=TC, template_hashes={"gemm_sm90": "changed"})
    assert hit.stale and "template gemm_sm90 changed (hash aaaa, now changed)" in hit.stale_reason
    hit = reg.lookup(make_key(m=2048), toolchain=TC, template_hashes={"gemm_sm90": ""})
    assert hit.stale and "template gemm_sm90 no longer exists" in hit.stale_reason
    # nearest: a usable row further away beats a stale row nearer
    reg.put_kernel(make_rec(make_key(m=16384), tc=TC_NEW_NVCC), **kw)
    near = reg.lookup(make_key(m=4096), toolchain=TC_NEW_NVCC, template_hashes=TH)
    assert near.record.key.m == 16384 and not near.stale and near.distance == pytest.approx(2.0)
    # ... and a stale row is still reported, flagged, when it is all there is
    reg2 = Registry.memory()
    reg2.put_kernel(make_rec(make_key(m=2048)), **kw)
    near = reg2.lookup(make_key(m=4096), toolchain=TC_NEW_NVCC, template_hashes=TH)
    assert near.stale and not near.exact and near.record.key.m == 2048


def test_lookup_ignores_failed_rows(reg):
    kw = KW
    reg.put_kernel(make_rec(status="failed", time_ms=None, error="nothing verified"), **kw)
    assert reg.lookup(make_key(), **kw) is None
    assert reg.get(make_key()).status == "failed"


def test_lookup_uses_the_installed_toolchain_by_default(monkeypatch):
    monkeypatch.setattr("fact_db.core.toolchain.current", lambda: TC)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: TH.get(name, ""))
    with Registry.memory() as reg:
        reg.put_kernel(make_rec())
        assert reg.lookup(make_key()).usable
        reg.put_kernel(make_rec(make_key(m=256), th="old"))
        hit = reg.lookup(make_key(m=256))
        assert hit.stale and "template gemm_sm90 changed" in hit.stale_reason


# ---------------------------------------------------------------------------------------
# queries, trials

def test_kernels_filters(reg):
    kw = KW
    reg.put_kernels([make_rec(make_key(m=256)), make_rec(make_key(m=512, policy="fp32")),
                     make_rec(make_key(m=768, gpu="a100", arch="sm80")),
                     make_rec(make_key(m=1024), status="failed", time_ms=None)], **kw)
    assert [r.key.m for r in reg.kernels()] == [256, 512, 768, 1024]
    assert [r.key.m for r in reg.kernels(policy="fp32")] == [512]
    assert [r.key.m for r in reg.kernels(gpu="NVIDIA A100-SXM4-80GB")] == [768]
    assert [r.key.m for r in reg.kernels(status="failed")] == [1024]
    assert [r.key.m for r in reg.kernels(rule="gemm", arch="sm90a", status="verified", dtype_in="fp32")] == [256, 512]
    assert reg.count(arch="sm80") == 1
    with pytest.raises(RegistryError, match="cannot filter kernels by speed"):
        list(reg.kernels(speed=1))


def test_trials_and_failed_configs(reg):
    key = make_key()
    mk = lambda cfg, status, tc=TC, th="aaaa", **kw: TrialRecord(
        key=key, template="gemm_sm90", config=cfg, status=status, template_hash=th, cutlass_version=tc.cutlass,
        nvcc_version=tc.nvcc, factdb_version=tc.factdb, **kw)
    trials = [mk({"t": 1}, "ok", time_ms=1.0), mk({"t": 2}, "compile_error", error="nvcc -O3 ... exit 1"),
              mk({"t": 3}, "verify_failed", rel_err=0.3), mk({"t": 4}, "timeout"), mk({"t": 5}, "skipped"),
              mk({"t": 6}, "crashed", tc=TC_NEW_NVCC), mk({"t": 7}, "launch_error", th="old")]
    assert reg.add_trials(trials) == 7
    got = reg.trials(key)
    assert len(got) == 7 and got[1].error == "nvcc -O3 ... exit 1" and got[0].config == {"t": 1}
    assert reg.trials(key.digest()) == got
    failed = reg.failed_configs(key, TC, template_hashes=TH)
    # failures under this toolchain only: not ok/skipped, not the other nvcc's crash, not the old template's
    assert failed == {R.config_hash({"t": i}) for i in (2, 3, 4)}
    assert reg.failed_configs(key, TC_NEW_NVCC, template_hashes=TH) == {R.config_hash({"t": 6})}
    assert reg.trials(make_key(m=1)) == [] and reg.add_trials([]) == 0
    with pytest.raises(RegistryError, match="trial status 'oops'"):
        mk({}, "oops")


def test_rules_and_examples_tables(reg):
    assert reg.put_rules([RuleRecord(id="gemm", family="gemm", title="GEMM", path="rules/gemm/gemm.yaml",
                                     hash="h1", template="gemm_sm90", status="stable")]) == 1
    reg.put_rules([RuleRecord(id="gemm", title="GEMM v2"), RuleRecord(id="attention")])
    assert [(r.id, r.title) for r in reg.rules()] == [("attention", ""), ("gemm", "GEMM v2")]
    reg.put_rules([RuleRecord(id="x")], replace_all=True)
    assert [r.id for r in reg.rules()] == ["x"]
    reg.put_examples([ExampleRecord(id="48_hopper_warp_specialized_gemm", kind="cutlass-example", arch="sm90a")])
    assert reg.examples()[0].arch == "sm90a"


def test_sync_rules_mirrors_the_shipped_rules(reg, ruleset):
    n = reg.sync_rules(ruleset)
    rows = {r.id: r for r in reg.rules()}
    assert n == len(rows) >= 10 and rows["gemm-bias-gelu-tanh"].template and len(rows["gemm"].hash) == 16


# ---------------------------------------------------------------------------------------
# JSONL

def test_export_import_roundtrip(reg, tmp_path):
    kw = KW
    reg.put_kernels([make_rec(make_key(m=256)), make_rec(make_key(m=512, gpu="a100", arch="sm80"))], **kw)
    out = tmp_path / "k.jsonl"
    assert reg.export_jsonl(out) == 2
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and lines == sorted(lines, key=lambda s: json.loads(s)["digest"])
    assert reg.export_jsonl(tmp_path / "a.jsonl", gpu="a100") == 1
    buf = io.StringIO()
    reg.export_jsonl(buf)
    assert buf.getvalue() == out.read_text()
    with Registry.memory() as other:
        rep = other.import_jsonl(out, **kw)
        assert (rep.inserted, rep.replaced, rep.kept, rep.path) == (2, 0, 0, str(out))
        strip = lambda rs: sorted((r.replace(updated_at=r.created_at) for r in rs), key=lambda r: r.digest)
        assert strip(other.kernels()) == strip(reg.kernels())   # updated_at: when this registry got the row
        rep = other.import_jsonl(out, **kw)
        assert (rep.inserted, rep.replaced, rep.kept) == (0, 0, 2)


def test_import_merges_and_fills_provenance(reg, tmp_path):
    kw = KW
    reg.put_kernel(make_rec(make_key(m=256), time_ms=1.0), **kw)
    rows = [make_rec(make_key(m=256), time_ms=0.5).as_dict(), make_rec(make_key(m=512)).as_dict(),
            make_rec(make_key(m=256), time_ms=2.0).as_dict()]
    del rows[1]["provenance"], rows[1]["digest"]
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    rep = reg.import_jsonl(p, **kw)
    assert (rep.inserted, rep.replaced, rep.kept) == (1, 1, 1)
    assert reg.get(make_key(m=256)).time_ms == 0.5 and reg.get(make_key(m=512)).provenance == "import"


def test_import_is_all_or_nothing_and_lists_every_bad_line(reg, tmp_path):
    kw = KW
    good = make_rec(make_key(m=256)).as_dict()
    lines = [json.dumps(good),
             "{not json",
             json.dumps({**make_rec(make_key(m=512)).as_dict(), "status": "great"}),
             json.dumps(make_rec(make_key(m=768)).as_dict()),
             "[1, 2]",
             json.dumps({**good, "m": 1024}),
             json.dumps({**good, "digest": "0000", "time_ms": "fast"}),
             json.dumps({**good, "rel_err": float("nan")}).replace("NaN", "NaN")]
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportError_) as ei:
        reg.import_jsonl(p, **kw)
    e = ei.value
    assert [n for n, _ in e.problems] == [2, 3, 5, 6, 7, 8]
    reasons = dict(e.problems)
    assert "not valid JSON" in reasons[2] and "status 'great'" in reasons[3] and "JSON object" in reasons[5]
    assert "does not match the key fields" in reasons[6] and "time_ms must be a finite number" in reasons[7]
    assert "NaN is not allowed" in reasons[8]
    msg = str(e)
    assert msg.startswith(f"{p}: 6 bad lines, nothing imported (line 2: not valid JSON")
    assert all(f"line {n}:" in msg for n in (2, 3, 5, 6, 7, 8)) and "fix them and import again" in msg
    assert reg.count() == 0      # lines 1 and 4 were fine, and were not applied either


def test_import_refuses_missing_and_binary_files(reg, tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        reg.import_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RegistryError, match="not UTF-8"):
        reg.import_jsonl(tmp_path / "b.jsonl")


# ---------------------------------------------------------------------------------------
# seed, revalidate, gc

def test_seed_is_imported_on_first_use_and_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setattr("fact_db.core.toolchain.current", lambda: TC)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: TH.get(name, ""))
    seed = tmp_path / "kernels.jsonl"
    seed.write_text(json.dumps({k: v for k, v in make_rec(make_key(m=256)).as_dict().items()
                                if k != "provenance"}) + "\n")
    monkeypatch.setenv("FACTDB_SEED", str(seed))
    url = f"duckdb:///{tmp_path / 'fact.duckdb'}"
    with Registry.open(url) as reg:
        assert [(r.key.m, r.provenance) for r in reg.kernels()] == [(256, "seed")]
        meta = reg.meta()
        assert meta["seed_sha256"] == __import__("hashlib").sha256(seed.read_bytes()).hexdigest()
        assert meta["seed_path"] == str(seed) and meta["schema_version"] == str(db_mod.SCHEMA_VERSION)
        assert meta["created_by"].startswith("fact-db ")
        reg.put_kernel(make_rec(make_key(m=256), time_ms=9.0).replace(notes="mine"))  # slower: kept
        reg.db.begin  # noqa: B018
        with reg.transaction() as conn:  # user deleted the seeded row: an unchanged seed is not re-imported
            conn.execute(sa.delete(R.K))
    with Registry.open(url) as reg:
        assert reg.count() == 0
    seed.write_text(seed.read_text() + json.dumps(make_rec(make_key(m=512)).as_dict()) + "\n")
    with Registry.open(url) as reg:     # a newer seed file is imported again
        assert sorted(r.key.m for r in reg.kernels()) == [256, 512]
    monkeypatch.setenv("FACTDB_SEED", "")
    assert R.seed_path() is None
    monkeypatch.delenv("FACTDB_SEED")
    assert R.seed_path() == ROOT / "index" / "kernels.jsonl"


def test_shipped_seed_file_exists_and_imports():
    seed = ROOT / "index" / "kernels.jsonl"
    assert seed.is_file()
    with Registry.open("memory", seed=seed) as reg:
        assert reg.count() == len([line for line in seed.read_text().splitlines() if line.strip()])


def test_shipped_seed_rows_match_the_shipped_templates():
    """A template edit makes every seed row built from it stale, so a new database would tune
    those workloads again (c9d955b did this to the bf16 rows unnoticed)."""
    from fact_db.core import toolchain
    seed = ROOT / "index" / "kernels.jsonl"
    for line in seed.read_text().splitlines():
        row = json.loads(line)
        assert row["template_hash"] == toolchain.template_hash(row["template"]), (
            f"index/kernels.jsonl row {row['digest']} ({row['policy']} {row['m']}x{row['n']}x{row['k']}) was tuned "
            f"with another version of kernels_cpp/{row['template']}.cu.j2: tune it again on a GPU and merge the "
            "results with benchmarks/seed_registry.py, or drop the row")


def test_bad_seed_file_is_refused_with_its_lines(tmp_path):
    seed = tmp_path / "kernels.jsonl"
    seed.write_text("{}\n")
    with pytest.raises(ImportError_, match=r"kernels.jsonl: 1 bad line, nothing imported \(line 1: key fields"
                                           r".*; fix the seed file, or set FACTDB_SEED"):
        Registry.open("memory", seed=seed)


def test_memory_registries_are_not_seeded_by_default(monkeypatch, tmp_path):
    seed = tmp_path / "kernels.jsonl"
    seed.write_text(json.dumps(make_rec().as_dict()) + "\n")
    monkeypatch.setenv("FACTDB_SEED", str(seed))
    with Registry.memory() as reg:
        assert reg.count() == 0
    with Registry.memory(seed=seed) as reg:
        assert reg.count() == 1


def test_revalidate_marks_stale_and_restores(reg):
    kw = {"template_hashes": TH}
    reg.put_kernels([make_rec(make_key(m=256)), make_rec(make_key(m=512), th="old"),
                     make_rec(make_key(m=768), status="failed", time_ms=None)], toolchain=TC, **kw)
    assert reg.revalidate(TC, dry_run=True, **kw) == [
        R.Change(make_key(m=512).digest(), "gemm", "512x4096x4096", "verified", "stale",
                 "template gemm_sm90 changed (hash old, now aaaa)")]
    assert reg.get(make_key(m=512)).status == "verified"          # dry run changed nothing
    changes = reg.revalidate(TC_NEW_NVCC, **kw)
    assert {(c.shape, c.new_status) for c in changes} == {("256x4096x4096", "stale"), ("512x4096x4096", "stale")}
    row = reg.get(make_key(m=256))
    assert row.status == "stale" and row.stale_reason == "built with nvcc 13.0.88, now 13.1.10"
    assert reg.get(make_key(m=768)).status == "failed"           # failed rows are left alone
    hit = reg.lookup(make_key(m=256), toolchain=TC, **kw)        # toolchain back, not yet revalidated
    assert hit.stale and "revalidate` will restore it" in hit.stale_reason
    changes = reg.revalidate(TC, **kw)                           # back on the old toolchain: restored
    assert [(c.shape, c.old_status, c.new_status) for c in changes] == [("256x4096x4096", "stale", "verified")]
    assert reg.lookup(make_key(m=256), toolchain=TC, **kw).usable
    assert reg.get(make_key(m=512)).status == "stale"
    assert reg.revalidate(TC, **kw) == []


def test_revalidate_recheck_hook(reg):
    kw = {"template_hashes": TH}
    reg.put_kernels([make_rec(make_key(m=256)), make_rec(make_key(m=512))], toolchain=TC, **kw)
    seen = []

    def recheck(rec, reason):
        seen.append((rec.key.m, reason))
        if rec.key.m == 256:   # re-verified on the GPU under the new toolchain, a bit faster
            return rec.replace(time_ms=0.8, nvcc_version=TC_NEW_NVCC.nvcc)
        return None            # could not be re-verified: stays stale

    changes = reg.revalidate(TC_NEW_NVCC, recheck=recheck, **kw)
    assert sorted(seen) == [(256, "built with nvcc 13.0.88, now 13.1.10"), (512, "built with nvcc 13.0.88, now 13.1.10")]
    assert {(c.shape, c.new_status) for c in changes} == {("256x4096x4096", "verified"), ("512x4096x4096", "stale")}
    assert reg.lookup(make_key(m=256), toolchain=TC_NEW_NVCC, **kw).record.time_ms == 0.8
    assert reg.get(make_key(m=512)).status == "stale"
    with pytest.raises(RegistryError, match="recheck returned a row for key"):
        reg.revalidate(TC_NEW_NVCC, recheck=lambda rec, why: rec.replace(key=make_key(m=1)), **kw)


def test_gc(reg):
    now = datetime(2026, 6, 1, tzinfo=timezone.utc)
    old = (now - timedelta(days=40)).isoformat()
    new = (now - timedelta(days=5)).isoformat()
    kw = KW
    reg.put_kernels([make_rec(make_key(m=256), created_at=old),                                   # verified: kept
                     make_rec(make_key(m=512), status="failed", time_ms=None, created_at=old),  # old failed: goes
                     make_rec(make_key(m=768), status="stale", created_at=old),                 # old stale: goes
                     make_rec(make_key(m=1024), status="failed", time_ms=None)], **kw)          # recent: kept
    with reg.transaction() as conn:  # put sets updated_at to now; age the rows as if written back then
        conn.execute(sa.update(R.K).where(R.K.c.m != 1024).values(updated_at=R._norm_time(old)))
        conn.execute(sa.update(R.K).where(R.K.c.m == 1024).values(updated_at=R._norm_time(new)))
    tr = lambda m, when: TrialRecord(key=make_key(m=m), template="gemm_sm90", config={"m": m},
                                     status="compile_error", created_at=when)
    reg.add_trials([tr(256, old), tr(512, old), tr(2048, old), tr(2048, new), tr(768, new)])
    dry = reg.gc(30, dry_run=True, now=now)
    assert sorted(dry.kernels) == sorted([make_key(m=512).digest(), make_key(m=768).digest()])
    assert dry.trials == 2 and dry.dry_run and reg.count() == 4          # 512's and 2048's old trials
    rep = reg.gc(30, now=now)
    assert rep.kernels == dry.kernels and rep.trials == 2
    assert sorted(r.key.m for r in reg.kernels()) == [256, 1024]
    left = sorted((t.key.m, t.created_at[:10]) for m in (256, 512, 768, 2048) for t in reg.trials(make_key(m=m)))
    assert left == [(256, old[:10]), (768, new[:10]), (2048, new[:10])]
    assert reg.gc(30, now=now).kernels == []
    with pytest.raises(RegistryError, match="days >= 0"):
        reg.gc(-1)


# ---------------------------------------------------------------------------------------
# backends, URLs, schema

def test_url_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("FACTDB_DB", raising=False)
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "home"))
    assert db_mod.resolve_url(None) == f"duckdb:///{tmp_path / 'home' / 'fact.duckdb'}"
    monkeypatch.setenv("FACTDB_DB", "sqlite:///x.db")
    assert db_mod.resolve_url(None) == "sqlite:///x.db"
    assert db_mod.resolve_url("memory") == "duckdb:///:memory:"
    assert db_mod.resolve_url(str(tmp_path / "r.duckdb")) == f"duckdb:///{tmp_path / 'r.duckdb'}"
    monkeypatch.setenv("FACTDB_DB_TIMEOUT", "2.5")
    assert db_mod.resolve_timeout(None) == 2.5 and db_mod.resolve_timeout(1) == 1.0
    monkeypatch.setenv("FACTDB_DB_TIMEOUT", "soon")
    with pytest.raises(RegistryError, match="FACTDB_DB_TIMEOUT='soon' is not a number"):
        db_mod.resolve_timeout(None)


def test_default_database_is_created_under_factdb_home(monkeypatch, tmp_path):
    monkeypatch.delenv("FACTDB_DB", raising=False)
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "new" / "home"))
    monkeypatch.setenv("FACTDB_SEED", "")
    with Registry.open() as reg:
        reg.put_kernel(make_rec(), toolchain=TC, template_hashes=TH)
    assert (tmp_path / "new" / "home" / "fact.duckdb").is_file()
    with Registry.open() as reg:
        assert reg.count() == 1 and reg.where == str(tmp_path / "new" / "home" / "fact.duckdb")


@pytest.mark.parametrize("backend", ["duckdb", "sqlite"])
def test_file_backends_full_cycle(backend, tmp_path):
    url = f"{backend}:///{tmp_path / ('r.' + backend)}"
    kw = KW
    with Registry.open(url, seed=False) as reg:
        assert reg.put_kernel(make_rec(make_key(m=256)), **kw) == "inserted"
        assert reg.put_kernel(make_rec(make_key(m=256), time_ms=0.5), **kw) == "replaced"
        reg.add_trials([TrialRecord(key=make_key(m=256), template="gemm_sm90", config={}, status="timeout",
                                    template_hash="aaaa", cutlass_version=TC.cutlass, nvcc_version=TC.nvcc)])
        with reg.pinned(write=True):
            reg.put_kernel(make_rec(make_key(m=512)), **kw)
            assert reg.lookup(make_key(m=512), **kw).exact
    with Registry.open(url, seed=False) as reg:   # reopened: everything is there
        assert reg.lookup(make_key(m=256), **kw).record.time_ms == 0.5
        assert reg.lookup(make_key(m=384), **kw).record.key.m in (256, 512)
        assert reg.failed_configs(make_key(m=256), TC, template_hashes=TH) == {R.config_hash({})}
        assert reg.meta()["schema_version"] == str(db_mod.SCHEMA_VERSION)
        assert reg.count() == 2


@pytest.mark.parametrize("backend", ["duckdb", "sqlite"])
def test_migrated_schema_matches_the_models(backend, tmp_path):
    url = f"{backend}:///{tmp_path / ('s.' + backend)}"
    with Registry.open(url, seed=False) as reg, reg.transaction(write=False) as conn:
        for table in R.METADATA.sorted_tables:
            if backend == "duckdb":  # duckdb-engine's inspector cannot reflect columns
                got = conn.exec_driver_sql("select column_name, data_type from information_schema.columns where "
                                           f"table_name = '{table.name}' order by ordinal_position").all()
            else:
                got = [(c["name"], str(c["type"])) for c in sa.inspect(conn).get_columns(table.name)]
            assert [name for name, _ in got] == [c.name for c in table.columns], table.name
            types = dict(got)
            if table.name == "kernels":  # doubles, not 4-byte floats (sa.Float is FLOAT4 in DuckDB)
                assert types["time_ms"] == "DOUBLE" and types["m"] == "BIGINT"


def test_migrations_run_once_in_order_and_leave_index_tables_alone(tmp_path, monkeypatch):
    path = tmp_path / "m.duckdb"
    import duckdb
    con = duckdb.connect(str(path))   # the index engineer got there first
    con.execute("create table index_docs (id varchar, body varchar)")
    con.execute("insert into index_docs values ('a', 'kept')")
    con.close()
    with Registry.open(str(path), seed=False) as reg:
        assert reg.meta()["schema_version"] == str(db_mod.SCHEMA_VERSION)
        assert reg.meta()["last_migration"] == db_mod.MIGRATIONS[-1][1]
    calls = []
    nxt = db_mod.SCHEMA_VERSION + 1

    def m_extra(conn):
        calls.append(1)
        conn.exec_driver_sql("alter table kernels add column extra varchar default ''")

    monkeypatch.setattr(db_mod, "MIGRATIONS", db_mod.MIGRATIONS + [(nxt, "m_extra", m_extra)])
    monkeypatch.setattr(db_mod, "SCHEMA_VERSION", nxt)
    for _ in range(2):
        with Registry.open(str(path), seed=False) as reg:
            assert reg.meta()["schema_version"] == str(nxt) and reg.meta()["last_migration"] == "m_extra"
    assert calls == [1]
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("select * from index_docs").fetchall() == [("a", "kept")]
    con.close()


def test_pinned_reuses_one_connection_and_refuses_writes_when_read_only(tmp_path):
    kw = KW
    with Registry.open(str(tmp_path / "p.duckdb"), seed=False) as reg:
        reg.put_kernel(make_rec(), **kw)
        with reg.pinned():
            assert all(reg.lookup(make_key(m=m), **kw) for m in (4096, 2048))
            with pytest.raises(RegistryError, match=r"inside pinned\(write=False\)"):
                reg.put_kernel(make_rec(make_key(m=64)), **kw)
        assert reg.count() == 1


def test_no_network_is_touched(tmp_path, monkeypatch):
    """A full cycle, and a SQLite file handed to DuckDB (which would download an extension), offline."""
    def refuse(*a, **k):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    kw = KW
    with Registry.open(str(tmp_path / "n.duckdb"), seed=False) as reg:
        reg.put_kernel(make_rec(), **kw)
        reg.lookup(make_key(m=1024), **kw)
        reg.export_jsonl(tmp_path / "n.jsonl")
        reg.import_jsonl(tmp_path / "n.jsonl", **kw)
        reg.revalidate(TC, template_hashes=TH)
        reg.gc(0)
    import sqlite3
    sqlite3.connect(tmp_path / "s.db").execute("create table t (x)").connection.commit()
    with pytest.raises(R.NotARegistry, match="SQLite file"):
        Registry.open(str(tmp_path / "s.db"))


def test_registry_module_imports_neither_torch_nor_sentence_transformers():
    # fact_db/__init__.py imports discovery (and torch); load fact_db.store.registry without it
    code = (
        "import sys, types, time\n"
        f"pkg = types.ModuleType('fact_db'); pkg.__path__ = [{str(ROOT / 'fact_db')!r}]; pkg.__version__ = '0'\n"
        "sys.modules['fact_db'] = pkg\n"
        "t = time.perf_counter()\n"
        "from fact_db.store.registry import Registry, KernelKey\n"
        "import fact_db.store.db\n"
        "r = Registry.open('memory')\n"
        "r.lookup(KernelKey(rule='gemm', arch='sm90a', gpu='h100', dtype_in='float32', dtype_acc='float32',"
        " dtype_out='float32', layout_a='row', layout_b='col', m=64, n=64, k=64, batch=1, epilogue='none',"
        " policy='fp32'))\n"
        "bad = [m for m in ('torch', 'sentence_transformers', 'numpy', 'transformers') if m in sys.modules]\n"
        "print(bad, round(time.perf_counter() - t, 3))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "FACTDB_SEED": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("]")[0] + "]" == "[]", out.stdout


def test_coexists_with_other_connections_in_this_process(tmp_path):
    """fact_db.store.index opens the same DuckDB file directly; DuckDB refuses mixed configurations in one process."""
    path = tmp_path / "shared.duckdb"
    with Registry.open(str(path), seed=False) as reg:
        reg.put_kernel(make_rec(), **KW)
        raw = db_mod.connect_duckdb(path)               # read-write, default configuration, held open
        raw.execute("create table index_docs (id varchar)")
        assert reg.lookup(make_key(), **KW).exact         # reads fall back to read-write connections
        assert reg.put_kernel(make_rec(make_key(m=64)), **KW) == "inserted"
        assert raw.execute("select count(*) from kernels").fetchone() == (2,)
        raw.close()
        ro = db_mod.connect_duckdb(path, read_only=True)  # a read-only one held open: writers wait, then say so
        reg.db.timeout = 0.2
        with pytest.raises(R.RegistryBusy, match="a read-only connection in this process holds it"):
            reg.put_kernel(make_rec(make_key(m=128)), **KW)
        assert reg.count() == 2
        ro.close()
        assert reg.put_kernel(make_rec(make_key(m=128)), **KW) == "inserted"


def test_threads_writing_one_file_do_not_duplicate_keys(tmp_path):
    import threading
    with Registry.open(str(tmp_path / "t.duckdb"), seed=False) as reg:
        errors = []

        def work(t):
            try:
                for i in range(6):
                    reg.put_kernel(make_rec(make_key(m=64 * (i + 1)), time_ms=1.0 + t / 10), **KW)  # shared keys
                    reg.put_kernel(make_rec(make_key(m=64 * (i + 1), n=64 * (t + 1))), **KW)
                    reg.lookup(make_key(m=64 * (i + 1)), **KW)
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        digests = [r.digest for r in reg.kernels()]
        assert len(digests) == len(set(digests)) == 6 + 3 * 6
        assert all(reg.get(make_key(m=64 * (i + 1))).time_ms == 1.0 for i in range(6))


def test_bulk_paths_keep_every_value(tmp_path):
    """Many rows go to DuckDB through a CSV file: text with quotes, commas, newlines, unicode, empty
    strings and NULLs must come back exactly (and a literal \\N, which takes the executemany path)."""
    odd = ['say "hi", then\nleave', "", "ünï ✓", "a,b", "'quoted'", " padded "]

    def rec(i, text):
        return make_rec(make_key(m=64 * (i + 1)), notes=text[i % len(text)], error=text[(i + 1) % len(text)],
                        rel_err=None if i % 2 else 1e-7 * (i + 1), baseline_ms=None if i % 3 else 1.0 / 3,
                        config={"s": text[i % len(text)], "f": 0.1 + i})

    csv_recs = [rec(i, odd) for i in range(20)]
    slow_recs = [rec(i, [*odd, "\\N"]) for i in range(20, 32)]
    assert any(r.notes == "\\N" for r in slow_recs)
    with Registry.open(str(tmp_path / "b.duckdb"), seed=False) as reg:
        assert reg.bulk_insert(csv_recs) == 20
        assert reg.put_kernels(slow_recs, **KW).inserted == 12
        back = {r.digest: r for r in reg.kernels()}
        trials = [TrialRecord(key=make_key(), template="gemm_sm90", config={"i": i}, status="compile_error",
                              error=f"line one, \"{i}\"\nline two", time_ms=None if i % 2 else 0.5)
                  for i in range(20)]
        reg.add_trials(trials)
        assert sorted(reg.trials(make_key()), key=lambda t: t.id) == sorted(trials, key=lambda t: t.id)
    assert len(back) == 32
    for r in csv_recs + slow_recs:
        assert back[r.digest].replace(updated_at=r.updated_at) == r


def test_export_rows_are_the_records_dicts(reg):
    recs = [make_rec(make_key(m=64 * i), notes="n", rel_err=None) for i in (1, 2, 3)]
    reg.bulk_insert(recs)
    buf = io.StringIO()
    reg.export_jsonl(buf)
    assert [json.loads(line) for line in buf.getvalue().splitlines()] == \
        [r.as_dict() for r in sorted(recs, key=lambda r: r.digest)]


def test_nearest_looks_past_the_first_candidates_when_they_are_stale(reg):
    # nine stale rows nearer than the one usable row: the usable one is returned
    reg.put_kernels([make_rec(make_key(n=128 * i), th="old") for i in range(1, 10)], **KW)
    reg.put_kernel(make_rec(make_key(n=128 * 64)), **KW)
    near = reg.lookup(make_key(n=128 * 5 + 1024), **KW)
    assert near.usable and near.record.key.n == 128 * 64
    # six rows tied at distance 1 (one dimension doubled or halved): the fastest wins, even when
    # fewer are fetched first (first=2): ties with the last one fetched are fetched too
    q = make_key(m=1024, n=1024, k=1024)
    tied = [q.with_(m=2048), q.with_(m=512), q.with_(n=2048), q.with_(n=512), q.with_(k=2048), q.with_(k=512)]
    reg.put_kernels([make_rec(k, time_ms=2.0 + i) for i, k in enumerate(tied[::-1])], **KW)
    with reg.transaction(write=False) as conn:
        rec, d = R._nearest(conn, q, Current(TC, TH), None, first=2)
    assert d == pytest.approx(1.0) and rec.time_ms == 2.0 and rec.key == tied[-1]
    assert reg.lookup(q, **KW).record.key == tied[-1]


def test_shipped_seed_imports_as_current_verified_rows(tmp_path):
    """index/kernels.jsonl (kernels tuned on an H100) must import into a new registry whole."""
    seed = ROOT / "index" / "kernels.jsonl"
    lines = [json.loads(line) for line in seed.read_text().splitlines() if line.strip()]
    with R.Registry.open(f"duckdb:///{tmp_path / 'seeded.duckdb'}", seed=seed) as reg:
        rows = list(reg.kernels())
    assert len(rows) == len(lines) > 0
    assert {r.provenance for r in rows} == {"seed"} and {r.status for r in rows} == {"verified"}
    assert all(r.time_ms and r.baseline_ms and r.time_ms < r.baseline_ms for r in rows)
