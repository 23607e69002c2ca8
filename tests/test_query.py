"""`factdb query`, `factdb index build` and `factdb index status` from the command line.

The index is built once per session (hash embedder, FACTDB_EMBED=hash) over the rules, the
installed CUTLASS examples and a small registry file with fresh and stale kernels.
"""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fact_db.cli.main import cli
from fact_db.core import toolchain
from fact_db.core.environment import Environment
from fact_db.discovery.rules import load_rules
from fact_db.store import index
from fact_db.store.registry import KernelKey, KernelRecord, Registry

# judged without a GPU (only CUTLASS and nvcc count), whatever this machine has
HERE = Environment(cutlass=toolchain.current().cutlass, nvcc=toolchain.current().nvcc)


@pytest.fixture(autouse=True, scope="module")
def _here():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fact_db.core.environment.current", lambda: HERE)
        yield


def kernel(m=4096, n=4096, k=4096, gpu="h100", arch="sm90a", policy="tf32", time_ms=1.0, template_hash=None,
           rule="gemm", epilogue="none"):
    key = KernelKey(rule=rule, arch=arch, gpu=gpu, dtype_in="float32", dtype_acc="float32", dtype_out="float32",
                    layout_a="row", layout_b="col", m=m, n=n, k=k, batch=1, epilogue=epilogue, policy=policy)
    rec = KernelRecord(key=key, template="gemm_sm90" if arch == "sm90a" else "gemm_sm80", config={"tile_m": 128},
                       time_ms=time_ms, baseline="torch eager", baseline_ms=time_ms * 2,
                       provenance="rule").stamped(HERE.with_(gpu_sku=f"NVIDIA {gpu.upper()} 80GB"))
    return rec.replace(template_hash=template_hash) if template_hash is not None else rec


FRESH = kernel()
NEAR = kernel(m=2048, n=2048, k=8192, policy="bf16", time_ms=0.5)
NEAR = KernelRecord(**{**NEAR.__dict__, "key": NEAR.key.with_(dtype_in="bfloat16", dtype_out="bfloat16")})
STALE = kernel(m=8192, n=8192, k=8192, gpu="a100", arch="sm80", template_hash="0ld", time_ms=9.0)
BIAS = kernel(rule="gemm-bias", epilogue="bias", m=1024, n=1024, k=1024)


@pytest.fixture(scope="session")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("factdb-query")
    env = {"FACTDB_HOME": str(home), "FACTDB_EMBED": "hash", "FACTDB_SEED": "", "FACTDB_DB": None,
           "HF_HUB_OFFLINE": "1"}
    with Registry.open(str(home / "fact.duckdb"), seed=False) as reg:
        reg.put_many([FRESH, NEAR, STALE, BIAS])
    r = CliRunner(env=env).invoke(cli, ["index", "build", "--json"])
    assert r.exit_code == 0, r.output
    return home, env


def run(home, *args):
    return CliRunner(env=home[1]).invoke(cli, list(args))


@pytest.mark.slow
def test_index_build_json_and_incremental(home):
    r = run(home, "index", "build", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["docs"] == {"example": len(index.example_dirs()), "kernel": 4, "rule": len(load_rules())}
    assert rep["embedded"] == 0 and rep["unchanged"] == sum(rep["docs"].values())
    assert rep["model"] == "test/hash-bag-of-words"
    t = run(home, "index", "build")
    assert t.exit_code == 0 and "0 added, 0 updated, 0 removed" in t.output


@pytest.mark.slow
def test_index_status(home):
    r = run(home, "index", "status", "--json")
    st = json.loads(r.stdout)
    assert st["exists"] and st["docs"]["kernel"] == 4 and st["stale"]["count"] == 0
    assert st["model"]["match"] is True
    t = run(home, "index", "status")
    assert "4 kernels" in t.output and "stale: none" in t.output


def test_text_query_says_why_each_result_ranked(home):
    r = run(home, "query", "stream-k gemm on ampere", "--json", "-n", "3")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["mode"] == "hybrid" and len(data["hits"]) == 3
    top = data["hits"][0]
    assert top["id"] == "examples/47_ampere_gemm_universal_streamk"
    assert set(top["scores"]) == {"bm25", "bm25_rank", "vector", "vector_rank", "fused"}
    t = run(home, "query", "stream-k gemm on ampere", "-n", "2")
    assert "1. [example] examples/47_ampere_gemm_universal_streamk  (sm80)" in t.output
    assert "why: bm25 " in t.output and "fused " in t.output


def test_kernel_results_show_time_and_device(home):
    r = run(home, "query", "tuned gemm tf32 kernel on h100", "--kind", "kernel", "--arch", "sm90")
    assert r.exit_code == 0, r.output
    assert f"[kernel] {FRESH.digest}" in r.output
    assert "1 ms on NVIDIA H100 80GB, 2.00x vs baseline; verified" in r.output
    j = json.loads(run(home, "query", "gemm h100", "--kind", "kernel", "--json").stdout)
    hit = next(h for h in j["hits"] if h["id"] == FRESH.digest)
    assert hit["meta"]["time_ms"] == 1.0 and hit["meta"]["device_name"] == "NVIDIA H100 80GB"


def test_filters_on_the_command_line(home):
    r = run(home, "query", "warp specialized gemm with TMA", "--arch", "sm80", "--json", "-n", "20")
    hits = json.loads(r.stdout)["hits"]
    assert hits and all(not h["archs"] or "sm80" in h["archs"] for h in hits)
    r = run(home, "query", "gemm", "--op", "gemm_epilogue", "--kind", "rule", "--json")
    got = {h["id"] for h in json.loads(r.stdout)["hits"]}
    epilogue_rules = {x for x, fam in index.rule_families().items() if fam == "gemm_epilogue"}
    assert got and got <= epilogue_rules  # not vacuous: the filter keeps some, and only those
    assert {"gemm-bias", "gemm-residual"} <= got
    bad = run(home, "query", "gemm", "--arch", "pentium")
    assert bad.exit_code == 1 and "arch 'pentium' is not an architecture" in bad.output


def test_structured_lookup_exact_nearest_and_stale(home):
    r = run(home, "query", "--op", "gemm", "--shape", "4096x4096x4096", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["results"]
    assert res[0]["digest"] == FRESH.digest and res[0]["exact"] and res[0]["distance"] == 0 and res[0]["usable"]
    assert res[0]["time_ms"] == 1.0 and res[0]["device_name"] == "NVIDIA H100 80GB"
    near = next(x for x in res if x["digest"] == NEAR.digest)
    assert not near["exact"] and near["distance"] == pytest.approx(3.0)   # 2048/4096, 2048/4096, 8192/4096
    stale = next(x for x in res if x["digest"] == STALE.digest)
    assert stale["stale"] and "template gemm_sm80 changed" in stale["stale_reason"] and not stale["usable"]
    assert [x["digest"] for x in res][-1] == STALE.digest                  # usable before stale
    t = run(home, "query", "--op", "gemm", "--shape", "4096x4096x4096", "--arch", "sm80")
    assert "nearest (distance 3.00)" in t.output and "STALE: template gemm_sm80 changed" in t.output
    assert FRESH.digest not in t.output                                     # never another GPU's kernel
    f = run(home, "query", "--op", "gemm_epilogue", "--shape", "1024x1024x1024", "--json")
    assert [x["digest"] for x in json.loads(f.stdout)["results"]] == [BIAS.digest]
    p = run(home, "query", "--op", "gemm", "--shape", "4096x4096x4096", "--policy", "bf16", "--json")
    assert [x["digest"] for x in json.loads(p.stdout)["results"]] == [NEAR.digest]
    none = run(home, "query", "--op", "rmsnorm", "--shape", "4096x4096x4096")
    assert none.exit_code == 0 and "no kernel in the registry for rmsnorm 4096x4096x4096" in none.output


@pytest.mark.parametrize("args, message", [
    (["--op", "gemm", "--shape", "4096x4096"], "shape '4096x4096' is not MxNxK or MxNxKxB; write e.g. 4096x4096x4096"),
    (["--op", "gemm", "--shape", "axbxc"], "shape 'axbxc' is not MxNxK or MxNxKxB"),
    (["--shape", "64x64x64"], "needs --op"),
    (["gemm", "--op", "gemm", "--shape", "64x64x64"], "either TEXT"),
    (["gemm", "--gpu", "h100"], "--gpu and --policy apply to a registry lookup"),
    ([], "give TEXT to search for"),
    (["--op", "gemn", "--shape", "64x64x64"], "--op 'gemn' is not a rule id or a rule family; did you mean `gemm`?"),
])
def test_clear_errors(home, args, message):
    r = run(home, "query", *args)
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_db_option_indexes_that_registry(home, tmp_path):
    db = tmp_path / "other.duckdb"
    with Registry.open(str(db), seed=False) as reg:
        reg.put(kernel(m=512, n=512, k=512))
    r = run(home, "query", "gemm tf32 h100", "--kind", "kernel", "--db", str(db), "--json")
    assert r.exit_code == 0, r.output
    assert [h["meta"]["shape"] for h in json.loads(r.stdout)["hits"]] == ["512x512x512"]
    assert (tmp_path / "other.search.duckdb").exists()


def test_missing_model_warns_and_answers_lexically(home):
    env = {**home[1], "FACTDB_EMBED": "none"}
    r = CliRunner(env=env).invoke(cli, ["query", "depthwise convolution", "-n", "1"])
    assert r.exit_code == 0, r.output
    assert "examples/46_depthwise_simt_conv2dfprop" in r.stdout
    assert "warning: embedding model disabled by FACTDB_EMBED=none" in r.stderr


def test_structured_lookup_needs_no_model(home):
    """The structured path imports neither the embedding stack nor sentence-transformers."""
    code = ("import sys; from fact_db.cli.main import cli; "
            "cli(['query', '--op', 'gemm', '--shape', '4096x4096x4096', '--json'], standalone_mode=False); "
            "bad = [m for m in ('sentence_transformers', 'transformers', 'safetensors', 'tokenizers') if m in sys.modules]; "
            "print('IMPORTED', bad)")
    env = {k: v for k, v in home[1].items() if v is not None}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**_base_env(), **env},
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED []" in out.stdout and FRESH.digest in out.stdout


def _base_env():
    import os
    return {k: v for k, v in os.environ.items() if k != "FACTDB_DB"}


def test_help_has_examples():
    for args in (["query"], ["index"], ["index", "build"], ["index", "status"]):
        r = CliRunner().invoke(cli, args + ["--help"])
        assert r.exit_code == 0 and "Example:" in r.output and "factdb " in r.output.split("Example:")[1]


@pytest.mark.slow
def test_batched_lookup_agrees_with_registry_lookup(tmp_path):
    """index.lookup fetches every family's candidates in one query; its answer per family must
    be Registry.lookup's."""
    from fact_db.store.registry import SYNTHETIC_ENV, synthetic_records
    hashes = {"gemm_sm90": "synthetic", "gemm_sm80": "other"}         # a100 rows stale, the rest fresh
    with Registry.open(str(tmp_path / "r.duckdb"), seed=False) as reg:
        reg.bulk_insert(synthetic_records(3000, seed=3, rules=("gemm", "gemm-bias")))
        seen = []
        first = next(reg.rows(rule="gemm"))
        for shape in (first.key.shape, "4096x4096x4096", "1016x2048x3008", "64x8192x512", "2048x2048x2048x4"):
            got = index.lookup("gemm", shape, n=10_000, registry=reg, env=SYNTHETIC_ENV, template_hashes=hashes)
            seen += got
            m, n, k, b = KernelKey.parse_shape(shape)
            for hit in got:
                r = hit.record
                key = KernelKey(**{f: r[f] for f in ("rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out",
                                                     "layout_a", "layout_b", "epilogue", "policy")},
                                m=m, n=n, k=k, batch=b)
                want = reg.lookup(key, SYNTHETIC_ENV, hashes)
                assert want is not None and want.record.digest == hit.digest, (shape, key)
                assert (want.exact, want.stale) == (hit.exact, hit.stale)
                assert want.distance == pytest.approx(hit.distance)
        assert len(seen) > 40 and any(h.stale for h in seen) and any(not h.stale for h in seen)
        assert any(h.exact for h in seen) and any(not h.exact for h in seen)


def test_paths_are_printed(home):
    good = run(home, "query", "gemm with bias and relu in the epilogue", "--kind", "rule", "-n", "2")
    assert "rules/gemm_epilogue/" in good.output  # the rule's file
    ex = run(home, "query", "split-k gemm", "--kind", "example", "-n", "1")
    assert "cutlass_library/source/examples/" in ex.output.splitlines()[1]  # the example's directory
