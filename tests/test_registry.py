"""The kernel registry: keys, records, merge, lookup, staleness, trials, JSONL, seed, gc.

Everything here runs on an in-memory or temporary database, with an explicit environment
and template hashes (ENV: no GPU named, so only CUTLASS and nvcc count; GPU_ENV: an H100
SXM with every field known), so nothing depends on this machine's GPU, nvcc or templates.
"""
import dataclasses
import hashlib
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

from fact_db.core.device import DeviceError
from fact_db.core.environment import Environment
from fact_db.store import db as db_mod
from fact_db.store import nearest
from fact_db.store import registry as R
from fact_db.store.records import CARRIED_OVER, norm_time
from fact_db.store.registry import (
    AttentionKey,
    Current,
    ExampleRecord,
    GemmKey,
    ImportError_,
    KernelKey,
    KernelRecord,
    Key,
    NormKey,
    RegionKey,
    Registry,
    RegistryError,
    RuleRecord,
    TrialRecord,
    canonical_gpu,
    merge_decision,
)

from conftest import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
ENV = Environment(cutlass="4.2.0.0", nvcc="13.0.88")          # judged without a GPU: CUTLASS and nvcc count
ENV_NEW_NVCC = ENV.with_(nvcc="13.1.10")
GPU_ENV = Environment(gpu_sku="NVIDIA H100 80GB HBM3", driver="580.95.05", cuda="13.0", torch="2.11.0+cu130",
                      cublas="13.1.0.3", cudnn="91200", cutlass="4.2.0.0", nvcc="13.0.88")
TH = {"gemm_sm90": "aaaa", "gemm_sm80": "bbbb"}
KW = {"env": ENV, "template_hashes": TH}


def make_key(**kw) -> GemmKey:
    base = {"rule": "gemm", "arch": "sm90a", "gpu": "h100", "dtype_in": "float32", "dtype_acc": "float32",
            "dtype_out": "float32", "layout_a": "row", "layout_b": "col", "m": 4096, "n": 4096, "k": 4096,
            "batch": 1, "epilogue": "none", "policy": "tf32"}
    return GemmKey(**{**base, **kw})


def make_rec(key=None, *, env=ENV, th="aaaa", **kw) -> KernelRecord:
    base = {"key": key or make_key(), "template": "gemm_sm90", "config": {"tile_m": 128, "tile_n": 128},
            "time_ms": 1.0, "baseline": "torch eager", "baseline_ms": 1.5, "rel_err": 1e-6, "baseline_rel_err": 1e-6,
            "env": env.with_(gpu_sku=env.gpu_sku or "NVIDIA H100 80GB HBM3") if isinstance(env, Environment) else env,
            "factdb_version": "0.1.0",
            "template_hash": th}
    return KernelRecord(**{**base, **kw})


def attn_key(**kw) -> AttentionKey:
    base = {"arch": "sm90a", "gpu": "h100", "batch": 8, "heads": 16, "kv_heads": 4, "lq": 2048, "lk": 2048, "d": 128,
            "dv": 128, "causal": True, "scale": 0.088, "dtype": "bfloat16", "policy": "bf16"}
    return AttentionKey(**{**base, **kw})


def norm_key(**kw) -> NormKey:
    base = {"arch": "sm90a", "gpu": "h100", "kind": "rmsnorm", "rows": 4096, "width": 4096, "residual": True,
            "write_sum": True, "has_bias": False, "eps": 1e-6, "dtype": "float32", "policy": "fp32"}
    return NormKey(**{**base, **kw})


SPEC = {"inputs": [{"name": "x", "kind": "input", "shape": [8, 64], "dtype": "float32"},
                   {"name": "y", "kind": "input", "shape": [64], "dtype": "float32"}],
        "ops": [{"name": "add", "op": "aten.add", "overload": "Tensor", "args": [{"ref": "x"}, {"ref": "y"}],
                 "arg_names": ["self", "other"]},
                {"name": "relu", "op": "aten.relu", "overload": "default", "args": [{"ref": "add"}],
                 "arg_names": ["self"]}],
        "output": "relu", "out_shape": [8, 64], "policy": "fp32", "dtype": "float32", "nodes": ["add", "relu"]}


BACKENDS = ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("team", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def reg(request, tmp_path):
    """The registry every test below runs against: in-memory DuckDB, a PostgreSQL schema of its
    own (tests/pg.py), and a team registry (that server, read through a local DuckDB cache)."""
    if request.param == "duckdb":
        r = Registry.memory()
    else:
        url = request.getfixturevalue("pg").new_schema()
        r = Registry.open(url, seed=False, cache=tmp_path / "cache.duckdb" if request.param == "team" else False)
    with r:
        yield r


@pytest.fixture
def here(monkeypatch):
    """Pin this process's environment and the template hashes now (the defaults of every call)."""
    def pin(env=ENV, hashes=TH):
        monkeypatch.setattr("fact_db.core.environment.current", lambda: env)
        monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: hashes.get(name, ""))
    pin()
    return pin


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
    with pytest.raises(DeviceError, match="empty"):
        canonical_gpu("  ")
    with pytest.raises(RegistryError, match="key field gpu: GPU name '  ' is empty"):
        make_key(gpu="  ")


def test_key_normalises_and_digest_is_stable():
    k = make_key(gpu="NVIDIA H100 80GB HBM3", dtype_in="fp32", dtype_out="fp32")
    assert k.gpu == "h100" and k.dtype_in == "float32"
    assert k == make_key() == make_key(arch="sm_90a") and KernelKey is GemmKey
    # the digest is the primary key and the JSONL key: it must never change between versions
    assert k.digest() == "9f5440d25517e611"
    text = json.dumps(["gemm", k.as_dict()], sort_keys=True, separators=(",", ":"))
    assert k.digest() == hashlib.sha256(text.encode()).hexdigest()[:16]       # the one scheme, spelled out
    assert make_key(m=4095).digest() != k.digest()
    assert k.shape == "4096x4096x4096" and make_key(batch=8).shape == "4096x4096x4096x8"
    assert k.summary == "gemm 4096x4096x4096 fp32"
    assert make_key(rule="gemm-bias", epilogue="bias", k=1024, dtype_in="bf16", dtype_out="bf16",
                    policy="bf16").summary == "gemm-bias 4096x4096x1024 bf16"
    assert Key.from_dict("gemm", k.as_dict()) == k and GemmKey.FIELDS[0] == "rule"
    assert set(GemmKey.FIELDS) == {f.name for f in dataclasses.fields(GemmKey)}


def test_every_family_has_one_digest_scheme_and_checked_fields():
    for key in (make_key(), attn_key(), norm_key(), RegionKey.of(SPEC, "sm_90a", "NVIDIA H200")):
        text = json.dumps([key.FAMILY, key.as_dict()], sort_keys=True, separators=(",", ":"))
        assert key.digest() == hashlib.sha256(text.encode()).hexdigest()[:16]
        assert Key.from_dict(key.FAMILY, {**key.as_dict(), "ignored": 1}) == key
        assert key.arch == "sm90a" and key.gpu in ("h100", "h200")
    assert attn_key().digest() == "e9bfc72fe7fbf31a"
    assert attn_key(scale=1) == attn_key(scale=1.0) and attn_key(scale=1).scale == 1.0
    assert attn_key().summary == "attention-causal 8x16/4kv 2048x2048 d128 bf16"
    assert norm_key().summary == "rmsnorm 4096x4096 +residual +sum fp32" and norm_key().rule_name == "rmsnorm"
    # nearest rows may vary the SHAPE fields only, within their DIV classes
    assert attn_key().near() == attn_key(batch=2, lq=1024).near() != attn_key(lq=1000).near()
    assert attn_key().near() != attn_key(d=64).near() and attn_key().distance(attn_key(lq=1024)) == 1.0
    assert norm_key().near() == norm_key(rows=7).near() != norm_key(width=2048).near()
    for bad, words in [(lambda: attn_key(causal=1), "key field causal must be true or false"),
                       (lambda: attn_key(heads=10), "heads=10 is not a multiple of kv_heads=4"),
                       (lambda: attn_key(scale=float("inf")), "key field scale must be a finite positive number"),
                       (lambda: norm_key(kind="batchnorm"), "key field kind is 'batchnorm'; use layernorm or rmsnorm"),
                       (lambda: norm_key(rows=0), "key field rows must be a positive integer"),
                       (lambda: norm_key(policy="int8"), "key field policy is 'int8'"),
                       (lambda: RegionKey(arch="sm90a", gpu="h100", policy="fp32", dtype="float32", ops="[]",
                                          inputs="[]", out="[1]"), "key field ops must be JSON text of a non-empty"),
                       (lambda: Key.from_dict("pool", {}), "family 'pool' is not one of attention, conv, gemm, norm, region")]:
        with pytest.raises(RegistryError, match=words):
            bad()


def test_region_key_ignores_node_names_and_keeps_constants():
    k = RegionKey.of(SPEC, "sm90a", "h100")
    assert json.loads(k.ops) == [["aten.add", "Tensor", [{"ref": "in0"}, {"ref": "in1"}]],
                                 ["aten.relu", "default", [{"ref": "op0"}]]]
    assert k.inputs == "[[8,64],[64]]" and k.out == "[8,64]" and k.summary == "region add+relu 8x64 fp32"
    renamed = json.loads(json.dumps(SPEC).replace('"x"', '"hidden"').replace('"add"', '"add_7"'))
    assert RegionKey.of(renamed, "sm90a", "h100") == k                # where the region sits does not count
    other = json.loads(json.dumps(SPEC))
    other["ops"][0]["args"].append(2.0)                               # an alpha: another kernel
    assert RegionKey.of(other, "sm90a", "h100").digest() != k.digest()
    with pytest.raises(RegistryError, match="pass RegionSpec.as_dict"):
        RegionKey.of({"ops": []}, "sm90a", "h100")


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
    assert make_key(m=4096, n=4000, k=24).div_classes == (128, 16, 8) and make_key(n=4000, k=24).div == "128,16,8"
    assert make_key(m=4097).div_classes[0] == 1 and make_key(m=192).div_classes[0] == 64
    assert make_key().distance(make_key(m=2048)) == pytest.approx(1.0)
    assert make_key().distance(make_key(m=2048, n=8192, batch=2)) == pytest.approx(3.0)
    assert make_key().compatible(make_key(m=2048)) and not make_key().compatible(make_key(m=4000))
    assert not make_key().compatible(make_key(policy="fp32")) and not make_key().compatible(attn_key())


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
                      ({"notes": 3}, "notes must be a string"), ({"env": {"torch": "2.11"}}, "env must be an Environment"),
                      ({"key": ("gemm",)}, "key must be a family's key"), ({"source": "x" * (512 * 1024 + 1)}, "over")]:
        with pytest.raises(RegistryError, match=words):
            make_rec(**kw)
    for winner in ("", "eager", "library"):   # winners that are not a template build
        assert make_rec(template=winner).template == winner


def test_record_times_are_normalised_to_utc():
    r = make_rec(created_at="2026-03-01T12:00:00+02:00")
    assert r.created_at == "2026-03-01T10:00:00.000000Z" and r.updated_at == r.created_at
    assert make_rec(created_at="2026-03-01T10:00:00Z").created_at == r.created_at


def test_record_dict_roundtrip_and_digest_check():
    r = make_rec(env=GPU_ENV)
    d = r.as_dict()
    assert list(d)[:3] == ["digest", "family", "rule"] and d["family"] == "gemm" and d["m"] == 4096
    assert d["config"] == {"tile_m": 128, "tile_n": 128} and d["torch"] == "2.11.0+cu130" and d["driver"] == "580.95.05"
    assert r.device_name == d["gpu_sku"] == "NVIDIA H100 80GB HBM3"
    assert KernelRecord.from_dict(d) == r
    with pytest.raises(RegistryError, match="does not match the key fields"):
        KernelRecord.from_dict({**d, "m": 2048})
    with pytest.raises(RegistryError, match="unknown fields speed"):
        KernelRecord.from_dict({**d, "speed": 3})
    with pytest.raises(RegistryError, match="key fields missing: policy"):
        KernelRecord.from_dict({k: v for k, v in d.items() if k != "policy"})
    with pytest.raises(RegistryError, match="torch must be a string"):
        KernelRecord.from_dict({**d, "torch": 2.11})
    a = KernelRecord(key=attn_key(), template="library", label="flash", time_ms=0.4, env=GPU_ENV)
    assert KernelRecord.from_dict(a.as_dict()) == a and a.as_dict()["causal"] is True


def test_stamped_fills_the_environment(here, monkeypatch):
    here(GPU_ENV)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: "hash-of-" + name)
    r = make_rec(env=Environment(), template_hash="", factdb_version="").stamped()
    assert (r.env, r.factdb_version, r.template_hash) == (GPU_ENV, "0.1.0", "hash-of-gemm_sm90")
    assert make_rec(template="eager").stamped().template_hash == ""   # no template file renders eager
    assert r.stamped(ENV, "x").env == ENV
    t = TrialRecord(key=make_key(), template="gemm_sm90", config={"a": 1}, status="ok").stamped(ENV, "x")
    assert t.template_hash == "x" and t.env == ENV and t.config_hash == R.config_hash({"a": 1}) and len(t.id) == 32


# ---------------------------------------------------------------------------------------
# merge

def _cur(env=ENV):
    return Current(env, TH)


def test_merge_rules():
    cur = _cur()
    v = make_rec(time_ms=1.0)
    assert merge_decision(None, v, cur) == "inserted"
    assert merge_decision(v, v, cur) == "kept"                                   # idempotent
    assert merge_decision(v, v.replace(time_ms=0.9), cur) == "replaced"          # faster, same environment
    assert merge_decision(v, v.replace(time_ms=1.1), cur) == "kept"              # slower
    assert merge_decision(v, v.replace(time_ms=1.0, notes="x"), cur) == "kept"  # a tie keeps the old row
    failed = v.replace(status="failed", time_ms=None, error="verify failed")
    stale = v.replace(status="stale", time_ms=0.5)
    assert merge_decision(v, failed, cur) == "kept"     # never replaced by an unverified row
    assert merge_decision(v, stale, cur) == "kept"      # ... even a faster one
    assert merge_decision(failed, v, cur) == "replaced"
    assert merge_decision(stale, v, cur) == "replaced"
    assert merge_decision(stale, failed, cur) == "kept"
    # the current environment beats another, whatever the times
    old_env = make_rec(env=ENV_NEW_NVCC, time_ms=0.1)  # verified, but under an nvcc that is not installed
    assert merge_decision(old_env, v, cur) == "replaced"
    assert merge_decision(v, old_env, cur) == "kept"
    # a changed template hash makes the old row non-current too
    assert merge_decision(make_rec(th="old", time_ms=0.1), v, cur) == "replaced"
    # two rows from other environments: the newer one wins
    a = make_rec(env=ENV_NEW_NVCC, time_ms=0.5, created_at="2026-01-01T00:00:00Z")
    b = make_rec(env=Environment(cutlass="4.1.0.0", nvcc="12.8.0"), time_ms=0.9, created_at="2026-02-01T00:00:00Z")
    assert merge_decision(a, b, cur) == "replaced" and merge_decision(b, a, cur) == "kept"
    # same other environment: the faster wins
    assert merge_decision(a, a.replace(time_ms=0.4, created_at="2025-01-01T00:00:00Z"), cur) == "replaced"
    # two failures: the newer wins
    f2 = failed.replace(created_at="2030-01-01T00:00:00Z", error="other")
    assert merge_decision(failed, f2, cur) == "replaced" and merge_decision(f2, failed, cur) == "kept"
    # with a GPU here, torch is part of "the same environment": a faster row under another torch
    # does not beat the current one, and between two other torch versions the newer row wins
    gcur = _cur(GPU_ENV)
    g = make_rec(env=GPU_ENV, time_ms=1.0)
    t1 = make_rec(env=GPU_ENV.with_(torch="2.9.0"), time_ms=0.2, created_at="2026-01-01T00:00:00Z")
    t2 = make_rec(env=GPU_ENV.with_(torch="2.10.0"), time_ms=0.9, created_at="2026-02-01T00:00:00Z")
    assert merge_decision(g, t1, gcur) == "kept" and merge_decision(t1, g, gcur) == "replaced"
    assert merge_decision(t1, t2, gcur) == "replaced" and merge_decision(t2, t1, gcur) == "kept"


def test_put_merges(reg):
    r = make_rec()
    assert reg.put(r, **KW) == "inserted"
    assert reg.put(r, **KW) == "kept"
    assert reg.put(r.replace(time_ms=0.5), **KW) == "replaced"
    assert reg.put(r.replace(status="failed", time_ms=None), **KW) == "kept"
    got = reg.get(r.key)
    assert got.time_ms == 0.5 and got.status == "verified" and got.updated_at >= got.created_at
    assert reg.count() == 1
    res = reg.put_many([make_rec(make_key(m=1024)), make_rec(make_key(m=1024), time_ms=0.1), r], **KW)
    assert res.outcomes == ["inserted", "replaced", "kept"]
    assert reg.get(make_key(m=1024)).time_ms == 0.1 and reg.count() == 2
    with pytest.raises(RegistryError, match="put takes KernelRecord"):
        reg.put(r.as_dict())


# ---------------------------------------------------------------------------------------
# lookup

def test_lookup_exact_nearest_and_none(reg):
    for m in (1024, 2048, 8192):
        reg.put(make_rec(make_key(m=m), time_ms=m / 1000), **KW)
    hit = reg.lookup(make_key(m=2048), **KW)
    assert hit.exact and hit.distance == 0.0 and not hit.stale and hit.usable and hit.record.key.m == 2048
    near = reg.lookup(make_key(m=4096), **KW)       # 2048 and 8192 are both 1.0 away: the faster wins
    assert not near.exact and near.distance == pytest.approx(1.0) and near.record.key.m == 2048
    near = reg.lookup(make_key(m=6144), **KW)       # log2(8192/6144)=0.415 < log2(6144/2048)=1.585
    assert near.record.key.m == 8192 and near.distance == pytest.approx(0.415, abs=1e-3)
    assert reg.lookup(make_key(m=6144), max_distance=0.4, **KW) is None
    assert reg.lookup(make_key(m=4096), nearest=False, **KW) is None           # exact only, when asked
    # another divisibility class (4000 is a multiple of 16, not of 64 or 128): no compatible row
    assert reg.lookup(make_key(m=4000), **KW) is None
    # nothing crosses hardware, policy, dtype, layout or epilogue
    for other in ({"gpu": "a100", "arch": "sm80"}, {"gpu": "h200"}, {"policy": "fp32"}, {"layout_b": "row"},
                  {"epilogue": "bias"}, {"rule": "gemm-bias"},
                  {"dtype_in": "bfloat16", "dtype_out": "bfloat16", "policy": "bf16"}):
        assert reg.lookup(make_key(m=2048, **other), **KW) is None, other
    with pytest.raises(RegistryError, match="lookup takes a family's key"):
        reg.lookup(make_key().as_dict())


def test_lookup_batch_counts_in_the_distance(reg):
    reg.put(make_rec(make_key(rule="batched-gemm", batch=8)), **KW)
    near = reg.lookup(make_key(rule="batched-gemm", batch=32), **KW)
    assert near.distance == pytest.approx(2.0)


def test_lookup_flags_stale_rows_and_prefers_usable_ones(reg):
    reg.put(make_rec(make_key(m=2048)), **KW)
    # exact row, environment changed since: returned, flagged, with the reason
    hit = reg.lookup(make_key(m=2048), env=ENV_NEW_NVCC, template_hashes=TH)
    assert hit.exact and hit.stale and not hit.usable
    assert hit.stale_reason == "nvcc 13.0.88 then, 13.1.10 now"
    hit = reg.lookup(make_key(m=2048), env=ENV, template_hashes={"gemm_sm90": "changed"})
    assert hit.stale and "template gemm_sm90 changed (hash aaaa, now changed)" in hit.stale_reason
    hit = reg.lookup(make_key(m=2048), env=ENV, template_hashes={"gemm_sm90": ""})
    assert hit.stale and "template gemm_sm90 no longer exists" in hit.stale_reason
    # nearest: a usable row further away beats a stale row nearer
    reg.put(make_rec(make_key(m=16384), env=ENV_NEW_NVCC), **KW)
    near = reg.lookup(make_key(m=4096), env=ENV_NEW_NVCC, template_hashes=TH)
    assert near.record.key.m == 16384 and not near.stale and near.distance == pytest.approx(2.0)
    # ... and a stale row is still reported, flagged, when it is all there is
    reg2 = Registry.memory()
    reg2.put(make_rec(make_key(m=2048)), **KW)
    near = reg2.lookup(make_key(m=4096), env=ENV_NEW_NVCC, template_hashes=TH)
    assert near.stale and not near.exact and near.record.key.m == 2048


def test_lookup_ignores_failed_rows(reg):
    reg.put(make_rec(status="failed", time_ms=None, error="nothing verified"), **KW)
    assert reg.lookup(make_key(), **KW) is None
    assert reg.get(make_key()).status == "failed"


def test_lookup_uses_this_environment_by_default(here):
    with Registry.memory() as reg:
        reg.put(make_rec())
        assert reg.lookup(make_key()).usable
        reg.put(make_rec(make_key(m=256), th="old"))
        hit = reg.lookup(make_key(m=256))
        assert hit.stale and "template gemm_sm90 changed" in hit.stale_reason


def test_rows_from_another_torch_driver_or_sku_read_back_stale(here):
    """The environment key: with a GPU here, every field counts, each named in the reason."""
    here(GPU_ENV)
    with Registry.memory() as reg:
        reg.put_many([make_rec(make_key(m=256), env=GPU_ENV),
                      make_rec(make_key(m=512), env=GPU_ENV.with_(torch="2.10.0+cu130")),
                      make_rec(make_key(m=768), env=GPU_ENV.with_(driver="575.57.08")),
                      make_rec(make_key(m=1024), env=GPU_ENV.with_(gpu_sku="NVIDIA H100 PCIe")),
                      make_rec(make_key(m=1280), env=GPU_ENV.with_(cublas="", cudnn=""))])
        assert reg.lookup(make_key(m=256)).usable
        why = {m: reg.lookup(make_key(m=m)).stale_reason for m in (512, 768, 1024, 1280)}
        assert why[512] == "torch 2.10.0+cu130 then, 2.11.0+cu130 now"
        assert why[768] == "driver 575.57.08 then, 580.95.05 now"
        assert why[1024] == "GPU NVIDIA H100 PCIe then, NVIDIA H100 80GB HBM3 now"    # one short name, two SKUs
        assert why[1280].startswith("cuBLAS not recorded") and "cuDNN not recorded" in why[1280]
        assert all(reg.lookup(make_key(m=m)).stale for m in why)
        # and revalidate writes it down: the rows read back as stale, with the reason
        changes = reg.revalidate()
        assert sorted(c.shape for c in changes) == sorted(f"{m}x4096x4096" for m in why)
        row = reg.get(make_key(m=512))
        assert row.status == "stale" and row.stale_reason == why[512] and row.env.torch == "2.10.0+cu130"


def test_without_a_gpu_only_cutlass_and_nvcc_count(here):
    here(ENV)   # planning on a laptop: the GPU side is the target's, unknown here
    with Registry.memory() as reg:
        reg.put_many([make_rec(make_key(m=256), env=GPU_ENV.with_(torch="2.9.0", driver="1.0", gpu_sku="NVIDIA H200")),
                      make_rec(make_key(m=512), env=GPU_ENV.with_(cutlass="4.3.0.0")),
                      make_rec(make_key(m=768), env=GPU_ENV.with_(nvcc="13.1.10"))])
        assert reg.lookup(make_key(m=256)).usable
        assert reg.lookup(make_key(m=512)).stale_reason == "CUTLASS 4.3.0.0 then, 4.2.0.0 now"
        assert reg.lookup(make_key(m=768)).stale_reason == "nvcc 13.1.10 then, 13.0.88 now"
        assert sorted(c.shape for c in reg.revalidate(dry_run=True)) == ["512x4096x4096", "768x4096x4096"]


def test_other_families_share_the_one_api(reg):
    a = KernelRecord(key=attn_key(), template="library", label="flash", time_ms=0.4, baseline="sdpa math",
                     baseline_ms=0.9, env=ENV)
    n = KernelRecord(key=norm_key(), template="eager", label="eager", time_ms=0.05, env=ENV)
    g = KernelRecord(key=RegionKey.of(SPEC, "sm90a", "h100"), template="llm_region", label="add_relu",
                     source="// kernel\nint x;\n", config={"build_key": "b1", "model": "scripted"}, time_ms=0.002,
                     baseline="torch eager", baseline_ms=0.005, provenance="llm", env=ENV)
    assert [reg.put(r, **KW) for r in (a, n, g)] == ["inserted"] * 3
    hit = reg.lookup(attn_key(), nearest=False, **KW)
    assert hit.exact and hit.usable and hit.record == a.replace(updated_at=hit.record.updated_at)
    assert reg.lookup(attn_key(lq=1024), nearest=False, **KW) is None
    near = reg.lookup(attn_key(lq=1024, batch=16), **KW)
    assert not near.exact and near.distance == pytest.approx(2.0) and near.record.label == "flash"
    assert reg.lookup(attn_key(causal=False), **KW) is None
    assert reg.lookup(norm_key(rows=1024), **KW).record.label == "eager"       # eager won: no template hash
    got = reg.lookup(RegionKey.of(SPEC, "sm90a", "h100"), **KW).record
    assert got.source == "// kernel\nint x;\n" and got.config["model"] == "scripted"
    assert reg.lookup(RegionKey.of(SPEC, "sm90a", "h200"), **KW) is None
    assert [r.family for r in reg.rows()] == ["attention", "norm", "region"]
    assert [r.label for r in reg.rows("region")] == ["add_relu"] and reg.count(family="norm") == 1
    assert [r.family for r in reg.rows(rule="rmsnorm")] == ["norm"] and reg.count(rule="llm-region") == 1
    with pytest.raises(RegistryError, match="family 'pool' is not one of"):
        list(reg.rows("pool"))
    reg.add_trials([TrialRecord(key=attn_key(), template="library", config={"label": "cudnn"}, status="build_failed")])
    assert [t.status for t in reg.trials(attn_key())] == ["build_failed"]


# ---------------------------------------------------------------------------------------
# queries, trials

def test_rows_filters(reg):
    reg.put_many([make_rec(make_key(m=256)), make_rec(make_key(m=512, policy="fp32")),
                  make_rec(make_key(m=768, gpu="a100", arch="sm80")),
                  make_rec(make_key(m=1024), status="failed", time_ms=None)], **KW)
    assert [r.key.m for r in reg.rows()] == [256, 512, 768, 1024]
    assert [r.key.m for r in reg.rows(policy="fp32")] == [512]
    assert [r.key.m for r in reg.rows(gpu="NVIDIA A100-SXM4-80GB")] == [768]
    assert [r.key.m for r in reg.rows(status="failed")] == [1024]
    assert [r.key.m for r in reg.rows("gemm", rule="gemm", arch="sm_90a", status="verified", dtype="fp32")] == [256, 512]
    assert reg.count(arch="sm80") == 1 and reg.count(template="gemm_sm90") == 4 and reg.count(provenance="rule") == 4
    with pytest.raises(RegistryError, match="cannot filter kernels by speed"):
        list(reg.rows(speed=1))


def test_trials_and_failed_configs(reg):
    key = make_key()
    mk = lambda cfg, status, env=ENV, th="aaaa", **kw: TrialRecord(
        key=key, template="gemm_sm90", config=cfg, status=status, template_hash=th, env=env, factdb_version="0.1.0",
        **kw)
    trials = [mk({"t": 1}, "ok", time_ms=1.0), mk({"t": 2}, "compile_error", error="nvcc -O3 ... exit 1"),
              mk({"t": 3}, "verify_failed", rel_err=0.3), mk({"t": 4}, "timeout"), mk({"t": 5}, "skipped"),
              mk({"t": 6}, "crashed", env=ENV_NEW_NVCC), mk({"t": 7}, "launch_error", th="old"),
              mk({"t": 8}, "crashed", env=GPU_ENV), mk({"t": 9}, "crashed", env=GPU_ENV.with_(torch="2.9.0"))]
    assert reg.add_trials(trials) == 9
    got = reg.trials(key)
    assert len(got) == 9 and got[1].error == "nvcc -O3 ... exit 1" and got[0].config == {"t": 1}
    assert got[7].env == GPU_ENV and reg.trials(key.digest()) == got
    failed = reg.failed_configs(key, ENV, template_hashes=TH)
    # failures in this environment only: not ok/skipped, not the other nvcc's crash, not the old template's;
    # without a GPU here the GPU side does not count
    assert failed == {R.config_hash({"t": i}) for i in (2, 3, 4, 8, 9)}
    assert reg.failed_configs(key, ENV_NEW_NVCC, template_hashes=TH) == {R.config_hash({"t": 6})}
    assert reg.failed_configs(key, GPU_ENV, template_hashes=TH) == {R.config_hash({"t": 8})}   # torch counts here
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

@pytest.mark.slow
def test_export_import_roundtrip(reg, tmp_path):
    reg.put_many([make_rec(make_key(m=256), env=GPU_ENV), make_rec(make_key(m=512, gpu="a100", arch="sm80")),
                  KernelRecord(key=attn_key(), template="library", label="flash", time_ms=0.4, env=GPU_ENV)], **KW)
    out = tmp_path / "k.jsonl"
    assert reg.export_jsonl(out) == 3
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and lines == sorted(lines, key=lambda s: json.loads(s)["digest"])
    assert reg.export_jsonl(tmp_path / "a.jsonl", gpu="a100") == 1
    assert reg.export_jsonl(tmp_path / "f.jsonl", family="attention") == 1
    buf = io.StringIO()
    reg.export_jsonl(buf)
    assert buf.getvalue() == out.read_text()
    with Registry.memory() as other:
        rep = other.import_jsonl(out, **KW)
        assert (rep.inserted, rep.replaced, rep.kept, rep.path, rep.carried) == (3, 0, 0, str(out), 0)
        strip = lambda rs: sorted((r.replace(updated_at=r.created_at) for r in rs), key=lambda r: r.digest)
        assert strip(other.rows()) == strip(reg.rows())   # updated_at: when this registry got the row
        rep = other.import_jsonl(out, **KW)
        assert (rep.inserted, rep.replaced, rep.kept) == (0, 0, 3)


def test_import_merges_and_fills_provenance(reg, tmp_path):
    reg.put(make_rec(make_key(m=256), time_ms=1.0), **KW)
    rows = [make_rec(make_key(m=256), time_ms=0.5).as_dict(), make_rec(make_key(m=512)).as_dict(),
            make_rec(make_key(m=256), time_ms=2.0).as_dict()]
    del rows[1]["provenance"], rows[1]["digest"]
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    rep = reg.import_jsonl(p, **KW)
    assert (rep.inserted, rep.replaced, rep.kept) == (1, 1, 1)
    assert reg.get(make_key(m=256)).time_ms == 0.5 and reg.get(make_key(m=512)).provenance == "import"


def test_import_is_all_or_nothing_and_lists_every_bad_line(reg, tmp_path):
    good = make_rec(make_key(m=256)).as_dict()
    lines = [json.dumps(good),
             "{not json",
             json.dumps({**make_rec(make_key(m=512)).as_dict(), "status": "great"}),
             json.dumps(make_rec(make_key(m=768)).as_dict()),
             "[1, 2]",
             json.dumps({**good, "m": 1024}),
             json.dumps({**good, "digest": "0000", "time_ms": "fast"}),
             json.dumps({**good, "rel_err": float("nan")}).replace("NaN", "NaN"),
             json.dumps({**good, "family": "pool"})]
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportError_) as ei:
        reg.import_jsonl(p, **KW)
    e = ei.value
    assert [n for n, _ in e.problems] == [2, 3, 5, 6, 7, 8, 9]
    reasons = dict(e.problems)
    assert "not valid JSON" in reasons[2] and "status 'great'" in reasons[3] and "JSON object" in reasons[5]
    assert "does not match the key fields" in reasons[6] and "time_ms must be a finite number" in reasons[7]
    assert "NaN is not allowed" in reasons[8] and "family 'pool' is not one of" in reasons[9]
    msg = str(e)
    assert msg.startswith(f"{p}: 7 bad lines, nothing imported (line 2: not valid JSON")
    assert all(f"line {n}:" in msg for n in (2, 3, 5, 6, 7, 8, 9)) and "fix them and import again" in msg
    assert reg.count() == 0      # lines 1 and 4 were fine, and were not applied either


def test_import_refuses_missing_and_binary_files(reg, tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        reg.import_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RegistryError, match="not UTF-8"):
        reg.import_jsonl(tmp_path / "b.jsonl")


def schema4_line(key: GemmKey, **kw) -> dict:
    """A row as fact-db wrote it before the environment key (no family; schema 4's digest)."""
    digest = hashlib.sha256(json.dumps([getattr(key, f) for f in GemmKey.FIELDS], separators=(",", ":")).encode()) \
        .hexdigest()[:16]
    row = {"digest": digest, **key.as_dict(), "template": "gemm_sm90", "config": {"tile_m": 128}, "time_ms": 1.0,
           "baseline": "torch eager", "baseline_ms": 1.5, "rel_err": 1e-6, "baseline_rel_err": 1e-6,
           "status": "verified", "provenance": "seed", "source_hash": "s", "template_hash": "aaaa",
           "cutlass_version": "4.2.0.0", "nvcc_version": "13.0.88", "factdb_version": "0.1.0",
           "device_name": "NVIDIA H100 80GB HBM3", "error": "", "stale_reason": "", "notes": "old",
           "created_at": "2026-11-25T20:10:58.981901Z", "updated_at": "2026-11-25T20:10:59.867567Z"}
    return {**row, **kw}


def test_old_format_jsonl_imports_as_stale(reg, tmp_path):
    """Schema 4's export: its digest checked under its own scheme, then re-keyed; its environment
    was never recorded, so a verified row comes in stale (and re-tuning replaces it)."""
    old = [schema4_line(make_key(m=256)), schema4_line(make_key(m=512), status="failed", time_ms=None),
           schema4_line(make_key(m=768), status="stale", stale_reason="nvcc 12.8 then")]
    p = tmp_path / "old.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in old))
    rep = reg.import_jsonl(p, **KW)
    assert (rep.inserted, rep.carried) == (3, 3)
    row = reg.get(make_key(m=256))
    assert row.digest == make_key(m=256).digest() != old[0]["digest"]
    assert row.status == "stale" and row.env == ENV.with_(gpu_sku="NVIDIA H100 80GB HBM3")
    assert row.stale_reason == (f"{CARRIED_OVER} (an export without the environment key): driver, CUDA runtime, "
                                "torch, cuBLAS, cuDNN not recorded")
    assert row.time_ms == 1.0 and row.notes == "old" and row.provenance == "seed"
    assert reg.get(make_key(m=512)).status == "failed"
    assert reg.get(make_key(m=768)).stale_reason.endswith("; before that: nvcc 12.8 then")
    hit = reg.lookup(make_key(m=256), **KW)                      # here only CUTLASS/nvcc count, and they match
    assert hit.stale and hit.stale_reason.startswith(CARRIED_OVER) and "tune it again" in hit.stale_reason
    assert reg.revalidate(**KW) == []                              # never restored: its environment is unknown
    assert reg.put(make_rec(make_key(m=256), time_ms=3.0), **KW) == "replaced"   # re-tuned: even slower wins
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**old[0], "digest": "0" * 16}) + "\n" + json.dumps({**old[0], "oops": 1}) + "\n")
    with pytest.raises(ImportError_) as ei:
        reg.import_jsonl(bad, **KW)
    assert "schema 4 gives" in ei.value.problems[0][1] and "unknown fields oops" in ei.value.problems[1][1]


# ---------------------------------------------------------------------------------------
# seed, revalidate, gc

def test_seed_is_imported_on_first_use_and_again_when_it_changes(tmp_path, monkeypatch, here):
    seed = tmp_path / "kernels.jsonl"
    seed.write_text(json.dumps({k: v for k, v in make_rec(make_key(m=256)).as_dict().items()
                                if k != "provenance"}) + "\n")
    monkeypatch.setenv("FACTDB_SEED", str(seed))
    url = f"duckdb:///{tmp_path / 'fact.duckdb'}"
    with Registry.open(url) as reg:
        assert [(r.key.m, r.provenance) for r in reg.rows()] == [(256, "seed")]
        meta = reg.meta()
        assert meta["seed_sha256"] == hashlib.sha256(seed.read_bytes()).hexdigest()
        assert meta["seed_path"] == str(seed) and meta["schema_version"] == str(db_mod.SCHEMA_VERSION)
        assert meta["created_by"].startswith("fact-db ")
        reg.put(make_rec(make_key(m=256), time_ms=9.0).replace(notes="mine"))  # slower: kept
        with reg.transaction() as conn:  # user deleted the seeded row: an unchanged seed is not re-imported
            conn.execute(sa.delete(R.K))
    with Registry.open(url) as reg:
        assert reg.count() == 0
    seed.write_text(seed.read_text() + json.dumps(make_rec(make_key(m=512)).as_dict()) + "\n")
    with Registry.open(url) as reg:     # a newer seed file is imported again
        assert sorted(r.key.m for r in reg.rows()) == [256, 512]
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


def test_shipped_seed_is_in_the_new_format_with_its_environment():
    """index/kernels.jsonl: each row names its family, its digest is today's, and its environment
    is what the run recorded: the GPU it was tuned on (its notes say which), torch, CUDA, and the
    driver, cuBLAS and cuDNN (gemm_realize.py records them): current on a GPU host with that
    environment, stale on one with another driver."""
    rows = (ROOT / "index" / "kernels.jsonl").read_text().splitlines()
    assert rows
    for line in rows:
        row = json.loads(line)
        rec = KernelRecord.from_dict(row)            # checks the digest under today's scheme
        assert row["family"] == "gemm" and rec.status == "verified"
        assert rec.env.gpu_sku and f"tuned on {rec.env.gpu_sku} on " in rec.notes
        assert (rec.env.torch, rec.env.cuda) == ("2.11.0+cu130", "13.0")
        assert rec.env.driver and rec.env.cublas and rec.env.cudnn
        assert not Current(ENV.with_(cutlass=rec.env.cutlass, nvcc=rec.env.nvcc)).staleness(rec)
        same_host = GPU_ENV.with_(gpu_sku=rec.env.gpu_sku, driver=rec.env.driver, cublas=rec.env.cublas,
                                  cudnn=rec.env.cudnn, cutlass=rec.env.cutlass, nvcc=rec.env.nvcc)
        assert not Current(same_host).staleness(rec)
        assert "driver" in Current(same_host.with_(driver="999.1")).staleness(rec)


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
    reg.put_many([make_rec(make_key(m=256)), make_rec(make_key(m=512), th="old"),
                  make_rec(make_key(m=768), status="failed", time_ms=None)], env=ENV, **kw)
    assert reg.revalidate(ENV, dry_run=True, **kw) == [
        R.Change(make_key(m=512).digest(), "gemm", "512x4096x4096", "verified", "stale",
                 "template gemm_sm90 changed (hash old, now aaaa)")]
    assert reg.get(make_key(m=512)).status == "verified"          # dry run changed nothing
    changes = reg.revalidate(ENV_NEW_NVCC, **kw)
    assert {(c.shape, c.new_status) for c in changes} == {("256x4096x4096", "stale"), ("512x4096x4096", "stale")}
    row = reg.get(make_key(m=256))
    assert row.status == "stale" and row.stale_reason == "nvcc 13.0.88 then, 13.1.10 now"
    assert reg.get(make_key(m=768)).status == "failed"           # failed rows are left alone
    hit = reg.lookup(make_key(m=256), env=ENV, **kw)             # nvcc back, not yet revalidated
    assert hit.stale and "revalidate` will restore it" in hit.stale_reason
    changes = reg.revalidate(ENV, **kw)                          # back on the old nvcc: restored
    assert [(c.shape, c.old_status, c.new_status) for c in changes] == [("256x4096x4096", "stale", "verified")]
    assert reg.lookup(make_key(m=256), env=ENV, **kw).usable
    assert reg.get(make_key(m=512)).status == "stale"
    assert reg.revalidate(ENV, **kw) == []


def test_revalidate_recheck_hook(reg):
    kw = {"template_hashes": TH}
    reg.put_many([make_rec(make_key(m=256)), make_rec(make_key(m=512))], env=ENV, **kw)
    seen = []

    def recheck(rec, reason):
        seen.append((rec.key.m, reason))
        if rec.key.m == 256:   # re-verified on the GPU in the new environment, a bit faster
            return rec.replace(time_ms=0.8, env=rec.env.with_(nvcc=ENV_NEW_NVCC.nvcc))
        return None            # could not be re-verified: stays stale

    changes = reg.revalidate(ENV_NEW_NVCC, recheck=recheck, **kw)
    assert sorted(seen) == [(256, "nvcc 13.0.88 then, 13.1.10 now"), (512, "nvcc 13.0.88 then, 13.1.10 now")]
    assert {(c.shape, c.new_status) for c in changes} == {("256x4096x4096", "verified"), ("512x4096x4096", "stale")}
    assert reg.lookup(make_key(m=256), env=ENV_NEW_NVCC, **kw).record.time_ms == 0.8
    assert reg.get(make_key(m=512)).status == "stale"
    with pytest.raises(RegistryError, match="recheck returned a row for key"):
        reg.revalidate(ENV_NEW_NVCC, recheck=lambda rec, why: rec.replace(key=make_key(m=1)), **kw)


def test_gc(reg):
    now = datetime(2026, 6, 1, tzinfo=timezone.utc)
    old = (now - timedelta(days=40)).isoformat()
    new = (now - timedelta(days=5)).isoformat()
    reg.put_many([make_rec(make_key(m=256), created_at=old),                                   # verified: kept
                  make_rec(make_key(m=512), status="failed", time_ms=None, created_at=old),  # old failed: goes
                  make_rec(make_key(m=768), status="stale", created_at=old),                 # old stale: goes
                  make_rec(make_key(m=1024), status="failed", time_ms=None)], **KW)          # recent: kept
    recent = make_key(m=1024).digest()
    with reg.transaction() as conn:  # put sets updated_at to now; age the rows as if written back then
        conn.execute(sa.update(R.K).where(R.K.c.digest != recent).values(updated_at=norm_time(old)))
        conn.execute(sa.update(R.K).where(R.K.c.digest == recent).values(updated_at=norm_time(new)))
    tr = lambda m, when: TrialRecord(key=make_key(m=m), template="gemm_sm90", config={"m": m},
                                     status="compile_error", created_at=when)
    reg.add_trials([tr(256, old), tr(512, old), tr(2048, old), tr(2048, new), tr(768, new)])
    dry = reg.gc(30, dry_run=True, now=now)
    assert sorted(dry.kernels) == sorted([make_key(m=512).digest(), make_key(m=768).digest()])
    assert dry.trials == 2 and dry.dry_run and reg.count() == 4          # 512's and 2048's old trials
    rep = reg.gc(30, now=now)
    assert rep.kernels == dry.kernels and rep.trials == 2
    assert sorted(r.key.m for r in reg.rows()) == [256, 1024]
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
        reg.put(make_rec(), **KW)
    assert (tmp_path / "new" / "home" / "fact.duckdb").is_file()
    with Registry.open() as reg:
        assert reg.count() == 1 and reg.where == str(tmp_path / "new" / "home" / "fact.duckdb")


def _url(backend, tmp_path, request, stem):
    if backend == "postgres":
        return request.getfixturevalue("pg").new_schema()
    return f"{backend}:///{tmp_path / (stem + '.' + backend)}"


@pytest.mark.parametrize("backend", ["duckdb", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_file_backends_full_cycle(backend, tmp_path, request):
    url = _url(backend, tmp_path, request, "r")
    with Registry.open(url, seed=False, cache=False) as reg:
        assert reg.put(make_rec(make_key(m=256)), **KW) == "inserted"
        assert reg.put(make_rec(make_key(m=256), time_ms=0.5), **KW) == "replaced"
        reg.add_trials([TrialRecord(key=make_key(m=256), template="gemm_sm90", config={}, status="timeout",
                                    template_hash="aaaa", env=ENV)])
        with reg.pinned(write=True):
            reg.put(make_rec(make_key(m=512)), **KW)
            assert reg.lookup(make_key(m=512), **KW).exact
    with Registry.open(url, seed=False, cache=False) as reg:   # reopened: everything is there
        assert reg.lookup(make_key(m=256), **KW).record.time_ms == 0.5
        assert reg.lookup(make_key(m=384), **KW).record.key.m in (256, 512)
        assert reg.failed_configs(make_key(m=256), ENV, template_hashes=TH) == {R.config_hash({})}
        assert reg.meta()["schema_version"] == str(db_mod.SCHEMA_VERSION)
        assert reg.count() == 2


@pytest.mark.parametrize("backend", ["duckdb", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_migrated_schema_matches_the_models(backend, tmp_path, request):
    url = _url(backend, tmp_path, request, "s")
    with Registry.open(url, seed=False, cache=False) as reg, reg.transaction(write=False) as conn:
        for table in R.METADATA.sorted_tables:
            if backend == "duckdb":  # duckdb-engine's inspector cannot reflect columns
                got = conn.exec_driver_sql("select column_name, data_type from information_schema.columns where "
                                           f"table_name = '{table.name}' order by ordinal_position").all()
            else:
                got = [(c["name"], str(c["type"])) for c in sa.inspect(conn).get_columns(table.name)]
            assert [name for name, _ in got] == [c.name for c in table.columns], table.name
            types = dict(got)
            if table.name == "kernels":  # doubles, not 4-byte floats (sa.Float is FLOAT4 in DuckDB)
                assert types["time_ms"] in ("DOUBLE", "DOUBLE PRECISION", "FLOAT")


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
    with Registry.open(str(tmp_path / "p.duckdb"), seed=False) as reg:
        reg.put(make_rec(), **KW)
        with reg.pinned():
            assert all(reg.lookup(make_key(m=m), **KW) for m in (4096, 2048))
            with pytest.raises(RegistryError, match=r"inside pinned\(write=False\)"):
                reg.put(make_rec(make_key(m=64)), **KW)
        assert reg.count() == 1


def test_no_network_is_touched(tmp_path, monkeypatch):
    """A full cycle, and a SQLite file handed to DuckDB (which would download an extension), offline."""
    def refuse(*a, **k):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    with Registry.open(str(tmp_path / "n.duckdb"), seed=False) as reg:
        reg.put(make_rec(), **KW)
        reg.lookup(make_key(m=1024), **KW)
        reg.export_jsonl(tmp_path / "n.jsonl")
        reg.import_jsonl(tmp_path / "n.jsonl", **KW)
        reg.revalidate(ENV, template_hashes=TH)
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
        reg.put(make_rec(), **KW)
        raw = db_mod.connect_duckdb(path)               # read-write, default configuration, held open
        raw.execute("create table index_docs (id varchar)")
        assert reg.lookup(make_key(), **KW).exact         # reads fall back to read-write connections
        assert reg.put(make_rec(make_key(m=64)), **KW) == "inserted"
        assert raw.execute("select count(*) from kernels").fetchone() == (2,)
        raw.close()
        ro = db_mod.connect_duckdb(path, read_only=True)  # a read-only one held open: writers wait, then say so
        reg.db.timeout = 0.2
        with pytest.raises(R.RegistryBusy, match="a read-only connection in this process holds it"):
            reg.put(make_rec(make_key(m=128)), **KW)
        assert reg.count() == 2
        ro.close()
        assert reg.put(make_rec(make_key(m=128)), **KW) == "inserted"


@pytest.mark.slow
def test_threads_writing_one_file_do_not_duplicate_keys(tmp_path):
    import threading
    with Registry.open(str(tmp_path / "t.duckdb"), seed=False) as reg:
        errors = []

        def work(t):
            try:
                for i in range(6):
                    reg.put(make_rec(make_key(m=64 * (i + 1)), time_ms=1.0 + t / 10), **KW)  # shared keys
                    reg.put(make_rec(make_key(m=64 * (i + 1), n=64 * (t + 1))), **KW)
                    reg.lookup(make_key(m=64 * (i + 1)), **KW)
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        digests = [r.digest for r in reg.rows()]
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
        assert reg.put_many(slow_recs, **KW).inserted == 12
        back = {r.digest: r for r in reg.rows()}
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
    reg.put_many([make_rec(make_key(n=128 * i), th="old") for i in range(1, 10)], **KW)
    reg.put(make_rec(make_key(n=128 * 64)), **KW)
    near = reg.lookup(make_key(n=128 * 5 + 1024), **KW)
    assert near.usable and near.record.key.n == 128 * 64
    # six rows tied at distance 1 (one dimension doubled or halved): the fastest wins, even when
    # fewer are fetched first (first=2): ties with the last one fetched are fetched too
    q = make_key(m=1024, n=1024, k=1024)
    tied = [q.with_(m=2048), q.with_(m=512), q.with_(n=2048), q.with_(n=512), q.with_(k=2048), q.with_(k=512)]
    reg.put_many([make_rec(k, time_ms=2.0 + i) for i, k in enumerate(tied[::-1])], **KW)
    with reg.transaction(write=False) as conn:
        rec, d = nearest.find(conn, q, Current(ENV, TH), None, first=2)
    assert d == pytest.approx(1.0) and rec.time_ms == 2.0 and rec.key == tied[-1]
    assert reg.lookup(q, **KW).record.key == tied[-1]


def test_shipped_seed_imports_as_current_verified_rows(tmp_path):
    """index/kernels.jsonl (kernels tuned on an H100) must import into a new registry whole."""
    seed = ROOT / "index" / "kernels.jsonl"
    lines = [json.loads(line) for line in seed.read_text().splitlines() if line.strip()]
    with R.Registry.open(f"duckdb:///{tmp_path / 'seeded.duckdb'}", seed=seed) as reg:
        rows = list(reg.rows())
    assert len(rows) == len(lines) > 0
    assert {r.provenance for r in rows} == {"seed"} and {r.status for r in rows} == {"verified"}
    assert all(r.time_ms and r.baseline_ms and r.time_ms < r.baseline_ms for r in rows)


def test_store_imports_only_core_and_discovery():
    """The stages import one way (DESIGN.md, "Layout"): store may use core and discovery, never kernels,
    realization, composition or the pipeline."""
    import ast
    allowed = ("fact_db.core", "fact_db.discovery", "fact_db.store")
    for path in sorted((ROOT / "fact_db" / "store").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                if name.startswith("fact_db."):
                    assert name.startswith(allowed), f"{path.relative_to(ROOT)} imports {name}"


def test_cudnn_read_from_torch_or_from_the_wheel_is_one_version():
    """A process that probes the environment before importing torch reads cuDNN from the wheel
    (`9.19.0.56`), one that probes after reads torch (`91900`): on an H200 a row the first wrote
    was stale in the second ("cuDNN 9.19.0.56 then, 91900 now"). Both are one version now, and
    rows written either way are current."""
    from fact_db.core.environment import cudnn_number
    assert cudnn_number("9.19.0.56") == cudnn_number("91900") == "91900"
    assert cudnn_number("8.9.7.29") == "80907" and cudnn_number("") == "" and cudnn_number("weird") == "weird"
    wheel, torch_side = GPU_ENV.with_(cudnn="9.19.0.56"), GPU_ENV.with_(cudnn="91900")
    assert torch_side.mismatch(wheel) == "" and wheel.mismatch(torch_side) == ""
    assert "cuDNN" in GPU_ENV.with_(cudnn="91200").mismatch(torch_side)  # another version is still stale


def test_a_results_file_with_its_environment_seeds_rows_current_on_that_gpu():
    """benchmarks/gemm_realize.py writes the host's environment key beside torch and CUDA;
    benchmarks/seed_registry.py stamps it on the rows it seeds, so on that GPU they are current
    (without it: "driver not recorded", stale on every GPU)."""
    seed = benchmark_script("seed_registry")
    here = GPU_ENV.with_(cudnn="91900")
    doc = {"device": here.gpu_sku, "torch": here.torch, "cuda": here.cuda,
           "environment": {**here.as_dict(), "cudnn": "9.19.0.56"}}  # the wheel's form: one version
    env = seed.results_env(doc, cutlass=here.cutlass, nvcc=here.nvcc)
    assert (env.driver, env.cublas) == (here.driver, here.cublas) and here.mismatch(env) == ""
    bare = seed.results_env({k: v for k, v in doc.items() if k != "environment"}, here.cutlass, here.nvcc)
    assert "driver not recorded" in here.mismatch(bare)
