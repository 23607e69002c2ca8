"""`factdb registry ...`: list, show, export, import, revalidate, gc; JSON output; one-line errors."""
import json

import pytest
from click.testing import CliRunner
from test_registry import (
    ENV,
    GPU_ENV,
    SPEC,
    TH,
    attn_key,
    make_key,
    make_rec,
    schema4_line,
)

from fact_db.cli.main import cli
from fact_db.store.registry import KernelRecord, RegionKey, Registry, TrialRecord


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A registry file with three GEMM kernels and two trials; this machine's environment pinned to ENV."""
    monkeypatch.setattr("fact_db.core.environment.current", lambda: ENV)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: TH.get(name, ""))
    monkeypatch.setenv("FACTDB_SEED", "")
    monkeypatch.delenv("FACTDB_DB", raising=False)
    path = tmp_path / "cli.duckdb"
    with Registry.open(str(path)) as reg:
        reg.put_many([make_rec(make_key(m=256), time_ms=0.5, baseline_ms=1.0),
                      make_rec(make_key(m=512, gpu="a100", arch="sm80"), template="gemm_sm80", th="bbbb"),
                      make_rec(make_key(m=768, policy="fp32"), status="failed", time_ms=None,
                               created_at="2020-01-01T00:00:00Z")])
        reg.add_trials([TrialRecord(key=make_key(m=256), template="gemm_sm90", config={"tile_m": 64},
                                    status="compile_error", error="nvcc -arch=sm_90a x.cu: error: bad\nmore"),
                        TrialRecord(key=make_key(m=256), template="gemm_sm90", config={"tile_m": 128},
                                    status="ok", time_ms=0.5)])
    return path


def run(*args, input=None):
    return CliRunner().invoke(cli, ["registry", *map(str, args)], input=input)


def test_list_table_and_json(env):
    r = run("list", "--db", env)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["DIGEST", "FAMILY", "KEY", "GPU", "POLICY", "TIME_MS", "SPEEDUP", "STATUS"]
    assert len(lines) == 4
    assert any("gemm 256x4096x4096 fp32" in line and "2.00x" in line and "verified" in line for line in lines)
    assert f"3 kernels in {env}" in r.stderr
    j = run("list", "--db", env, "--json", "--gpu", "NVIDIA A100-SXM4-80GB")
    data = json.loads(j.stdout)
    assert [d["m"] for d in data] == [512] and data[0]["digest"] == make_key(m=512, gpu="a100", arch="sm80").digest()
    assert data[0]["family"] == "gemm" and data[0]["gpu_sku"] == "NVIDIA H100 80GB HBM3"
    assert json.loads(run("list", "--db", env, "--json", "--status", "failed").stdout)[0]["m"] == 768
    assert json.loads(run("list", "--db", env, "--json", "--policy", "bf16").stdout) == []
    assert json.loads(run("list", "--db", env, "--json", "--family", "attention").stdout) == []
    bad = run("list", "--db", env, "--family", "fft")
    assert bad.exit_code == 1 and "family 'fft' is not one of attention, conv, gemm, norm, region" in bad.output


def test_db_comes_from_factdb_db(env, monkeypatch):
    monkeypatch.setenv("FACTDB_DB", str(env))
    assert len(json.loads(run("list", "--json").stdout)) == 3


def test_show_with_trials_and_prefixes(env):
    d = make_key(m=256).digest()
    r = run("show", d[:6], "--db", env)
    assert r.exit_code == 0, r.output
    assert f"digest:            {d}" in r.output and "trials: 2" in r.output
    assert "compile_error" in r.output and "nvcc -arch=sm_90a x.cu: error: bad" in r.output and "more" not in r.output
    j = json.loads(run("show", d, "--db", env, "--json").stdout)
    assert j["kernel"]["m"] == 256 and [t["status"] for t in j["trials"]] == ["compile_error", "ok"]
    assert j["usable"] is True and j["key"]["m"] == 256 and j["environment"]["cutlass"] == "4.2.0.0"
    miss = run("show", "ffffffff", "--db", env)
    assert miss.exit_code == 1 and "no kernel with a digest starting 'ffffffff'" in miss.output
    assert "factdb registry list" in miss.output and "Traceback" not in miss.output
    short = run("show", "7", "--db", env)
    assert short.exit_code == 1 and "unique prefix of 4+ characters" in short.output


def test_show_prints_the_environment_key_and_why_a_row_is_stale(env, monkeypatch):
    monkeypatch.setattr("fact_db.core.environment.current", lambda: GPU_ENV)
    with Registry.open(str(env)) as reg:
        reg.put(make_rec(make_key(m=1024), env=GPU_ENV.with_(torch="2.10.0+cu130", cudnn="")))
    d = make_key(m=1024).digest()
    r = run("show", d, "--db", env)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "environment:" in out and "  GPU:             NVIDIA H100 80GB HBM3" in out
    assert "  driver:          580.95.05" in out and "  torch:           2.10.0+cu130" in out
    assert "  cuDNN:           ?" in out and "  CUTLASS:         4.2.0.0" in out and "  nvcc:            13.0.88" in out
    assert "template:          gemm_sm90 (hash aaaa, current)" in out
    assert ("usable here:       no, stale: torch 2.10.0+cu130 then, 2.11.0+cu130 now; cuDNN not recorded (a row from "
            "before the environment key), now 91200") in out
    assert "key:" in out and "  epilogue:        none" in out
    j = json.loads(run("show", d, "--db", env, "--json").stdout)
    assert j["usable"] is False and j["stale_reason"].startswith("torch 2.10.0+cu130 then")
    assert j["environment"] == {**GPU_ENV.as_dict(), "torch": "2.10.0+cu130", "cudnn": ""}
    assert j["environment_here"] == GPU_ENV.as_dict()
    # a row every field of whose environment matches is usable
    with Registry.open(str(env)) as reg:
        reg.put(make_rec(make_key(m=2048), env=GPU_ENV))
    assert "usable here:       yes" in run("show", make_key(m=2048).digest(), "--db", env).output


def test_export_and_import(env, tmp_path):
    out = tmp_path / "x.jsonl"
    r = run("export", out, "--db", env, "--status", "verified")
    assert r.exit_code == 0 and "exported 2 kernels" in r.stderr
    assert len(out.read_text().splitlines()) == 2
    s = run("export", "--db", env)
    assert len(s.stdout.splitlines()) == 3 and all(json.loads(line)["digest"] for line in s.stdout.splitlines())
    other = tmp_path / "other.duckdb"
    i = run("import", out, "--db", other, "--json")
    assert i.exit_code == 0, i.output
    assert json.loads(i.stdout) == {"inserted": 2, "replaced": 0, "kept": 0, "path": str(out), "carried": 0}
    i = run("import", out, "--db", other)
    assert i.stdout.strip() == f"{out}: 0 inserted, 0 replaced, 2 kept"
    i = run("import", "-", "--db", other, "--json", input=s.stdout)
    assert json.loads(i.stdout)["inserted"] == 1


def test_import_of_an_old_export_says_its_rows_are_stale(env, tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(schema4_line(make_key(m=4096))) + "\n")
    r = run("import", old, "--db", env)
    assert r.exit_code == 0, r.output
    assert f"{old}: 1 inserted, 0 replaced, 0 kept" in r.stdout
    assert "1 rows were exported before the environment key" in r.stderr and "imported as stale" in r.stderr
    row = json.loads(run("list", "--db", env, "--json", "--status", "stale").stdout)[0]
    assert row["m"] == 4096 and row["stale_reason"].startswith("carried over from registry schema 4")


def test_import_bad_file_lists_every_line_and_applies_nothing(env, tmp_path):
    good = json.dumps(make_rec(make_key(m=64)).as_dict())
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good, "{oops", good.replace('"layout_a": "row"', '"layout_a": "diag"')]) + "\n")
    r = run("import", bad, "--db", env)
    assert r.exit_code == 1
    assert f"{bad}:2: not valid JSON" in r.stderr and f"{bad}:3: key field layout_a is 'diag'" in r.stderr
    assert f"Error: {bad}: 2 bad lines, nothing imported" in r.stderr and "Traceback" not in r.output
    assert len(json.loads(run("list", "--db", env, "--json").stdout)) == 3


def test_revalidate_and_gc(env, monkeypatch):
    r = run("revalidate", "--db", env, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == []
    monkeypatch.setattr("fact_db.core.environment.current", lambda: ENV.with_(cutlass="4.3.0.0"))
    dry = run("revalidate", "--db", env, "--dry-run")
    assert dry.exit_code == 0 and "2 would change" in dry.stderr
    assert "verified -> stale (CUTLASS 4.2.0.0 then, 4.3.0.0 now)" in dry.stdout
    j = json.loads(run("revalidate", "--db", env, "--json").stdout)
    assert sorted(c["shape"] for c in j) == ["256x4096x4096", "512x4096x4096"]
    assert {c["new_status"] for c in j} == {"stale"}
    g = json.loads(run("gc", "--db", env, "--dry-run", "--json").stdout)
    # the failed row was written today (updated_at), so a 30-day gc keeps it; --older-than 0 does not
    assert g == {"kernels": [], "trials": 0, "dry_run": True}
    g = json.loads(run("gc", "--db", env, "--older-than", "0", "--json").stdout)
    assert len(g["kernels"]) == 3 and g["trials"] == 2      # 2 stale + 1 failed; 256's trials are orphans now
    assert run("gc", "--db", env).stdout.strip() == "deleted 0 kernel rows and 0 orphan trials"


def test_foreign_file_is_a_one_line_error(tmp_path):
    p = tmp_path / "notes.duckdb"
    p.write_text("hello\n")
    r = run("list", "--db", p)
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert r.output.startswith(f"Error: {p} is not a DuckDB database")


def _region_row(path, policy="fp32", gpu="h100"):
    spec = {**SPEC, "policy": policy}
    with Registry.open(str(path)) as reg:
        rec = KernelRecord(key=RegionKey.of(spec, "sm90a", gpu), template="llm_region", label="relu_kernel",
                           source="// the source\nint x;\n", config={"build_key": "bk", "model": "scripted"},
                           time_ms=0.002, baseline="torch eager", baseline_ms=0.005, rel_err=0.0, provenance="llm",
                           env=ENV)
        reg.put(rec)
        return rec.digest


def test_list_llm_region_kernels_and_show_one(env):
    digest = _region_row(env)
    _region_row(env, policy="tf32", gpu="a100")
    r = run("list", "--db", env, "--llm")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["DIGEST", "FAMILY", "KEY"] and len(lines) == 3
    assert any(digest in line and "2.50x" in line and "region add+relu 8x64 fp32" in line for line in lines)
    assert "2 region kernels (provenance llm)" in r.stderr
    j = json.loads(run("list", "--db", env, "--llm", "--json", "--gpu", "NVIDIA H100 80GB HBM3").stdout)
    assert [d["digest"] for d in j] == [digest] and j[0]["provenance"] == "llm" and "source" not in j[0]
    assert json.loads(run("list", "--db", env, "--family", "region", "--json", "--gpu", "h100").stdout) == j
    assert json.loads(run("list", "--db", env, "--llm", "--json", "--policy", "bf16").stdout) == []
    assert len(json.loads(run("list", "--db", env, "--json", "--family", "gemm").stdout)) == 3  # the GEMM rows
    assert len(json.loads(run("list", "--db", env, "--json").stdout)) == 5                       # every family
    bad = run("list", "--db", env, "--llm", "--rule", "gemm")
    assert bad.exit_code == 2 and "--rule does not apply to --llm" in bad.output
    s = run("show", digest[:8], "--db", env)
    assert s.exit_code == 0, s.output
    assert f"digest:            {digest}" in s.output and "  // the source" in s.output and "label:" in s.output
    assert "family:            region" in s.output and "template:          llm_region (hash ?, current)" in s.output
    assert json.loads(run("show", digest, "--db", env, "--json").stdout)["kernel"]["label"] == "relu_kernel"


def test_other_families_list_and_show(env):
    with Registry.open(str(env)) as reg:
        reg.put(KernelRecord(key=attn_key(), template="library", label="flash", time_ms=0.4, env=ENV))
    r = run("list", "--db", env, "--family", "attention")
    assert "attention-causal 8x16/4kv 2048x2048 d128 bf16" in r.stdout
    s = run("show", attn_key().digest(), "--db", env)
    assert "  causal:          true" in s.output and "usable here:       yes" in s.output
