"""What `torch.compile(model, backend="factdb")` adds to torch.compile's own compile time, per
phase, on the CPU: the backend's fixed cost (imports, rules, discovery, the registry) on small
models shaped like issue 25's rows (minGPT block, ReLU self-attention, ResNet-50 bottleneck).

Each run is a fresh process that compiles the problem's model once and calls it, either with
plain `torch.compile(model)` ("plain") or with the factdb backend ("factdb"), and reports the
first call's wall time (`compile_s`), the time to import torch and the backend, and the
backend's `GraphReport.seconds` (discover, lookup, rewrite, inductor). The models are built at
a small batch and sequence length (the graph's structure is what the fixed cost depends on).

On the CPU the backend would put no kernel in and skip discovery (its tensors are not on a
GPU), so this script tells it they are (`backend._on_gpu`): it then runs its GPU path,
discovery, then the registry ($FACTDB_HOME/fact.duckdb, created and migrated before the runs,
so it is warm) asked for each region's kernel as for an H100; the registry holds none for
these shapes, so every region stays with Inductor. Loading kernel libraries is not timed here. FACTDB_HOME and Inductor's cache directory are per invocation of this
script: a first, untimed run of each problem fills Inductor's FX graph cache and fact-db's
rule caches, so the timed runs are cold processes with warm caches (--cold-caches clears
fact-db's caches before every run instead).

    python benchmarks/backend_overhead.py [--runs 3] [--problems mingpt_block] [--policies fp32,bf16] [--out F]

Writes benchmarks/results/cpu-<date>-backend-overhead.json (device, date, commit) unless --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from _provenance import commit, machine  # noqa: E402  (benchmarks/ is on sys.path)

PROBLEMS = ("mingpt_block", "relu_self_attention", "resnet50_bottleneck")
# Small CPU sizes: module globals each problem's get_inputs/get_init_inputs read.
SMALL = {"mingpt_block": {"batch_size": 2, "seq_len": 64, "max_seqlen": 64},
         "relu_self_attention": {"batch_size": 2, "seq_len": 64},
         "resnet50_bottleneck": {"batch_size": 2, "size": 16}}
HEAVY = ("sentence_transformers", "transformers", "tokenizers", "safetensors", "jinja2", "duckdb", "sqlalchemy",
         "sqlmodel", "jsonschema", "yaml", "numpy", "matplotlib", "openai", "psycopg", "tqdm")


def _timing(fn, spent: list):
    """`fn`, appending the seconds each call takes to `spent`."""
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent.append(time.perf_counter() - t)
    return timed


def child(name: str, policy: str, mode: str) -> int:
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, HERE / "problems" / f"{name}.py")
    prob = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prob)
    for k, v in SMALL[name].items():
        setattr(prob, k, v)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[policy]
    model = prob.Model(*prob.get_init_inputs()).eval().to(dtype)
    inputs = [x.to(dtype) for x in prob.get_inputs()]
    out = {"problem": name, "policy": policy, "mode": mode, "import_torch_s": t1 - t0}
    t2 = time.perf_counter()
    import torch._dynamo  # noqa: F401  (both modes pay it; torch.compile imports it on the first call)
    out["import_dynamo_s"] = time.perf_counter() - t2
    if mode == "plain":
        fast = torch.compile(model)
    else:
        t2 = time.perf_counter()
        from fact_db.pipeline import backend
        spent: list = []
        backend.factdb = _timing(backend.factdb, spent)  # the time dynamo waits on the backend, Inductor included
        backend.register()  # what the torch_dynamo_backends entry point does for an installed fact-db
        out["import_backend_s"] = time.perf_counter() - t2
        backend._on_gpu = lambda tensors: True  # the GPU path: discovery, the registry's lookups, Inductor
        fast = torch.compile(model, backend="factdb", options={"policy": policy, "gpu": "h100"})
    import torch._inductor.compile_fx as cfx
    fx_spent: list = []
    cfx.compile_fx = _timing(cfx.compile_fx, fx_spent)  # Inductor's own time, in both modes
    import gc
    gcs = {"gen2": 0, "gen2_s": 0.0, "all_s": 0.0}
    started = []

    def on_gc(phase, info):  # time the collector takes during the compile (both modes pay it)
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            took = time.perf_counter() - started.pop()
            gcs["all_s"] += took
            if info.get("generation") == 2:
                gcs["gen2"] += 1
                gcs["gen2_s"] += took
    gc.callbacks.append(on_gc)
    with torch.no_grad():
        t3 = time.perf_counter()
        fast(*inputs)
        out["compile_s"] = time.perf_counter() - t3
    gc.callbacks.remove(on_gc)
    out["compile_fx_s"] = sum(fx_spent)
    out["gc"] = gcs
    if mode == "factdb":
        rep = backend.report()
        out["graphs"] = len(rep.graphs)
        out["regions"] = sum(len(g.left) + len(g.kernels) for g in rep.graphs)
        phases: dict = {}
        for g in rep.graphs:
            for k, v in g.seconds.items():
                phases[k] = phases.get(k, 0.0) + v
        out["phases_s"] = phases
        out["in_backend_s"] = sum(spent)
        out["backend_s"] = out["in_backend_s"] - phases.get("inductor", 0.0)  # the backend's own cost: all but Inductor
        out["unphased_s"] = out["backend_s"] - sum(v for k, v in phases.items() if k != "inductor")
    out["imported"] = sorted(m for m in HEAVY if m in sys.modules)
    print(json.dumps(out))
    return 0


def _run(name: str, policy: str, mode: str, env: dict) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", name, "--policy", policy, "--mode", mode], env=env,
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{name} {policy} {mode} failed:\n{res.stderr[-3000:]}")
    row = json.loads(res.stdout.strip().splitlines()[-1])
    return row


def _median(rows: list, key) -> float:
    return statistics.median(key(r) for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="timed cold processes per problem, policy and mode")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--policies", default="fp32,bf16")
    ap.add_argument("--cold-caches", action="store_true", help="clear fact-db's caches ($FACTDB_HOME/cache) per run")
    ap.add_argument("--label", default="", help="a note stored with the results (e.g. before/after)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.policy, args.mode)

    tmp = Path(tempfile.mkdtemp(prefix="factdb-overhead-"))
    env = dict(os.environ, FACTDB_HOME=str(tmp / "home"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    env.pop("FACTDB_DB", None)
    subprocess.run([sys.executable, "-c", "from fact_db.store.registry import Registry; Registry.open().close()"],
                   env=env, check=True)
    results = []
    try:
        for name in args.problems.split(","):
            for policy in args.policies.split(","):
                for mode in ("plain", "factdb"):
                    _run(name, policy, mode, env)  # untimed: fills Inductor's and fact-db's caches
                rows = {"plain": [], "factdb": []}
                for _ in range(args.runs):
                    for mode in ("plain", "factdb"):
                        if args.cold_caches:
                            shutil.rmtree(tmp / "home" / "cache", ignore_errors=True)
                        rows[mode].append(_run(name, policy, mode, env))
                fd = rows["factdb"]
                phases = sorted({k for r in fd for k in r["phases_s"]})
                row = {"problem": name, "policy": policy,
                       "plain_compile_s": _median(rows["plain"], lambda r: r["compile_s"]),
                       "factdb_compile_s": _median(fd, lambda r: r["compile_s"]),
                       "import_backend_s": _median(fd, lambda r: r["import_backend_s"]),
                       "phases_s": {k: _median(fd, lambda r, k=k: r["phases_s"].get(k, 0.0)) for k in phases},
                       "backend_s": _median(fd, lambda r: r["backend_s"]),
                       "graphs": fd[0]["graphs"], "regions": fd[0]["regions"],
                       "imported_by_factdb": sorted(set(fd[0]["imported"]) - set(rows["plain"][0]["imported"])),
                       "runs": rows}
                row["extra_s"] = row["factdb_compile_s"] + row["import_backend_s"] - row["plain_compile_s"]
                row["extra_pct"] = 100 * row["extra_s"] / row["plain_compile_s"]
                results.append(row)
                print(f"{name:22s} {policy:5s} plain {row['plain_compile_s']:5.2f} s  factdb {row['factdb_compile_s']:5.2f}"
                      f" s (+import {row['import_backend_s']:.2f})  extra {row['extra_s']:+.2f} s "
                      f"({row['extra_pct']:+.0f}%)  phases " + ", ".join(f"{k} {v:.2f}" for k, v in row["phases_s"].items())
                      + f"  imports {','.join(row['imported_by_factdb']) or '-'}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import torch
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"benchmark": "backend_overhead", "label": args.label, "date": now.isoformat(timespec="seconds"),
           "commit": commit(), "machine": machine(torch=torch.__version__), "cold_caches": args.cold_caches,
           "sizes": SMALL, "results": results}
    out = args.out or HERE / "results" / f"cpu-{now.date().isoformat()}-backend-overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
