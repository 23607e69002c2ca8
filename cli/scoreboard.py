"""`factdb bench --kernelbench DIR`: the KernelBench scoreboard (fact_db/pipeline/scoreboard.py),
called by the `bench` command in cli/optimize.py; the parent's loop and the one-problem child."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import jdump


def run(kernelbench, level, problems, policies, budget_s, memory_mb, max_candidates, gpus, db, out, resume,
        as_json, budget_given: bool = False, max_held: str = "eager", strict: bool = False) -> None:
    """Parse, call the scoreboard, print. In the sandbox's child: the one problem named, its
    row written to `out`. `max_held`: --max-held as given ("eager", "none" or MiB), and `strict`
    (--strict-allclose), for every problem's optimize; the scoreboard's head records them, and a
    resumed run must give the same."""
    from fact_db.core import paths
    from fact_db.discovery import sandbox
    from fact_db.pipeline import kernelbench as kb
    from fact_db.pipeline import scoreboard
    probs = kb.problems(kernelbench, kb.levels_of(level), kb.selection(problems))
    pols = list(policies) or ["fp32"]
    if sandbox.in_child():
        _child(probs, pols, kernelbench, budget_s, max_candidates, gpus, db, out, max_held, strict)
        return
    sys.path.insert(0, str(paths.ROOT / "benchmarks"))
    from _provenance import commit, machine
    doc = scoreboard.load(Path(resume)) if resume else scoreboard.new_doc(
        kernelbench, pols, budget_s=budget_s, memory_mb=memory_mb, max_candidates=max_candidates, commit=commit(),
        machine=machine(), max_held=max_held, strict=strict)
    ran = doc.get("max_held", "eager")
    if ran != max_held:
        raise click.UsageError(f"--resume {resume}: that scoreboard ran with --max-held {ran}, this run gives "
                               f"{max_held}; give the same, or start another scoreboard")
    if scoreboard.is_strict(doc) != strict:
        said = "with" if scoreboard.is_strict(doc) else "without"
        raise click.UsageError(f"--resume {resume}: that scoreboard ran {said} --strict-allclose; give the same, "
                               "or start another scoreboard")
    target = Path(out) if out else Path(resume) if resume else scoreboard.default_out(paths.ROOT, doc.get("gpu"), pols)
    if not doc.get("timed"):
        click.echo("no CUDA GPU here: the scoreboard runs the plan of each problem and cannot time or check "
                   "anything (fast_p needs a GPU)", err=True)
    extra = ["--max-candidates", str(max_candidates), *(["--gpus", gpus] if gpus else []), *(["--db", db] if db else []),
             *(["--max-held", max_held] if max_held != "eager" else []), *(["--strict-allclose"] if strict else [])]
    click.echo(f"{len(probs)} problem(s) x {len(pols)} polic{'y' if len(pols) == 1 else 'ies'}, each in its own "
               f"process: at most {budget_s:g} s and {memory_mb} MiB; results in {target}", err=True)
    from datetime import date
    doc = scoreboard.run(probs, kernelbench, pols, out=target, doc=doc, budget_s=budget_s, memory_mb=memory_mb,
                         extra=extra, say=lambda s: click.echo(s, err=True),
                         stamp={"commit": commit(), "date": date.today().isoformat()} if resume else None,
                         rerun_stopped=budget_given)
    for pol, levels in doc["levels"].items():
        for lv, s in levels.items():
            fp = s["fast_p"]["vs_eager"]
            fc = s["fast_p"]["vs_compile"]
            g = s.get("geomean") or {}
            mean = (f"; geometric mean of the {g['rows']} correct: {g['vs_eager']:.2f}x eager"
                    + (f", {g['vs_compile']:.2f}x torch.compile" if g.get("vs_compile") else "")
                    if g.get("vs_eager") else "")
            what = (f"fast_p vs eager {_fp(fp)}, vs torch.compile {_fp(fc)}{mean}" if fp is not None else
                    "not timed (no GPU)")
            click.echo(f"level {lv} {pol}: {s['problems']} problem(s), {s['correct']} correct, {s['failed']} failed; "
                       f"{what}", err=True)
    click.echo(f"wrote {target}", err=as_json)
    if as_json:  # stdout is the JSON alone
        click.echo(jdump(doc, indent=1))


def _fp(d: dict) -> str:
    return " ".join(f"p={p}: {v:.2f}" for p, v in d.items() if v is not None)


def _child(probs, pols, kernelbench, budget_s, max_candidates, gpus, db, out, max_held="eager",
           strict: bool = False) -> None:
    """The scoreboard's child: one problem, one policy, its row written to `out` as a
    document with one result."""
    import json

    from fact_db.discovery import sandbox
    from fact_db.pipeline import scoreboard
    from .common import gpu_list, max_held_of, open_registry
    if len(probs) != 1 or len(pols) != 1 or not out:
        raise click.UsageError("the scoreboard's child runs one problem under one policy into --out")
    with sandbox.guarded(probs[0].id):
        reg = open_registry(db, True)
        try:
            # progress on: the stage lines on stderr tell the parent where a stopped child was
            row = scoreboard.run_problem(probs[0], pols[0], budget_s=budget_s, registry=reg,
                                         max_candidates=max_candidates, gpus=gpu_list(gpus), progress=True,
                                         max_held=max_held_of(max_held), strict_allclose=strict)
        finally:
            if reg is not None:
                reg.close()
        from fact_db.composition.report import clean
        Path(out).write_text(json.dumps(clean({"results": [row]}), allow_nan=False))
