"""`factdb registry ...`: list, show, export, import, revalidate, gc; JSON output; one-line errors."""
import json

import pytest
from click.testing import CliRunner
from fact_db.cli.main import cli
from test_registry import TC, TH, make_key, make_rec

from fact_db.store.registry import Registry, TrialRecord
from fact_db.core.toolchain import Toolchain


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A registry file with three kernels and two trials; the installed toolchain pinned to TC."""
    monkeypatch.setattr("fact_db.core.toolchain.current", lambda: TC)
    monkeypatch.setattr("fact_db.core.toolchain.template_hash", lambda name: TH.get(name, ""))
    monkeypatch.setenv("FACTDB_SEED", "")
    monkeypatch.delenv("FACTDB_DB", raising=False)
    path = tmp_path / "cli.duckdb"
    with Registry.open(str(path)) as reg:
        reg.put_kernels([make_rec(make_key(m=256), time_ms=0.5, baseline_ms=1.0),
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
    assert lines[0].split()[:4] == ["DIGEST", "RULE", "ARCH", "GPU"] and len(lines) == 4
    assert any("256x4096x4096" in line and "2.00x" in line and "verified" in line for line in lines)
    assert f"3 kernels in {env}" in r.stderr
    j = run("list", "--db", env, "--json", "--gpu", "NVIDIA A100-SXM4-80GB")
    data = json.loads(j.stdout)
    assert [d["m"] for d in data] == [512] and data[0]["digest"] == make_key(m=512, gpu="a100", arch="sm80").digest()
    assert json.loads(run("list", "--db", env, "--json", "--status", "failed").stdout)[0]["m"] == 768
    assert json.loads(run("list", "--db", env, "--json", "--policy", "bf16").stdout) == []


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
    miss = run("show", "ffffffff", "--db", env)
    assert miss.exit_code == 1 and "no kernel with a digest starting 'ffffffff'" in miss.output
    assert "factdb registry list" in miss.output and "Traceback" not in miss.output
    short = run("show", "7", "--db", env)
    assert short.exit_code == 1 and "unique prefix of 4+ characters" in short.output


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
    assert json.loads(i.stdout) == {"inserted": 2, "replaced": 0, "kept": 0, "path": str(out)}
    i = run("import", out, "--db", other)
    assert i.stdout.strip() == f"{out}: 0 inserted, 0 replaced, 2 kept"
    i = run("import", "-", "--db", other, "--json", input=s.stdout)
    assert json.loads(i.stdout)["inserted"] == 1


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
    monkeypatch.setattr("fact_db.core.toolchain.current", lambda: Toolchain("4.3.0.0", TC.nvcc, TC.factdb))
    dry = run("revalidate", "--db", env, "--dry-run")
    assert dry.exit_code == 0 and "2 would change" in dry.stderr
    assert "verified -> stale (built with CUTLASS 4.2.0.0, now 4.3.0.0)" in dry.stdout
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
    from fact_db.kernels.region.spec import RegionSpec
    spec = RegionSpec(inputs=[{"name": "x", "kind": "input", "shape": [8, 64], "dtype": "float32"}],
                      ops=[{"name": "relu", "op": "aten.relu", "overload": "default", "args": [{"ref": "x"}],
                            "arg_names": ["self"]}], output="relu", out_shape=[8, 64], policy=policy,
                      dtype="float32", nodes=["relu"])
    with Registry.open(str(path)) as reg:
        return reg.region_put(spec, "sm90a", gpu, name="relu_kernel", source="// the source\nint x;\n",
                              time_ms=0.002, eager_ms=0.005, rel_err=0.0, model="scripted")


def test_list_llm_region_kernels_and_show_one(env):
    digest = _region_row(env)
    _region_row(env, policy="tf32", gpu="a100")
    r = run("list", "--db", env, "--llm")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["DIGEST", "NAME", "ARCH"] and len(lines) == 3
    assert any(digest[:16] in line and "2.50x" in line and "aten.relu" in line for line in lines)
    assert "2 region kernels (provenance llm)" in r.stderr
    j = json.loads(run("list", "--db", env, "--llm", "--json", "--gpu", "NVIDIA H100 80GB HBM3").stdout)
    assert [d["digest"] for d in j] == [digest] and j[0]["provenance"] == "llm" and "source" not in j[0]
    assert json.loads(run("list", "--db", env, "--llm", "--json", "--policy", "bf16").stdout) == []
    assert len(json.loads(run("list", "--db", env, "--json").stdout)) == 3  # the GEMM rows, unchanged
    bad = run("list", "--db", env, "--llm", "--rule", "gemm")
    assert bad.exit_code == 2 and "--rule does not apply to --llm" in bad.output
    s = run("show", digest[:8], "--db", env)
    assert s.exit_code == 0, s.output
    assert f"digest:            {digest}" in s.output and "  // the source" in s.output and "model:" in s.output
    assert json.loads(run("show", digest, "--db", env, "--json").stdout)["region_kernel"]["name"] == "relu_kernel"
