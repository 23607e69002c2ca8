"""Time discovery (build on meta + torch.export + matching + roofline) on every benchmark problem.

Writes benchmarks/results/discover-<date>.json with the machine, date and commit. Each
problem runs in a fresh process, which reports: `import_s` (importing torch and
fact_db), `rules_s` (loading and checking the rules), `first_s` (the first discovery in
the process: building on meta, torch.export including its one-time import of
torch._dynamo, matching, roofline), `warm_s` (the median of later discoveries), and the
cold command: `--cold` runs (default 5) of `factdb discover --json`, each a fresh parent and
sandboxed child, as a user types it; `cold_cli_runs` has each one's wall time with the
1-minute load average read just before it, `cold_cli_s` their median and `cold_cli_min_s`
their minimum. `registry` says whether the command asked a registry ($FACTDB_HOME/fact.duckdb
or $FACTDB_DB) for its REGISTRY column. The target (issue 13): a cold `factdb discover` of
the minGPT block in at most 5 s end to end on a 2-core CPU machine.

    python benchmarks/discover_speed.py [--repeat 3] [--cold 5] [--problems mingpt_block,llama_block]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from _provenance import commit, machine  # noqa: E402  (benchmarks/ is on sys.path)


def _torch_version() -> str:
    import torch
    return torch.__version__




def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _span(loads) -> str:
    loads = [x for x in loads if x is not None]
    return f"{min(loads):.2f}-{max(loads):.2f}" if loads else "unknown"


def child(path: str, repeat: int) -> int:
    t0 = time.perf_counter()
    from fact_db.discovery.discover import discover_problem
    from fact_db.discovery.rules import load_rules
    t1 = time.perf_counter()
    rules = load_rules()
    t2 = time.perf_counter()
    times = []
    for _ in range(max(2, repeat + 1)):
        s = time.perf_counter()
        rep = discover_problem(path, rules=rules)
        times.append(time.perf_counter() - s)
    print(json.dumps({"import_s": t1 - t0, "rules_s": t2 - t1, "first_s": times[0], "warm_s": statistics.median(times[1:]),
                      "all_s": times, "ops": rep.n_ops, "regions": [r.rule for r in rep.regions]}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", type=int, default=5, help="cold `factdb discover` runs per problem")
    ap.add_argument("--problems", help="comma-separated problem names (default: all)")
    ap.add_argument("--out", type=Path, help="output JSON path")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        return child(args.child, args.repeat)
    names = args.problems.split(",") if args.problems else sorted(p.stem for p in (HERE / "problems").glob("*.py"))
    results = []
    for name in names:
        path = HERE / "problems" / f"{name}.py"
        out = subprocess.run([sys.executable, __file__, "--child", str(path), "--repeat", str(args.repeat)],
                             check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        runs = []
        for _ in range(max(1, args.cold)):
            load = _loadavg()
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "fact_db.cli", "discover", str(path), "--json"], check=True,
                                 capture_output=True, text=True)
            runs.append({"wall_s": time.perf_counter() - t0, "loadavg_1m": load})
        walls = [r["wall_s"] for r in runs]
        row["cold_cli_s"] = statistics.median(walls)
        row["cold_cli_min_s"] = min(walls)
        row["cold_cli_runs"] = runs
        row["registry"] = json.loads(res.stdout).get("registry")
        row["problem"] = name
        results.append(row)
        print(f"{name:24s} first {row['first_s']:5.2f} s  warm {row['warm_s']:5.2f} s  (import {row['import_s']:.2f} s, "
              f"rules {row['rules_s']:.2f} s)  cold CLI median {row['cold_cli_s']:5.2f} s, min {row['cold_cli_min_s']:5.2f} s "
              f"(load {_span([r['loadavg_1m'] for r in runs])})  "
              f"{len(row['regions'])} regions; registry: {row['registry']}", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"benchmark": "discover_speed", "date": now.isoformat(timespec="seconds"), "commit": commit(),
           "machine": machine(torch=_torch_version()), "target": {"problem": "mingpt_block", "max_s": 5.0}, "results": results}
    out = args.out or HERE / "results" / f"discover-{now.date().isoformat()}.json"
    n = 2
    while not args.out and out.exists():  # another run's file of that day is kept
        out = HERE / "results" / f"discover-{now.date().isoformat()}-{n}.json"
        n += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
