"""Time the kernel registry over a DuckDB file of synthetic kernel rows (default 100,000).

Writes benchmarks/results/registry-<date>.json with the machine, date and commit:

- `fill`: generating the rows (fact_db.store.registry.synthetic_rows) and bulk-inserting them.
- `lookup_ms`: Registry.lookup in one process, half on keys present (exact) and half on
  shapes moved within their divisibility class (nearest), plus a third set on a GPU with
  no rows (miss); `nearest_all_stale` (not in `per_call`) times lookups under an environment
  (another nvcc) that makes every row stale. `per_call` opens and closes a connection per
  lookup (the default, so other processes can use the file in between); `pinned` reuses one
  (Registry.pinned()).
  Target: per-call median at most 50 ms.
- `process_s`: a fresh Python process that opens the registry and does one lookup, wall
  time, twice: importing fact_db.store.registry on its own (what `factdb query` needs from the
  registry; target at most 1 s), and through `import fact_db` as it stands (whose
  __init__ imports discovery and torch).
- `cli_s`: `factdb registry list --gpu l4 --json`, a whole CLI call, wall time.
- `write_ms`: put and add_trials per call (each its own transaction and
  connection), import of 1,000 JSONL rows, export of every row, a revalidate pass.

    python benchmarks/registry_speed.py [--rows 100000] [--lookups 150] [--out PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit, machine  # noqa: E402  (benchmarks/ is on sys.path)

from fact_db.store.registry import (
    SYNTHETIC_ENV,
    KernelKey,
    Registry,
    TrialRecord,
    synthetic_records,
    synthetic_rows,
)

ENV = SYNTHETIC_ENV   # synthetic_rows' environment (no GPU named: CUTLASS and nvcc count): every row is current
TH = {"gemm_sm90": "synthetic", "gemm_sm80": "synthetic"}

REGISTRY_ONLY = f"""
import sys, types, time
t0 = time.perf_counter()
pkg = types.ModuleType("fact_db"); pkg.__path__ = [{str(ROOT / 'fact_db')!r}]; pkg.__version__ = "0.1.0"
sys.modules["fact_db"] = pkg
"""
OPEN_LOOKUP = """
from fact_db.store.registry import Registry, KernelKey, SYNTHETIC_ENV
reg = Registry.open(sys.argv[1], seed=False)
hit = reg.lookup(KernelKey(**__import__("json").loads(sys.argv[2])), env=SYNTHETIC_ENV,
                 template_hashes={"gemm_sm90": "synthetic", "gemm_sm80": "synthetic"})
reg.close()
print(time.perf_counter() - t0, hit is not None, "torch" in sys.modules)
"""


def _db_versions() -> dict:
    import duckdb
    import sqlalchemy
    return {"duckdb": duckdb.__version__, "sqlalchemy": sqlalchemy.__version__}


def stats_ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": round(statistics.median(xs) * 1e3, 2), "p90": round(xs[int(0.9 * (len(xs) - 1))] * 1e3, 2),
            "max": round(xs[-1] * 1e3, 2), "n": len(xs)}


def load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=150)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    load_before = load()
    tmp = Path(tempfile.mkdtemp(prefix="factdb-registry-speed-"))
    path = tmp / "fact.duckdb"
    doc: dict = {"benchmark": "registry_speed", "rows": args.rows}

    # -- fill -----------------------------------------------------------------------
    t0 = time.perf_counter()
    rows = list(synthetic_rows(args.rows, seed=1))
    t1 = time.perf_counter()
    reg = Registry.open(str(path), seed=False)
    reg.bulk_insert_rows(rows)
    t2 = time.perf_counter()
    doc["fill"] = {"generate_s": round(t1 - t0, 2), "insert_s": round(t2 - t1, 2), "rows": reg.count(),
                   "file_mb": round(path.stat().st_size / 2**20, 1)}
    print(f"fill: {doc['fill']}", flush=True)

    # -- lookups ----------------------------------------------------------------------
    step = max(1, len(rows) // args.lookups)
    sample = [KernelKey(**json.loads(r["key"])) for r in rows[::step][: args.lookups]]
    exact = sample[: len(sample) // 2]
    near = [k.with_(m=k.m + 128) for k in sample[len(sample) // 2:]]   # +128 keeps M's divisibility class
    miss = [k.with_(gpu="l4") for k in sample[: len(sample) // 3]]
    outcomes = {"exact": 0, "nearest": 0, "none": 0}
    per_call, kinds = [], {}
    for name, keys in (("exact", exact), ("nearest", near), ("miss", miss)):
        ts = []
        for k in keys:
            s = time.perf_counter()
            hit = reg.lookup(k, env=ENV, template_hashes=TH)
            ts.append(time.perf_counter() - s)
            outcomes["none" if hit is None else "exact" if hit.exact else "nearest"] += 1
        kinds[name] = stats_ms(ts)
        per_call += ts
    ts = []   # after an nvcc upgrade every row is stale: the slow path ranks the whole family
    for k in near[:50]:
        s = time.perf_counter()
        reg.lookup(k, env=ENV.with_(nvcc="99.9"), template_hashes=TH)
        ts.append(time.perf_counter() - s)
    kinds["nearest_all_stale"] = stats_ms(ts)
    pinned = []
    with reg.pinned():
        for k in exact + near + miss:
            s = time.perf_counter()
            reg.lookup(k, env=ENV, template_hashes=TH)
            pinned.append(time.perf_counter() - s)
    doc["lookup_ms"] = {"per_call": stats_ms(per_call), "per_call_by_kind": kinds, "pinned": stats_ms(pinned),
                        "outcomes": outcomes, "target_median_ms": 50}
    print(f"lookup per call: {doc['lookup_ms']['per_call']}  pinned: {doc['lookup_ms']['pinned']}  {outcomes}",
          flush=True)
    reg.close()

    # -- fresh processes ----------------------------------------------------------------
    key = json.dumps(near[0].as_dict())
    proc = {}
    for name, code in (("registry_only", REGISTRY_ONLY + OPEN_LOOKUP),
                       ("via_import_fact_db", "import sys, time\nt0 = time.perf_counter()\nimport fact_db\n" + OPEN_LOOKUP)):
        walls, inner = [], []
        for _ in range(3):
            s = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code, str(path), key], capture_output=True, text=True,
                                 check=True, cwd=ROOT).stdout.split()
            walls.append(time.perf_counter() - s)
            inner.append(float(out[0]))
            torch_loaded = out[2] == "True"
        proc[name] = {"wall_median_s": round(statistics.median(walls), 3),
                      "import_open_lookup_median_s": round(statistics.median(inner), 3), "torch_imported": torch_loaded}
    proc["target_s"] = 1.0
    doc["process_s"] = proc
    print(f"fresh process: {proc}", flush=True)
    walls = []
    for _ in range(3):
        s = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fact_db.cli", "registry", "list", "--gpu", "l4", "--json", "--db",
                        str(path)], check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - s)
    doc["cli_s"] = {"registry_list_empty_filter_median_s": round(statistics.median(walls), 3)}
    print(f"cli: {doc['cli_s']}", flush=True)

    # -- writes -----------------------------------------------------------------------------
    reg = Registry.open(str(path), seed=False)
    new = list(synthetic_records(1030, seed=2, gpus=("h20",)))
    puts, trials = [], []
    for r in new[:30]:
        s = time.perf_counter()
        reg.put(r, env=ENV, template_hashes=TH)
        puts.append(time.perf_counter() - s)
        t = TrialRecord(key=r.key, template=r.template, config=r.config, status="ok", time_ms=r.time_ms)
        s = time.perf_counter()
        reg.add_trials([t])
        trials.append(time.perf_counter() - s)
    jl = tmp / "in.jsonl"
    jl.write_text("".join(json.dumps(r.as_dict()) + "\n" for r in new[30:]))
    s = time.perf_counter()
    rep = reg.import_jsonl(jl, env=ENV, template_hashes=TH)
    imp = time.perf_counter() - s
    s = time.perf_counter()
    n_exp = reg.export_jsonl(tmp / "out.jsonl")
    exp = time.perf_counter() - s
    s = time.perf_counter()
    changed = reg.revalidate(ENV, template_hashes=TH, dry_run=True)
    reval = time.perf_counter() - s
    reg.close()
    doc["write_ms"] = {"put": stats_ms(puts), "add_trials_one": stats_ms(trials),
                       "import_1000_rows_s": round(imp, 2), "import_inserted": rep.inserted,
                       "export_all_s": round(exp, 2), "exported": n_exp,
                       "revalidate_dry_run_all_s": round(reval, 2), "revalidate_changes": len(changed)}
    print(f"writes: {doc['write_ms']}", flush=True)

    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"benchmark": "registry_speed", "date": now.isoformat(timespec="seconds"), "commit": commit(["fact_db/store/"],
                                                                                    "+uncommitted registry changes"),
           "machine": {**machine(**_db_versions()), "loadavg_before": load_before, "loadavg_after": load()}, **doc}
    out = args.out or HERE / "results" / f"registry-{now.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
