#!/usr/bin/env python3
"""Draw the KernelBench GPU set: a fixed, seeded sample of 30 level 1 and 30 level 2 problems,
and every level 3 problem, written to benchmarks/kernelbench_gpu_set.txt (one problem a line,
its id then its file name), so the GPU runs of the scoreboard, split over several sessions,
run the same problems:

    python benchmarks/kernelbench_gpu_set.py --kernelbench /path/to/KernelBench
    factdb bench --kernelbench /path/to/KernelBench --problems benchmarks/kernelbench_gpu_set.txt

How: for each of levels 1 and 2, the level's problems sorted by number, then
`random.Random(SEED + level).sample(them, 30)`, listed by number. SEED is 26, the issue that
asked for the set. `--check` draws again and exits 1 where the file differs.
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fact_db.pipeline import kernelbench as kb  # noqa: E402  (no torch at import)

SEED = 26
SAMPLE = {1: 30, 2: 30}  # level 3: all of it
OUT = HERE / "kernelbench_gpu_set.txt"


def draw(root) -> list[kb.Problem]:
    """The set: SAMPLE[level] problems of levels 1 and 2 drawn with seed SEED + level, all of level 3."""
    out = []
    for level in kb.LEVELS:
        probs = kb.problems(root, (level,))
        if level in SAMPLE:
            probs = sorted(random.Random(SEED + level).sample(probs, SAMPLE[level]), key=lambda p: p.number)
        out += probs
    return out


def text(root) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        rev = "unknown"
    probs = draw(root)
    head = [f"# The KernelBench GPU set: {SAMPLE[1]} level 1 and {SAMPLE[2]} level 2 problems drawn at random, "
            "and all of level 3.",
            f"# Drawn by benchmarks/kernelbench_gpu_set.py: per level, random.Random({SEED} + level).sample(the "
            "level's problems sorted by number, k), from KernelBench at commit " + rev + ".",
            "# Run it: factdb bench --kernelbench DIR --problems benchmarks/kernelbench_gpu_set.txt",
            f"# {len(probs)} problems: id, then file name."]
    return "\n".join(head + [f"{p.id:<7} {p.path.name}" for p in probs]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", required=True, help="a clone of ScalingIntelligence/KernelBench")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh draw")
    a = ap.parse_args(argv)
    new = text(a.kernelbench)
    if a.check:
        same = a.out.is_file() and a.out.read_text() == new
        print(f"{a.out}: {'matches' if same else 'differs from'} the draw")
        return 0 if same else 1
    a.out.write_text(new)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
