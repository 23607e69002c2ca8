"""Fused residual add + LayerNorm / RMSNorm kernels (kernels_cpp/add_norm.cu.j2) against eager
`x + r` then `layer_norm` / `rms_norm`, at minGPT and Llama shapes, on one GPU. Every candidate
is built in one parallel batch, verified against float64 (both outputs: the norm and the sum)
and timed with eager in the worker (fact_db/kernels/worker.py); writes
`benchmarks/results/<gpu>-<date>-norm.json` (or --out):

    {"device", "gpu", "commit", "date", "torch", "cuda",
     "results": [{"workload", "eager_ms", "best_ms", "speedup", "kernel", "err", "eager_err",
                  "trials": [...]}]}

    python benchmarks/norm_realize.py --quick     # 4 workloads x 6 candidates, ~1-2 min on an H100
    python benchmarks/norm_realize.py             # 8 workloads x 12 candidates
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit  # noqa: E402  (benchmarks/ is on sys.path)

from fact_db.kernels.norm import kernel as norm_kernel, tune as norm_tune, workload as norm_workload  # noqa: E402
from fact_db.kernels.norm.workload import NormWorkload  # noqa: E402

MINGPT_ROWS, LLAMA_ROWS = 128 * 512, 16 * 1024


def workloads(quick: bool) -> list[NormWorkload]:
    ws = [
        NormWorkload("layernorm", MINGPT_ROWS, 768, residual=True, write_sum=True, dtype="float32", policy="fp32"),
        NormWorkload("layernorm", MINGPT_ROWS, 768, residual=True, write_sum=True, dtype="bfloat16", policy="bf16"),
        NormWorkload("rmsnorm", LLAMA_ROWS, 4096, residual=True, write_sum=True, eps=1e-6, dtype="bfloat16",
                     policy="bf16"),
        NormWorkload("rmsnorm", LLAMA_ROWS, 4096, eps=1e-6, dtype="bfloat16", policy="bf16"),
    ]
    if not quick:
        ws += [
            NormWorkload("layernorm", MINGPT_ROWS, 768, dtype="float32", policy="fp32"),
            NormWorkload("layernorm", MINGPT_ROWS, 768, residual=True, dtype="float32", policy="fp32"),
            NormWorkload("rmsnorm", LLAMA_ROWS, 4096, residual=True, write_sum=True, eps=1e-6, dtype="float32",
                         policy="fp32"),
            NormWorkload("layernorm", MINGPT_ROWS, 768, residual=True, write_sum=True, dtype="float16",
                         policy="fp16"),
        ]
    return ws


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 workloads, 6 candidates each")
    ap.add_argument("--candidates", type=int, default=None, help="candidates per workload (default 6 quick, 12)")
    ap.add_argument("--jobs", type=int, default=16, help="parallel nvcc processes")
    ap.add_argument("--in-process", action="store_true", help="time in this process instead of the worker")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    from fact_db.kernels import build
    from fact_db.kernels.abi import current_gpu
    gpu, device_name = current_gpu()
    limit = args.candidates or (6 if args.quick else 12)
    ws = workloads(args.quick)
    cands = {w: norm_tune.candidates(w, limit) for w in ws}
    t0 = time.perf_counter()
    sources = [(w, c, build.Source(norm_workload.TEMPLATE, norm_tune.render(w, c), "sm90a")) for w in ws for c in cands[w]]
    res = build.build([s for _, _, s in sources], jobs=args.jobs, progress=False)
    built = {(w, c): b for (w, c, _), b in zip(sources, res)}
    compile_s = time.perf_counter() - t0
    print(f"compiled {len(res)} kernels in {compile_s:.0f} s ({sum(not b.ok for b in res)} failed)", file=sys.stderr)

    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{gpu}-{date}-norm.json"
    rows = []
    for w in ws:
        trials = norm_tune.tune_norm(w, cands[w], built={c: built[(w, c)] for c in cands[w]},
                                in_process=args.in_process, progress=False)
        eager = next((t for t in trials if t.label == "eager"), None)
        best = next((t for t in trials if t.status == "ok" and t.label != "eager"), None)
        row = {"workload": asdict(w), "key": w.key_string(),
               "eager_ms": eager.time_ms if eager else None, "best_ms": best.time_ms if best else None,
               "speedup": (eager.time_ms / best.time_ms) if (eager and best and eager.time_ms) else None,
               "kernel": best.label if best else None, "err": best.err if best else None,
               "eager_err": eager.err if eager else None,
               "trials": [{"kernel": t.label, "status": t.status, "time_ms": t.time_ms, "err": t.err,
                           "error": t.error[:200]} for t in trials]}
        rows.append(row)
        sp = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        print(f"{w.key_string():60s} eager {row['eager_ms'] or float('nan'):.4f} ms  best "
              f"{row['best_ms'] or float('nan'):.4f} ms ({row['kernel']})  {sp}  err {row['err']}", file=sys.stderr)
    doc = {"device": device_name, "gpu": gpu, "commit": commit(), "date": date, "torch": torch.__version__,
           "cuda": torch.version.cuda, "compile_s": compile_s, "results": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
