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

Each row's environment key comes from the results file: the device's full name, torch and
CUDA (top level, or its `toolchain` dict), and driver, cuBLAS and cuDNN where the file records
them (older files do not: those fields stay unknown, so on a GPU such a row reads as stale
until the workload is tuned again there). CUTLASS and nvcc come from the file's `toolchain`,
else from what is installed (the kernels are rebuilt from the templates here).

`--restamp` rewrites a seed file written before the environment key (schema 4: no `family`)
in today's format, re-keyed, with each row's environment taken from its own columns and from
the results file its notes name; times, configs and notes are left as they are (not re-timed).

    python benchmarks/seed_registry.py benchmarks/results/h100-2026-11-23.json
    python benchmarks/seed_registry.py RESULTS.json --only square_gemm_fp32:fp32 --dry-run
    python benchmarks/seed_registry.py --restamp
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemm_realize import workload  # noqa: E402  (benchmarks/ is on sys.path)


def results_env(doc: dict, cutlass: str = "", nvcc: str = ""):
    """The environment key a results document records (see the module docstring)."""
    from fact_db.core import toolchain
    from fact_db.core.environment import Environment
    tc = {**(doc.get("toolchain") or {}), **(doc.get("environment") or {})}
    now = toolchain.current()
    pick = lambda name: str(doc.get(name) or tc.get(name) or "")
    return Environment(gpu_sku=doc.get("device", ""), driver=pick("driver"), cuda=pick("cuda"), torch=pick("torch"),
                       cublas=pick("cublas"), cudnn=pick("cudnn"), cutlass=cutlass or tc.get("cutlass") or now.cutlass,
                       nvcc=nvcc or tc.get("nvcc") or now.nvcc)


def seed_records(doc: dict, only: set[str] | None = None) -> list:
    """KernelRecords for the non-eager winners of results document `doc`."""
    from fact_db import __version__
    from fact_db.core import toolchain
    from fact_db.kernels import template
    from fact_db.kernels.gemm.tune import candidates, rule_space, with_rule
    from fact_db.store.registry import KernelRecord, canonical_gpu

    gpu = canonical_gpu(doc.get("gpu") or doc["device"])
    env = results_env(doc)
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
        out.append(KernelRecord(
            key=w.key("sm90a", gpu), template=c.template, config={**c.config, "label": c.label},
            time_ms=row["factdb_ms"], baseline=row["baseline"], baseline_ms=row["baseline_ms"],
            rel_err=row["rel_err"], baseline_rel_err=row["baseline_rel_err"], status="verified", provenance="seed",
            source_hash=template.source_hash(template.render(c.template, c.params)),
            template_hash=toolchain.template_hash(c.template), env=env, factdb_version=__version__,
            notes=(f"tuned on {doc['device']} on {doc['date']} by benchmarks/gemm_realize.py; row rebuilt from "
                   f"{doc.get('_path', 'its results JSON')} by benchmarks/seed_registry.py (config regenerated "
                   "by the same deterministic candidate list and matched by label)")))
    return out


def restamp(seed: Path) -> list:
    """The rows of seed file `seed` as today's KernelRecords: schema-4 rows re-keyed, with their
    environment from their own columns and the results file their notes name (not re-timed:
    times, configs, status and notes unchanged); rows already in today's format as they are."""
    from fact_db.store.jsonl import from_schema4
    from fact_db.store.registry import KernelRecord
    out = []
    for line in seed.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if "family" in d:
            out.append(KernelRecord.from_dict(d))
            continue
        m = re.search(r"benchmarks/results/[\w.-]+\.json", d.get("notes", ""))
        doc = json.loads((ROOT / m.group(0)).read_text()) if m else {}
        env = results_env({"device": d.get("device_name", ""), **doc}, d.get("cutlass_version", ""),
                          d.get("nvcc_version", ""))
        if env.gpu_sku != d.get("device_name", env.gpu_sku):
            raise SystemExit(f"{seed}: row {d.get('digest')} was measured on {d['device_name']}, but {m.group(0)} "
                             f"says {env.gpu_sku}; fix its notes or drop the row")
        out.append(from_schema4(d).replace(env=env, status=d["status"], stale_reason=d.get("stale_reason", "")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", help="a benchmarks/results/<gpu>-<date>.json file")
    ap.add_argument("--seed", default=str(ROOT / "index" / "kernels.jsonl"), help="seed file to merge into")
    ap.add_argument("--only", default="", help="comma-separated problem:policy rows (default: every row)")
    ap.add_argument("--dry-run", action="store_true", help="print what would merge; write nothing")
    ap.add_argument("--restamp", action="store_true",
                    help="rewrite the seed file in today's format (see above); RESULTS is not used")
    args = ap.parse_args()
    if bool(args.results) == args.restamp:
        ap.error("give a RESULTS file, or --restamp (not both)")

    from fact_db.store.registry import Registry

    seed = Path(args.seed)
    if args.restamp:
        recs = restamp(seed)
    else:
        path = Path(args.results)
        doc = json.loads(path.read_text())
        doc["_path"] = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) \
            else str(path)
        recs = seed_records(doc, {s for s in args.only.split(",") if s} or None)
    reg = Registry.open("memory")
    try:
        if seed.exists() and not args.restamp:
            reg.import_jsonl(seed)
        merged = reg.put_many(recs)
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
