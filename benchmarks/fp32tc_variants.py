"""Build, verify and time a grid of gemm_fp32tc_sm90 variants (in-mainloop TF32 rounding and
3xTF32 split) against eager PyTorch on this GPU, and write
`benchmarks/results/fp32tc-<gpu>-<date>.json`: what each knob (promotion interval, hi from
the raw stage, tile, schedule, split-K) does to error and time, measured in one run, through
the same build/verify/time path as `factdb tune` (worker processes, fresh inputs, L2 flushed).

    python benchmarks/fp32tc_variants.py                     # the default grid
    python benchmarks/fp32tc_variants.py --only square       # one problem
    python benchmarks/fp32tc_variants.py --only square_bcol,mingpt_qkv,mingpt_fc2 --policy fp32
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit  # noqa: E402  (benchmarks/ is on sys.path)

PROBLEMS = {  # the GEMM benchmark problems' workloads, as discovery plans them (A row, B row)
    "square": dict(m=4096, n=4096, k=4096),
    "square_bcol": dict(m=4096, n=4096, k=4096, layout_b="col"),  # both operands K-major: no transposition
    "batched": dict(m=512, n=2048, k=1024, batch=128),
    "large_k": dict(m=256, n=256, k=524288),
    # minGPT's Linear layers at batch 128 x 512 tokens, 768 wide (A row-major, the weight N x K)
    "mingpt_qkv": dict(m=65536, n=2304, k=768, layout_b="col"),
    "mingpt_fc2": dict(m=65536, n=768, k=3072, layout_b="col"),
    "mingpt_proj": dict(m=65536, n=768, k=768, layout_b="col"),
}


def variant(transform: str, promote: int, tile=(128, 128, 16), schedule="cooperative", scheduler="persistent",
            hi_from_raw=True, options=(0, 1, 1, 0)) -> dict:
    return dict(transform=transform, promote_every=promote, tile=tile, schedule=schedule, scheduler=scheduler,
                hi_from_raw=hi_from_raw, options=options)


WIDE = (128, 256, 16)
DEEP = (128, 128, 32)
N192 = (128, 192, 16)  # 96 accumulators and 96 temporaries a thread: the widest promoted tile that fits
GRID = {
    ("square_bcol", "tf32"): [variant("round", 0, tile=WIDE), variant("round", 0, tile=DEEP)],
    ("square", "tf32"): [variant("round", 0, tile=WIDE), variant("round", 0, tile=DEEP)],
    ("square_bcol", "tf32x3"): [variant("split3", 0), variant("split3", 2)],
    ("square", "tf32x3"): [variant("split3", 2), variant("split3", 2, hi_from_raw=False), variant("split3", 4),
                           variant("split3", 2, tile=(64, 128, 16), schedule="pingpong")],
    ("square", "fp32"): [variant("split3", 1), variant("split3", 2)],
    ("batched", "tf32x3"): [variant("split3", 2)],
    ("batched", "fp32"): [variant("split3", 1)],
    ("batched", "tf32"): [variant("round", 0, tile=WIDE), variant("round", 0, tile=DEEP)],
    ("large_k", "tf32x3"): [variant("split3", 2, scheduler="stream_k", options=(0, 1, s, 2)) for s in (16, 32)]
                           + [variant("split3", 2, scheduler="stream_k", options=(0, 1, 1, 3))],
    ("large_k", "tf32"): [variant("round", 0, tile=t, scheduler="stream_k", options=(0, 1, 32, 2))
                          for t in ((128, 128, 16), DEEP)],
    # presplit (lo parts from a pass before the kernel) against split3 (lo made in shared memory)
    # and regsplit (A split in registers: no pass over A); the wider promoted tile (N192) timed the
    # same as 128x128 on an H100 (h100-2026-11-27-fp32tc-presplit.json) and is left out
    ("square_bcol", "fp32"): [variant("split3", 2), variant("presplit", 2), variant("presplit", 1),
                              variant("regsplit", 2), variant("regsplit", 1)],
    ("mingpt_qkv", "fp32"): [variant("split3", 2), variant("presplit", 2), variant("presplit", 1),
                             variant("regsplit", 2), variant("regsplit", 1)],
    ("mingpt_fc2", "fp32"): [variant("split3", 2), variant("presplit", 2), variant("presplit", 1),
                             variant("regsplit", 2), variant("regsplit", 1)],
    ("mingpt_proj", "fp32"): [variant("presplit", 2), variant("presplit", 1), variant("regsplit", 2),
                              variant("regsplit", 1)],
    ("mingpt_qkv", "tf32x3"): [variant("split3", 4), variant("presplit", 4), variant("presplit", 0),
                               variant("regsplit", 4)],
}


def candidate(w, v: dict):
    from fact_db.kernels import template
    from fact_db.kernels.gemm.tune import SCHEDULES, Candidate, _label
    tm, tn, tk = v["tile"]
    ks, es = SCHEDULES[v["schedule"]]
    params = asdict(template.GemmFp32TcParams(
        element_a="float", element_b="float", element_c="void", element_d="float", element_bias="float",
        element_accumulator="float", layout_a=template.LAYOUT[w.layout_a], layout_b=template.LAYOUT[w.layout_b],
        tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=1, cluster_n=1, kernel_schedule=ks, epilogue_schedule=es,
        stages="auto", tile_scheduler=v["scheduler"], epilogue=w.epilogue, bias_axis=w.bias_axis,
        transform=v["transform"], promote_every=v["promote_every"], hi_from_raw=v["hi_from_raw"]))
    label = _label("gemm_fp32tc_sm90", params, v["options"], [])
    if not v["hi_from_raw"]:
        label += " hi-rounded"
    return Candidate("gemm_fp32tc_sm90", params, tuple(v["options"]), "sm90a", float("nan"), label)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated problems (square, batched, large_k)")
    ap.add_argument("--policy", default="", help="comma-separated policies (fp32, tf32x3, tf32); all if empty")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import torch

    from fact_db.kernels import build
    from fact_db.kernels.abi import current_gpu
    from fact_db.kernels.gemm.tune import Candidate, build_candidates, evaluate
    from fact_db.kernels.gemm.workload import GemmWorkload

    gpu, device_name = current_gpu()
    only = set(filter(None, args.only.split(",")))
    policies = set(filter(None, args.policy.split(",")))
    grid = {k: v for k, v in GRID.items() if (not only or k[0] in only) and (not policies or k[1] in policies)}
    # Build everything first, in one parallel batch; evaluate() then finds it in the cache.
    plan = []
    for (prob, policy), variants in grid.items():
        w = GemmWorkload(**PROBLEMS[prob], policy=policy)
        plan.append((prob, w, [Candidate("eager", {}, None, "sm90a", float("nan"), f"torch eager ({policy})")]
                     + [candidate(w, v) for v in variants]))
    build_candidates([c for _, _, cs in plan for c in cs], progress=False)
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"fp32tc-{gpu}-{date}.json"
    rows = []
    for prob, w, cands in plan:
        ev = evaluate(w, cands, progress=False, reps=args.reps)
        eager = next(t for t in ev.trials if t.candidate.template == "eager")
        for t in ev.trials:
            row = {"problem": prob, "shape": w.shape, "policy": w.policy, "kernel": t.candidate.label,
                   "template": t.candidate.template, "status": t.status, "ms": t.time_ms, "rel_err": t.err,
                   "eager_ms": eager.time_ms, "eager_rel_err": eager.err,
                   "speedup": (eager.time_ms / t.time_ms) if t.time_ms and eager.time_ms else None,
                   "tflops": w.flops / (t.time_ms * 1e-3) / 1e12 if t.time_ms else None,
                   "error": t.error[:300]}
            rows.append(row)
            print(f"{prob:8s} {w.policy:7s} {t.candidate.label[:62]:62s} {t.status:13s} "
                  f"{(t.time_ms or float('nan')):8.3f} ms x{(row['speedup'] or float('nan')):5.2f} "
                  f"err {(t.err if t.err is not None else float('nan')):.2e} (eager {(eager.err or float('nan')):.2e})"
                  + (f"  {t.error.splitlines()[0][:120]}" if t.error else ""), flush=True)
        doc = {"device": device_name, "gpu": gpu, "commit": commit(), "date": date, "torch": torch.__version__,
               "cuda": torch.version.cuda, "nvcc": build.toolchain.current().nvcc,
               "notes": ["speedup is over eager PyTorch at the same policy (eager fp32 for tf32x3 and fp32), timed "
                         "in the same worker process; times are medians of 20+ event-timed runs, L2 flushed"],
               "results": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
