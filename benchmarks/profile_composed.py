"""Where a composed model's time goes: the model at the policy in eager PyTorch against the
module `factdb optimize` returns, under torch.profiler, kernel by kernel, plus the host time
per call (what a launch-bound block pays in Python). Run on a GPU machine:

    python benchmarks/profile_composed.py benchmarks/problems/llama_block.py --policy bf16 --max-candidates 2

Prints both tables (top GPU kernels by total time, per call) and writes them as JSON with
--json PATH.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def _profile(fn, xs, calls: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        for _ in range(5):
            fn(*xs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*xs)
        host_ms = (time.perf_counter() - t0) / calls * 1e3  # launch time, before the GPU catches up
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) / calls * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*xs)
            torch.cuda.synchronize()
    rows, ops = [], []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dev > 0 and e.device_type.name == "CUDA":
            rows.append({"kernel": e.key[:110], "calls": e.count // calls, "us_per_call": dev / calls})
        elif e.device_type.name == "CPU" and e.self_cpu_time_total > 0:
            ops.append({"op": e.key[:110], "calls": e.count / calls, "self_us_per_call": e.self_cpu_time_total / calls})
    rows.sort(key=lambda r: -r["us_per_call"])
    ops.sort(key=lambda r: -r["self_us_per_call"])
    return {"host_ms": host_ms, "wall_ms": wall_ms, "gpu_us": sum(r["us_per_call"] for r in rows),
            "launches": sum(r["calls"] for r in rows), "kernels": rows[:20],
            "host_ops": ops[:25]}  # where the host's time goes (self CPU time, under the profiler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem")
    ap.add_argument("--policy", default="bf16")
    ap.add_argument("--max-candidates", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from fact_db.composition.module import cast_floats, policy_dtype, run_at_policy
    from fact_db.pipeline.run import at_policy, optimize_problem
    from fact_db.discovery.trace import load_problem
    fast = optimize_problem(a.problem, policy=a.policy, max_candidates=a.max_candidates, bench=False, save=False,
                            progress=False)
    problem = load_problem(a.problem)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = problem.make_model().eval()
        xs = problem.make_inputs()
    model_p = at_policy(model, a.policy)
    dt = policy_dtype(a.policy)
    xs_p = cast_floats(tuple(xs), dt) if dt else tuple(xs)
    out = {"problem": a.problem, "policy": a.policy, "device": torch.cuda.get_device_name(),
           "regions": [{"rule": z.region.rule, "runs": z.impl.label, "eager_ms": z.eager_ms, "ms": z.ms}
                       for z in fast.report.regions],
           "eager": _profile(lambda *x: run_at_policy(model_p, a.policy, x), xs_p),
           "fact-db": _profile(fast, xs_p),
           "graph only": _profile(fast.gm, xs_p)}
    for name in ("eager", "fact-db", "graph only"):
        p = out[name]
        print(f"== {name}: wall {p['wall_ms']:.3f} ms/call, host {p['host_ms']:.3f} ms/call, "
              f"GPU {p['gpu_us'] / 1e3:.3f} ms in {p['launches']} launches")
        for r in p["kernels"][:12]:
            print(f"   {r['us_per_call']:9.1f} us  x{r['calls']:<3d} {r['kernel']}")
        print("   host, self CPU time per call:")
        for r in p["host_ops"][:12]:
            print(f"   {r['self_us_per_call']:9.1f} us  x{r['calls']:<5.1f} {r['op']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
