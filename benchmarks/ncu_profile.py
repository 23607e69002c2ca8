"""Nsight Compute's main figures for one fact-db kernel at one shape, as a results JSON (issue 28
asks for the profile first: achieved TFLOP/s and the limiter ncu names). The script runs itself
under `ncu` (a child process that builds the kernel, launches it once to warm up and once to be
profiled), reads ncu's CSV and writes `benchmarks/results/<gpu>-<date>-ncu-<name>.json`:

    {"device", "gpu", "date", "commit", "ncu", "kernel", "shape", "flops",
     "launches": [{"kernel", "duration_us", "tflops", "sm_throughput_pct", "memory_throughput_pct",
                   "dram_throughput_pct", "l2_throughput_pct", "l1_throughput_pct", "ipc_active",
                   "issue_slots_busy_pct", "achieved_occupancy_pct", "registers_per_thread",
                   "warp_cycles_per_issued_instruction", "limiter", "metrics": {section: {name: value}},
                   "counters": {raw counter: value}}],
     "source": {"samples", "by_opcode", "top"}}   (with --source: where the warps waited)

`limiter` is the larger of SM and memory throughput, as ncu's Speed Of Light puts it; `counters`
are the raw page's tensor-pipe, shared-memory and stall counters (RAW_KEEP), which say which
unit inside the SM binds. ncu reads
hardware counters on the H100 hosts (Firecracker runtime); on some H200 hosts it cannot (see
the device notes): the JSON says which GPU it ran on.

    python benchmarks/ncu_profile.py gemm --shape 65536x768x3072 --name mingpt_fc2
    python benchmarks/ncu_profile.py gemm --shape 65536x768x768 --transform split3 --promote 2
    python benchmarks/ncu_profile.py conv --shape l2_1_bias_relu --config 256x128x64:coop --policy bf16
    python benchmarks/ncu_profile.py conv --shape resnet50_1x1_reduce --config 64x64x32:gemm --policy fp32 --promote 1
    python benchmarks/ncu_profile.py attention --shape 128x8x512x96 --config 128x32:smemsplit --promote 32
    python benchmarks/ncu_profile.py attention --shape 128x8x512x96 --config 128x32:smemsplit:ws --promote 32
    python benchmarks/ncu_profile.py attention --shape 128x8x512x96 --config 128x32:smemsplit:ws:pp --promote 32
    python benchmarks/ncu_profile.py attention --shape 128x8x512x96 --config 128x64:smemsplit:ws:kv1:pp --promote 32
    python benchmarks/ncu_profile.py attention --shape 128x8x512x96 --config 128x32:smemsplit:ws --promote 32 --source
    python benchmarks/ncu_profile.py gemm-op --shape 512x2048x1024x128 --layout-b row --policy tf32x3 --label split3
    python benchmarks/ncu_profile.py gemm-op --shape 65536x2304x768 --policy tf32 --label eager

The GEMM is `gemm_fp32tc_sm90` (fp32 operands on TF32 tensor cores; `--transform presplit` or
`regsplit`: B's lo parts split once, as composition holds a weight), A row-major and B a Linear weight
(N x K); the convolution a `conv_sm90` config on a `benchmarks/conv_realize.py` shape; the
attention `fmha_fp32wg_sm90` (fp32 causal self-attention, BxHxLxD, q, k and v contiguous, so the
kernel reads them as they are: the one launch profiled is the attention kernel itself).

`gemm-op` profiles one call of a GEMM workload as the tuner times it (`--shape MxNxK[xBATCH]`,
`--layout-b`, `--policy`): the first of the tuner's own candidates whose label contains `--label`,
or `--label eager` for the library path under the policy (cuBLAS SGEMM at `fp32`, cuBLAS TF32 at
`tf32`): every launch of that call (a split pass, an operand copy, the kernel, a split-K
reduction), each with its figures, and `total_us` their sum. The call is marked with
cudaProfilerStart/Stop, so any kernel name is caught and the warm-up call is not.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

# ncu's "details" page: (section, metric name) -> the key in a launch's summary
FIGURES = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_throughput_pct",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "memory_throughput_pct",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_throughput_pct",
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput"): "l2_throughput_pct",
    ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"): "l1_throughput_pct",
    ("Compute Workload Analysis", "Executed Ipc Active"): "ipc_active",
    ("Compute Workload Analysis", "Issue Slots Busy"): "issue_slots_busy_pct",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers_per_thread",
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): "warp_cycles_per_issued_instruction",
}
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "WarpStateStats", "Occupancy",
            "LaunchStats")
TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_details(text: str, flops: float | None = None) -> list[dict]:
    """ncu's `--csv --page details` output, one summary per profiled launch (in launch order):
    the FIGURES it found, the duration in us, TFLOP/s where `flops` is given, the limiter, and
    every metric by section. Lines before the CSV header (the program's own output, ncu's ==PROF==
    lines) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or not row.get("Metric Name"):
            continue
        one = launches.setdefault(row["ID"], {"kernel": row.get("Kernel Name", ""), "metrics": {}})
        section, name, unit = row.get("Section Name", ""), row["Metric Name"], row.get("Metric Unit", "")
        value = _number(row.get("Metric Value", ""))
        one["metrics"].setdefault(section, {})[name] = {"value": value, "unit": unit} if unit else value
        key = FIGURES.get((section, name))
        if key == "duration" and value is not None:
            one["duration_us"] = value * TO_US.get(unit.strip().lower(), float("nan"))
        elif key is not None:
            one[key] = value
    out = []
    for _, one in sorted(launches.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        if flops and one.get("duration_us"):
            one["tflops"] = flops / (one["duration_us"] * 1e-6) / 1e12
        sm, mem = one.get("sm_throughput_pct"), one.get("memory_throughput_pct")
        if sm is not None and mem is not None:
            one["limiter"] = "compute (SM)" if sm >= mem else "memory"
        out.append(one)
    return out


# Counters of the raw page kept beside the sections' figures: what says whether the tensor pipe,
# shared memory or the issue slots bound a kernel (pipe utilization, shared-memory wavefronts and
# bank conflicts, stall reasons). Matched as substrings of the metric names ncu collected.
RAW_KEEP = ("pipe_tensor", "gmma", "mem_shared", "pipe_lsu", "pipe_fma", "pipe_alu", "issue_stalled",
            "inst_executed.", "cycles_elapsed.avg", "dram__bytes", "lts__t_bytes", "lts__t_sector_hit_rate")


def parse_raw(text: str, keep=RAW_KEEP) -> list[dict]:
    """ncu's `--csv --page raw` output (a header of metric names, a row of units, one row per
    launch): per launch {metric: value or {"value", "unit"}}, numeric metrics whose name contains
    one of `keep` only."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    if len(rows) < 2:
        return []
    names, units = rows[0], rows[1]
    out = []
    for row in rows[2:]:
        one = {}
        for name, unit, cell in zip(names, units, row):
            if not any(k in name for k in keep):
                continue
            value = _number(cell)
            if value is not None:
                one[name] = {"value": value, "unit": unit} if unit else value
        out.append(one)
    return out


def parse_source(text: str, top: int = 40) -> dict:
    """ncu's `--csv --page source --print-source sass` output (one row per SASS instruction,
    with its warp-stall samples where the SourceCounters section ran): where the warps waited.
    Returns {"samples": all stall samples, "by_opcode": [[opcode, samples, share], ...] most first,
    "top": the `top` instructions with most samples ({"address", "sass", "samples", "share",
    "not_issued"}, and for a branch "target": the instruction it branches to, so the retry loop of
    an mbarrier wait names its barrier's `SYNCS ... TRYWAIT [address]`)}; {} where no column of
    stall samples is found (ncu's layout changed, or no samples were taken). The opcode is the
    instruction's first word past its predicate (`@P0`), modifiers dropped (`HGMMA.64x32x8.F32.TF32` is `HGMMA`): the wgmma waits
    (`WARPGROUP.DEPBAR`, `WARPGROUP.ARRIVE`), mbarrier waits (`SYNCS`), named barriers (`BAR`),
    exponentials (`MUFU`) and shared-memory loads (`LDS`) each add up apart."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"') and "Source" in line and "Warp Stall Sampling" in line), None)
    if start is None:
        return {}
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    names = list(rows[0].keys()) if rows else []
    col = next((n for n in names if n.startswith("Warp Stall Sampling (All")), None)
    idle = next((n for n in names if n.startswith("Warp Stall Sampling (Not")), None)
    if col is None:
        return {}
    found = []
    sass_at = {(row.get("Address") or "").strip(): (row.get("Source") or "").strip() for row in rows}
    for row in rows:
        n = _number(row.get(col) or "")
        if not n:
            continue
        sass = (row.get("Source") or "").strip()
        words = [w for w in sass.split() if not w.startswith("@")]
        parts = words[0].split(".") if words else ["?"]
        op = ".".join(parts[:2]) if parts[0] == "WARPGROUP" else parts[0]
        found.append({"address": (row.get("Address") or "").strip(), "sass": sass, "op": op, "samples": n,
                      "not_issued": _number(row.get(idle) or "") if idle else None,
                      "last": words[-1] if words else ""})   # a branch's target address (`BRA P0, 0x...` too)
    total = sum(f["samples"] for f in found)
    if not total:
        return {}
    by_op: dict = {}
    for f in found:
        by_op[f["op"]] = by_op.get(f["op"], 0.0) + f["samples"]
    found.sort(key=lambda f: -f["samples"])

    def entry(f: dict) -> dict:
        one = {"address": f["address"], "sass": f["sass"], "samples": f["samples"],
               "share": round(f["samples"] / total, 4), "not_issued": f["not_issued"]}
        if f["op"] == "BRA" and f["last"] in sass_at:
            one["target"] = sass_at[f["last"]]
        return one
    return {"samples": total,
            "by_opcode": [[op, n, round(n / total, 4)] for op, n in sorted(by_op.items(), key=lambda kv: -kv[1])],
            "top": [entry(f) for f in found[:top]]}


# ------------------------------------------------------------------------------------------
# The child: build and launch under ncu.

def _gemm_child(a) -> None:
    import torch

    import fp32tc_variants as V
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec
    from fact_db.kernels.gemm.tune import build_candidates
    from fact_db.kernels.gemm.workload import GemmWorkload
    m, n, k = (int(x) for x in a.shape.split("x"))
    w = GemmWorkload(m=m, n=n, k=k, layout_b="col", policy="fp32")
    tile = tuple(int(x) for x in a.tile.split("x"))
    c = V.candidate(w, V.variant(a.transform, a.promote, tile=tile))
    b = build_candidates([c], progress=False)[c.config_hash]
    if not b.ok:
        sys.exit(f"build failed: {b.error[:500]}")
    kern = GemmKernel(b.path, c.template, GemmSpec("float32", "row", "col"), c.options)
    x = torch.randn(m, k, device="cuda")
    bt = torch.randn(n, k, device="cuda").t()
    lo = kern.split_lo(bt) if a.transform in ("presplit", "regsplit") else None
    for _ in range(2):  # the warm-up launch, then the profiled one
        kern(x, bt, b_lo=lo) if lo is not None else kern(x, bt)
    torch.cuda.synchronize()
    print(f"LABEL {c.label}")


def _conv_child(a) -> None:
    import torch

    import conv_realize as CR
    from fact_db.kernels import build
    from fact_db.kernels.conv.kernel import ConvConfig, ConvKernel, source
    from fact_db.kernels.conv.tune import _prepared
    from fact_db.kernels.conv.workload import ConvWorkload, canonical_chain
    shape = {name: (geo, chain) for name, _, geo, chain in CR.SHAPES}
    geo, chain = shape[a.shape]
    w = ConvWorkload(**geo, chain=canonical_chain(chain), dtype=CR.POLICIES[a.policy], policy=a.policy,
                     rule="conv-epilogue" if chain else "conv")
    tiles, _, schedule = a.config.partition(":")
    tm, tn, tk = (int(x) for x in tiles.split("x"))
    split = w.dtype == "float32" and a.policy in ("fp32", "tf32x3")
    promote = (max(1, a.promote) if schedule == "gemm" else a.promote) if split else 0  # gemm: every k-tile at least
    cfg = ConvConfig(tm, tn, tk, split3=split, promote=promote, schedule=schedule or "ws")
    (b,) = build.build([source(w, cfg)], progress=False)
    if not b.ok:
        sys.exit(f"build failed: {b.error[:500]}")
    kern = ConvKernel(str(b.path), w, cfg)
    p = _prepared(w, cfg, w.make_inputs("randn"))
    for _ in range(2):
        kern(p["x"], p["wt"], p["bias"], p["vecs"], p["r"])
    torch.cuda.synchronize()
    print(f"LABEL {cfg.label}")


def _attention_child(a) -> None:
    import torch

    import fmha_fp32tc_check as FC
    from fact_db.kernels import build
    from fact_db.kernels.attention import fmha_fp32wg, fp32_family
    from fact_db.kernels.attention.workload import AttentionWorkload
    b, h, n, d = (int(x) for x in a.shape.split("x"))
    w = AttentionWorkload(b, h, h, n, n, d, d, causal=True, policy=a.policy)
    tiles, *flags = a.config.split(":")
    bm, bn = (int(x) for x in tiles.split("x"))
    cfg = {"head_dim": fp32_family.padded(d), "head_dim_v": fp32_family.padded(d),
           "block_m": bm, "block_n": bn, "promote_k": a.promote, "terms": fmha_fp32wg.TERMS[a.policy],
           "split_in_smem": int("smemsplit" in flags or "ws" in flags), "warp_specialized": int("ws" in flags),
           "pingpong": int("pp" in flags), "kv_stages": 1 if "kv1" in flags else 2,
           "tma_kv": int("tma" in flags), "v_direct": int("vd" in flags),
           "k_early": int("ke" in flags)}
    (built,) = build.build([fmha_fp32wg.source(w, cfg)], progress=False)
    if not built.ok:
        sys.exit(f"build failed: {built.error[:500]}")
    run = FC.launcher(built.path, fmha_fp32wg.TEMPLATE)
    q, k, v = (torch.randn(b, h, n, d, device="cuda") for _ in range(3))
    for _ in range(2):
        run(q, k, v, d ** -0.5, True)
    torch.cuda.synchronize()
    print(f"LABEL {fmha_fp32wg.label(cfg)}")


def gemm_op_workload(a):
    """The GemmWorkload of `gemm-op`'s --shape (MxNxK or MxNxKxBATCH), --layout-b and --policy."""
    from fact_db.kernels.gemm.workload import GemmWorkload
    dims = [int(x) for x in a.shape.split("x")]
    if len(dims) not in (3, 4):
        sys.exit(f"--shape {a.shape!r}: gemm-op takes MxNxK or MxNxKxBATCH")
    m, n, k, batch = (*dims, 1)[:4]
    return GemmWorkload(m=m, n=n, k=k, batch=batch, layout_b=a.layout_b, policy=a.policy)


def _gemm_op_child(a) -> None:
    import torch

    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec
    from fact_db.kernels.gemm.tune import build_candidates, candidate_list, spec_of
    w = gemm_op_workload(a)
    if a.label == "eager":
        label = f"torch eager ({w.policy})"

        def run():
            return w.eager(inputs)
    else:
        cands, _ = candidate_list(w, gpu="h100", max_candidates=99)
        c = next((c for c in cands if c.template != "eager" and a.label in c.label), None)
        if c is None:
            sys.exit(f"--label {a.label!r}: none of the tuner's {len(cands) - 1} candidates for {w.shape} "
                     f"{w.policy} has it; they are:\n  " + "\n  ".join(c.label for c in cands[1:]))
        b = build_candidates([c], progress=False)[c.config_hash]
        if not b.ok:
            sys.exit(f"build failed: {b.error[:500]}")
        kern = GemmKernel(b.path, c.template, GemmSpec(**spec_of(w, c)), c.options)
        label = c.label

        def run():
            return kern(inputs["a"], inputs["b"])
    inputs = w.make_inputs("randn")
    run()   # the warm-up call (builds plans, workspaces, cuBLAS heuristics), outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"LABEL {label}")


CHILDREN = {"gemm": _gemm_child, "conv": _conv_child, "attention": _attention_child, "gemm-op": _gemm_op_child}
KERNEL_NAMES = {"gemm": "device_kernel", "conv": "device_kernel", "attention": "fmha_kernel"}


def _flops(a) -> tuple[float, str]:
    if a.family == "attention":   # Q K^T and P V, half of each under the causal mask
        b, h, n, d = (int(x) for x in a.shape.split("x"))
        return 2.0 * b * h * n * n * d, f"{a.shape} causal"
    if a.family == "gemm":
        m, n, k = (int(x) for x in a.shape.split("x"))
        return 2.0 * m * n * k, a.shape
    if a.family == "gemm-op":
        w = gemm_op_workload(a)
        return float(w.flops), f"{w.shape} B {w.layout_b}"
    import math

    import conv_realize as CR
    from fact_db.kernels.conv.workload import ConvWorkload
    geo = {name: g for name, _, g, _ in CR.SHAPES}[a.shape]
    w = ConvWorkload(**geo, dtype=CR.POLICIES[a.policy], policy=a.policy)
    return 2.0 * w.n * w.k * math.prod(w.output) * w.c * math.prod(w.filter), w.describe()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=tuple(CHILDREN))
    ap.add_argument("--shape", required=True,
                    help="gemm: MxNxK; gemm-op: MxNxK or MxNxKxBATCH; conv: a benchmarks/conv_realize.py shape "
                         "name; attention: BxHxLxD")
    ap.add_argument("--layout-b", default="col", choices=("row", "col"),
                    help="gemm-op: B stored K x N (row) or as a Linear weight, N x K (col)")
    ap.add_argument("--label", default="eager",
                    help="gemm-op: the first tuner candidate whose label contains this, or `eager` (the library)")
    ap.add_argument("--name", default="", help="the results file's name part (default: from the shape)")
    ap.add_argument("--transform", default="presplit", choices=("presplit", "regsplit", "split3", "round"), help="gemm")
    ap.add_argument("--promote", type=int, default=2,
                    help="gemm, conv: k-tiles between promotions (fp32-class kernels); attention: promote_k, "
                         "head-dim elements a Q K^T chunk (0 or 32)")
    ap.add_argument("--tile", default="128x128x16", help="gemm CTA tile")
    ap.add_argument("--config", default="256x128x64:coop",
                    help="conv: TMxTNxTK[:coop|ws|gemm] (gemm: the pointwise fp32 kernel); "
                         "attention: BLOCK_MxBLOCK_N[:smemsplit][:ws][:kv1][:pp][:tma][:vd][:ke] (ws: warp-specialized, "
                         "split in smem; kv1: one K/V stage; pp: its two consumers taking turns; tma: K and V "
                         "by TMA; vd: with tma, V by TMA as v stores it, no pass over V; ke: with tma, the next "
                         "tile's K copied during V's split)")
    ap.add_argument("--policy", default=None,
                    help="conv: bf16 (default), fp16, tf32, fp32; attention and gemm-op: fp32 (default), "
                         "tf32x3, tf32")
    ap.add_argument("--source", action="store_true",
                    help="also ncu's SourceCounters: warp-stall samples by SASS instruction (where the warps "
                         "wait), summed by opcode, the top instructions in the JSON's `source`")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="the ncu executable")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.policy = a.policy or ("fp32" if a.family in ("attention", "gemm-op") else "bf16")
    if a.child:
        CHILDREN[a.family](a)
        return 0
    if shutil.which(a.ncu) is None:
        sys.exit(f"ncu not found ('{a.ncu}'): run on a GPU host with Nsight Compute, or pass --ncu PATH")
    child = [sys.executable, __file__, *[x for x in (argv if argv is not None else sys.argv[1:])], "--child"]
    # the warm-up launch and the profiled one of the kernel (CUTLASS's device_kernel), nothing else,
    # in one profile, exported, then read twice: the sections' figures (details) and the counters (raw)
    import tempfile
    rep = Path(tempfile.mkdtemp(prefix="ncu-")) / "profile"
    # gemm-op: every launch between cudaProfilerStart and Stop (the child's one profiled call)
    which = (["--profile-from-start", "off", "--launch-count", "16"] if a.family == "gemm-op" else
             ["--kernel-name", f"regex:{KERNEL_NAMES[a.family]}", "--launch-skip", "1", "--launch-count", "1"])
    cmd = [a.ncu, "--clock-control", "none", *which, *[x for s in SECTIONS + (("SourceCounters",) if a.source else ())
                                                        for x in ("--section", s)], "-o", str(rep), *child]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    label = next((line[6:] for line in r.stdout.splitlines() if line.startswith("LABEL ")), "")
    if r.returncode != 0 or not rep.with_suffix(".ncu-rep").is_file():
        sys.exit(f"ncu failed (rc {r.returncode}): {(r.stderr or r.stdout)[-1500:]}")

    def page(name: str, *more: str) -> str:
        return subprocess.run([a.ncu, "--import", str(rep.with_suffix(".ncu-rep")), "--csv", "--page", name, *more],
                              capture_output=True, text=True, timeout=300).stdout

    flops, shape = _flops(a)
    launches = parse_details(page("details"), flops)
    if not launches:
        sys.exit(f"ncu wrote no launch of the kernel: {(r.stderr or r.stdout)[-1500:]}")
    for one, raw in zip(launches, parse_raw(page("raw"))):
        one["counters"] = raw
    source = None
    if a.source:  # best effort: a layout this script cannot read keeps the rest of the profile
        text = page("source", "--print-source", "sass")
        source = parse_source(text) or {"unread": text[:4000]}
    shutil.rmtree(rep.parent, ignore_errors=True)
    import torch

    from _provenance import commit
    from fact_db.core.environment import device_info
    info = device_info(torch.device("cuda"))
    ver = subprocess.run([a.ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    today = datetime.date.today().isoformat()
    name = a.name or f"{a.family}-{a.shape}"
    doc = {"device": info["name"], "gpu": info["gpu"], "date": today, "commit": commit(),
           "ncu": ver[-1] if ver else "", "command": " ".join(cmd), "family": a.family, "kernel": label,
           "shape": shape, "flops": flops, "launches": launches}
    if a.family == "gemm-op":   # the call's launches together (a pass, a copy, the kernel, a reduction)
        doc["policy"] = a.policy
        doc["total_us"] = sum(one.get("duration_us") or 0.0 for one in launches)
        doc["total_tflops"] = flops / (doc["total_us"] * 1e-6) / 1e12 if doc["total_us"] else None
    if source is not None:
        doc["source"] = source
    out = a.out or HERE / "results" / f"{info['gpu']}-{today}-ncu-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for one in launches:
        print(f"{label} [{one.get('kernel', '')[:60]}]: {one.get('duration_us', float('nan')):.1f} us, {one.get('tflops', float('nan')):.1f} TFLOP/s, "
              f"SM {one.get('sm_throughput_pct')}%, memory {one.get('memory_throughput_pct')}% "
              f"(limiter: {one.get('limiter')}), issue slots {one.get('issue_slots_busy_pct')}%")
    if doc.get("total_us"):
        print(f"total {doc['total_us']:.1f} us over {len(launches)} launch(es), {doc['total_tflops']:.1f} TFLOP/s")
    if source and "by_opcode" in source:
        print("stall samples by opcode: " + ", ".join(f"{op} {share:.0%}" for op, _, share in source["by_opcode"][:8]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
