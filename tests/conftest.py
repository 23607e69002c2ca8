import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "benchmarks" / "problems"
BROKEN = Path(__file__).resolve().parent / "broken_rules"
BAD = Path(__file__).resolve().parent / "bad_problems"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def ruleset():
    from fact_db.rules import load_rules
    return load_rules()


@pytest.fixture(scope="session")
def traced():
    """Trace each problem file once per session."""
    from fact_db.trace import load_problem, trace_problem
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = trace_problem(load_problem(str(PROBLEMS / f"{name}.py")))
        return cache[name]
    return get
