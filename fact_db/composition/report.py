"""Report: what `optimize` did and measured, as JSON, markdown and a PNG chart.

    >>> write_all(report, Path("out"))     # report.json, report.md, report.png
    >>> print(markdown(report))

Every speedup is against a variant timed in the same process on the same device; JSON
carries null where a figure is missing or not a number, never NaN.
"""
from __future__ import annotations

import json
import math
from pathlib import Path


def clean(x):
    """JSON-safe: NaN and infinities become None, tuples lists, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def _ratio(a, b):
    return a / b if a and b else None


def speedups(report) -> dict:
    f = report.variant("fact-db")
    fm = f.ms if f else None
    out = {}
    for key, name in (("vs_eager_policy", f"eager {report.policy}"), ("vs_eager_fp32", "eager fp32"),
                      ("vs_compile", "torch.compile"),
                      ("vs_max_autotune", "torch.compile max-autotune-no-cudagraphs")):
        v = report.variant(name)
        out[key] = _ratio(v.ms if v else None, fm)
    if report.policy == "fp32":
        out["vs_eager_policy"] = out["vs_eager_fp32"]
    return out


def region_rows(report) -> list[dict]:
    base = report.variant(f"eager {report.policy}") or report.variant("eager fp32")
    total = base.ms if base else None
    rows = []
    for z in report.regions:
        d = z.as_dict()
        d["share"] = z.eager_ms / total if z.eager_ms and total else None
        rows.append(d)
    return rows


def skipped(report) -> list[dict]:
    out = []
    for z in report.regions:
        if z.impl.kind == "eager" and not z.impl.note.startswith("served by "):  # not by an llm kernel
            why = z.impl.note or "; ".join(n for n in z.notes if n) or "no kernel for this region yet"
            out.append({"region": z.index + 1, "rule": z.region.rule, "why": why})
    return out


def report_dict(report) -> dict:
    d = {
        "problem": report.problem, "policy": report.policy, "device": report.device, "toolchain": report.toolchain,
        "plan_only": report.plan_only, "stages_s": report.stages_s, "speedup": speedups(report),
        "variants": [v.as_dict() for v in report.variants], "regions": region_rows(report),
        "verification": report.verification.as_dict() if report.verification is not None else None,
        "skipped": skipped(report), "notes": report.notes, "llm_calls": report.llm_calls,
        "choice": report.choice.as_dict() if getattr(report, "choice", None) is not None else None,
        "fallback": getattr(report, "fallback", "") or None,
    }
    disc = getattr(report, "discovery", None)  # the plan keeps discovery's report: its uncovered heavy ops
    if disc is not None:
        d["uncovered"] = [u.as_dict() for u in disc.uncovered]  # node, op, reason, share, est_s, source
        d["uncovered_rest"] = getattr(disc, "rest", None)
    return clean(d)


def _ms(x) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _x(x) -> str:
    return f"{x:.2f}x" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _e(x) -> str:
    return f"{x:.2g}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _mib(v: dict) -> str:
    """A variant's peak memory; for fact-db's, with what its module holds between calls (the
    buffers composition made, CUDA graph pools), which the peak counts in."""
    if not v.get("peak_mib"):
        return "-"
    peak = f"{v['peak_mib']:.1f}".rstrip("0").rstrip(".")
    return peak + (f" ({v['held_mib']:.1f})" if v.get("held_mib") else "")


def markdown(report) -> str:
    d = report_dict(report)
    dev = d["device"] or {}
    lines = [f"# fact-db: {d['problem']} under the `{d['policy']}` policy", ""]
    tc = d["toolchain"] or {}
    lines.append(f"Device: {dev.get('name')}; torch {tc.get('torch')}, CUDA {tc.get('cuda')}, nvcc {tc.get('nvcc')}, "
                 f"CUTLASS {tc.get('cutlass')}, fact-db {tc.get('factdb')}.")
    if d["plan_only"]:
        lines += ["", "**Plan only** (no GPU): nothing was tuned or timed."]
    if d.get("fallback"):
        lines += ["", f"**Returned eager PyTorch under the `{d['policy']}` policy**: {d['fallback']}."]
    ver = d["verification"]
    against = (ver or {}).get("reference") or "the float64 model"
    sp = d["speedup"]
    if d["variants"]:
        over = f"{_x(sp['vs_eager_policy'])} over eager {d['policy']}" + (
            f", {_x(sp['vs_eager_fp32'])} over eager fp32" if d["policy"] != "fp32" else "")
        fc = next((v for v in d["variants"] if v["name"] == "fact-db + torch.compile" and v["ms"]), None)
        lines += ["", f"**fact-db: {over}, {_x(sp['vs_compile'])} over torch.compile, "
                      f"{_x(sp['vs_max_autotune'])} over max-autotune-no-cudagraphs** (same process)."
                  + (f" Under torch.compile the composed module takes {_ms(fc['ms'])} ms." if fc else ""), "",
                  "| variant | ms (median) | p10-p90 | rounds (interleaved) | error vs "
                  + ("float64" if against.startswith("the float64 model") else f"eager {d['policy']}")
                  + " | peak MiB (held) | compile s | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for v in d["variants"]:
            spread = f"{_ms(v['p10_ms'])}-{_ms(v['p90_ms'])}" if v.get("p10_ms") else "-"
            rounds = " / ".join(_ms(r) for r in v.get("round_ms") or []) or "-"
            lines.append(f"| {v['name']} | {_ms(v['ms'])} | {spread} | {rounds} | {_e(v['err'])} | "
                         f"{_mib(v)} | "
                         f"{_ms(v['compile_s']) if v['compile_s'] else '-'} | {v['note']} |")
    ch = d.get("choice")
    if ch:
        bound = f"{ch['bound_mib']:.1f} MiB" if ch["bound_mib"] is not None else "none"
        lines += ["", "## What optimize returns", "", f"fact-db {ch['note']}. Held-memory bound: {bound}"
                  + (f" (eager's per-call peak {ch['eager_peak_mib']:.1f} MiB)." if ch["eager_peak_mib"] else "."), "",
                  "| candidate | ms | error vs float64 | verified | held MiB | compile s | chosen / why not |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in ch["candidates"]:
            lines.append(f"| {c['name']} | {_ms(c['ms'])} | {_e(c['err'])} | {'yes' if c['verified'] else 'no'} | "
                         f"{c['held_mib']:.1f} | {_ms(c['compile_s']) if c['compile_s'] else '-'} | "
                         f"{'**chosen**' if c['chosen'] else c['why']} |")
    lines += ["", "## Regions", "",
              "| # | rule | problem | runs | how | eager ms | fact-db ms | speedup | share | registry |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["regions"]:
        share = f"{r['share'] * 100:.0f}%" if r.get("share") else "-"
        lines.append(f"| {r['index']} | {r['rule']} | {r['shape']} | {r['impl']['label']} | {r['how']} | "
                     f"{_ms(r['eager_ms'])} | {_ms(r['ms'])} | {_x(r['speedup'])} | {share} | {r['registry']} |")
    if ver:
        lines += ["", "## Verification", "",
                  f"{'Passed' if ver['ok'] else 'FAILED'}: {len(ver['trials'])} trials, worst error {_e(ver['err'])} "
                  f"against {against} (eager {d['policy']}: {_e(ver['eager_err'])}), KernelBench allclose at "
                  f"{ver['kernelbench_tol']:g} against eager." + (f" {ver['reason']}" if ver["reason"] else "")]
    if d["skipped"]:
        lines += ["", "## Left to eager PyTorch", ""] + [f"- region {s['region']} ({s['rule']}): {s['why']}"
                                                          for s in d["skipped"]]
    if d["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def chart(report, path: Path) -> Path | None:
    """A PNG: end-to-end time of each variant, and per region eager vs fact-db. None if there
    is nothing measured to draw."""
    d = report_dict(report)
    variants = [v for v in d["variants"] if v["ms"]]
    regions = [r for r in d["regions"] if r["eager_ms"] or r["ms"]]
    if not variants and not regions:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ax = axes[0]
    names = [v["name"].replace("torch.compile max-autotune-no-cudagraphs", "compile max-autotune") for v in variants]
    ax.barh(names, [v["ms"] for v in variants], color=["#d62728" if v["name"].startswith("fact-db") else "#7f7f7f"
                                                       for v in variants])
    ax.set_xlabel("ms (median, end to end)")
    ax.set_title(f"{d['problem']} ({d['policy']}) on {(d['device'] or {}).get('name')}")
    ax.invert_yaxis()
    ax = axes[1]
    labels = [f"{r['index']} {r['rule']}" for r in regions]
    y = range(len(regions))
    ax.barh([i - 0.2 for i in y], [r["eager_ms"] or 0 for r in regions], height=0.4, label="eager", color="#7f7f7f")
    ax.barh([i + 0.2 for i in y], [r["ms"] or 0 for r in regions], height=0.4, label="fact-db", color="#d62728")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per region")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(report, directory: Path) -> dict:
    """report.json, report.md and report.png into `directory`; {kind: path}."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {"json": directory / "report.json", "md": directory / "report.md"}
    out["json"].write_text(json.dumps(report_dict(report), indent=1))
    out["md"].write_text(markdown(report))
    png = chart(report, directory / "report.png")
    if png is not None:
        out["png"] = png
    return out
