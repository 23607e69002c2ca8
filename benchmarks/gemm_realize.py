"""Realize the GEMM benchmark problems under each precision policy on this GPU and write
`benchmarks/results/<gpu>-<date>.json` (or --out):

    {"device", "commit", "date", "torch", "cuda", "environment", "results": [{"problem", "policy",
     "factdb_ms", "baseline", "baseline_ms", "speedup", "rel_err", "baseline_rel_err",
     "tflops", "ceiling_tflops", "kernel", ...}]}

The baseline is eager PyTorch at the same policy (eager fp32 for tf32x3), timed in the same
run by the same worker; `vs_fp32` is the speedup over eager fp32 (KernelBench's convention)
where that was timed. Needs a CUDA GPU (sm90a), nvcc and the CUTLASS headers.

    python benchmarks/gemm_realize.py                       # every problem x policy
    python benchmarks/gemm_realize.py --problems square_gemm_fp32 --policies tf32,bf16
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit  # noqa: E402  (benchmarks/ is on sys.path)

PROBLEMS = ["square_gemm_fp32", "batched_gemm", "large_k_gemm"]
POLICIES = ["fp32", "tf32x3", "tf32", "bf16"]
# The minGPT MLP's first GEMM (c_fc with the tanh-GELU), bf16: the fused-epilogue target.
MLP = dict(m=65536, n=3072, k=768, policy="bf16", layout_a="row", layout_b="col", epilogue="bias_gelu_tanh",
           rule="gemm-bias-gelu-tanh")
CEILING = {"fp32": "fp32", "tf32x3": "tf32", "tf32": "tf32", "bf16": "bf16", "fp16": "bf16"}


def workload(name: str, policy: str):
    """The GemmWorkload of benchmark problem `name` under `policy`: the first GEMM region that
    discovery plans for it (or the minGPT MLP GEMM)."""
    from fact_db.discovery.discover import discover_problem
    from fact_db.realization.realize import plan
    from fact_db.kernels.gemm.workload import GemmWorkload
    if name == "mingpt_mlp":
        return GemmWorkload(**MLP)
    report = discover_problem(str(ROOT / "benchmarks" / "problems" / f"{name}.py"), policy=policy)
    [p] = [p for p in plan(report, policy) if p.workload is not None][:1]
    return p.workload


def compile_baseline(w, reps: int) -> dict:
    """torch.compile(mode='max-autotune') of the eager workload, timed like the candidates."""
    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import rel_err
    fn = torch.compile(lambda a, b, bias: torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh"),
                       mode="max-autotune", fullgraph=True)
    sets = [w.make_inputs("randn") for _ in range(3)]
    t0 = time.perf_counter()
    fn(sets[0]["a"], sets[0]["b"], sets[0]["bias"])
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    x = w.make_inputs("rand")
    err = rel_err(fn(x["a"], x["b"], x["bias"]), w.reference(x))
    t = time_cuda(lambda s: fn(s["a"], s["b"], s["bias"]), sets, reps=reps)
    return {"compile_ms": t.median_ms, "compile_rel_err": err, "compile_s": compile_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS + ["mingpt_mlp"]))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--max-candidates", type=int, default=24)
    ap.add_argument("--gpus", default="", help="comma-separated device indices (default: the current device)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile max-autotune baseline")
    ap.add_argument("--db", default=None, help="registry URL (default: none, nothing recorded)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from fact_db.core.device import device
    from fact_db.kernels.abi import current_gpu
    from fact_db.kernels.gemm.tune import tune

    gpu, device_name = current_gpu()
    dev = device(gpu)
    registry = None
    if args.db:
        from fact_db.store.registry import Registry
        registry = Registry.open(args.db)
    gpus = [int(g) for g in args.gpus.split(",") if g] or None
    results = []
    fp32_ms: dict[str, float] = {}
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{gpu}-{date}.json"

    from fact_db.core import environment

    def write(rows):  # after every row, so a run cut short keeps what it measured
        # `environment`: the registry's key for this host (driver, cuBLAS and cuDNN besides torch and
        # CUDA), which benchmarks/seed_registry.py stamps on the rows it seeds: without it a seed row
        # reads stale on every GPU ("driver not recorded")
        doc = {"device": device_name, "gpu": gpu, "commit": commit(), "date": date, "torch": torch.__version__,
               "cuda": torch.version.cuda, "environment": environment.current().as_dict(), "results": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")

    for name in args.problems.split(","):
        for policy in args.policies.split(","):
            if name == "mingpt_mlp" and policy != "bf16":
                continue
            w = workload(name, policy)
            t0 = time.perf_counter()
            r = tune(w, registry=registry, gpus=gpus, max_candidates=args.max_candidates, reps=args.reps,
                     progress=False)
            wall = time.perf_counter() - t0
            win, eag = r.winner, r.eager
            row = {"problem": name, "shape": w.shape, "policy": policy, "epilogue": w.epilogue,
                   "factdb_ms": win.time_ms if win else None,
                   "baseline": "torch eager fp32" if policy == "tf32x3" else f"torch eager {policy}",
                   "baseline_ms": eag.time_ms if eag else None, "speedup": r.speedup,
                   "rel_err": win.err if win else None, "baseline_rel_err": eag.err if eag else None,
                   "tflops": w.flops / (win.time_ms * 1e-3) / 1e12 if win and win.time_ms else None,
                   "ceiling_tflops": dev.tflops[CEILING[policy]],
                   "kernel": win.candidate.label if win else None, "template": win.candidate.template if win else None,
                   "candidates": len(r.trials), "ok": sum(t.status == "ok" for t in r.trials),
                   "failed": {t.candidate.label: f"{t.status}: {t.error[:160]}" for t in r.trials if t.status != "ok"},
                   "compile_s": r.compile_s, "bench_s": r.bench_s, "wall_s": wall, "notes": r.notes,
                   "from_registry": r.from_registry,
                   "trials": [{"kernel": t.candidate.label, "template": t.candidate.template, "status": t.status,
                               "ms": t.time_ms, "err": t.err} for t in r.trials]}
            if policy == "fp32" and eag and eag.time_ms:
                fp32_ms[name] = eag.time_ms
            if name in fp32_ms and win and win.time_ms:
                row["vs_fp32"] = fp32_ms[name] / win.time_ms
            if name == "mingpt_mlp" and not args.no_compile:
                try:
                    row.update(compile_baseline(w, args.reps))
                    if win and win.time_ms:
                        row["vs_compile"] = row["compile_ms"] / win.time_ms
                except Exception as e:  # noqa: BLE001  (report it; the other numbers still stand)
                    row["compile_error"] = f"{type(e).__name__}: {e}"[:300]
            if registry is not None:
                t0 = time.perf_counter()
                again = tune(w, registry=registry, gpus=gpus, max_candidates=args.max_candidates, reps=args.reps,
                             progress=False)
                row["again_s"] = time.perf_counter() - t0
                row["again_from_registry"] = again.from_registry
            results.append(row)
            write(results)
            print(f"{name:18s} {policy:7s} factdb {row['factdb_ms'] or float('nan'):8.3f} ms  "
                  f"eager {row['baseline_ms'] or float('nan'):8.3f} ms  x{(row['speedup'] or float('nan')):5.2f}  "
                  f"err {row['rel_err'] or float('nan'):.2e} (eager {row['baseline_rel_err'] or float('nan'):.2e})  "
                  f"{row['kernel']}  [{row['ok']}/{row['candidates']} ok, compile {r.compile_s:.0f}s "
                  f"bench {r.bench_s:.0f}s]", flush=True)
    write(results)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
