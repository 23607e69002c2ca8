"""Merge scoreboard parts (`factdb bench --kernelbench` JSONs run apart: one per GPU of a host,
or one per session) into one scoreboard JSON with its per-level summary recomputed.

    python benchmarks/kernelbench_merge.py part-0.json part-1.json --out benchmarks/results/h100-<date>-kernelbench-fp32.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fact_db.pipeline import scoreboard  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", type=Path, help="scoreboard JSONs")
    ap.add_argument("--out", type=Path, required=True, help="the merged scoreboard JSON")
    args = ap.parse_args(argv)
    doc = scoreboard.merge([scoreboard.load(p) for p in args.parts])
    scoreboard.write(doc, args.out)
    for pol, levels in doc["levels"].items():
        for lv, s in levels.items():
            print(f"level {lv} {pol}: {s['problems']} problem(s), {s['correct']} correct, {s['failed']} failed")
    print(f"wrote {args.out} ({len(doc['results'])} rows from {len(args.parts)} part(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
