"""Convolution kernels (kernels_cpp/conv_sm90.cu.j2) against cuDNN, at KernelBench-like shapes and
the fp32 (cuDNN with TF32 off; candidates 3xTF32 split3), tf32 and bf16 policies, on one GPU.
Every candidate of every workload is built in one parallel nvcc batch, then verified against
float64 and timed with cuDNN in the worker (fact_db/kernels/worker.py). Under fp32 the row also
records cuDNN with PyTorch's default (TF32 on) and its error, so both are in the JSON. Writes
`benchmarks/results/<gpu>-<date>-conv.json` (or --out):

    {"device", "gpu", "commit", "date", "torch", "cuda", "cudnn",
     "results": [{"workload", "problem", "policy", "cudnn_ms", "cudnn_err", "best_ms", "speedup",
                  "kernel", "err", "tf32_default_ms", "tf32_default_err", "trials": [...]}]}

    python benchmarks/conv_realize.py --quick     # 4 shapes x 3 policies x 2 candidates: ~5 min on an H100
    python benchmarks/conv_realize.py             # 10 shapes x 3 policies x 3 candidates
    python benchmarks/conv_realize.py --policies bf16 --only l2_1_bias_relu --candidates 4
    python benchmarks/conv_realize.py --policies fp32 --only resnet50_1x1_reduce --layout nhwc
    python benchmarks/conv_realize.py --policies bf16 --only l2_1_bias_relu --schedules pingpong,persistent,ws --candidates 6
    python benchmarks/conv_realize.py --policies fp32 --shape n=16,c=64,k=128,input=1024x1024,filter=1x1,bias=0

`--shape` times any geometry at its full size (KernelBench L1-87's above, whose candidates tied
cuDNN there and won 3.6x at 128 x 128), each candidate's trial printed.
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

from fact_db.kernels.conv import tune as conv_tune  # noqa: E402
from fact_db.kernels.conv.workload import ConvError, ConvWorkload, canonical_chain  # noqa: E402

# (name, KernelBench problem it is drawn from, geometry and chain). Channels, filters and chains
# are the problems'; batch and spatial sizes are cut to 2-5 GFLOP a convolution, so the float64
# reference of every verification trial stays well under a second and the whole run fits one
# device call.
SHAPES = [
    ("l2_35_sub_hardswish", "L2-35 Conv2d_Subtract_HardSwish (MaxPool, Mish after)",
     dict(n=8, c=64, k=128, input=(64, 64), filter=(3, 3)), [{"op": "sub", "scalar": 0.5}, {"op": "hardswish"}]),
    ("resnet_conv_bn_relu", "L3-9 ResNet18 layer2 conv-bn-relu (BN folded)",
     dict(n=16, c=128, k=128, input=(28, 28), filter=(3, 3), padding=(1, 1)), [{"op": "relu"}]),
    ("l2_87_sub_sub_mish", "L2-87 Conv2d_Subtract_Subtract_Mish",
     dict(n=16, c=64, k=64, input=(64, 64), filter=(3, 3)),
     [{"op": "sub", "scalar": 0.5}, {"op": "sub", "scalar": 0.2}, {"op": "mish"}]),
    ("l1_87_pointwise", "L1-87 conv_pointwise_2D",
     dict(n=16, c=64, k=128, input=(128, 128), filter=(1, 1)), []),
    ("l2_47_conv3d_mish_tanh", "L2-47 Conv3d_Mish_Tanh",
     dict(n=2, c=32, k=64, input=(16, 32, 32), filter=(3, 3, 3), padding=(1, 1, 1)),
     [{"op": "mish"}, {"op": "tanh"}]),
    ("resnet_residual", "L3-8 ResNetBasicBlock conv-bn + residual + relu",
     dict(n=16, c=64, k=64, input=(56, 56), filter=(3, 3), padding=(1, 1)),
     [{"op": "add", "kind": "full"}, {"op": "relu"}]),
    ("l2_1_bias_relu", "L2-1 Conv2D_ReLU_BiasAdd (batch 16 of 128)",
     dict(n=16, c=64, k=128, input=(128, 128), filter=(3, 3)), [{"op": "relu"}]),
    ("l1_76_conv1d", "L1-76 conv_standard_1D dilated strided",
     dict(n=32, c=64, k=128, input=(4096,), filter=(3,), stride=(3,), dilation=(2,)), []),
    # ResNet-50's pointwise convolutions (conv2_x, batch 32; BatchNorm folded into the bias): at fp32
    # the GEMM kernel (schedule gemm) reads the activation once, where split3 writes it three times
    ("resnet50_1x1_reduce", "ResNet-50 bottleneck 1x1 256 -> 64, BN folded, ReLU",
     dict(n=32, c=256, k=64, input=(56, 56), filter=(1, 1)), [{"op": "relu"}]),
    ("resnet50_1x1_expand_residual", "ResNet-50 bottleneck 1x1 64 -> 256, BN folded, + identity, ReLU",
     dict(n=32, c=64, k=256, input=(56, 56), filter=(1, 1)), [{"op": "add", "kind": "full"}, {"op": "relu"}]),
]
POLICIES = {"fp32": "float32", "tf32x3": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


SHAPE_KEYS = {"n": int, "c": int, "k": int, "groups": int, "input": tuple, "filter": tuple, "stride": tuple,
              "padding": tuple, "dilation": tuple, "output_padding": tuple, "transposed": bool, "bias": bool}


def parse_shape(text: str) -> dict:
    """`n=16,c=64,k=128,input=1024x1024,filter=1x1[,stride=2x2,padding=..,dilation=..,groups=..,
    transposed=1,bias=0]` -> ConvWorkload keyword arguments; ValueError naming a bad field."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or key not in SHAPE_KEYS:
            raise ValueError(f"--shape: '{part}' is not key=value with a key of {', '.join(SHAPE_KEYS)}")
        kind = SHAPE_KEYS[key]
        try:
            out[key] = (tuple(int(v) for v in value.split("x")) if kind is tuple else
                        value.strip().lower() in ("1", "true", "yes") if kind is bool else int(value))
        except ValueError:
            raise ValueError(f"--shape: {key}={value} is not {'sizes like 56x56' if kind is tuple else 'a number'}") from None
    missing = [k for k in ("n", "c", "k", "input", "filter") if k not in out]
    if missing:
        raise ValueError(f"--shape needs {', '.join(missing)} (e.g. n=16,c=64,k=128,input=1024x1024,filter=1x1)")
    return out


def workloads(quick: bool, policies: list[str], layout: str = "nchw") -> list[tuple[str, str, ConvWorkload]]:
    out = []
    for name, problem, geo, chain in (SHAPES[:4] if quick else SHAPES):
        for p in policies:
            out.append((name, problem, ConvWorkload(**geo, chain=canonical_chain(chain), dtype=POLICIES[p], policy=p,
                                                    rule="conv-epilogue" if chain else "conv", layout=layout)))
    return out


def tf32_default(w: ConvWorkload) -> dict:
    """cuDNN under PyTorch's default (TF32 on) on the fp32 workload: its time and its error."""
    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import rel_err
    inp = w.make_inputs("randn")
    ref = w.reference(inp)
    errs = [rel_err(w.eager(inp, policy="tf32"), ref)]
    inp2 = w.make_inputs("rand")
    errs.append(rel_err(w.eager(inp2, policy="tf32"), w.reference(inp2)))
    del ref
    torch.cuda.empty_cache()
    t = time_cuda(lambda i: w.eager(i, policy="tf32"), [w.make_inputs("randn") for _ in range(3)])
    return {"tf32_default_ms": t.median_ms, "tf32_default_err": max(errs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 shapes, 2 candidates each")
    ap.add_argument("--candidates", type=int, default=None, help="candidates per workload (default 2 quick, 3)")
    ap.add_argument("--policies", default="fp32,tf32,bf16", help="comma-separated (default fp32,tf32,bf16)")
    ap.add_argument("--only", default="", help="comma-separated shape names (default: every shape, or --quick's)")
    ap.add_argument("--shape", default="", help="time this geometry instead of the shapes above "
                    "(n=16,c=64,k=128,input=1024x1024,filter=1x1[,stride=..,padding=..,dilation=..,groups=..,"
                    "transposed=1,bias=0])")
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw",
                    help="how the activation arrives: nchw (a model's input: the kernels' times include the "
                         "conversion to channels-last) or nhwc (from another fact-db convolution)")
    ap.add_argument("--schedules", default=",".join(conv_tune.SCHEDULES),
                    help="the conv kernels offered, in the order the candidates alternate them (default "
                         f"{','.join(conv_tune.SCHEDULES)}; the tuner's; also: pingpong)")
    ap.add_argument("--jobs", type=int, default=16, help="parallel nvcc processes")
    ap.add_argument("--in-process", action="store_true", help="time in this process instead of the worker")
    ap.add_argument("--compile-only", action="store_true", help="build every candidate, time nothing (no GPU needed)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    limit = args.candidates or (2 if args.quick else 3)
    from fact_db.kernels.conv.kernel import SCHEDULES as KNOWN
    schedules = tuple(x.strip() for x in args.schedules.split(",") if x.strip())
    bad = [x for x in schedules if x not in KNOWN or x == "gemm"]
    if bad or not schedules:
        ap.error(f"--schedules: {', '.join(bad) or 'none given'}: give conv kernels among "
                 f"{', '.join(k for k in KNOWN if k != 'gemm')}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies: {', '.join(bad)} not among {', '.join(POLICIES)}")
    ws = workloads(args.quick, policies, args.layout)
    if args.shape:
        try:
            geo = parse_shape(args.shape)
            ws = [("shape", args.shape, ConvWorkload(**geo, dtype=POLICIES[p], policy=p, layout=args.layout))
                  for p in policies]
        except (ValueError, ConvError) as e:
            ap.error(str(e))
    elif args.only:
        only = {x.strip() for x in args.only.split(",") if x.strip()}
        unknown = only - {name for name, *_ in SHAPES}
        if unknown:
            ap.error(f"--only: no shape {', '.join(sorted(unknown))} (have: {', '.join(n for n, *_ in SHAPES)})")
        ws = [x for x in ws if x[0] in only]
    t0 = time.perf_counter()
    cands = {id(w): conv_tune.candidates(w, limit, schedules) for _, _, w in ws}
    from fact_db.kernels import build
    from fact_db.kernels.conv.kernel import source
    sources = list(dict.fromkeys(source(w, c) for _, _, w in ws
                                 for c in cands[id(w)]))
    print(f"{len(ws)} workloads, {len(sources)} distinct kernels to build", flush=True)
    built = dict(zip(sources, build.build(sources, jobs=args.jobs, progress=False)))
    print(f"built in {time.perf_counter() - t0:.0f} s: {sum(b.ok for b in built.values())} ok", flush=True)
    for b in built.values():
        if not b.ok:
            print(f"  build failed: {b.error[:300]}", flush=True)
    if args.compile_only:
        return 0 if all(b.ok for b in built.values()) else 1
    import torch
    results = []
    for name, problem, w in ws:
        bs = {c: built[source(w, c)] for c in cands[id(w)]}
        t1 = time.perf_counter()
        trials = conv_tune.tune_conv(w, cands[id(w)], built=bs, in_process=args.in_process, progress=False)
        cudnn = next((t for t in trials if t.config is None), None)
        best = next((t for t in trials if t.status == "ok"), None)
        row = {"workload": w.as_dict(), "name": name, "problem": problem, "policy": w.policy, "describe": w.describe(),
               "cudnn_ms": cudnn.time_ms if cudnn else None, "cudnn_err": cudnn.err if cudnn else None,
               "best_ms": best.time_ms if best else None, "kernel": best.label if best else None,
               "err": best.err if best else None,
               "speedup": (cudnn.time_ms / best.time_ms) if cudnn and best and cudnn.time_ms and best.time_ms else None,
               "trials": [{**asdict(t), "config": asdict(t.config) if t.config else None} for t in trials]}
        if w.policy == "fp32":
            row.update(tf32_default(w))
        results.append(row)
        print(f"{w.describe()}: cuDNN {row['cudnn_ms']} ms (err {row['cudnn_err']}), best {row['kernel']} "
              f"{row['best_ms']} ms (err {row['err']}), {time.perf_counter() - t1:.0f} s", flush=True)
        for t in trials:
            print(f"    {t.label}: {t.status} " + (f"{t.time_ms:.4g} ms, err {t.err:.2e}" if t.status == "ok"
                                                    else t.error[:200]), flush=True)
    dev = torch.cuda.get_device_name()
    out = {"device": dev, "gpu": dev, "commit": commit(), "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "seconds": time.perf_counter() - t0, "results": results}
    path = args.out or ROOT / "benchmarks" / "results" / (
        f"{'h200' if 'H200' in dev else 'h100'}-{out['date']}-conv.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
