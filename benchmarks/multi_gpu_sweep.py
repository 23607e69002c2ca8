"""The tuning sweep spread over several GPUs against one GPU, measured in one process
(issue: "Tuning spread over several GPUs").

For each policy: build every candidate first (so both sweeps find a warm build cache and
the comparison is of verification and timing, not of compiles), then `tune(--force)` with
`gpus=[0]` and with every GPU, each on a fresh in-memory registry. Then three checks:
each worker is pinned to its GPU (the trials name the GPU that ran them), the same
candidate timed on each GPU agrees within 3%, and a kernel that faults on one GPU does not
stop the other GPU's worker.

    python benchmarks/multi_gpu_sweep.py --max-candidates 48 --out results.json

Needs two or more sm90 GPUs, nvcc and CUTLASS. Writes a results JSON with device, date
and commit, and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _provenance import commit  # noqa: E402


def sweep(policy: str, n: int, gpus: list[int], reg_mod, tune_mod, workload) -> dict:
    reg = reg_mod.Registry.open("memory")
    t0 = time.perf_counter()
    r = tune_mod.tune(workload, registry=reg, max_candidates=n, gpus=gpus, force=True, progress=False)
    wall = time.perf_counter() - t0
    ok = [t for t in r.trials if t.status == "ok"]
    return r, {"policy": policy, "gpus": gpus, "candidates": len(r.trials), "ok": len(ok), "wall_s": wall,
            "compile_s": r.compile_s, "bench_s": r.bench_s,
            "winner": r.winner.candidate.label if r.winner else None,
            "winner_ms": r.winner.time_ms if r.winner else None,
            "trials": [{"label": t.candidate.label, "status": t.status, "ms": t.time_ms, "gpu": t.gpu,
                        "err": t.err} for t in r.trials],
            "by_gpu": {g: sum(1 for t in r.trials if t.gpu == g) for g in sorted({t.gpu for t in r.trials})}}


def same_candidate_on_each_gpu(so: str, tmpl: str, spec: dict, options, workload, gpus: list[int]) -> dict:
    from fact_db.kernels.pool import WorkerPool
    out = {}
    for g in gpus:
        job = {"id": 0, "kind": "cutlass", "so": so, "template": tmpl, "spec": spec, "options": options,
               "workload": workload.as_dict(), "trials": 2, "reps": 50}
        with WorkerPool([g], timeout=120) as pool:
            times = [pool.run([{**job, "id": i}])[0] for i in range(3)]
        out[str(g)] = {"ms": statistics.median(t["time_ms"] for t in times if t.get("time_ms")),
                       "gpu": times[0].get("gpu"), "uuid": times[0].get("uuid"), "status": times[0]["status"]}
    ms = [v["ms"] for v in out.values()]
    return {"per_gpu": out, "spread": (max(ms) - min(ms)) / min(ms), "within_3pct": (max(ms) - min(ms)) / min(ms) <= 0.03}


def fault_isolation(gpus: list[int]) -> dict:
    from fact_db.kernels.pool import WorkerPool
    from fact_db.kernels.gemm.workload import GemmWorkload
    data = HERE.parent / "tests" / "data" / "broken_gemm.cu"
    so = Path(tempfile.mkdtemp()) / "fault.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler=-fPIC", "-gencode=arch=compute_90a,code=sm_90a", str(data),
                    "-o", str(so)], check=True)
    w = GemmWorkload(256, 256, 256, policy="tf32")
    spec = {"dtype": "float32", "layout_a": "row", "layout_b": "row", "epilogue": "none", "bias_axis": "col"}
    jobs = [{"id": 0, "kind": "cutlass", "so": str(so), "template": "broken", "spec": spec, "options": None,
             "workload": w.as_dict(), "trials": 2, "reps": 20}]
    jobs += [{"id": i, "kind": "eager", "so": "", "template": "eager", "spec": spec, "options": None,
              "workload": w.as_dict(), "trials": 2, "reps": 20} for i in range(1, 9)]
    with WorkerPool(gpus, timeout=30) as pool:
        res = pool.run(jobs)
    good = [r for r in res[1:] if r["status"] == "ok"]
    return {"fault": {k: res[0].get(k) for k in ("status", "error", "gpu")}, "eager_ok": len(good),
            "eager_jobs": len(res) - 1, "eager_gpus": sorted({str(r.get("gpu")) for r in good}),
            "passed": res[0]["status"] in ("crashed", "launch_error") and len(good) == len(res) - 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-candidates", type=int, default=48)
    ap.add_argument("--policies", default="fp32,bf16")
    ap.add_argument("--shape", default="4096x4096x4096")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from fact_db.store import registry as reg_mod
    from fact_db.kernels.gemm import tune as tune_mod
    from fact_db.kernels.gemm.workload import GemmWorkload, parse_shape
    n_gpu = torch.cuda.device_count()
    if n_gpu < 2:
        print(f"needs two or more GPUs, found {n_gpu}", file=sys.stderr)
        return 2
    gpus = list(range(n_gpu))
    m, n, k, b = parse_shape(a.shape)
    doc = {"device": torch.cuda.get_device_name(0), "gpus": n_gpu, "date": date.today().isoformat(),
           "commit": commit(), "torch": torch.__version__, "max_candidates": a.max_candidates, "shape": a.shape,
           "sweeps": [], "checks": {}}
    # Both pools started before anything is timed: each GPU's worker imports torch and makes its
    # CUDA context once per process (tune shares the pool across calls), so the comparison is of
    # verification and timing spread over GPUs, not of start-up.
    from fact_db.kernels.pool import shared_pool
    t0 = time.perf_counter()
    shared_pool([0], 120.0).warm()
    shared_pool(gpus, 120.0).warm()
    doc["warm_s"] = time.perf_counter() - t0
    for pol in a.policies.split(","):
        w = GemmWorkload(m, n, k, b, policy=pol)
        t0 = time.perf_counter()
        cands, _ = tune_mod.candidate_list(w, max_candidates=a.max_candidates, gpu="h200")
        tune_mod.build_candidates(cands, progress=False)
        build_s = time.perf_counter() - t0
        _, one = sweep(pol, a.max_candidates, [0], reg_mod, tune_mod, w)
        res, many = sweep(pol, a.max_candidates, gpus, reg_mod, tune_mod, w)
        doc["sweeps"].append({"policy": pol, "build_s": build_s, "one_gpu": one, "all_gpus": many,
                              "speedup": one["bench_s"] / many["bench_s"] if many["bench_s"] else None,
                              "same_winner": one["winner"] == many["winner"],
                              "winner_gap": abs(one["winner_ms"] - many["winner_ms"]) / one["winner_ms"]
                              if one["winner_ms"] and many["winner_ms"] else None})
        if a.out:
            Path(a.out).write_text(json.dumps(doc, indent=1))
        kernels = [t for t in res.trials if t.status == "ok" and t.candidate.template != "eager"]
        if pol == a.policies.split(",")[0] and kernels:
            win = min(kernels, key=lambda t: t.time_ms)
            c = win.candidate
            doc["checks"]["same_candidate"] = {"label": c.label, **same_candidate_on_each_gpu(
                win.so, c.template, tune_mod.spec_of(w, c), list(c.options) if c.options else None, w, gpus)}
    doc["checks"]["fault_isolation"] = fault_isolation(gpus)
    pinned = all(t["gpu"] in {str(g) for g in gpus} for s in doc["sweeps"] for t in s["all_gpus"]["trials"]
                 if t["status"] != "compile_error")
    doc["checks"]["pinned"] = pinned
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"{'policy':8} {'cands':>5} {'1 GPU s':>8} {f'{n_gpu} GPUs s':>8} {'speedup':>7}  winner(1) / winner(all)")
    for s in doc["sweeps"]:
        print(f"{s['policy']:8} {s['one_gpu']['candidates']:5d} {s['one_gpu']['bench_s']:8.1f} "
              f"{s['all_gpus']['bench_s']:8.1f} {s['speedup'] or 0:7.2f}  {s['one_gpu']['winner']} "
              f"{s['one_gpu']['winner_ms']:.4f} / {s['all_gpus']['winner']} {s['all_gpus']['winner_ms']:.4f}")
    print("checks:", json.dumps({k: (v if k == "pinned" else {kk: vv for kk, vv in v.items() if kk != "per_gpu"})
                                 for k, v in doc["checks"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
