"""What keeps `torch.compile(model, backend="factdb")`'s own cost small, and that it changes
nothing the backend or load_rules returns: the rule cache (fact_db/discovery/rulecache.py),
one registry connection for a graph's lookups, the garbage collector paused while fact-db
discovers and looks up, and no heavy module imported by a compile. Speed itself is measured by
benchmarks/backend_overhead.py, not here."""
from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

from fact_db.core.errors import RuleError
from fact_db.discovery import rulecache
from fact_db.discovery import rules as R
from fact_db.pipeline import backend as B

from conftest import ROOT


def _same(a, b) -> None:
    """Two RuleSets hold the same rules (an expression's parsed tree compares by its source)."""
    assert [r.summary() for r in a] == [r.summary() for r in b]
    assert [(r.match, r.realize, r.description, r.priority, r.fixture) for r in a] == \
        [(r.match, r.realize, r.description, r.priority, r.fixture) for r in b]
    strip = lambda rs: [repr(r.patterns).split("tree=")[0] + str([[[e.source for e in p.where] for p in r.patterns]])
                        for r in rs]  # noqa: E731
    assert strip(a) == strip(b)
    assert {k: repr(v) for k, v in a.fragments.items()} == {k: repr(v) for k, v in b.fragments.items()}


def _cache_files(home):
    return sorted((home / "cache").glob("rules-*.pickle"))


def test_a_second_load_comes_from_the_rule_cache_and_equals_a_full_load(home, rules_copy, monkeypatch):
    first = R.load_rules()
    assert len(_cache_files(home)) == 1
    monkeypatch.setattr(R, "_collect", lambda *a, **k: pytest.fail("the rules were parsed again"))
    second = R.load_rules()
    assert second is not first
    _same(first, second)
    assert second.get("gemm-bias-gelu-tanh").realize["template"] == first.get("gemm-bias-gelu-tanh").realize["template"]


def test_a_changed_rule_file_is_loaded_again(home, rules_copy):
    R.load_rules()
    f = rules_copy / "gemm" / "gemm.yaml"
    f.write_text(f.read_text().replace("title:", "title: Changed", 1))
    assert R.load_rules().get("gemm").title.startswith("Changed")
    (rules_copy / "gemm" / "gemm.py").unlink()  # a fixture gone is a fault, not a cached pass
    with pytest.raises(RuleError, match="fixture"):
        R.load_rules()


def test_a_broken_rule_is_never_cached(home, rules_copy):
    (rules_copy / "gemm" / "broken.yaml").write_text("id: broken\n")
    for _ in range(2):
        with pytest.raises(RuleError):
            R.load_rules()
    assert _cache_files(home) == []


@pytest.mark.parametrize("content", [b"", b"not a pickle", pickle.dumps({"version": 1, "digest": "x", "rules": 1}),
                                     pickle.dumps(["a", "list"]), b"\x80\x05corrupt"],
                         ids=["empty", "text", "foreign-digest", "foreign-object", "truncated"])
def test_a_corrupt_or_foreign_cache_file_is_ignored_and_replaced(home, rules_copy, content):
    want = R.load_rules()
    (path,) = _cache_files(home)
    path.write_bytes(content)
    _same(R.load_rules(), want)
    assert pickle.loads(path.read_bytes())["digest"] == rulecache.RuleCache(rules_copy, R.SchemaCache().salt()).digest


def test_an_unwritable_cache_directory_only_costs_the_cache(home, rules_copy):
    home.mkdir()
    (home / "cache").write_text("a file where the directory would go")
    assert len(R.load_rules()) == len(R.load_rules(ROOT / "rules"))


def test_the_digest_covers_the_code_and_the_schema(home, rules_copy, monkeypatch):
    salt = R.SchemaCache().salt()
    d = rulecache.RuleCache(rules_copy, salt).digest
    assert rulecache.RuleCache(rules_copy, salt + b"another schema").digest != d
    monkeypatch.setattr(rulecache, "_code", lambda: b"edited pattern.py")
    assert rulecache.RuleCache(rules_copy, salt).digest != d


# ------------------------------------------------------------------ the backend


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + x


def _compile_on_the_gpu_path(monkeypatch, **options):
    """torch.compile with the backend on its GPU path (discovery, the registry) for a CPU model."""
    monkeypatch.setattr(B, "_on_gpu", lambda tensors: True)
    torch._dynamo.reset()
    B.reset_report()
    model, x = _Mlp().eval(), torch.randn(4, 32)
    fast = torch.compile(model, backend=lambda gm, ex: B.factdb(gm, ex, options={"policy": "fp32", "gpu": "h100",
                                                                                   **options}))
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    return B.report().graphs[-1]


def test_a_graphs_registry_lookups_share_one_connection(home, monkeypatch, tmp_path):
    from fact_db.store import db as D
    from fact_db.store.registry import Registry
    reg = Registry.open(f"duckdb:///{tmp_path / 'reg.duckdb'}")
    opened = []
    real = D.Database._connect
    monkeypatch.setattr(D.Database, "_connect", lambda self, write: opened.append(write) or real(self, write))
    try:
        entry = _compile_on_the_gpu_path(monkeypatch, registry=reg)
    finally:
        reg.close()
    asked = [r for r in entry.left if r[3]]  # regions the registry was asked about
    assert len(asked) >= 2, entry.left
    assert opened == [False], opened


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_for_discovery_and_left_as_it_was(home, monkeypatch, enabled):
    from fact_db.discovery import discover as D
    seen = []
    real = D.discover
    monkeypatch.setattr(D, "discover", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        _compile_on_the_gpu_path(monkeypatch, lookup=lambda *a: None)
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.subprocess
def test_a_compile_in_a_fresh_process_reads_no_rule_file_and_imports_nothing_heavy(tmp_path):
    """The second process compiles with the rules from the cache (parsing them fails the run)
    and never imports the embedding model's stack, the LLM client, plotting or jsonschema."""
    script = r"""
import json, sys, torch
from torch import nn
from fact_db.discovery import rules as R
from fact_db.pipeline import backend as B
if sys.argv[1] == "warm":
    R._collect = lambda *a, **k: (_ for _ in ()).throw(AssertionError("rules parsed in a warm process"))
B._on_gpu = lambda tensors: True
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
fast = torch.compile(model, backend=lambda gm, ex: B.factdb(gm, ex, options={"policy": "fp32", "gpu": "h100"}))
with torch.no_grad():
    fast(torch.randn(2, 16))
heavy = ("sentence_transformers", "transformers", "tokenizers", "safetensors", "openai", "matplotlib", "jsonschema")
print(json.dumps({"note": B.report().graphs[-1].note, "heavy": [m for m in heavy if m in sys.modules]}))
"""
    env = dict(os.environ, FACTDB_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop("FACTDB_DB", None)
    env.pop("FACTDB_RULES", None)
    for mode in ("cold", "warm"):
        res = subprocess.run([sys.executable, "-c", script, mode], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["note"] == "no region has a kernel in the registry", out  # discovery ran, the registry was asked
        if mode == "warm":
            assert out["heavy"] == [], out
