"""What makes a cold `factdb discover` start quickly, and that it changes nothing it returns:
the libyaml parse of rule files, the cache of schema-checked rule files, the child's
garbage-collector window and quick exit, and the imports left out where nothing needs them.
Speed itself is measured by benchmarks/discover_speed.py, not here."""
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fact_db.core import paths
from fact_db.discovery import rules as R
from fact_db.core.errors import RuleError

from conftest import PROBLEMS, ROOT

# Every test here starts child processes (the CLI in its sandbox, workers, writers): seconds each.
pytestmark = pytest.mark.subprocess

YAML_FILES = sorted(p for d in (ROOT / "rules", ROOT / "tests" / "broken_rules", ROOT / "tests" / "hostile" / "rules")
                    for p in d.rglob("*") if p.suffix in (".yaml", ".yml"))


def _pure(path: Path):
    """What load_yaml returned before libyaml was used: the pure-Python parse, or its faults."""
    raw = path.read_bytes()
    if len(raw) > R.MAX_RULE_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if R._flow_depth(text)[0] > R.MAX_RULE_NESTING:
        return None
    try:
        return R._parse_pure(path, text)
    except RuleError as e:
        return [str(f) for f in e.faults]


@pytest.mark.skipif(getattr(yaml, "CSafeLoader", None) is None, reason="PyYAML without libyaml")
@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_libyaml_parse_gives_what_the_pure_python_parse_gave(path):
    want = _pure(path)
    if want is None:
        pytest.skip("refused before parsing (size, encoding or nesting)")
    try:
        got = R.load_yaml(path)
    except RuleError as e:
        got = [str(f) for f in e.faults]
    assert got == want


def test_the_corpus_has_anchors_syntax_errors_and_good_rules():
    """The comparison above covers each path of _parse_fast: a pass, an anchor, a libyaml error."""
    texts = {p.name: p.read_text(errors="replace") for p in YAML_FILES}
    assert R._parse_fast(texts["gemm.yaml"])[0] is None
    assert R._parse_fast(texts["alias-in-rule.yaml"])[0] is not None
    assert R._parse_fast(texts["unclosed-bracket.yaml"]) is None


# ------------------------------------------------------------------ the schema cache

@pytest.fixture
def checks(monkeypatch):
    """Counts schema checks (one per file checked)."""
    seen = []
    real = R._validator

    class Counting:
        def __init__(self, kind):
            self.v = real(kind)

        def iter_errors(self, data):
            seen.append(data.get("id") or data.get("fragment"))
            return self.v.iter_errors(data)
    monkeypatch.setattr(R, "_validator", Counting)
    return seen


def _cache_file(home):
    return home / "cache" / "rules-schema.json"


def _drop_rule_cache(home):
    """Remove the rule cache (fact_db/discovery/rulecache.py), so that a load reads the files and
    the schema cache is what spares the checks."""
    for p in (home / "cache").glob("rules-*.pickle"):
        p.unlink()


def _summary(rs):
    return [(r.id, r.family, r.realize, r.match, len(r.patterns)) for r in rs], sorted(rs.fragments)


def test_unchanged_rules_are_not_checked_again(home, checks):
    first = R.load_rules()
    n = len(checks)
    assert n == len(first) + len(first.fragments) > 20
    assert sorted(os.listdir(home)) == ["cache"]
    assert [p for p in sorted(os.listdir(home / "cache")) if not p.endswith(".pickle")] == ["rules-schema.json"]
    assert len(json.loads(_cache_file(home).read_text())["passed"]) == n
    again = R.load_rules()
    assert len(checks) == n  # nothing checked the second time
    assert _summary(again) == _summary(first)


def test_an_edited_rule_is_checked_again_and_its_fault_reported(home, rules_copy, checks):
    R.load_rules()
    n = len(checks)
    f = rules_copy / "gemm" / "gemm.yaml"
    good = f.read_text()
    assert "status: stable" in good
    f.write_text(good.replace("status: stable", "status: bogus", 1))
    with pytest.raises(RuleError) as ei:
        R.load_rules()
    assert any(x.path == str(f) and x.field.startswith("status") for x in ei.value.faults), ei.value.faults
    assert len(checks) == n + 1  # only the edited file was checked
    f.write_text(good)
    assert R.load_rules().get("gemm")  # the original text is known to pass again
    assert len(checks) == n + 1
    f.write_text(good + "\n# a comment\n")  # any change of bytes is a new digest
    R.load_rules()
    assert len(checks) == n + 2


def test_a_changed_schema_checks_every_file_again(home, tmp_path, monkeypatch, checks):
    R.load_rules()
    n = len(checks)
    schema = tmp_path / "rules.schema.json"
    shutil.copy(paths.schema_path(), schema)
    monkeypatch.setattr(paths, "schema_path", lambda: schema)
    R._schema_source.cache_clear()
    try:
        R.load_rules()
        assert len(checks) == n  # the same bytes
        schema.write_text(schema.read_text().rstrip() + "\n\n")
        R._schema_source.cache_clear()  # a process reads the schema once
        R.load_rules()
        assert len(checks) == 2 * n
    finally:
        R._schema_source.cache_clear()


def test_a_rule_with_a_fault_is_never_cached(home, tmp_path, checks):
    bad = ROOT / "tests" / "broken_rules" / "bad-status.yaml"
    for _ in range(2):
        faults = R.validate([bad])
        assert faults
        with pytest.raises(RuleError):
            R.load_rules(extra=[bad])
    digests = set(json.loads(_cache_file(home).read_text())["passed"])
    cache = R.SchemaCache(home)
    assert cache.digest("rule", bad.read_bytes()) not in digests


def test_a_corrupt_or_unwritable_cache_is_ignored(home, tmp_path, monkeypatch, checks):
    _cache_file(home).parent.mkdir(parents=True)
    _cache_file(home).write_text("{not json")
    first = R.load_rules()
    n = len(checks)
    assert json.loads(_cache_file(home).read_text())["passed"]  # rewritten
    _cache_file(home).write_text(json.dumps({"version": 999, "passed": ["x"]}))
    _drop_rule_cache(home)
    R.load_rules()
    assert len(checks) == 2 * n  # another version's cache is not trusted
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("FACTDB_HOME", str(blocker / "home"))  # cannot be created: its parent is a file
    assert _summary(R.load_rules()) == _summary(first)
    assert blocker.read_text() == "x"


def test_validate_checks_every_file_whatever_the_cache(home, checks):
    R.load_rules()
    n = len(checks)
    assert R.validate() == []
    assert len(checks) == 2 * n


def test_the_schema_cache_is_written_only_under_factdb_home(home, rules_copy):
    before = sorted(str(p.relative_to(rules_copy)) for p in rules_copy.rglob("*"))
    R.load_rules()
    assert sorted(str(p.relative_to(rules_copy)) for p in rules_copy.rglob("*")) == before
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.suffix != ".pickle") == \
        ["cache", "cache/rules-schema.json"]  # and the rule cache's rules-*.pickle beside it


# ------------------------------------------------------------------ the child

def test_trusted_imports_is_a_no_op_outside_the_child(monkeypatch):
    from fact_db.discovery import sandbox
    monkeypatch.delenv(sandbox.ENV_CHILD, raising=False)
    frozen = gc.get_freeze_count()
    with sandbox.trusted_imports():
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert not sandbox.quick_exit_allowed()


def test_trusted_imports_in_the_child_turns_the_collector_off_then_on(monkeypatch, tmp_path):
    from fact_db.discovery import sandbox
    monkeypatch.setenv(sandbox.ENV_CHILD, str(tmp_path / "done"))
    try:
        with pytest.raises(ValueError):
            with sandbox.trusted_imports():
                assert not gc.isenabled()
                raise ValueError("an import failed")
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def _cli(*args, env_extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "fact_db.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_the_quick_exit_keeps_the_output_the_exit_code_and_atexit(tmp_path):
    """The discover child skips the interpreter's teardown; its whole JSON report still arrives,
    the problem file's atexit handlers still run, and its own exit code still reaches the parent."""
    marker = tmp_path / "atexit-ran"
    prob = tmp_path / "with_atexit.py"
    src = (PROBLEMS / "mingpt_block.py").read_text()
    prob.write_text(f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n" + src)
    r = _cli("discover", str(prob), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert len(data["regions"]) == 7 and data["registry"].startswith("none yet at")
    assert marker.read_text() == "yes"
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    r = _cli("discover", str(exits))
    assert r.returncode == 1 and "exit code 3" in r.stderr, r.stderr[-2000:]
    says = tmp_path / "says.py"
    says.write_text("import sys\nsys.exit('a message of its own')\n")
    r = _cli("discover", str(says))
    assert r.returncode == 1 and "a message of its own" in r.stderr and "exit code 1" in r.stderr, r.stderr[-2000:]


def test_no_registry_file_means_no_database_library_imported(tmp_path):
    """With no registry to ask, the REGISTRY column is answered without importing SQLAlchemy."""
    code = ("import sys, types; from fact_db.cli.discover import _ask\n"
            "r = types.SimpleNamespace(); _ask(r, None, False)\n"
            "print(r.registry_note); print('sqlalchemy' in sys.modules, 'duckdb' in sys.modules)")
    env = dict(os.environ, FACTDB_HOME=str(tmp_path / "home"))
    env.pop("FACTDB_DB", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120).stdout.splitlines()
    assert out == [f"none yet at {tmp_path / 'home' / 'fact.duckdb'} (every region a miss)", "False False"]


def test_the_version_is_looked_up_on_first_use():
    from importlib.metadata import PackageNotFoundError, version

    import fact_db
    try:
        want = version("fact-db")
    except PackageNotFoundError:
        want = "0.0.0"
    assert fact_db.__version__ == want
    from fact_db import __version__
    assert __version__ == want
    from fact_db.core.toolchain import current
    assert current().factdb == want


# ------------------------------------------------------------------ commands that need no torch

NO_TORCH = [
    ("rules", "list"), ("rules", "show", "gemm"), ("rules", "validate"),
    ("registry", "list"), ("registry", "show", "abcd1234"), ("registry", "export", "{tmp}/k.jsonl"),
    ("registry", "import", "{tmp}/k.jsonl"), ("registry", "gc"), ("registry", "revalidate"),
    ("query", "split-k gemm", "--mode", "lexical"), ("query", "--op", "gemm", "--shape", "4096x4096x4096"),
    ("discover", "{tmp}/missing.py"), ("optimize", "{tmp}/missing.py"), ("realize", "{tmp}/missing.py"),
    ("bench", "{tmp}/missing.py"), ("optimize", "{tmp}"),
]
# The hybrid query embeds its text with the offline model, whose forward pass store/embed.py
# writes in torch: a numpy forward pass would lift this (the store branch owns store/).
TORCH_TODAY = [("query", "split-k gemm")]


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory):
    """A FACTDB_HOME with an empty registry and a built index (building it embeds documents,
    which imports torch: that is `index build`'s cost, not the commands' below)."""
    tmp = tmp_path_factory.mktemp("no-torch")
    env = {"FACTDB_HOME": str(tmp / "home"), "FACTDB_SEED": ""}
    r = _cli("index", "build", env_extra=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp, env


def _imports_torch(args, cli_home) -> tuple[bool, subprocess.CompletedProcess]:
    tmp, env = cli_home
    args = [a.replace("{tmp}", str(tmp)) for a in args]
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "fact_db.cli", *args], capture_output=True,
                       text=True, env=dict(os.environ, HF_HUB_OFFLINE="1", **env), timeout=300, cwd=ROOT)
    # -X importtime lists every module imported, torch's own line ending in "| torch"
    return any(ln.rstrip().endswith("| torch") for ln in r.stderr.splitlines()), r


@pytest.mark.slow
@pytest.mark.parametrize("args", NO_TORCH, ids=" ".join)
def test_commands_that_need_no_model_never_import_torch(args, cli_home):
    torch_imported, r = _imports_torch(args, cli_home)
    said = [ln for ln in r.stderr.splitlines() if not ln.startswith("import time:")]
    assert "Traceback" not in r.stdout + "\n".join(said)
    assert not torch_imported, f"`factdb {' '.join(args)}` imported torch: " + "\n".join(said[-5:])
    if "missing.py" in " ".join(args):
        assert r.returncode == 1 and "missing.py` does not exist" in r.stderr
    if args == ("optimize", "{tmp}"):
        assert r.returncode == 1 and "is a directory, not a problem file" in r.stderr


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="store/embed.py runs the embedding model's forward pass in torch")
@pytest.mark.parametrize("args", TORCH_TODAY, ids=" ".join)
def test_the_hybrid_query_does_not_import_torch_yet(args, cli_home):
    torch_imported, r = _imports_torch(args, cli_home)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not torch_imported


def test_realize_without_a_gpu_says_so_before_tracing():
    """`factdb realize` times candidates on a GPU: without one (and without --compile-only) it
    stops before building or tracing the problem, and says what to do instead."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from click.testing import CliRunner

    from fact_db.cli.main import cli
    from fact_db.discovery import sandbox
    ran = []
    real = sandbox.run
    sandbox.run = lambda *a, **k: ran.append(a) or real(*a, **k)
    try:
        r = CliRunner().invoke(cli, ["realize", str(PROBLEMS / "layernorm.py")])
    finally:
        sandbox.run = real
    assert r.exit_code == 1 and ran == []  # no child built or traced it
    assert "no CUDA GPU is visible: `factdb realize` verifies and times candidates" in r.output
    assert "--compile-only builds them without one" in r.output
