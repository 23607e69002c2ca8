"""Merge the CUTLASS winners of a GEMM benchmark results file into the seed registry
`index/kernels.jsonl`, which every new fact-db database imports. Then `factdb tune` on the
same workload and GPU answers from the registry without compiling or timing anything.

A results file records each winner's label, not its full configuration. This script
regenerates the configurations from the same deterministic candidate list
(`fact_db.kernels.gemm.tune.candidates`, with the run's candidate budget) and matches them by label.
If a label is no longer produced, the candidate list has changed since the run; the script
stops, names the row and writes nothing. Rows that eager PyTorch won are not seeded:
eager needs no kernel. A row merges by key, under the registry's usual rules: a faster
verified row replaces a slower one.

    python benchmarks/seed_registry.py benchmarks/results/h100-2026-11-23.json
    python benchmarks/seed_registry.py RESULTS.json --only square_gemm_fp32:fp32 --dry-run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemm_realize import workload  # noqa: E402  (benchmarks/ is on sys.path)


def seed_records(doc: dict, only: set[str] | None = None) -> list:
    """KernelRecords for the non-eager winners of results document `doc`."""
    from fact_db.kernels import template
    from fact_db.store.registry import canonical_gpu
    from fact_db.kernels.gemm.tune import candidates, kernel_record, rule_space, with_rule

    gpu = canonical_gpu(doc.get("gpu") or doc["device"])
    out = []
    for row in doc["results"]:
        tag = f"{row['problem']}:{row['policy']}"
        if only and tag not in only:
            continue
        if row.get("template") in (None, "eager") or row.get("factdb_ms") is None:
            continue
        w = with_rule(workload(row["problem"], row["policy"]))   # as tune() resolves it
        space, _ = rule_space(w.rule)
        cands, _ = candidates(w, space, "sm90a", gpu, max_candidates=row.get("candidates") or 24)
        match = [c for c in cands if c.label == row["kernel"] and c.template == row["template"]]
        if not match:
            raise SystemExit(f"{tag}: no candidate is labelled {row['kernel']!r} ({row['template']}) any more; "
                             "the candidate list changed since the run, so its configuration cannot be rebuilt. "
                             "Tune the workload again on a GPU instead.")
        c = match[0]
        out.append(kernel_record(
            w.key("sm90a", gpu), c, row["factdb_ms"], row["rel_err"],
            template.source_hash(template.render(c.template, c.params)), doc["device"], baseline=row["baseline"],
            baseline_ms=row["baseline_ms"], baseline_rel_err=row["baseline_rel_err"], provenance="seed",
            notes=(f"tuned on {doc['device']} on {doc['date']} by benchmarks/gemm_realize.py; row rebuilt from "
                   f"{doc.get('_path', 'its results JSON')} by benchmarks/seed_registry.py (config regenerated "
                   "by the same deterministic candidate list and matched by label)")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a benchmarks/results/<gpu>-<date>.json file")
    ap.add_argument("--seed", default=str(ROOT / "index" / "kernels.jsonl"), help="seed file to merge into")
    ap.add_argument("--only", default="", help="comma-separated problem:policy rows (default: every row)")
    ap.add_argument("--dry-run", action="store_true", help="print what would merge; write nothing")
    args = ap.parse_args()

    from fact_db.store.registry import Registry

    path = Path(args.results)
    doc = json.loads(path.read_text())
    doc["_path"] = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else str(path)
    recs = seed_records(doc, {s for s in args.only.split(",") if s} or None)
    seed = Path(args.seed)
    reg = Registry.open("memory")
    try:
        if seed.exists():
            reg.import_jsonl(seed)
        merged = reg.put_kernels(recs)
        for r, outcome in zip(recs, merged.outcomes):
            print(f"{outcome:8s} {r.key.policy:7s} {r.key.shape:22s} {r.config['label']}  {r.time_ms:.3f} ms")
        if args.dry_run:
            return 0
        # all or nothing: write beside the seed, then rename over it
        fd, tmp = tempfile.mkstemp(dir=seed.parent, prefix=".kernels-", suffix=".jsonl")
        os.close(fd)
        try:
            n = reg.export_jsonl(tmp)
            os.replace(tmp, seed)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        print(f"wrote {n} rows to {seed}", file=sys.stderr)
    finally:
        reg.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
