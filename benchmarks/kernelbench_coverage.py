"""What would cover each KernelBench problem the scoreboard left at about 1.0x: a missing rule,
a missing kernel (or kernel family), a kernel that lost to the library, or no gain possible.

Reads a GPU scoreboard JSON (`factdb bench --kernelbench`), and plans every problem of the GPU
set whose row is missing, stopped, incorrect or below --threshold (default 1.05x over eager)
again on the CPU (discovery on the meta device, the roofline of the GPU the scoreboard ran on):
what its regions are and what they run on the GPU, and which ops no region covers with their
share of the estimated eager time. Writes one entry per problem (`--out`, default beside the
scoreboard: `<gpu>-<date>-kb-coverage-<policy>.json`) and prints them as a Markdown table.

    python benchmarks/kernelbench_coverage.py benchmarks/results/h200-2026-11-26-kernelbench-fp32.json \
        --kernelbench ../KernelBench

A class, per problem, first that applies:
- `not run` / `stopped`: no row yet, or the run ended past its budget (what to rerun it with);
- `fp32 convolution kernel`: convolution regions that ran on cuDNN under fp32, each with why: a
  geometry the family has no kernel for, or fact-db's candidates lost to cuDNN;
- `kernel lost`: regions tuned, none faster end to end (each region's winner named: the
  library where fact-db's kernels lost or did not verify);
- `no gain possible`: no region, and eager within 1.25x of the roofline floor (one or two
  memory-bound passes already at bandwidth);
- `missing rule`: no region covers the ops that hold the time (named, with their shares);
- `missing kernel family`: recurrent layers (LSTM, GRU, RNN), which no family implements.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _provenance import commit  # noqa: E402  (benchmarks/ is on sys.path)

RECURRENT = ("aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu", "aten._cudnn_rnn")
NO_GAIN = 1.25  # eager within this factor of the roofline floor: nothing left worth a kernel


def _set(path: Path) -> list[str]:
    return [ln.split()[0] for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def plan_of(problem_path: Path, policy: str, gpu: str) -> dict:
    """The CPU plan of one problem: regions (rule, shape, share), uncovered ops (op, share,
    reason), the estimated eager time; an `error` entry where planning fails."""
    from fact_db.pipeline.run import plan_problem
    from fact_db.pipeline.scoreboard import uncovered_shares
    try:
        rep = plan_problem(str(problem_path), policy=policy, gpu=gpu)
    except Exception as e:  # noqa: BLE001  (a problem that cannot be planned says why)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    disc = rep.discovery
    reasons: dict = {}
    for u in disc.uncovered:
        reasons.setdefault(u.op, u.reason)
    shares = {op: {"op": op, "share": v, "reason": reasons[op]} for op, v in uncovered_shares(disc).items()}
    return {"est_eager_ms": disc.eager_s * 1e3,
            "regions": [{"rule": z.rule, "shape": z.shape, "share": z.share} for z in disc.regions],
            "covered_share": sum(z.share or 0.0 for z in disc.regions),
            "uncovered": sorted(shares.values(), key=lambda s: -(s["share"] or 0.0)),
            "rest": dict(disc.rest)}


def _pct(x) -> str:
    return f"{100 * x:.0f}%" if x is not None else "?"


def _conv_why(z: dict) -> str:
    """Why a conv region of a row ran cuDNN: its geometry (the family has no kernel for it) or
    fact-db's candidates lost (cuDNN's time)."""
    note = z.get("note") or ""
    if "cuDNN only" in note:
        return f"{z['rule']}: no kernel for its geometry ({note.removeprefix('cuDNN only: ')[:110]})"
    if note.lower().startswith("cudnn:"):
        return f"{z['rule']}: fact-db's candidates lost to cuDNN fp32 ({note})"
    return f"{z['rule']}: {z['how']}, {z['runs']}" + (f" ({note[:80]})" if note else "")


def classify(row: dict | None, plan: dict, threshold: float) -> tuple[str, str]:
    """(class, what would cover it) of one problem."""
    if row is None:
        return "not run", "not run on the GPU yet"
    if row.get("status") != "ok":
        return "stopped", f"{row.get('reason', '')[:160]}: rerun with a larger --budget-per-problem"
    if "error" in plan:
        return "unknown", f"the CPU plan failed: {plan['error']}"
    did = row.get("did") or {}
    regions = plan["regions"]
    unc = [u for u in plan["uncovered"] if (u["share"] or 0) >= 0.05]
    top = ", ".join(f"{u['op'].removeprefix('aten.')} ({_pct(u['share'])})" for u in unc[:3])
    if any(u["op"] in RECURRENT for u in plan["uncovered"]):
        return "missing kernel family", ("recurrent layers (LSTM/GRU/RNN) run as one cuDNN op each; no family "
                                         "implements them" + (f"; uncovered: {top}" if top else ""))
    per = did.get("per_region")
    conv_share = sum(z["share"] or 0.0 for z in regions if z["rule"].startswith("conv"))
    conv_kernels = any(z["rule"].startswith("conv") and "eager" not in z["runs"] and "cudnn" not in z["runs"].lower()
                       for z in per or [])
    # the convolutions hold most of the time and none ran on a fact-db kernel (rows from before
    # per-region records: no region on a kernel at all)
    if conv_share >= 0.5 and row.get("policy") == "fp32" and (not conv_kernels if per is not None
                                                             else not did.get("kernels")):
        if per is None:  # a row from before per-region records
            what = ("an fp32-class convolution kernel that wins: no conv region ran one (cuDNN did); this row "
                    "predates per-region records and the promoted 3xTF32 convolution: a rerun says which")
        else:
            what = "an fp32-class convolution kernel that wins: no conv region ran one; " + "; ".join(
                sorted({_conv_why(z) for z in per if z["rule"].startswith("conv")})[:3])
        return "fp32 convolution kernel", what + (f"; uncovered: {top}" if top else "")
    if regions:
        how = did.get("returned") or "?"
        runs = sorted({f"{z['rule']}: {z['runs']}" + (f" ({z['note'][:80]})" if z.get("note") else "")
                       for z in per or []})[:3]
        lost = ("regions cover {0} of the estimated time, and none made the model faster end to end (returned "
                "{1}); {2}").format(_pct(plan["covered_share"]), how, "; ".join(runs) if runs else
                                    "this row predates per-region records: what each region ran is not in it")
        return "kernel lost", lost + (f"; uncovered: {top}" if top else "")
    eager_ms, floor = row.get("eager_ms"), plan["est_eager_ms"]
    if eager_ms and floor and eager_ms / floor <= NO_GAIN:
        return "no gain possible", (f"eager is {eager_ms / floor:.2f}x the roofline floor ({floor:.3f} ms): "
                                    f"{top or 'its ops'} already run at about HBM bandwidth")
    gap = f"eager {eager_ms / floor:.1f}x the roofline floor" if eager_ms and floor else "eager not timed"
    return "missing rule", f"a rule for {top or 'its ops'} ({gap})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scoreboard", type=Path)
    ap.add_argument("--kernelbench", type=Path, required=True, help="the KernelBench clone the scoreboard ran")
    ap.add_argument("--set", type=Path, default=ROOT / "benchmarks" / "kernelbench_gpu_set.txt")
    ap.add_argument("--threshold", type=float, default=1.05, help="list problems below this speedup over eager")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fact_db.pipeline import kernelbench as kb
    doc = json.loads(args.scoreboard.read_text())
    policy = (doc.get("policies") or ["fp32"])[0]
    gpu = doc.get("gpu") or "h100"
    rows = {r["id"]: r for r in doc["results"] if r["policy"] == policy}
    ids = _set(args.set)
    probs = {p.id: p for p in kb.problems(args.kernelbench, only=ids)}
    out = []
    for pid in ids:
        row = rows.get(pid)
        sp = row.get("speedup") if row else None
        if row and row.get("status") == "ok" and row.get("correct") and sp is not None and sp >= args.threshold:
            continue
        plan = plan_of(probs[pid].path, policy, gpu) if pid in probs else {"error": "not in the KernelBench clone"}
        cls, what = classify(row, plan, args.threshold)
        out.append({"id": pid, "name": probs[pid].name if pid in probs else "", "speedup": sp,
                    "returned": ((row or {}).get("did") or {}).get("returned"), "class": cls, "what": what,
                    "plan": plan})
        print(f"{pid}: {cls}: {what}", file=sys.stderr, flush=True)
    # not *-kernelbench*.json: benchmarks/tables.py reads those as scoreboards
    stem = args.scoreboard.stem
    target = args.out or args.scoreboard.with_name(
        (stem.replace("-kernelbench-", "-kb-coverage-") if "-kernelbench-" in stem else stem + "-kb-coverage") + ".json")
    counts: dict = {}
    for e in out:
        counts[e["class"]] = counts.get(e["class"], 0) + 1
    target.write_text(json.dumps({"scoreboard": str(args.scoreboard), "policy": policy, "gpu": gpu,
                                  "threshold": args.threshold, "commit": commit(), "counts": counts,
                                  "problems": out}, indent=1) + "\n")
    print("| problem | speedup | class | what would cover it |\n| --- | --- | --- | --- |")
    for e in out:
        sp = f"{e['speedup']:.2f}x" if e["speedup"] is not None else "-"
        print(f"| {e['id']} {e['name']} | {sp} | {e['class']} | {e['what']} |")
    print(f"\n{len(out)} problem(s): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
