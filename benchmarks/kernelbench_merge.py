"""Merge scoreboard parts (`factdb bench --kernelbench` JSONs run apart: one per GPU of a host,
or one per session) into one scoreboard JSON with its per-level summary recomputed.

    python benchmarks/kernelbench_merge.py part-0.json part-1.json --out benchmarks/results/h100-<date>-kernelbench-fp32.json
    python benchmarks/kernelbench_merge.py ... --rerun "L3-29=its compose bug is fixed" --raw raw/shard-2.json
    python benchmarks/kernelbench_merge.py new-part.json merged.json --out merged.json --keep-finished

A merged scoreboard keeps `to_rerun` (problems whose rows ended on faults fixed since): an
entry is dropped once a part has its row, and `--rerun ID=WHY` moves a row there (the row as
measured stays in the raw part named with `--raw`, whose paths the JSON lists). Newest part first:
where its row failed (ran out of its budget) and an older part finished the problem, the merge
says so, and `--keep-finished` keeps the finished row.
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
    ap.add_argument("--rerun", action="append", default=[], metavar="ID=WHY",
                    help="move that problem's row to to_rerun, saying why it is run again")
    ap.add_argument("--raw", action="append", default=[], help="a raw part's path, added to the JSON's list")
    ap.add_argument("--keep-finished", action="store_true",
                    help="where a part's row failed (ran out of its budget, crashed) and a later part finished the "
                         "same problem, keep the finished row (the failed one stays in its raw part)")
    args = ap.parse_args(argv)
    docs = [scoreboard.load(p) for p in args.parts]
    for (pid, pol), row in scoreboard.hidden_finished(docs):
        what = "kept: a later part's finished row" if args.keep_finished else \
            "hides a later part's finished row (--keep-finished keeps that one)"
        print(f"{pid} {pol}: the newest row failed ({(row.get('reason') or '')[:90]}); {what}", file=sys.stderr)
    doc = scoreboard.merge(docs, keep_finished=args.keep_finished)
    rerun = {}
    for d in docs:  # every part's list, first mention kept
        for e in d.get("to_rerun") or []:
            rerun.setdefault(e["id"], e)
    have = {r["id"] for r in doc["results"]}
    rerun = {k: e for k, e in rerun.items() if k not in have}
    for spec in args.rerun:
        pid, _, why = spec.partition("=")
        row = next((r for r in doc["results"] if r["id"] == pid), None)
        if row is None or not why:
            raise SystemExit(f"--rerun {spec!r}: give ID=WHY for a problem with a row (no row for {pid!r})")
        doc["results"].remove(row)
        measured = row.get("reason") or "; ".join((row.get("did") or {}).get("notes", [])[:1]) or row["status"]
        rerun[pid] = {"id": pid, "name": row["name"], "measured": measured, "why_rerun": why,
                      **{k: row.get(k) for k in ("eager_ms", "compile_ms", "factdb_ms")}}
    doc = scoreboard.merge([doc])  # the stamped parts' row counts, without the rows moved out
    doc["to_rerun"] = list(rerun.values())
    # every part's raw list (a merged part brings its own), first mention kept
    doc["raw"] = list(dict.fromkeys([*(r for d in docs for r in d.get("raw") or []), *args.raw]))
    scoreboard.write(doc, args.out)
    for pol, levels in doc["levels"].items():
        for lv, s in levels.items():
            print(f"level {lv} {pol}: {s['problems']} problem(s), {s['correct']} correct, {s['failed']} failed")
    print(f"wrote {args.out} ({len(doc['results'])} rows from {len(args.parts)} part(s); "
          f"{len(doc['to_rerun'])} to rerun)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
