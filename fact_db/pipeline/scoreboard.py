"""The KernelBench scoreboard: KernelBench problems, as they are, through fact-db, one child
process each; per problem whether fact-db's module is correct by KernelBench's own check and
how fast eager, torch.compile and fact-db run; per level KernelBench's fast_p against eager
and against torch.compile (what `factdb bench --kernelbench DIR` runs).

    >>> probs = kernelbench.problems(DIR, levels=(1,), only=["L1-19"])
    >>> doc = new_doc(DIR, ["fp32"], budget_s=300, memory_mb=32768, max_candidates=12, commit="abc1234")
    >>> doc = run(probs, DIR, ["fp32"], out=Path("kb.json"), doc=doc)
    >>> doc["levels"]["fp32"]["1"]["fast_p"]["vs_eager"]["1.5"]      # fast_1.5 against eager

Each problem runs in a child (`factdb bench --kernelbench DIR --problems ID` under
sandbox.run), stopped at the per-problem budget or past the memory limit, so a problem that
crashes, hangs or leaks costs its own row and nothing else. Without a GPU the child runs the
plan (what `factdb optimize` prints on a CPU) and the row says nothing was timed.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path

from fact_db.core.errors import FactError, first_line
from fact_db.core.policy import POLICY_DTYPE
from fact_db.pipeline import kernelbench as kb

DEFAULT_BUDGET_S = 300.0   # a problem's child is stopped after this many seconds
DEFAULT_MEMORY_MB = 32768  # resident memory of a problem's processes (torch.compile's workers included)
TUNING_SHARE = 0.5         # of the budget, for tuning; the rest builds, verifies, compiles the peers, times
PEERS = ("compile",)       # torch.compile's default mode: the baseline KernelBench reports beside eager
# timed besides where the returned module replays a CUDA graph (pipeline/measure.py: like with like)
CUDA_GRAPH_PEER = "torch.compile reduce-overhead"


def _ratio(a, b):
    return a / b if a and b and math.isfinite(a) and math.isfinite(b) else None


def _base(problem: kb.Problem, policy: str) -> dict:
    return {**problem.as_dict(), "policy": policy, "status": "failed", "correct": None, "eager_ms": None,
            "compile_ms": None, "factdb_ms": None, "speedup": None, "speedup_vs_compile": None, "reason": ""}


def uncovered_shares(disc) -> dict:
    """op -> the summed share of the estimated eager time of the ops no region covers (None
    where one of them has no estimate)."""
    shares: dict = {}
    for u in disc.uncovered:
        shares[u.op] = None if u.share is None or shares.get(u.op, 0) is None else shares.get(u.op, 0) + u.share
    return shares


def _clocks(samples: list) -> dict:
    """bench.gpu_clocks samples as the row keeps them: the SM clock of each, and the clock
    event reasons any of them had ({} for none)."""
    if not samples:
        return {}
    return {"sm_mhz": [s.get("sm_mhz") for s in samples],
            "reasons": sorted({s.get("reasons") for s in samples if s.get("reasons")})}


def _did(report, fast=None) -> dict:
    """What fact-db did with a problem: its regions, how each runs, and what the module it
    returned runs (`fast`: that module; None for the plan)."""
    regions = report.regions or []
    disc = getattr(report, "discovery", None)
    out = {"regions": len(regions), "rules": sorted({z.region.rule for z in regions}),
           "kernels": sum(1 for z in regions if z.impl.kind != "eager"),
           "from_registry": sum(1 for z in regions if z.how == "registry"),
           "how": {h: sum(1 for z in regions if z.how == h) for h in sorted({z.how for z in regions})},
           "stages_s": dict(report.stages_s),
           # per region: what it runs and why (a kernel that lost to the library, failed, or was never tried)
           "per_region": [{"rule": z.region.rule, "shape": str(z.region.shape), "how": z.how, "runs": z.impl.label,
                           "ms": z.ms, "eager_ms": z.eager_ms,
                           "note": first_line((z.notes or [z.impl.note or ""])[0], 200)} for z in regions][:40]}
    if disc is not None:  # what no rule covers: op -> its share of the estimated eager time (None: unknown)
        out["uncovered"] = {op: (round(v, 4) if v is not None else None)
                            for op, v in sorted(uncovered_shares(disc).items())}
        rest = getattr(disc, "rest", None) or {}
        out["uncovered_rest"] = {"ops": rest.get("ops", 0), "share": round(rest.get("share", 0.0), 4)}  # small ops
    v = report.verification
    if fast is not None and v is not None:
        out["verified"] = bool(v.ok)
        choice = getattr(fast, "choice", None)  # what optimize returned: eager, torch.compile, composed, ...
        bare = choice == "composed" and not out["kernels"]
        out["returned"] = (f"{choice}{' (composed failed verification)' if not v.ok else ''}"
                           f"{' (no region on a kernel)' if bare else ''}" if choice else
                           "eager (failed verification)" if not v.ok else
                           "eager (timed faster)" if getattr(fast, "prefer_eager", False) else
                           "composed" if out["kernels"] else "eager (no region on a kernel)")
    ch = getattr(report, "choice", None)
    if ch is not None:  # every candidate of the choice: a peer left out (failed verification, slower) says why
        out["choice"] = [{"name": c.name, "ms": c.ms, "rounds_ms": c.rounds_ms, "verified": c.verified,
                          "chosen": c.chosen, "held_mib": round(c.held_mib, 3), "why": first_line(c.why or "", 300),
                          **_clocks(c.clocks)}
                         for c in ch.candidates]
    timed = [v for v in report.variants or [] if v.clocks]
    if timed:  # the GPU's clocks after each timing of the benchmark (its SM clock, and why it was held back)
        out["clocks"] = {v.name: _clocks(v.clocks) for v in timed}
    rounds = {v.name: [round(t, 4) for t in v.round_ms] for v in report.variants or [] if v.round_ms}
    if rounds:  # each interleaved round's median: a steady gap between two variants, or one slow round
        out["rounds_ms"] = rounds
    from fact_db.kernels.bench import rounds_unsettled
    unsettled = {name: first_line(note, 200) for name, r in rounds.items() if (note := rounds_unsettled(r))}
    if unsettled:  # rounds still spread after the last one: a gap smaller than that is noise
        out["unsettled"] = unsettled
    if hasattr(os, "getloadavg"):  # the host's load when the row was made: other shards' compiles compete for it
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    out["notes"] = [first_line(n, 240) for n in report.notes][:8]
    return out


def run_problem(problem: kb.Problem, policy: str, *, budget_s: float = DEFAULT_BUDGET_S, registry=None,
                max_candidates: int = 12, gpus=None, progress: bool = False, device: str | None = None,
                hooks: dict | None = None, max_held="eager", strict_allclose: bool = False) -> dict:
    """One problem in this process (the scoreboard's child): its row. With a GPU: the model is
    built as KernelBench builds it (seeded, on the GPU), optimized by fact-db under `policy`
    with a tuning budget of TUNING_SHARE of `budget_s`, checked by KernelBench's check against
    the model at KernelBench's precision for the policy, and timed (eager at the policy,
    torch.compile, fact-db: fact-db's report, one process). Without one: the plan. A stage
    that fails is the row's `reason`, not an exception. `device` and `hooks` (optimize's
    `realizer`, `timer`, `peers`) run the GPU path elsewhere (tests on the CPU); `max_held` is
    optimize's bound on held memory, `strict_allclose` its verification with KernelBench's
    allclose unexempted (run.optimize).

    >>> run_problem(kernelbench.problems(DIR, only=["L1-19"])[0], "fp32")["correct"]
    True
    """
    import torch

    from fact_db.discovery.trace import load_problem
    from fact_db.pipeline.run import optimize, plan_problem
    device = device or ("cuda" if torch.cuda.is_available() else None)
    row = _base(problem, policy)
    row["device"] = torch.cuda.get_device_name() if device == "cuda" else device or "cpu"
    t0 = time.perf_counter()
    stage = "planning it" if device is None else "building the model"
    try:
        if device is None:
            rep = plan_problem(str(problem.path), policy=policy, registry=registry)
            row.update(status="plan", did=_did(rep), reason="no CUDA GPU here: the plan only, nothing timed or checked")
            row["did"]["planned"] = sum(1 for z in rep.regions if z.how == "planned")
            row["wall_s"] = round(time.perf_counter() - t0, 2)
            return row
        prob = load_problem(str(problem.path))
        torch.manual_seed(kb.SEED)
        model = prob.make_model().to(device)  # in training mode, as KernelBench builds it

        def make_inputs():
            # drawn on the device: KernelBench's level 1 inputs reach 1.6e9 elements, seconds of
            # CPU random numbers a draw (its harness draws on the CPU: the same seeds, other values)
            with torch.device(device):
                return [x.to(device) if isinstance(x, torch.Tensor) else x for x in prob.make_inputs()]
        torch.manual_seed(kb.SEED)
        inputs = make_inputs()
        stage = "optimizing it"
        fast = optimize(model, inputs, policy=policy, registry=registry, max_candidates=max_candidates,
                        budget=budget_s * TUNING_SHARE / 60, gpus=gpus, make_inputs=make_inputs, name=problem.name,
                        progress=progress, save=False, max_held=max_held, strict_allclose=strict_allclose,
                        **{"peers": PEERS, **(hooks or {})})
        rep = fast.report
        row["did"] = _did(rep, fast)
        v = {x.name: x.ms for x in rep.variants}
        row["eager_ms"] = v.get(f"eager {policy}") or v.get("eager fp32")
        row["compile_ms"], row["factdb_ms"] = v.get("torch.compile"), v.get("fact-db")
        row["speedup"] = _ratio(row["eager_ms"], row["factdb_ms"])
        row["speedup_vs_compile"] = _ratio(row["compile_ms"], row["factdb_ms"])
        if v.get(CUDA_GRAPH_PEER) is not None:  # fact-db replays a CUDA graph: torch.compile's own graphs too
            row["compile_cudagraphs_ms"] = v[CUDA_GRAPH_PEER]
            row["speedup_vs_compile_cudagraphs"] = _ratio(row["compile_cudagraphs_ms"], row["factdb_ms"])
        eager_time(row)
        stage = "KernelBench's check"
        precision = POLICY_DTYPE[policy]
        # KernelBench's reference: a fresh Model with the same seed, in training mode as KernelBench
        # leaves it (and as `model` was optimized: BatchNorm on batch statistics).
        torch.manual_seed(kb.SEED)
        ref = prob.make_model().to(device=device, dtype=getattr(torch, precision))
        # The reference computes at the policy's precision: under fp32 that is IEEE fp32, cuDNN's
        # TF32 off. KernelBench's harness leaves PyTorch's default (cuDNN convolutions on TF32,
        # about 1e-3 off), which a true-fp32 module misses at KernelBench's 1e-4: that check is
        # recorded beside it (check_pytorch_default), not counted.
        from fact_db.composition.module import run_at_policy
        at_policy = (lambda *xs: run_at_policy(ref, policy, xs)) if precision == "float32" else ref
        ieee = precision == "float32" and policy != "tf32"  # fp32, tf32x3: IEEE fp32, PyTorch's TF32 differs
        got = kb.check(at_policy, fast, make_inputs, precision, device=device)
        row["check"] = got
        row["check_reference"] = f"{policy}: IEEE fp32 (TF32 off)" if ieee else f"{policy}: {precision}"
        row["correct"] = got["correct"]
        row["status"] = "ok"
        row["reason"] = got["reason"]
        if ieee:
            row["check_pytorch_default"] = kb.check(ref, fast, make_inputs, precision, device=device)
    except Exception as e:  # noqa: BLE001  (a problem that fails is a row with its reason; the run goes on)
        row["reason"] = f"{stage} failed: {first_line(e, 300, typed=not isinstance(e, FactError))}"
        row["correct"] = False
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def line(row: dict) -> str:
    """A row as one progress line: its result and elapsed time."""
    head = f"{row['id']} {row['name']} {row['policy']}: "
    took = f"; {row.get('wall_s', 0):.1f} s"
    did = row.get("did") or {}
    if row["status"] == "plan":
        unc = did.get("uncovered") or []
        return (head + f"plan: {did.get('regions', 0)} region(s), {did.get('planned', 0)} to tune, "
                f"{len(unc)} uncovered op(s); not timed (no GPU)" + took)
    if row["status"] != "ok":
        return head + f"failed: {row['reason']}" + took

    def ms(x):
        return f"{x:.4g} ms" if x is not None else "-"
    sp = f" ({row['speedup']:.2f}x eager" if row.get("speedup") else " (-"
    sp += f", {row['speedup_vs_compile']:.2f}x torch.compile" if row.get("speedup_vs_compile") else ""
    sp += (f", {row['speedup_vs_compile_cudagraphs']:.2f}x its reduce-overhead mode)"
           if row.get("speedup_vs_compile_cudagraphs") else ")")
    verdict = "correct" if row["correct"] else f"INCORRECT ({row['reason']})"
    shaky = [n for n in ("fact-db", "torch.compile") if n in (did.get("unsettled") or {})]
    return (head + f"{verdict}; eager {ms(row['eager_ms'])}, torch.compile {ms(row['compile_ms'])}, fact-db "
            f"{ms(row['factdb_ms'])}{sp}; {did.get('kernels', 0)}/{did.get('regions', 0)} region(s) on kernels, "
            f"returned {did.get('returned', '?')}" + (f"; rounds unsettled: {', '.join(shaky)}" if shaky else "")
            + took)


def summary(rows: list[dict]) -> dict:
    """Per policy, per level: problems, correct, timed, fast_p (kernelbench.P_VALUES) against
    eager and against torch.compile, and the geometric mean over the correct timed rows against
    each (`vs_compile_verified`: without the rows whose torch.compile fact-db's verification
    refused; `compile_refused` counts them); fast_p and the means are None where nothing could
    be timed."""
    out: dict = {}
    for pol in sorted({r["policy"] for r in rows}):
        for level in sorted({r["level"] for r in rows if r["policy"] == pol}):
            mine = [r for r in rows if r["policy"] == pol and r["level"] == level]
            timed = [r for r in mine if r.get("factdb_ms") is not None]
            s = {"problems": len(mine), "correct": sum(1 for r in mine if r.get("correct")), "timed": len(timed),
                 "failed": sum(1 for r in mine if r["status"] == "failed"),
                 "plan_only": sum(1 for r in mine if r["status"] == "plan"),
                 "with_regions": sum(1 for r in mine if (r.get("did") or {}).get("regions"))}
            s["fast_p"] = {base: ({f"{p:g}": kb.fast_p(mine, p, key) for p in kb.P_VALUES}
                                  if timed else None)
                           for base, key in (("vs_eager", "speedup"), ("vs_compile", "speedup_vs_compile"))}
            verified = [r for r in mine if not kb.compile_failed_verification(r)]
            s["geomean"] = {"rows": sum(1 for r in timed if r.get("correct")),
                            "vs_eager": kb.geomean(mine), "vs_compile": kb.geomean(mine, "speedup_vs_compile"),
                            "vs_compile_verified": kb.geomean(verified, "speedup_vs_compile"),
                            "compile_refused": len(mine) - len(verified)}
            out.setdefault(pol, {})[str(level)] = s
    return out


def new_doc(kernelbench_dir, policies: list[str], *, budget_s: float, memory_mb: int, max_candidates: int,
            commit: str, machine: dict | None = None, max_held: str = "eager", strict: bool = False) -> dict:
    """The head of a scoreboard JSON: device, date, commit (this repository's and the
    KernelBench clone's), the host (`machine`), toolchain, the settings (`max_held` where it is
    not eager's peak, the default; `allclose: "strict"` under --strict-allclose) and KernelBench's
    check; rows go in `results`."""
    import torch

    from fact_db.core.environment import device_info, toolchain_info
    gpu = torch.cuda.is_available()
    info = device_info(torch.device("cuda")) if gpu else {"name": "cpu", "gpu": None}
    kb_commit = kb.clone_commit(kernelbench_dir)
    return {"what": "KernelBench scoreboard (factdb bench --kernelbench)", "device": info["name"], "gpu": info["gpu"],
            "date": date.today().isoformat(), "commit": commit, "machine": machine or {}, "toolchain": toolchain_info(),
            "kernelbench": {"dir": str(Path(kernelbench_dir).resolve()), "commit": kb_commit},
            "policies": list(policies), "budget_per_problem_s": budget_s, "tuning_share": TUNING_SHARE,
            "max_memory_mb": memory_mb, "max_candidates": max_candidates, "peers": list(PEERS),
            "check": {"trials": kb.CORRECT_TRIALS, "seed": kb.SEED, "tolerance": kb.TOLERANCE,
                      "source": "KernelBench src/kernelbench/eval.py: run_and_check_correctness"},
            "fast_p": {"p": list(kb.P_VALUES), "source": "KernelBench src/kernelbench/score.py: fastp"},
            "timed": gpu, **({"max_held": max_held} if max_held != "eager" else {}),
            **({"allclose": "strict"} if strict else {}), "results": []}


def is_strict(doc: dict) -> bool:
    """Whether a scoreboard ran with --strict-allclose (its head says so; older ones did not)."""
    return doc.get("allclose") == "strict"


def default_out(root: Path, gpu: str | None, policies: list[str]) -> Path:
    """benchmarks/results/<gpu>-<date>-kernelbench-<policies>.json (`cpu` without a GPU)."""
    return root / "benchmarks" / "results" / f"{gpu or 'cpu'}-{date.today().isoformat()}-kernelbench-" \
        f"{'-'.join(policies)}.json"


def load(path: Path) -> dict:
    """A scoreboard JSON written before (for --resume); KernelBenchError naming the file if it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise kb.KernelBenchError(f"{path}: cannot be read as a scoreboard JSON ({first_line(e)}); pass a file "
                                  "`factdb bench --kernelbench` wrote") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise kb.KernelBenchError(f"{path}: no `results` list in it; pass a file `factdb bench --kernelbench` wrote")
    return doc


def eager_time(row: dict) -> dict:
    """A row whose returned module runs eager PyTorch: fact-db's time is eager's (the module is
    the model itself behind a signature check). Timed apart it differs by the timing's spread
    alone (a launch-bound model's: KernelBench L3-23's eager measured 6% apart in alternating
    runs, L3-10's 1.9x apart in blocks), which is neither a speedup nor a loss; that time stays
    in `factdb_timed_ms`. Returns the row, changed in place."""
    returned = str((row.get("did") or {}).get("returned", ""))
    if returned.split(" (")[0] == "eager" and row.get("eager_ms") and row.get("factdb_ms") \
            and row["factdb_ms"] != row["eager_ms"]:
        row["factdb_timed_ms"], row["factdb_ms"] = row["factdb_ms"], row["eager_ms"]
        row["speedup"] = 1.0
        row["speedup_vs_compile"] = _ratio(row.get("compile_ms"), row["factdb_ms"])
    return row


def merge(docs: list[dict], keep_finished: bool = False) -> dict:
    """One scoreboard from parts run apart (shards on several GPUs of one host, or runs in
    several sessions): the first part's head, every part's rows (a problem and policy that two
    parts ran keeps the first part's row; with `keep_finished`, a later part's finished row
    wins over a failed one: a run that ran out of its budget does not erase a row that
    finished, see `hidden_finished`), each part's device, date, commit and row count in
    `parts`, and the per-level summary recomputed. KernelBenchError where the parts ran with
    other candidates, peers, held-memory bounds, allclose checks (--strict-allclose) or KernelBench
    commits, or one timed and another did not (the budget may differ: each row says its own,
    `budget_s`)."""
    if not docs:
        raise kb.KernelBenchError("no scoreboard to merge")
    same = ("max_candidates", "peers", "timed")
    for d in docs[1:]:
        if d.get("max_held", "eager") != docs[0].get("max_held", "eager"):
            raise kb.KernelBenchError(f"the parts differ in max_held ({docs[0].get('max_held', 'eager')!r} and "
                                      f"{d.get('max_held', 'eager')!r}): merge only parts run with the same bound")
        if is_strict(d) != is_strict(docs[0]):
            raise kb.KernelBenchError("the parts differ in --strict-allclose (one ran with it, one without): merge "
                                      "only parts verified the same way")
        for k in same:
            if d.get(k) != docs[0].get(k):
                raise kb.KernelBenchError(f"the parts differ in {k} ({docs[0].get(k)!r} and {d.get(k)!r}): merge "
                                          "only parts run with the same settings")
    known = {(d.get("kernelbench") or {}).get("commit") for d in docs} - {None}
    if len(known) > 1:
        raise kb.KernelBenchError(f"the parts ran different KernelBench commits ({', '.join(sorted(known))}): merge "
                                  "only parts of one commit")
    out = {k: v for k, v in docs[0].items() if k not in ("results", "levels", "parts")}
    if known:  # a part from a copy without .git (commit unknown) merges with parts that know it
        out["kernelbench"] = {**(out.get("kernelbench") or {}), "commit": known.pop()}
    if keep_finished:  # each failed row's later finished twin first, so the loop below keeps it
        hidden = {key for key, _ in hidden_finished(docs)}
        docs = [{**d, "results": [r for r in d["results"]
                                  if not ((r["id"], r["policy"]) in hidden and r.get("status") == "failed")]}
                for d in docs]
    seen, rows, parts = set(), [], []
    for d in docs:
        # a part resumed from a merged file carries that file's parts: each is listed once
        for part in d.get("parts") or [{k: d.get(k) for k in ("device", "gpu", "date", "commit", "machine")}
                                         | {"rows": len(d["results"])}]:
            if part not in parts and not part.get("stamped"):  # stamped parts: recounted from the rows below
                parts.append(part)
        for r in d["results"]:
            if (r["id"], r["policy"]) not in seen:
                seen.add((r["id"], r["policy"]))
                rows.append(eager_time(r))  # rows made before eager_time was applied where they ran
    # runs whose rows carry their own commit and date (stamped: resumed parts), on the device
    # each row names (a resumed run may have had another GPU than the part it resumed from)
    from fact_db.core.device import canonical_gpu
    stamped = Counter((r["commit"], r.get("date"), r.get("device") or out.get("device")) for r in rows if r.get("commit"))
    for (c, day, dev), n in sorted(stamped.items(), key=lambda kv: (kv[0][1] or "", kv[0][0], kv[0][2] or "")):
        gpu = canonical_gpu(dev) if dev and dev != out.get("device") else out.get("gpu")
        parts.append({"device": dev, "gpu": gpu, "date": day, "commit": c, "rows": n, "stamped": True})
    out["policies"] = sorted({p for d in docs for p in d.get("policies", [])})
    out["parts"], out["results"] = parts, rows
    out["levels"] = summary(rows)
    return out


def hidden_finished(docs: list[dict]) -> list[tuple[tuple[str, str], dict]]:
    """((id, policy), the failed row) where merging `docs` in order would keep a failed row
    (a time-out, a crash) over a later part's row that finished: merge(keep_finished=True)
    keeps the finished one instead."""
    first, finished = {}, set()
    for d in docs:
        for r in d["results"]:
            key = (r["id"], r["policy"])
            first.setdefault(key, r)
            if r.get("status") != "failed":
                finished.add(key)
    return [(key, r) for key, r in first.items() if r.get("status") == "failed" and key in finished]


def write(doc: dict, out: Path) -> None:
    """Atomically, after every row: a run cut short keeps the rows it finished."""
    from fact_db.composition.report import clean
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(clean(doc), indent=1, allow_nan=False) + "\n")
    tmp.replace(out)


def _last_stage(stderr: str) -> str:
    """Where a stopped child was: its last stage line (`[realize] ...`), as a clause; "" if none."""
    import re
    lines = [ln for ln in stderr.splitlines() if re.match(r"\[(discover|realize|compose|verify|choose|benchmark|"
                                                          r"build|save)\] ", ln)]
    return f" (last: {first_line(lines[-1], 160)})" if lines else ""


def _stopped(stderr: str) -> dict:
    """What a stopped child's stderr says about where its time went: the stages it finished
    with their seconds (`[verify] done in 12.3 s`), the one it was in, and its last lines."""
    import re
    done = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\[(\w+)\] done in ([\d.]+) s", stderr, re.M)}
    started = re.findall(r"^\[(discover|realize|compose|verify|choose|benchmark|save)\] \.\.\.", stderr, re.M)
    tail = [first_line(ln, 200) for ln in stderr.splitlines() if ln.strip()][-12:]
    return {"stages_s": done, "stopped_in": next((s for s in reversed(started) if s not in done), ""),
            "stderr_tail": tail}


def child_row(problem: kb.Problem, policy: str, kernelbench_dir: str, *, budget_s: float, memory_mb: int,
              extra: list[str] | None = None, doing: str = "optimizing, checking and timing it") -> dict:
    """`run_problem` in a child process under the limits; a child that crashes, hangs, exits
    or passes the memory limit is a failed row saying so."""
    from fact_db.discovery import sandbox
    fd, path = tempfile.mkstemp(prefix="factdb-kb-row-", suffix=".json")
    os.close(fd)
    t0 = time.perf_counter()
    err: list = []
    try:
        args = ["bench", "--kernelbench", str(kernelbench_dir), "--problems", problem.id, "--level",
                str(problem.level), "--policy", policy, "--budget-per-problem", f"{budget_s:g}", "--out", path,
                *(extra or [])]
        try:
            rc = sandbox.run(args, problem.id, max_memory_mb=memory_mb, timeout_s=budget_s, stderr=err,
                             memory="rss", doing=doing,
                             hint="(the per-problem budget, --budget-per-problem); it was stopped",
                             lost="no result")
        except FactError as e:
            return {**_base(problem, policy), "correct": False,
                    "reason": str(e).removeprefix(f"{problem.id}: ") + _last_stage("".join(err)),
                    "did": _stopped("".join(err)), "wall_s": round(time.perf_counter() - t0, 2)}
        text = Path(path).read_text() if os.path.getsize(path) else ""
        rows = json.loads(text).get("results", []) if text else []
        if rc == 0 and rows:
            return {**rows[0], "wall_s": round(time.perf_counter() - t0, 2)}  # its process's start included
        said = [ln for ln in "".join(err).splitlines() if ln.strip()]
        why = said[-1].removeprefix("Error: ") if said else f"exit code {rc}"
        return {**_base(problem, policy), "correct": False, "reason": f"the child failed: {why}",
                "wall_s": round(time.perf_counter() - t0, 2)}
    finally:
        Path(path).unlink(missing_ok=True)


def out_of_budget(row: dict, budget_s: float) -> bool:
    """Whether `row` was stopped by a per-problem budget smaller than `budget_s` (so a resumed
    run with the larger budget runs it again)."""
    return (row.get("status") == "failed" and "stopped_in" in (row.get("did") or {})
            and row.get("budget_s", budget_s) < budget_s)


def run(problems: list[kb.Problem], kernelbench_dir, policies: list[str], *, out: Path, doc: dict,
        budget_s: float = DEFAULT_BUDGET_S, memory_mb: int = DEFAULT_MEMORY_MB, extra: list[str] | None = None,
        say=print, runner=None, stamp: dict | None = None, rerun_stopped: bool = False) -> dict:
    """Every problem under every policy not already in `doc["results"]` (resume), each in its
    own child (`runner(problem, policy)` replaces it in tests); `doc` is written to `out`
    after each row, with its per-level summary; `say` gets one line per problem. `stamp`
    (this run's commit and date) goes into every row it adds: a resumed file's head names the
    run that started it, and its rows may come from several. `rerun_stopped` (a budget given for
    the resumed run): a row that a smaller budget stopped runs again."""
    doing = "optimizing, checking and timing it" if doc.get("timed") else "planning it"
    # a row stopped by its budget runs again where this run was given a larger one; its old row goes
    ids = {p.id for p in problems}
    doc["results"] = [r for r in doc["results"] if not (rerun_stopped and r["id"] in ids and r["policy"] in policies
                                                        and out_of_budget(r, budget_s))]
    done = {(r["id"], r["policy"]) for r in doc["results"]}
    todo = [(p, pol) for p in problems for pol in policies if (p.id, pol) not in done]
    if len(todo) < len(problems) * len(policies):
        say(f"resuming: {len(problems) * len(policies) - len(todo)} run(s) already in {out}, {len(todo)} to go")
    width = len(str(len(todo)))
    for i, (p, pol) in enumerate(todo, 1):
        row = runner(p, pol) if runner else child_row(p, pol, kernelbench_dir, budget_s=budget_s, memory_mb=memory_mb,
                                                      extra=extra, doing=doing)
        row.setdefault("budget_s", budget_s)  # a resumed file's rows may have run under other budgets
        row.update(stamp or {})
        doc["results"].append(row)
        doc["levels"] = summary(doc["results"])
        write(doc, out)
        say(f"[{i:>{width}}/{len(todo)}] {line(row)}")
    doc["levels"] = summary(doc["results"])
    write(doc, out)
    return doc
