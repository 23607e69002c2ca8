"""The agent end to end on a GPU, with no network. A scripted chat-completions server on
loopback answers after the gemm-bias-relu rule is removed from a copy of the shipped rules:

  rule:   it proposes that rule; the proposal is validated, its fixture run, matched on
          benchmarks/problems/gemm_bias_relu.py, tuned on the GPU (--max-candidates), verified
          against float64 and stored in a fresh registry; a second run makes no call.
  kernel: it proposes a CUDA source for a Linear -> ReLU region (by default
          tests/data/agent/linear_relu_tiled.cu at 262144x16 -> 64, a memory-bound GEMM where
          fusing the ReLU saves a pass over the output; the region ABI of fact_db/kernels/region/);
          the source policy is checked, nvcc builds it in the worker subprocess, the worker
          verifies it against the region's ATen ops in float64 and times it against eager;
          a winner is stored (region_kernels, provenance llm, with its source) and a second run
          makes no call (registry hit). Then `optimize` on the module (no call): the kernel is
          composed where it beats the tuned GEMM plus an eager ReLU, verified end to end, timed
          against eager, saved, and the artifact loaded back.

    python benchmarks/agent_demo.py --max-candidates 4           # both parts
    python benchmarks/agent_demo.py --part kernel --source kernel --m 16 --k 128 --n 64

Without a GPU the rule part is skipped (it tunes on the GPU) and the kernel part compiles where
nvcc exists and records "needs a GPU". Writes benchmarks/results/<gpu>-<date>-agent.json
(device, date, commit; without a GPU, into the run's temporary directory)."""
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


def rule_part(args, tmp, relu_yaml, relu_fix, reg) -> list:
    from loopback_llm import Server  # the loopback server the CPU tests use
    from fact_db.realization.agent import Agent, region_realizer
    from fact_db.discovery.discover import discover_problem
    from fact_db.realization.llm import LLM, Config
    from fact_db.discovery.rules import load_rules

    reply = json.dumps({"kind": "rule", "rule": relu_yaml, "fixture": relu_fix})
    problem = str(ROOT / "benchmarks" / "problems" / "gemm_bias_relu.py")
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
            props = Agent(llm, out_dir=tmp / "out", realize=hook, registry=reg).run(rep, rs, problem)
        finally:
            srv.close()
        rz = hook.results[0] if hook.results else None
        runs.append({"part": "rule", "run": i + 1, "regions_before": before, "requests": len(srv.requests),
                     **llm.usage.as_dict(), "proposals": [p.as_dict() for p in props],
                     "realized": None if rz is None else {"how": rz.how, "impl": rz.impl.label, "ms": rz.ms,
                                                           "eager_ms": rz.eager_ms, "err": rz.err, "notes": rz.notes},
                     "wall_s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(runs[-1], indent=1, default=str))
    return runs


def kernel_part(args, reg, tmp) -> list:
    import torch
    import torch.nn as nn

    from loopback_llm import Server
    from fact_db.realization.agent import Agent
    from fact_db.discovery.discover import discover
    from fact_db.realization.llm import LLM, Config
    from fact_db.discovery.rules import load_rules

    class LinearRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(args.k, args.n)

        def forward(self, x):
            return torch.relu(self.fc(x))

    source = (ROOT / "tests" / "data" / "agent" / f"linear_relu_{args.source}.cu").read_text()
    reply = json.dumps({"kind": "kernel", "name": "linear_relu", "source": source,
                        "explanation": "one thread per output, bias and ReLU fused"})
    runs = []
    for i in range(2):
        srv = Server([(200, reply, 0)])
        t0 = time.perf_counter()
        try:
            llm = LLM(Config(srv.url, "scripted"))
            rs = load_rules()
            gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "H100"
            rep = discover(LinearRelu(), (torch.randn(args.m, args.k),), rules=rs, policy="fp32", gpu=gpu)
            props = Agent(llm, registry=reg, retriever=None, compile_timeout=args.compile_timeout).run(rep, rs)
        finally:
            srv.close()
        rows = list(reg.rows("region"))
        runs.append({"part": "kernel", "run": i + 1, "source": args.source, "shape": [args.m, args.k, args.n],
                     "requests": len(srv.requests),
                     **llm.usage.as_dict(), "proposals": [p.as_dict() for p in props],
                     "registry": [{"digest": r.digest, "name": r.label, "ops": r.key.summary,
                                   "provenance": r.provenance, "status": r.status, "time_ms": r.time_ms,
                                   "eager_ms": r.baseline_ms, "rel_err": r.rel_err, "eager_rel_err": r.baseline_rel_err,
                                   "device_name": r.device_name} for r in rows],
                     "wall_s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(runs[-1], indent=1, default=str))
    if torch.cuda.is_available():
        runs.append(compose_part(args, reg, LinearRelu, tmp))
    return runs


def compose_part(args, reg, LinearRelu, tmp) -> dict:
    """`optimize` on the module with the registry the kernel part filled: no model is called;
    the llm kernel is composed where it beats the tuned GEMM plus an eager ReLU, verified end
    to end and timed against eager; the artifact is loaded back and run."""
    import torch

    import fact_db
    from fact_db.discovery.rules import load_rules
    torch.manual_seed(0)
    model = LinearRelu().cuda().eval()
    x = torch.randn(args.m, args.k, device="cuda")
    t0 = time.perf_counter()
    fast = fact_db.optimize(model, (x,), registry=reg, rules=load_rules(), max_candidates=args.max_candidates,
                            peers=(), out=tmp / "artifact", progress=False)
    r = fast.report
    back = fact_db.load(fast.artifact)
    same = torch.equal(back(x), fast(x))
    out = {"part": "compose", "shape": [args.m, args.k, args.n], "wall_s": round(time.perf_counter() - t0, 1),
           "regions": [{k: z.as_dict()[k] for k in ("rule", "nodes", "how", "impl", "ms", "eager_ms", "notes")}
                       for z in r.regions],
           "verification": {"ok": r.verification.ok, "err": r.verification.err,
                            "eager_err": r.verification.eager_err},
           "variants": [{"name": v.name, "ms": v.ms, "err": v.err} for v in r.variants], "notes": r.notes,
           "artifact_loaded": [n for n in back.load_notes], "artifact_output_equal": same}
    print(json.dumps(out, indent=1, default=str))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("rule", "kernel", "both"), default="both")
    ap.add_argument("--max-candidates", type=int, default=4, help="rule part: candidates the tuner tries")
    ap.add_argument("--policy", default="fp32", help="rule part's policy (the kernel part is fp32)")
    ap.add_argument("--source", choices=("tiled", "kernel"), default="tiled",
                    help="kernel part: the proposal, tests/data/agent/linear_relu_<source>.cu (tiled: 64x64 tiles "
                         "through shared memory; kernel: one thread per output)")
    ap.add_argument("--m", type=int, default=262144, help="kernel part: rows of the Linear's input")
    ap.add_argument("--k", type=int, default=16, help="kernel part: in_features")
    ap.add_argument("--n", type=int, default=64, help="kernel part: out_features")
    ap.add_argument("--compile-timeout", type=float, default=300.0, help="kernel part: nvcc's limit in seconds")
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
    from fact_db.store.registry import Registry

    reg = Registry.open(str(tmp / "home" / "fact.duckdb"))
    runs, notes = [], []
    if args.part in ("rule", "both"):
        if torch.cuda.is_available():
            runs += rule_part(args, tmp, relu_yaml, relu_fix, reg)
        else:
            notes.append("rule part skipped: it tunes the accepted rule's region on a GPU, and none is visible")
            print(notes[-1])
    if args.part in ("kernel", "both"):
        runs += kernel_part(args, reg, tmp)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    short = gpu.split()[1].lower() if gpu.startswith("NVIDIA") else gpu.lower()
    # a run without a GPU shows the pipeline, not results: its file goes to the temporary directory
    out = (HERE / "results" if torch.cuda.is_available() else tmp) / f"{short}-{datetime.date.today()}-agent.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"device": gpu, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                               "commit": _provenance.commit(), "policy": args.policy, "part": args.part,
                               "max_candidates": args.max_candidates, "notes": notes, "runs": runs},
                              indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
