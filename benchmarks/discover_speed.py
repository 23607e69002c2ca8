"""Time discovery (build on meta + torch.export + matching + roofline) on every benchmark problem.

Writes benchmarks/results/discover-<date>.json with the machine, date and commit. Two
numbers per problem: `in_process_s`, the median of several discoveries in one process
(torch already imported, the rules already loaded), and `cold_cli_s`, the wall time of
one `factdb discover --json` in a fresh process (Python start, torch import, rule loading
included). The target: the minGPT block in at most 5 s on a 2-core CPU machine.

    python benchmarks/discover_speed.py [--repeat 3] [--problems mingpt_block,llama_block]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    return {"device": "cpu", "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--problems", help="comma-separated problem names (default: all)")
    ap.add_argument("--out", type=Path, help="output JSON path")
    args = ap.parse_args(argv)

    from fact_db.discover import discover_problem
    from fact_db.rules import load_rules

    names = args.problems.split(",") if args.problems else sorted(p.stem for p in (HERE / "problems").glob("*.py"))
    rules = load_rules()
    results = []
    for name in names:
        path = HERE / "problems" / f"{name}.py"
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rep = discover_problem(str(path), rules=rules)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fact_db.cli.main", "discover", str(path), "--json"],
                       check=True, capture_output=True)
        cold = time.perf_counter() - t0
        results.append({"problem": name, "in_process_s": statistics.median(times), "in_process_all_s": times,
                        "cold_cli_s": cold, "regions": [r.rule for r in rep.regions], "ops": rep.n_ops})
        print(f"{name:24s} in-process {statistics.median(times):6.2f} s   cold CLI {cold:6.2f} s   {len(rep.regions)} regions", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"benchmark": "discover_speed", "date": now.isoformat(timespec="seconds"), "commit": commit(),
           "machine": machine(), "target": {"problem": "mingpt_block", "max_s": 5.0}, "results": results}
    out = args.out or HERE / "results" / f"discover-{now.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
