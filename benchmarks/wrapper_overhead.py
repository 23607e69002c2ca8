"""The time fact-db's returned module adds around what it runs: optimize a problem, then time the
returned module, the choice's runner, the chosen torch.compile'd module called directly, a fresh
torch.compile of the model and eager, each alone and interleaved (each run from an idle GPU, as
the choice and KernelBench time), and profile one call of each (the CUDA kernels should match).
Written for KernelBench L2-1 at bf16, where the returned torch.compile timed 3-21% behind the
same compiled module timed as the peer (benchmarks/results/raw/h200x4-2026-11-27-s6c3-why.log).

    python benchmarks/wrapper_overhead.py ~/KernelBench/KernelBench/level2/1_Conv2D_ReLU_BiasAdd.py bf16

Prints; writes nothing. Needs a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", help="a KernelBench-format problem file")
    ap.add_argument("policy", nargs="?", default="bf16")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("wrapper_overhead.py times on a GPU; none is visible")
    from torch.profiler import ProfilerActivity, profile

    from fact_db.composition.module import cast_floats, policy_dtype
    from fact_db.discovery.trace import load_problem
    from fact_db.kernels.bench import time_cuda_interleaved
    from fact_db.pipeline.run import at_policy, optimize
    prob = load_problem(a.problem)
    torch.manual_seed(42)
    model = prob.make_model().cuda()

    def make_inputs():
        with torch.device("cuda"):
            return [x.cuda() if isinstance(x, torch.Tensor) else x for x in prob.make_inputs()]
    fast = optimize(model, make_inputs(), policy=a.policy, max_candidates=2, budget=1.0, make_inputs=make_inputs,
                    peers=("compile",), save=False, progress=False, bench=False)
    print("returned", fast.choice)
    if fast._chosen is None:
        sys.exit("the returned module runs no compiled choice here; this script times one that does")
    dt = policy_dtype(a.policy)
    sets = [cast_floats(make_inputs(), dt) if dt else make_inputs() for _ in range(3)]
    model_p = at_policy(model, a.policy)
    fresh = torch.compile(model_p)
    fns = {"returned module": lambda *x: fast(*x),
           "choice's runner": fast.report.choice.candidate("torch.compile").run,
           "compiled, direct": lambda *x: fast._chosen(*x),
           "fresh torch.compile": lambda *x: fresh(*x),
           "eager": lambda *x: model_p(*x)}
    with torch.no_grad():
        for f in fns.values():
            f(*sets[0])
        for name, f in fns.items():
            t = [time_cuda_interleaved([lambda x, f=f: f(*x)], sets)[0].median_ms for _ in range(3)]
            print(f"alone       {name:20s} {statistics.median(t):.4f} ms {[round(v, 4) for v in t]}")
        rounds = [time_cuda_interleaved([lambda x, f=f: f(*x) for f in fns.values()], sets) for _ in range(3)]
        for i, name in enumerate(fns):
            print(f"interleaved {name:20s} {statistics.median(r[i].median_ms for r in rounds):.4f} ms")
        for name, f in fns.items():
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
                for _ in range(3):
                    f(*sets[0])
                torch.cuda.synchronize()
            print("=====", name)
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
