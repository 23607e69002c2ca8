"""The agent end to end on a GPU, with no network: a scripted chat-completions server on
loopback proposes the gemm-bias-relu rule after that rule is removed from a copy of the
shipped rules; the proposal is validated, its fixture run, matched on
benchmarks/problems/gemm_bias_relu.py, tuned on the GPU (--max-candidates), verified against
float64, stored in a fresh registry, and a second run makes no call.

    python benchmarks/agent_demo.py --max-candidates 4

Writes benchmarks/results/<gpu>-<date>-agent.json (device, date, commit)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-candidates", type=int, default=4)
    ap.add_argument("--policy", default="fp32")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="factdb-agent-demo-"))
    rules = tmp / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("__pycache__"))
    relu_yaml = (rules / "gemm_epilogue" / "gemm-bias-relu.yaml").read_text()
    relu_fix = (rules / "gemm_epilogue" / "gemm-bias-relu.py").read_text()
    (rules / "gemm_epilogue" / "gemm-bias-relu.yaml").unlink()
    (rules / "gemm_epilogue" / "gemm-bias-relu.py").unlink()
    os.environ["FACTDB_RULES"] = str(rules)
    os.environ["FACTDB_HOME"] = str(tmp / "home")
    import torch

    import _provenance
    from loopback_llm import Server  # the loopback server the CPU tests use
    from fact_db.agent import Agent, region_realizer
    from fact_db.discover import discover_problem
    from fact_db.llm import LLM, Config
    from fact_db.registry import Registry
    from fact_db.rules import load_rules

    reply = json.dumps({"kind": "rule", "rule": relu_yaml, "fixture": relu_fix})
    problem = str(ROOT / "benchmarks" / "problems" / "gemm_bias_relu.py")
    reg = Registry.open(str(tmp / "home" / "fact.duckdb"))
    runs = []
    for i in range(2):
        srv = Server([(200, reply, 0)])
        t0 = time.perf_counter()
        try:
            llm = LLM(Config(srv.url, "scripted"))
            rs = load_rules()
            rep = discover_problem(problem, policy=args.policy, rules=rs)
            before = [r.rule for r in rep.regions]
            hook = region_realizer(rep, args.policy, registry=reg, max_candidates=args.max_candidates, progress=True)
            props = Agent(llm, out_dir=tmp / "out", realize=hook).run(rep, rs, problem)
        finally:
            srv.close()
        rz = hook.results[0] if hook.results else None
        runs.append({"run": i + 1, "regions_before": before, "requests": len(srv.requests), **llm.usage.as_dict(),
                     "proposals": [p.as_dict() for p in props],
                     "realized": None if rz is None else {"how": rz.how, "impl": rz.impl.label, "ms": rz.ms,
                                                           "eager_ms": rz.eager_ms, "err": rz.err, "notes": rz.notes},
                     "wall_s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(runs[-1], indent=1, default=str))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    short = gpu.split()[1].lower() if gpu.startswith("NVIDIA") else gpu.lower()
    out = HERE / "results" / f"{short}-{datetime.date.today()}-agent.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"device": gpu, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                               "commit": _provenance.commit(), "policy": args.policy,
                               "max_candidates": args.max_candidates, "runs": runs}, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
