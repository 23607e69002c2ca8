"""torch.compile(model, backend="factdb")'s compile time from nothing, against plain
torch.compile's, each in a fresh process with empty Inductor and Triton caches
(compile_peers.cold_compile_s), interleaved run by run: plain torch.compile ("inductor") and the
backend ("factdb"), with the backend's time per phase (discover, lookup, rewrite, inductor) and
the kernels it put in. Run on a GPU host; the registry is --db (default: $FACTDB_HOME's), whose
kernels the backend puts in (with an empty one every region stays with Inductor, and the rows
time the backend's fixed cost: issue 25 allows it 20% over torch.compile's compile):

    python benchmarks/backend_cold.py layernorm square_gemm_fp32 mingpt_block --policy fp32 --runs 2

Writes benchmarks/results/<gpu>-<date>-backend-cold.json (device, date, commit) unless --out,
after each problem (a run cut short keeps the problems done). --profile DIR adds a profiled run
of each (cProfile over the timed block: DIR/<problem>-<which>.prof, and .prof.txt with the top
functions by cumulative and by own time), kept out of the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHICH = ("inductor", "factdb")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", help="names in benchmarks/problems/ or paths")
    ap.add_argument("--policy", default="fp32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--db", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", default=None, help="a folder for one more, profiled run of each (see above)")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from _provenance import commit
    from compile_peers import cold_compile_s

    import torch

    from fact_db.core.environment import device_info
    info = device_info(torch.device(a.device))
    info["gpu"] = info["gpu"] or "cpu"
    out = Path(a.out) if a.out else HERE / "results" / f"{info['gpu']}-{date.today().isoformat()}-backend-cold.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": info["name"], "gpu": info["gpu"], "date": date.today().isoformat(), "commit": commit(),
           "torch": torch.__version__, "policy": a.policy, "runs": a.runs, "rows": []}
    if a.profile:
        Path(a.profile).mkdir(parents=True, exist_ok=True)
    for prob in a.problems:
        path = prob if "/" in prob or prob.endswith(".py") else str(HERE / "problems" / f"{prob}.py")
        row = {"problem": Path(path).stem, "policy": a.policy, **{w: [] for w in WHICH}, "errors": [], "runs": []}
        for _ in range(a.runs):
            for w in WHICH:
                got = cold_compile_s(path, a.policy, w, a.db, a.device)
                row["runs"].append({"which": w, **got})
                if "error" in got:
                    row["errors"].append(f"{w}: {got['error']}")
                else:
                    row[w].append(got["compile_s"])
        for w in WHICH:
            row[f"{w}_median_s"] = statistics.median(row[w]) if row[w] else None
        base, ours = row["inductor_median_s"], row["factdb_median_s"]
        row["factdb_over_torch_compile"] = ours / base if base and ours else None
        print(f"{row['problem']:<24} torch.compile {base}  factdb {row['factdb_median_s']}  "
              f"{'; '.join(row['errors'])}", flush=True)
        if a.profile:  # one more run each, profiled: where the time goes, not how much
            row["profiled"] = {w: cold_compile_s(path, a.policy, w, a.db, a.device,
                                                 profile=str(Path(a.profile) / f"{row['problem']}-{w}.prof"))
                               for w in WHICH}
        doc["rows"].append(row)
        out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
