#!/usr/bin/env python3
"""The plan (`factdb optimize FILE --policy P --json` on a machine without a GPU) over every
KernelBench problem, each in its own subprocess under a time limit: the check that every
model file, as it is, gets an answer -- no traceback, no internal error, within the limit.

Per problem and policy it records the exit code, the seconds, the 1-minute load average before
the run (the machine is shared: a loaded one stretches the seconds), whether the output holds a
Python traceback or the words "internal error", the regions found (their rules), the heavy
ops no region covers, the error's last line where the command failed, and the commit it ran
at. Writes benchmarks/results/cpu-<date>-kernelbench-plan.json with the machine, date and
commit; `--update FILE` runs only the problems named and replaces their rows in FILE (after a
fix). The registry is a fresh one under a temporary FACTDB_HOME (seeded from
index/kernels.jsonl, as a user's first run is), shared by every run of the sweep.

    nice -n 10 python benchmarks/kernelbench_cpu_sweep.py --kernelbench /path/to/KernelBench
    python benchmarks/kernelbench_cpu_sweep.py --kernelbench DIR --problems L3-28,L1-89 --policies fp32 --out /tmp/x.json
    python benchmarks/kernelbench_cpu_sweep.py --kernelbench DIR --problems L2-17 --update benchmarks/results/cpu-...json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit, machine  # noqa: E402  (benchmarks/ is on sys.path)
from fact_db.pipeline import kernelbench as kb  # noqa: E402  (no torch at import)

TRACEBACK = "Traceback (most recent call last)"


def run_one(path: Path, policy: str, timeout_s: float, env: dict) -> dict:
    """One `factdb optimize PATH --policy POLICY --json` in its own process group, killed at
    `timeout_s`."""
    load = _loadavg()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "fact_db.cli", "optimize", str(path), "--policy", policy, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        timed_out = True
    secs = time.perf_counter() - t0
    text = out + err
    row = {"policy": policy, "exit_code": p.returncode, "seconds": round(secs, 2), "loadavg_1m": load,
           "timed_out": timed_out,
           "traceback": TRACEBACK in text, "internal_error": "internal error" in text.lower(),
           "regions": None, "uncovered": None, "error": ""}
    try:
        doc = json.loads(out)
        row["regions"] = [r["rule"] for r in doc.get("regions") or []]
        row["uncovered"] = sorted({u["op"] for u in doc.get("uncovered") or []})
        row["how"] = dict(Counter(r.get("how") for r in doc.get("regions") or []))
    except (json.JSONDecodeError, TypeError, KeyError):
        pass
    if p.returncode != 0 or timed_out:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        row["error"] = (f"stopped after {timeout_s:g} s" if timed_out else (lines[-1] if lines else ""))[:400]
    if row["traceback"]:
        i = text.find(TRACEBACK)
        row["traceback_text"] = text[i:i + 4000]
    return row


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def summarize(rows: list[dict]) -> dict:
    out = {}
    for pol in sorted({r["policy"] for r in rows}):
        mine = [r for r in rows if r["policy"] == pol]
        out[pol] = {"runs": len(mine), "ok": sum(1 for r in mine if r["exit_code"] == 0 and not r["timed_out"]),
                    "tracebacks": sum(r["traceback"] for r in mine),
                    "internal_errors": sum(r["internal_error"] for r in mine),
                    "timeouts": sum(r["timed_out"] for r in mine),
                    "failed": sum(1 for r in mine if r["exit_code"] != 0 and not r["timed_out"]),
                    "with_regions": sum(1 for r in mine if r.get("regions")),
                    "regions": sum(len(r.get("regions") or []) for r in mine),
                    "max_seconds": max((r["seconds"] for r in mine), default=None)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", required=True, help="a clone of ScalingIntelligence/KernelBench")
    ap.add_argument("--level", default="1,2,3")
    ap.add_argument("--problems", help="names (L1-19, 19_ReLU) comma-separated, or a file of them")
    ap.add_argument("--policies", default="fp32,bf16")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run (default 60)")
    ap.add_argument("--out", type=Path, help="output JSON (default benchmarks/results/cpu-<date>-kernelbench-plan.json)")
    ap.add_argument("--update", type=Path, help="a sweep JSON whose rows for the problems run are replaced")
    a = ap.parse_args(argv)
    probs = kb.problems(a.kernelbench, kb.levels_of(a.level), kb.selection(a.problems))
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    today = datetime.date.today().isoformat()
    out = a.update or a.out or HERE / "results" / f"cpu-{today}-kernelbench-plan.json"
    rev = commit()
    import torch
    doc = {"what": "factdb optimize --json (the plan, no GPU) on every KernelBench problem",
           "device": "cpu", "machine": machine(torch=torch.__version__), "date": today, "commit": rev,
           "kernelbench": str(Path(a.kernelbench).resolve()), "timeout_s": a.timeout, "policies": policies,
           "results": []}
    del torch
    if a.update:
        doc = json.loads(a.update.read_text())
        doc["date"] = today
        names = {(p.id, pol) for p in probs for pol in policies}
        doc["results"] = [r for r in doc["results"] if (r["id"], r["policy"]) not in names]
    home = tempfile.mkdtemp(prefix="factdb-kb-sweep-")
    env = dict(os.environ, FACTDB_HOME=home, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("FACTDB_DB", None)
    t_all = time.perf_counter()
    for i, prob in enumerate(probs, 1):
        for pol in policies:
            row = {**prob.as_dict(), **run_one(prob.path, pol, a.timeout, env), "commit": rev}
            doc["results"].append(row)
            flag = ("TIMEOUT" if row["timed_out"] else "TRACEBACK" if row["traceback"] else
                    "INTERNAL" if row["internal_error"] else "ok" if row["exit_code"] == 0 else "error")
            print(f"[{i}/{len(probs)}] {prob.id} {prob.name} {pol}: {flag} {row['seconds']:.1f} s, "
                  f"{len(row['regions'] or [])} region(s)" + (f"; {row['error']}" if row["error"] else ""),
                  flush=True)
    doc["wall_s"] = round(time.perf_counter() - t_all, 1) + (doc.get("wall_s", 0) if a.update else 0)
    order = {(p.id, pol): i for i, (p, pol) in enumerate((p, pol) for p in kb.problems(a.kernelbench) for pol in policies)}
    doc["results"].sort(key=lambda r: order.get((r["id"], r["policy"]), len(order)))
    doc["commits"] = sorted({r.get("commit") or doc["commit"] for r in doc["results"]})
    doc["summary"] = summarize(doc["results"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
