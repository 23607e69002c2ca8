import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "benchmarks" / "problems"
BROKEN = Path(__file__).resolve().parent / "broken_rules"
BAD = Path(__file__).resolve().parent / "bad_problems"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def benchmark_script(name: str):
    """benchmarks/<name>.py loaded as a module (the scripts are not a package), with benchmarks/ on
    sys.path while it loads, for the scripts that import their siblings."""
    import importlib.util
    import sys
    where = str(ROOT / "benchmarks")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, where)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(where)
    return mod

_STATE_VARS = ("FACTDB_HOME", "FACTDB_DB", "FACTDB_SEED")
_collect_state: dict = {}


def pytest_configure(config):
    """Before collection, too, the user's state is out of reach: test modules run code at
    import (tests/test_fixtures.py loads the rules, which keeps its schema cache in
    $FACTDB_HOME/cache), before the session fixture below redirects FACTDB_HOME."""
    import tempfile
    _collect_state["old"] = {k: os.environ.get(k) for k in _STATE_VARS}
    _collect_state["home"] = tempfile.mkdtemp(prefix="factdb-collect-home-")
    os.environ["FACTDB_HOME"] = _collect_state["home"]
    os.environ["FACTDB_SEED"] = ""
    os.environ.pop("FACTDB_DB", None)


def pytest_unconfigure(config):
    import shutil
    for k, v in _collect_state.get("old", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if _collect_state.get("home"):
        shutil.rmtree(_collect_state["home"], ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _private_state(tmp_path_factory):
    """Tests never touch the user's state: registry, build cache and index go to a per-session
    directory even when FACTDB_HOME is set (a user's home is never written by tests; the
    GPU tests' kernel builds land there too). FACTDB_DB is cleared so a
    user's registry URL does not leak in, and new registries start empty (FACTDB_SEED="")
    rather than with the shipped seed; tests of seeding name their seed file."""
    old = {k: os.environ.get(k) for k in ("FACTDB_HOME", "FACTDB_DB", "FACTDB_SEED")}
    os.environ["FACTDB_SEED"] = ""
    os.environ["FACTDB_HOME"] = str(tmp_path_factory.mktemp("factdb-home"))
    os.environ.pop("FACTDB_DB", None)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A FACTDB_HOME of the test's own (the caches: schema, rules, builds)."""
    h = tmp_path / "home"
    monkeypatch.setenv("FACTDB_HOME", str(h))
    return h


@pytest.fixture
def rules_copy(tmp_path, monkeypatch):
    """A copy of the shipped rules as FACTDB_RULES, for tests that edit rule files."""
    d = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", d, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("FACTDB_RULES", str(d))
    return d


@pytest.fixture(scope="session")
def ruleset():
    from fact_db.discovery.rules import load_rules
    return load_rules()


@pytest.fixture(scope="session")
def traced():
    """Trace each problem file once per session."""
    from fact_db.discovery.trace import load_problem, trace_problem
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = trace_problem(load_problem(str(PROBLEMS / f"{name}.py")))
        return cache[name]
    return get


@pytest.fixture(scope="session")
def pg():
    """A PostgreSQL server of the session's own on 127.0.0.1 (tests/pg.py): tests marked
    `postgres` use it, and skip where no PostgreSQL binaries are installed (fail with
    FACTDB_TEST_POSTGRES=1, as CI sets)."""
    import pg as pg_mod
    if pg_mod.find_bin() is None:
        why = ("no PostgreSQL server binaries (initdb, pg_ctl) found: install the distribution's postgresql "
               "package, or point FACTDB_PG_BIN at its bin directory")
        if os.environ.get("FACTDB_TEST_POSTGRES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    server = pg_mod.PgServer.start()
    yield server
    server.destroy()


@pytest.fixture
def own_pg(pg):
    """A PostgreSQL server of this test's own, to stop and start (after `pg`, which skips where
    there are no binaries)."""
    import pg as pg_mod
    server = pg_mod.PgServer.start()
    yield server
    server.destroy()
