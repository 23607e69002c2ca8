"""Attention on Hopper: fact-db's fmha_sm90 kernels (CUTLASS example 88) against SDPA, bf16.

Shapes: minGPT causal self-attention (batch 128, 8 heads, 512 tokens) at head dims 64, 96 and
128, and a Llama-style grouped-query shape (batch 8, 32 query heads over 8 KV heads, 1024
tokens, head dim 128, causal). Every fmha_sm90 config is compiled first, in one parallel batch
(fact_db.kernels.build.build, jobs=16); then, per shape, every candidate (each kernel, SDPA with
PyTorch's choice, SDPA flash / efficient / cudnn forced) is verified against the float64
reference on a smaller batch (the causal mask included) and timed on the full shape in the
same process. Results: benchmarks/results/<gpu>-<date>-attention.json, written after every shape.

    python benchmarks/attention_realize.py --quick        # <= 3 min on an H100 incl. compiles
    python benchmarks/attention_realize.py --tune         # also the full tuner (worker subprocess, registry)
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _provenance import commit  # noqa: E402

SHAPES = {  # name: (batch, heads, kv_heads, length, head dim)
    "mingpt_hd64": (128, 8, 8, 512, 64),
    "mingpt_hd96": (128, 8, 8, 512, 96),
    "mingpt_hd128": (128, 8, 8, 512, 128),
    "llama_gqa_hd128": (8, 32, 8, 1024, 128),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: python benchmarks/attention_realize.py --quick")
    ap.add_argument("--quick", action="store_true", help="fewer timing repetitions (the default shapes all run)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--tune", action="store_true", help="also run fact_db.kernels.attention.tune.tune per shape")
    ap.add_argument("--out", default="", help="results file (default benchmarks/results/<gpu>-<date>-attention.json)")
    args = ap.parse_args()

    import torch

    from fact_db.kernels import build
    from fact_db.kernels.attention import fmha_sm90
    from fact_db.kernels.attention.workload import AttentionWorkload, library_op, sdpa
    from fact_db.kernels.attention.kernel import AttentionKernel
    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.abi import current_gpu
    from fact_db.kernels.verify import rel_err

    gpu, device_name = current_gpu()
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{gpu}-{date}-attention.json"
    reps = 20 if args.quick else 50
    names = [s for s in args.shapes.split(",") if s]
    ws = {}
    for n in names:
        b, h, hkv, L, d = SHAPES[n]
        ws[n] = AttentionWorkload(b, h, hkv, L, L, d, d, causal=True, policy="bf16")

    # every kernel of every shape, compiled in one parallel batch
    t0 = time.perf_counter()
    todo = []
    for n, w in ws.items():
        for cfg in fmha_sm90.configs(w, 8):
            todo.append((n, cfg, fmha_sm90.source(w, cfg)))
    uniq = {}
    for _, _, src in todo:
        uniq.setdefault(src.code, src)
    built = dict(zip(uniq, build.build(list(uniq.values()), jobs=16, progress=True)))
    build_s = time.perf_counter() - t0
    print(f"built {sum(b.ok for b in built.values())}/{len(built)} kernels in {build_s:.0f} s", flush=True)

    rows = []

    def write():
        doc = {"device": device_name, "gpu": gpu, "commit": commit(), "date": date, "torch": torch.__version__,
               "cuda": torch.version.cuda, "build_s": build_s, "results": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")

    for n, w in ws.items():
        small = w.with_(batch=max(1, min(w.batch, 4)))
        scale = w.softmax_scale
        cands = [("sdpa", None, lambda x: sdpa(x["q"], x["k"], x["v"], scale, True))]
        for be in ("flash", "efficient", "cudnn"):
            cands.append((f"sdpa-{be}", None, (lambda op: lambda x: op(x["q"], x["k"], x["v"], scale, True))(
                library_op(be))))
        for tn, cfg, src in todo:
            if tn != n:
                continue
            b = built[src.code]
            if not b.ok:
                rows.append({"shape": n, "candidate": fmha_sm90.label(cfg), "status": "build_failed",
                             "error": b.error[:400]})
                continue
            k = AttentionKernel(b.path, fmha_sm90.TEMPLATE, build_key=b.key)
            cands.append((fmha_sm90.label(cfg), cfg, (lambda k: lambda x: k(x["q"], x["k"], x["v"], scale, True))(k)))
        checks = [small.make_inputs(dist, device="cuda") for dist in ("randn", "rand")]
        refs = [small.reference(x) for x in checks]
        eager_err = max(rel_err(small.eager(x), r) for x, r in zip(checks, refs))
        # a kernel that ignored the mask would match this instead of the reference
        nomask = small.with_(causal=False)
        sets = [w.make_inputs("randn", device="cuda") for _ in range(2)]
        shape_rows = []
        for label, cfg, fn in cands:
            row = {"shape": n, "workload": w.as_dict(), "candidate": label, "status": "ok", "flops": w.flops}
            try:
                errs = [rel_err(fn(x), r) for x, r in zip(checks, refs)]
                row["rel_err"], row["eager_rel_err"] = max(errs), eager_err
                row["nomask_rel_err"] = rel_err(fn(checks[0]), nomask.reference(checks[0]))
                if not max(errs) <= max(4 * eager_err, 2e-2):
                    row["status"] = "verify_failed"
                else:
                    t = time_cuda(lambda x, out=None: fn(x), sets, reps=reps)
                    row["ms"], row["p10_ms"], row["p90_ms"] = t.median_ms, t.p10_ms, t.p90_ms
                    row["tflops"] = w.flops / (t.median_ms * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001  (a backend or kernel that refuses the shape)
                row["status"], row["error"] = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            shape_rows.append(row)
            print(f"{n:18s} {label:32s} {row['status']:14s} "
                  f"{row.get('ms', float('nan')):8.3f} ms  err {row.get('rel_err', float('nan')):.2e}", flush=True)
        sd = next((r["ms"] for r in shape_rows if r["candidate"] == "sdpa" and "ms" in r), None)
        for r in shape_rows:
            if sd and "ms" in r:
                r["speedup_vs_sdpa"] = sd / r["ms"]
        rows.extend(shape_rows)
        if args.tune:
            from fact_db.kernels.attention.tune import tune
            t1 = time.perf_counter()
            res = tune(w, jobs=16)
            rows.append({"shape": n, "candidate": "tune", "tune_s": time.perf_counter() - t1, **res.as_dict()})
        write()
    write()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
