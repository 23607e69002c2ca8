"""Retrieval quality of `factdb query`: recall@1, recall@5 and MRR over
benchmarks/retrieval_queries.yaml, for lexical-only (BM25), vector-only and hybrid ranking.

Builds a fresh index of the shipped rules and the installed CUTLASS examples (plus the
seed registry's kernels, if any) in a temporary FACTDB_HOME, then asks every query
without filters. Writes benchmarks/results/retrieval-<date>.json with the machine, date
and commit. Targets (hybrid): recall@1 >= 0.8, recall@5 >= 0.95.

`--tune` also grids the fusion parameters (reciprocal rank fusion k and weights, and a
normalised score blend) and reports the best; the parameters in fact_db.store.index.FUSION
were chosen this way. Tuning and scoring use the same queries, so the untuned default
(RRF, k=60, equal weights) is reported beside them for an honest comparison.

    python benchmarks/retrieval.py [--tune] [--kernels 100000] [--out PATH]
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
QUERIES = HERE / "retrieval_queries.yaml"
TARGETS = {"recall@1": 0.8, "recall@5": 0.95}

sys.path.insert(0, str(HERE))  # for _provenance when this file is loaded by path (tests/test_index_retrieval.py)
from _provenance import commit, machine  # noqa: E402,F401  (index_speed.py imports them from here too)


def load_queries(path: Path = QUERIES) -> list[dict]:
    data = yaml.safe_load(path.read_text())
    qs = data["queries"]
    for q in qs:
        if not q.get("q") or not q.get("expect"):
            raise ValueError(f"{path}: every query needs `q` and a non-empty `expect` list: {q}")
    return qs


def rankings(queries: list[dict], url: str | None = None) -> list[dict]:
    """Per query: the lexical and vector rankings (document ids with their rank), from the index."""
    from fact_db.store import index
    out = []
    for q in queries:
        lex = index.search(q["q"], mode="lexical", n=index.POOL, url=url)
        vec = index.search(q["q"], mode="vector", n=index.POOL, url=url)
        out.append({"q": q["q"], "expect": q["expect"],
                    "lex": [(h.id, h.bm25_rank, h.bm25) for h in lex.hits],
                    "vec": [(h.id, h.vector_rank, h.vector) for h in vec.hits]})
    return out


def fuse(r: dict, mode: str, fusion: dict) -> list[str]:
    """Document ids in fused order, from the rankings of one query (docs are 1:1 with texts here)."""
    from fact_db.store import index
    lex = [(doc, score) for doc, _, score in r["lex"]]
    vec = [(doc, 1.0 - sim) for doc, _, sim in r["vec"]]
    return index.ranked(index._fuse(lex, vec, {**index.FUSION, **fusion}, mode))


def score(ranks: list[dict], mode: str, fusion: dict | None = None) -> dict:
    hits1 = hits5 = 0
    rr = 0.0
    misses = []
    for r in ranks:
        order = fuse(r, mode, fusion or {})
        pos = next((i for i, d in enumerate(order) if d in r["expect"]), None)
        hits1 += pos == 0
        hits5 += pos is not None and pos < 5
        rr += 1.0 / (pos + 1) if pos is not None else 0.0
        if pos != 0:
            misses.append({"q": r["q"], "expect": r["expect"], "rank": None if pos is None else pos + 1,
                           "top3": order[:3]})
    n = len(ranks)
    return {"recall@1": round(hits1 / n, 4), "recall@5": round(hits5 / n, 4), "mrr": round(rr / n, 4),
            "queries": n, "misses": misses}


def tune(ranks: list[dict]) -> list[dict]:
    grid = []
    for k, wv in itertools.product((1, 3, 5, 10, 20, 30, 60, 100), (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)):
        f = {"method": "rrf", "k": k, "w_lex": 1.0, "w_vec": wv}
        s = score(ranks, "hybrid", f)
        grid.append({**f, **{m: s[m] for m in ("recall@1", "recall@5", "mrr")}})
    for a in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        f = {"method": "blend", "alpha": a}
        s = score(ranks, "hybrid", f)
        grid.append({**f, **{m: s[m] for m in ("recall@1", "recall@5", "mrr")}})
    grid.sort(key=lambda g: (-g["recall@1"], -g["recall@5"], -g["mrr"]))
    return grid


def evaluate(url: str | None = None, queries: list[dict] | None = None, fusion: dict | None = None) -> dict:
    """Scores for lexical, vector and hybrid ranking against the index at `url` (built if missing)."""
    ranks = rankings(queries or load_queries(), url)
    return {mode: score(ranks, mode, fusion) for mode in ("lexical", "vector", "hybrid")}, ranks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true", help="grid the fusion parameters and report the best")
    ap.add_argument("--kernels", type=int, default=0,
                    help="then add this many synthetic registry kernels, rebuild, and score again (do they crowd "
                         "the answers?)")
    ap.add_argument("--out", type=Path, help="output JSON path")
    ap.add_argument("--home", type=Path, help="FACTDB_HOME to build in (default: a temporary directory)")
    ap.add_argument("--no-notes", action="store_true",
                    help="ablation: index the examples without the curated notes in index/examples.yaml")
    args = ap.parse_args(argv)

    home = args.home or Path(tempfile.mkdtemp(prefix="factdb-retrieval-"))
    os.environ["FACTDB_HOME"] = str(home)
    os.environ.pop("FACTDB_DB", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fact_db.store import embed, index
    t = time.perf_counter()
    report = index.build(progress=True, docs=index.collect_docs(None, notes={}) if args.no_notes else None)
    build_s = time.perf_counter() - t
    queries = load_queries()
    t = time.perf_counter()
    results, ranks = evaluate(queries=queries)
    eval_s = time.perf_counter() - t
    default = score(ranks, "hybrid", {"method": "rrf", "k": 60, "w_lex": 1.0, "w_vec": 1.0})
    out = {"benchmark": "retrieval", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "machine": machine(), "model": {"name": embed.MODEL_NAME, "version": embed.model_version()},
           "index": {"docs": report.docs, "vectors": report.vectors, "build_s": round(build_s, 2)},
           "queries": len(queries), "targets_hybrid": TARGETS, "fusion": index.FUSION,
           "curated_notes": not args.no_notes,
           "results": {m: {k: v for k, v in s.items() if k != "misses"} for m, s in results.items()},
           "hybrid_untuned_rrf_k60": {k: v for k, v in default.items() if k != "misses"},
           "misses": {m: s["misses"] for m, s in results.items()}, "eval_s": round(eval_s, 2)}
    if args.tune:
        out["tuning"] = tune(ranks)[:15]
    if args.kernels:
        from fact_db.store.registry import Registry, synthetic_rows
        with Registry.open() as reg:
            if reg.count() < args.kernels:
                reg.bulk_insert_rows(synthetic_rows(args.kernels - reg.count(), seed=1))
        t = time.perf_counter()
        krep = index.build(progress=True)
        kres, kranks = evaluate(queries=queries)
        out["with_kernels"] = {"docs": krep.docs, "vectors": krep.vectors, "build_s": round(time.perf_counter() - t, 2),
                               "results": {m: {k: v for k, v in s.items() if k != "misses"} for m, s in kres.items()},
                               "misses": {m: s["misses"] for m, s in kres.items()}}
        if args.tune:
            out["with_kernels"]["tuning"] = tune(kranks)[:15]
        for m, s in kres.items():
            print(f"{m + '+kern':10} {s['recall@1']:9.3f} {s['recall@5']:9.3f} {s['mrr']:7.3f}  ({krep.docs.get('kernel', 0)} kernels)")
    print(f"{'mode':10} {'recall@1':>9} {'recall@5':>9} {'mrr':>7}")
    for m, s in results.items():
        print(f"{m:10} {s['recall@1']:9.3f} {s['recall@5']:9.3f} {s['mrr']:7.3f}")
    print(f"{'hybrid@k60':10} {default['recall@1']:9.3f} {default['recall@5']:9.3f} {default['mrr']:7.3f}  (untuned RRF)")
    for miss in results["hybrid"]["misses"]:
        print(f"  hybrid miss: {miss['q']!r} expected {miss['expect']} at rank {miss['rank']}; top: {miss['top3']}")
    if args.tune:
        print("best fusion settings:")
        for g in out["tuning"][:8]:
            print("  ", g)
    path = args.out or HERE / "results" / f"retrieval-{datetime.date.today().isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    ok = all(results["hybrid"][k] >= v for k, v in TARGETS.items())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
