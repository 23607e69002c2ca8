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

`--conv` writes the convolution set instead (benchmarks/kernelbench_conv_set.txt, issue 27's
targets): every level 1 and level 2 problem with a convolution in its name, and the level 3
CNNs the issue names (ResNet, VGG, MobileNetV2, EfficientNetB0, DenseNet121). The KernelBench
commit in a file's header is the clone's own (`unknown` for a copy without .git).
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fact_db.pipeline import kernelbench as kb  # noqa: E402  (no torch at import)

SEED = 26
SAMPLE = {1: 30, 2: 30}  # level 3: all of it
OUT = HERE / "kernelbench_gpu_set.txt"
CONV_OUT = HERE / "kernelbench_conv_set.txt"
CONV_L3 = ("ResNet", "VGG", "MobileNetV2", "EfficientNetB0", "DenseNet121")  # issue 27's L3 CNNs


def draw_conv(root) -> list[kb.Problem]:
    """Every level 1 and level 2 problem with `conv` in its name, and the level 3 models CONV_L3
    names (DenseNet121 alone, not its transition layer or dense block)."""
    l12 = [p for p in kb.problems(root, (1, 2)) if "conv" in p.name.lower()]
    l3 = [p for p in kb.problems(root, (3,)) if any(p.name.split("_", 1)[1].startswith(m) for m in CONV_L3)
          and not p.name.split("_", 1)[1].startswith(("DenseNet121Transition", "DenseNet121Dense"))]
    return l12 + l3


def draw(root) -> list[kb.Problem]:
    """The set: SAMPLE[level] problems of levels 1 and 2 drawn with seed SEED + level, all of level 3."""
    out = []
    for level in kb.LEVELS:
        probs = kb.problems(root, (level,))
        if level in SAMPLE:
            probs = sorted(random.Random(SEED + level).sample(probs, SAMPLE[level]), key=lambda p: p.number)
        out += probs
    return out


def text(root, conv: bool = False) -> str:
    rev = kb.clone_commit(root, short=True) or "unknown"
    if conv:
        probs = draw_conv(root)
        head = ["# The KernelBench convolution set (issue 27's targets): every level 1 and level 2 problem with a "
                "convolution in its name, and the level 3 CNNs " + ", ".join(CONV_L3) + ".",
                "# Drawn by benchmarks/kernelbench_gpu_set.py --conv from KernelBench at commit " + rev + ".",
                "# Run it: factdb bench --kernelbench DIR --problems benchmarks/kernelbench_conv_set.txt --policy bf16",
                f"# {len(probs)} problems: id, then file name."]
    else:
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
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT.name} ({CONV_OUT.name} with --conv)")
    ap.add_argument("--conv", action="store_true", help="the convolution set instead")
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh draw")
    a = ap.parse_args(argv)
    a.out = a.out or (CONV_OUT if a.conv else OUT)
    new = text(a.kernelbench, conv=a.conv)
    if a.check:
        same = a.out.is_file() and a.out.read_text() == new
        print(f"{a.out}: {'matches' if same else 'differs from'} the draw")
        return 0 if same else 1
    a.out.write_text(new)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
