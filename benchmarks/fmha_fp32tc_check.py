"""GPU check of the fp32 attention families on TF32 tensor cores: fmha_fp32tc_sm90 (warp-level
mma.sync) and fmha_fp32wg_sm90 (warpgroup wgmma).

Builds the variants of the families named (`--families`, both by default) in parallel, checks
each against a float64 reference (small ragged, causal/non-causal, GQA, head dims 64/96/128,
and the minGPT shape), prints per-variant max error with its location, times them against SDPA
fp32 and SDPA with TF32 allowed at minGPT's and the Llama decoder's shapes, and writes
benchmarks/results/<gpu>-<date>-fmha-fp32tc.json.

    python benchmarks/fmha_fp32tc_check.py --quick
    python benchmarks/fmha_fp32tc_check.py --quick --families fp32wg
    python benchmarks/fmha_fp32tc_check.py --quick --families fp32wg --ws   # and the warp-specialized configs
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _provenance  # noqa: E402  (benchmarks/ is on sys.path)
from fact_db.kernels.attention import fmha_fp32tc, fmha_fp32wg, fp32_family  # noqa: E402
from fact_db.kernels.attention.workload import AttentionWorkload  # noqa: E402
from fact_db.kernels.build import build  # noqa: E402

ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 19 + [ctypes.c_float, ctypes.c_int64, ctypes.c_void_p,
                                                           ctypes.c_void_p]


FAMILIES = {"fp32tc": fmha_fp32tc, "fp32wg": fmha_fp32wg}


def launcher(path, template: str = "fmha_fp32tc_sm90"):
    """A callable (q, k, v, scale, causal) -> o over the built library at `path`, its workspace
    allocated per call as the family asks (FMHA_ABI)."""
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, f"fact_{template}_launch")
    fn.argtypes = ARGTYPES
    fn.restype = ctypes.c_int
    ws_size = getattr(lib, f"fact_{template}_workspace_size")
    ws_size.argtypes = [ctypes.c_int64] * 4
    ws_size.restype = ctypes.c_size_t

    def run(q, k, v, scale, causal):
        b, h, lq, d = q.shape
        hk, lk, dv = k.shape[1], k.shape[2], v.shape[3]
        o = torch.empty(b, h, lq, dv, device=q.device, dtype=torch.float32)
        n = ws_size(b, h, lq, lk)
        ws = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
        rc = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), b, h, hk, lq, lk, d, dv,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], scale, int(causal),
                ws.data_ptr() if ws is not None else None, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"fact_{template}_launch returned {rc}")
        return o
    return run


def variants_of(fam, quick: bool, ws: bool = False) -> list[dict]:
    """The configs checked and timed: every tile, presplit and promotion of fmha_fp32tc (fewer
    with --quick), and fmha_fp32wg's fp32 and tf32x3 configs (`ws`: its warp-specialized fp32
    ones with and without turns)."""
    out = []
    for hd in (64, 96, 128):
        if fam is fmha_fp32wg:
            w32 = AttentionWorkload(1, 1, 1, 64, 64, hd, hd, policy="fp32")
            if ws:   # two tiles' (four with --full)
                out += fam.warp_specialized(w32, 2 if quick else 4)
            for pol, few in (("fp32", 2), ("tf32x3", 1)):
                cs = fam.configs(AttentionWorkload(1, 1, 1, 64, 64, hd, hd, policy=pol), 12)
                if quick:
                    cs = cs[:few + 1] if hd == 96 else cs[:few]   # 64-key tiles first where they fit
                for c in cs:
                    out += [c] if c not in out else []
            continue
        for promote in ((32, 0) if hd != 96 or quick else (32, 64, 0)):
            for bm, bn in (((128, 32),) if quick and hd != 96 else fam.TILES):
                for presplit in (1, 0):
                    c = {"head_dim": hd, "head_dim_v": hd, "block_m": bm, "block_n": bn, "presplit": presplit,
                         "promote_k": promote}
                    if fam.smem_bytes(c) <= fam.SMEM_LIMIT:
                        out.append(c)
    return out


def reference(q, k, v, scale, causal):
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, 1)
    v = v.double().repeat_interleave(g, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def eager(q, k, v, scale, causal, tf32: bool):
    """Explicit eager attention in fp32 (DESIGN's "eager fp32"; with tf32=True its matmuls on TF32)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        s = q @ k.transpose(-1, -2) * scale
        if causal:
            lq, lk = s.shape[-2:]
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def timeit(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes and reps (~2 min on an H100)")
    ap.add_argument("--families", default="fp32tc,fp32wg",
                    help="comma-separated: fp32tc (mma.sync), fp32wg (wgmma); default both")
    ap.add_argument("--ws", action="store_true",
                    help="fp32wg: also the warp-specialized configs (a producer warpgroup, consumers on mbarriers)")
    ap.add_argument("--out", default="", help="results file (default benchmarks/results/<gpu>-<date>-fmha-fp32tc.json)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    fams = []
    for name in args.families.split(","):
        if name.strip() not in FAMILIES:
            ap.error(f"--families: unknown family {name!r} (choose from {', '.join(FAMILIES)})")
        fams.append(FAMILIES[name.strip()])
    variants = [(fam, c) for fam in fams for c in variants_of(fam, args.quick, args.ws)]
    w0 = AttentionWorkload(1, 1, 1, 64, 64, 64, 64)
    built = build([fam.source(w0, c) for fam, c in variants], jobs=16)
    runs = {}
    for (fam, c), bt in zip(variants, built):
        name = fam.label(c)
        print(f"build {name}: {'ok' if bt.ok else 'FAILED ' + bt.error[:2000]} ({bt.seconds:.0f}s)", flush=True)
        if bt.ok:
            runs[name] = (c, launcher(bt.path, fam.TEMPLATE))
    shapes = [  # b, h, hk, lq, lk, d, causal
        (2, 4, 4, 77, 77, 64, False), (2, 4, 4, 77, 77, 64, True), (1, 8, 2, 130, 200, 64, True),
        (2, 4, 4, 100, 37, 96, True), (2, 4, 2, 129, 129, 96, False), (1, 2, 2, 65, 300, 128, True),
        (1, 2, 2, 200, 100, 128, False), (2, 3, 3, 64, 64, 80, True), (2, 2, 2, 150, 150, 90, True), (4, 8, 8, 512, 512, 96, True),
    ]  # d=90: rows not 16-byte multiples, the plain-load path
    results = {"machine": _provenance.machine(torch=torch.__version__), "gpu": torch.cuda.get_device_name(),
               "commit": _provenance.commit(), "checks": [], "timings": []}
    for (b, h, hk, lq, lk, d, causal) in shapes:
        for dist in ("normal", "rand"):
            draw = torch.randn if dist == "normal" else torch.rand
            q, k, v = draw(b, h, lq, d, device=dev), draw(b, hk, lk, d, device=dev), draw(b, hk, lk, d, device=dev)
            scale = d ** -0.5
            ref = reference(q, k, v, scale, causal)
            kk, vv = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
            torch.backends.cuda.matmul.allow_tf32 = False
            sd = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=scale)
            e32 = (sd.double() - ref).abs().max().item()
            ee32 = (eager(q, k, v, scale, causal, False).double() - ref).abs().max().item()
            etf32 = (eager(q, k, v, scale, causal, True).double() - ref).abs().max().item()
            for name, (c, run) in runs.items():
                if c["head_dim"] < d or fp32_family.padded(d) != c["head_dim"]:
                    continue
                rec = {"variant": name, "shape": [b, h, hk, lq, lk, d], "causal": causal, "dist": dist,
                       "sdpa_fp32_err": e32, "eager_fp32_err": ee32, "eager_tf32_err": etf32}
                try:
                    o = run(q, k, v, scale, causal)
                    torch.cuda.synchronize()
                    err = (o.double() - ref).abs()
                    idx = err.argmax().item()
                    loc = list(torch.unravel_index(torch.tensor(idx), err.shape))
                    rec.update(err=err.max().item(), where=[int(x) for x in loc], nan=bool(torch.isnan(o).any()),
                               fp32_bound=bool(err.max().item() <= 4 * ee32),
                               tf32x3_bound=bool(err.max().item() <= (etf32 / 10 if dist == "normal" else etf32)))
                except Exception as e:  # keep going: one faulting variant must not hide the others
                    rec.update(error=f"{type(e).__name__}: {e}")
                    print(traceback.format_exc(), file=sys.stderr)
                print(json.dumps(rec), flush=True)
                results["checks"].append(rec)
    print("summary: variant, checks, worst err / eager-fp32 err, fp32-bound fails, tf32x3-bound fails, errors")
    for name in runs:
        recs = [r for r in results["checks"] if r["variant"] == name]
        ok = [r for r in recs if "err" in r]
        worst = max((r["err"] / max(r["eager_fp32_err"], 1e-30) for r in ok), default=float("nan"))
        print(f"  {name}: {len(recs)} checks, worst {worst:.2f}x eager fp32, "
              f"{sum(not r['fp32_bound'] for r in ok)} fp32 / {sum(not r['tf32x3_bound'] for r in ok)} tf32x3 "
              f"bound misses, {len(recs) - len(ok)} launch errors, {sum(r['nan'] for r in ok)} with NaN", flush=True)
    # timings at minGPT's shape (the table's rows), the Llama decoder's (GQA, head dim 128) and a
    # GPT-2-small-like one (head dim 64: block_n 64 against 32)
    reps = 10 if args.quick else 50
    for shape_name, (b, h, hk, lq, d) in (("mingpt", (128, 8, 8, 512, 96)), ("llama_4x2048", (4, 16, 4, 2048, 128)),
                                          ("hd64_12x1024", (32, 12, 12, 1024, 64))):
        q = torch.randn(b, h, lq, d, device=dev)
        k, v = (torch.randn(b, hk, lq, d, device=dev) for _ in range(2))
        kk, vv = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
        torch.backends.cuda.matmul.allow_tf32 = False
        t_sdpa = timeit(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True), reps)
        torch.backends.cuda.matmul.allow_tf32 = True
        t_sdpa_tf32 = timeit(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True), reps)
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"[{shape_name}] SDPA fp32 {t_sdpa:.3f} ms; SDPA allow_tf32 {t_sdpa_tf32:.3f} ms "
              "(tf32 precision, not comparable)")
        suffix = "" if shape_name == "mingpt" else f" @{shape_name}"
        results["timings"] += [{"name": "sdpa_fp32" + suffix, "ms": t_sdpa, "shape": shape_name},
                               {"name": "sdpa_allow_tf32" + suffix, "ms": t_sdpa_tf32, "shape": shape_name}]
        for name, (c, run) in runs.items():
            if c["head_dim"] != fp32_family.padded(d):
                continue
            try:
                ms = timeit(lambda: run(q, k, v, d ** -0.5, True), reps)
            except Exception as e:
                print(f"{name}: {e}")
                continue
            print(f"[{shape_name}] {name}: {ms:.3f} ms, {t_sdpa / ms:.2f}x SDPA fp32", flush=True)
            results["timings"].append({"name": name + suffix, "ms": ms, "speedup_vs_sdpa_fp32": t_sdpa / ms,
                                       "shape": shape_name})
    gpu = torch.cuda.get_device_name().split()[1].lower() if " " in torch.cuda.get_device_name() else "gpu"
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"{gpu}-{datetime.date.today()}-fmha-fp32tc.json"
    out.write_text(json.dumps(results, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
