"""KernelBench as KernelBench defines it: its problems in a clone the user points at, its own
correctness check, and its fast_p score. Nothing here is copied from KernelBench; each piece
names the function of ScalingIntelligence/KernelBench it follows.

    >>> probs = problems("/path/to/KernelBench", levels=(1,), only=["L1-19"])
    >>> probs[0].id, probs[0].name
    ('L1-19', '19_ReLU')
    >>> fast_p([{"correct": True, "speedup": 1.3}, {"correct": False, "speedup": 4.0}], 1.0)
    0.5

Importing this module does not import torch (the check imports it when it runs).
"""
from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fact_db.core.errors import FactError

LEVELS = (1, 2, 3)
P_VALUES = (0.0, 1.0, 1.5, 2.0)  # the thresholds the scoreboard reports
SEED = 42            # eval.py: eval_kernel_against_ref(seed_num=42)
CORRECT_TRIALS = 5   # scripts/eval_from_generations.py, run_and_check.py: num_correct_trials = 5
# eval.py: get_tolerance_for_precision -- atol = rtol = this, by the dtype the model runs in
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}

_FILE = re.compile(r"(\d+)_.*\.py$")
_ID = re.compile(r"[Ll](\d)-(\d+)$")


class KernelBenchError(FactError):
    """A KernelBench directory or problem selection that cannot be used."""


@dataclass(frozen=True)
class Problem:
    """One KernelBench problem file: `id` like L1-19 (level, number), `name` its file stem."""

    id: str
    level: int
    number: int
    name: str
    path: Path

    def as_dict(self) -> dict:
        return {"id": self.id, "level": self.level, "name": self.name}


def clone_commit(kernelbench_dir, short: bool = False) -> str | None:
    """The commit of the KernelBench clone at `kernelbench_dir` (its first 7 hex digits with
    `short`), or None where that directory is not the top of a git clone (a copy without .git:
    git would answer for whatever repository encloses it, as it did on the device hosts, where a
    copy inside this checkout recorded this repository's commit as KernelBench's)."""
    here = Path(kernelbench_dir).resolve()
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(top) != 2 or Path(top[0]).resolve() != here:
        return None
    return top[1][:7] if short else top[1]


def level_dir(root: str | Path, level: int) -> Path:
    """`root`/KernelBench/level<N> (a clone of ScalingIntelligence/KernelBench), or
    `root`/level<N> (its KernelBench folder itself)."""
    root = Path(root).expanduser()
    for d in (root / "KernelBench" / f"level{level}", root / f"level{level}"):
        if d.is_dir():
            return d
    raise KernelBenchError(f"{root}: no KernelBench/level{level} folder in it; point --kernelbench at a clone of "
                           "ScalingIntelligence/KernelBench (or at its KernelBench folder)")


def _has_level(root, level: int) -> bool:
    try:
        level_dir(root, level)
        return True
    except KernelBenchError:
        return False


def problems(root: str | Path, levels=None, only: list[str] | None = None) -> list[Problem]:
    """The problem files of `levels` under `root` (default: every level folder it has), by
    level then number. `only` keeps the ones named (ids like L1-19, file stems like 19_ReLU,
    or level1/19_ReLU.py) that are in `levels` (so `--level 1` with the GPU set's file runs its
    level 1 part), in the order of the levels; a name that matches no file of any level, or a
    level asked for that has no folder, is an error naming it."""
    there = [lv for lv in LEVELS if _has_level(root, lv)]
    if levels is None:
        levels = there or LEVELS
    found = []
    for level in sorted(set(levels) | (set(there) if only is not None else set())):
        for p in level_dir(root, level).glob("*.py"):
            m = _FILE.match(p.name)
            if m:
                found.append(Problem(f"L{level}-{int(m.group(1))}", level, int(m.group(1)), p.stem, p))
    found.sort(key=lambda p: (p.level, p.number, p.name))
    if only is None:
        return found
    keys = {}
    for p in found:
        for k in (p.id, p.name, f"level{p.level}/{p.name}", f"level{p.level}/{p.path.name}"):
            keys.setdefault(k.lower(), p)
    missing = [n for n in only if n.lower() not in keys]
    if missing:
        raise KernelBenchError(f"{Path(root)}: no problem {', '.join(missing[:5])}"
                               + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
                               + f" in level(s) {', '.join(map(str, sorted(set(levels) | set(there))))}: name "
                               "problems as L1-19, 19_ReLU or level1/19_ReLU.py")
    want = {id(keys[n.lower()]) for n in only}
    return [p for p in found if id(p) in want and p.level in levels]


def selection(spec: str | None) -> list[str] | None:
    """`--problems`: a file of problem names (one a line, `#` comments; what
    benchmarks/kernelbench_gpu_set.txt holds) or a comma-separated list; None for all."""
    if not spec:
        return None
    path = Path(spec).expanduser()
    try:
        is_file = "," not in spec and path.is_file()
    except OSError:  # a list longer than a file name may be
        is_file = False
    if is_file:
        text = path.read_text()
        names = [ln.split("#", 1)[0].split()[0] for ln in text.splitlines() if ln.split("#", 1)[0].strip()]
        if not names:
            raise KernelBenchError(f"{path}: no problem names in it (one a line, like L1-19)")
        return names
    if "/" in spec and spec.endswith(".txt"):
        raise KernelBenchError(f"{spec}: no such file (--problems takes a file of names or a list like L1-19,L2-3)")
    return [n.strip() for n in spec.split(",") if n.strip()]


def levels_of(spec: str | None) -> tuple[int, ...] | None:
    """`--level 1,3` -> (1, 3); None (every level there is) without one."""
    if not spec:
        return None
    try:
        out = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        out = ()
    if not out or any(x not in LEVELS for x in out):
        raise KernelBenchError(f"--level {spec}: use levels 1, 2 and 3, comma-separated (e.g. 1,2)")
    return out


def fast_p(rows: list[dict], p: float, speedup: str = "speedup") -> float | None:
    """KernelBench's fast_p (src/kernelbench/score.py: fastp): the share of ALL rows that are
    correct and whose speedup over the baseline is above `p`. A row that failed, or was not
    timed, counts in the denominator and never in the numerator. None for no rows."""
    if not rows:
        return None
    return sum(1 for r in rows if r.get("correct") and (r.get(speedup) or 0.0) > p) / len(rows)


def geomean(rows: list[dict], speedup: str = "speedup") -> float | None:
    """The geometric mean of `speedup` over the rows that are correct by KernelBench's check and
    timed (the figure issue targets state; fast_p counts the others as failures, this leaves them
    out, and the summary gives their number beside it). None for no such row."""
    xs = [r[speedup] for r in rows if r.get("correct") and r.get(speedup)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def compile_failed_verification(row: dict) -> bool:
    """Whether fact-db's verification refused the row's `torch.compile` of the model (the
    choice's candidate): then the row's ratio over torch.compile compares with a module that
    does not pass the same check (bf16 GroupNorm, training-mode BatchNorm: KernelBench L2-11,
    L2-73), and the summary gives the geometric mean without those rows too."""
    for c in (row.get("did") or {}).get("choice") or []:
        if c.get("name") == "torch.compile":
            return c.get("verified") is False
    return False


def check(reference, candidate, get_inputs, precision: str = "float32", *, trials: int = CORRECT_TRIALS,
          seed: int = SEED, device=None) -> dict:
    """KernelBench's correctness check (src/kernelbench/eval.py: run_and_check_correctness):
    `trials` input sets, each from `get_inputs()` after seeding with a seed drawn from
    torch.manual_seed(`seed`) (torch.randint(0, 2**32 - 1)), inputs cast to `precision` and
    moved to `device`; both models run under no_grad; every trial's output must have the
    reference's shape and pass torch.allclose with atol = rtol = TOLERANCE[precision]
    (eval.py: get_tolerance_for_precision). Returns {"correct", "trials_passed", "trials",
    "max_difference", "avg_difference", "reason"}; an exception in the candidate is a failed
    check with its one-line reason, as KernelBench records it.

    >>> check(model, fast, problem.get_inputs, "float32", device="cuda")["correct"]
    True
    """
    import torch

    from fact_db.core.errors import first_line
    dtype = getattr(torch, precision)
    tol = TOLERANCE[precision]
    torch.manual_seed(seed)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(trials)]
    passed, max_d, avg_d, reason = 0, [], [], ""

    def prepare(x):
        return x.to(dtype=dtype).to(device=device) if isinstance(x, torch.Tensor) else x

    def seed_all(s):
        torch.manual_seed(s)
        if torch.cuda.is_available():
            torch.cuda.manual_seed(s)

    with torch.no_grad():
        for s in seeds:
            seed_all(s)
            inputs = [prepare(x) for x in get_inputs()]
            out = reference(*inputs)
            try:
                new = candidate(*inputs)
            except Exception as e:  # noqa: BLE001  (KernelBench: a runtime error is an incorrect result)
                reason = f"runtime error: {first_line(e, typed=True)}"
                break
            if not isinstance(new, torch.Tensor) or new.shape != out.shape:
                reason = f"output shape mismatch: expected {tuple(out.shape)}, got {tuple(getattr(new, 'shape', ()))}"
                break
            if new.dtype != out.dtype:
                reason = f"output dtype {new.dtype}, the reference's {out.dtype} (torch.allclose refuses the pair)"
                break
            diff = (out.double() - new.double()).abs()
            if torch.allclose(out, new, atol=tol, rtol=tol):
                passed += 1
            else:
                max_d.append(float(diff.max()) if diff.numel() else 0.0)
                avg_d.append(float(diff.mean()) if diff.numel() else 0.0)
                reason = reason or f"output mismatch (atol = rtol = {tol:g})"
    return {"correct": passed == trials, "trials_passed": passed, "trials": trials, "tolerance": tol,
            "max_difference": max(max_d) if max_d else None, "avg_difference": max(avg_d) if avg_d else None,
            "reason": "" if passed == trials else reason or "output mismatch"}
