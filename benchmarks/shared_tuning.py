"""Two hosts tuning one model's regions together through a team registry, against one host alone.

On one GPU machine: the regions of a problem (default minGPT's block) are realized (registry
first, then tuned: fact_db.realization.realize.realize_regions) by one process with a fresh home
and an empty registry, timed; then by two processes at once, each with its own FACTDB_HOME (its
own cache and build cache), sharing one PostgreSQL registry, and timed until both are done.
With a team registry the two divide the regions, each taking a few workloads at a time and
compiling their candidates in one batch (fact_db.store.lease.groups, realize.claim_size). Target: the pair
takes at most 60% of one host's time. Both processes use the same GPUs (--gpus);
`--cores-per-host N` gives each process N CPU cores of its own (the first host the first N
of the cores this script may use, the second the next N; the lone host the first N), as two
machines would have, where without it they share this machine's cores (nvcc's compiles are
most of a cold tuning).

Writes benchmarks/results/<gpu>-<date>-shared-tuning.json (device, date, commit, each run's
seconds and per-region outcomes) and prints the ratio.

PostgreSQL: `--url` names a server (an empty database or schema the user may create tables in);
without it, one is started from the installed binaries (tests/pg.py) on 127.0.0.1. With neither,
the script says so and stops without measuring.

    python benchmarks/shared_tuning.py [--problem benchmarks/problems/mingpt_block.py] [--policy fp32]
                                       [--url postgresql+psycopg://...] [--gpus 0] [--max-candidates 4]
                                       [--cores-per-host 8] [--share-binaries] [--out PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from _provenance import commit  # noqa: E402  (benchmarks/ is on sys.path)

HOST = r"""
import json, sys, time
from fact_db.discovery.discover import discover_problem
from fact_db.kernels.abi import current_gpu
from fact_db.realization.realize import realize_regions
from fact_db.store.registry import Registry

problem, policy, url, gpus, max_candidates = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
gpu, device = current_gpu()
report = discover_problem(problem, arch="sm90", policy=policy)
reg = Registry.open(url, seed=False)
t0 = time.perf_counter()
realized = realize_regions(report, policy, registry=reg, gpu=gpu, gpus=[int(g) for g in gpus.split(",")],
                           max_candidates=max_candidates, progress=False)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "device": device, "gpu": gpu,
                  "regions": [{"index": z.index + 1, "rule": z.region.rule, "how": z.how, "ms": z.ms,
                               "notes": z.notes} for z in realized]}), flush=True)
reg.close()
"""


def schema_url(server, url: str | None) -> str:
    """A fresh place for the registry: a new schema on the server started here, or, on a given
    server, a new schema when the URL's user may create one, else the URL as given."""
    if server is not None:
        return server.new_schema()
    import sqlalchemy as sa
    name = "factdb_bench_" + uuid.uuid4().hex[:8]
    eng = sa.create_engine(url)
    try:
        with eng.begin() as conn:
            conn.execute(sa.text(f"create schema {name}"))
    except sa.exc.SQLAlchemyError:
        return url
    finally:
        eng.dispose()
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{name}"


def run_hosts(n: int, url: str, args, tmp: Path) -> dict:
    procs = []
    mine = sorted(os.sched_getaffinity(0))
    per = args.cores_per_host
    if per and per * n > len(mine):
        raise SystemExit(f"--cores-per-host {per}: {n} host(s) need {per * n} cores, this process may use {len(mine)}")
    print(f"{n} host(s) tuning {Path(args.problem).name} at {args.policy}"
          + (f", {per} cores each" if per else ", sharing this machine's cores"), flush=True)
    t0 = time.perf_counter()
    for h in range(n):
        cores = set(mine[h * per:(h + 1) * per]) if per else None
        env = {**os.environ, "FACTDB_HOME": str(tmp / f"run{n}-host{h}"), "FACTDB_SEED": "",
               # the project first, then whatever the caller's PYTHONPATH holds (wheels installed
               # with --target on a device machine): replacing it loses the dependencies
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        env.pop("FACTDB_DB", None)
        env.pop("FACTDB_CACHE", None)
        env["FACTDB_SHARE_BINARIES"] = "1" if args.share_binaries else ""
        procs.append(subprocess.Popen([sys.executable, "-c", HOST, args.problem, args.policy, url, args.gpus,
                                       str(args.max_candidates)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                      preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None))
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a host failed ({p.returncode}): {err[-3000:]}")
    hosts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    print(f"  {n} host(s): {wall:.1f} s (each host's tuning: "
          f"{', '.join(format(h['seconds'], '.1f') for h in hosts)} s)", flush=True)
    return {"hosts": n, "wall_s": round(wall, 2), "cores_per_host": per or None, "realize_s": [round(h["seconds"], 2) for h in hosts],
            "per_host": hosts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default=str(ROOT / "benchmarks" / "problems" / "mingpt_block.py"))
    ap.add_argument("--policy", default="fp32")
    ap.add_argument("--url", help="PostgreSQL URL of the team registry's server (default: start one here)")
    ap.add_argument("--gpus", default="0", help="GPU indices each host uses (default 0: both share one)")
    ap.add_argument("--max-candidates", type=int, default=4, help="candidates per region (default 4)")
    ap.add_argument("--share-binaries", action="store_true",
                    help="FACTDB_SHARE_BINARIES=1 for the hosts: a winner one host built, the other loads")
    ap.add_argument("--cores-per-host", type=int, default=0,
                    help="CPU cores of its own for each host process (default: they share this machine's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    server = None
    if not args.url:
        import pg as pg_mod
        if pg_mod.find_bin() is None:
            print("skipped: PostgreSQL is not installed on this machine and no --url was given; pass "
                  "--url postgresql+psycopg://USER@HOST/DB of a reachable server, or install the postgresql "
                  "package (its initdb and pg_ctl) and run again")
            return 0
        server = pg_mod.PgServer.start()
    tmp = Path(tempfile.mkdtemp(prefix="factdb-shared-tuning-"))
    try:
        one = run_hosts(1, schema_url(server, args.url), args, tmp)
        two = run_hosts(2, schema_url(server, args.url), args, tmp)
    finally:
        if server is not None:
            server.destroy()
    ratio = two["wall_s"] / one["wall_s"]
    device = one["per_host"][0]["device"]
    gpu = one["per_host"][0]["gpu"]
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"benchmark": "shared_tuning", "date": now.isoformat(timespec="seconds"), "commit": commit(),
           "device": device, "problem": Path(args.problem).name, "policy": args.policy, "gpus": args.gpus,
           "max_candidates": args.max_candidates, "cores_per_host": args.cores_per_host or None,
           "share_binaries": args.share_binaries,
           "one_host": one, "two_hosts": two, "ratio": round(ratio, 3), "target": "<= 0.6"}
    out = args.out or HERE / "results" / f"{gpu}-{now.date().isoformat()}-shared-tuning.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"one host: {one['wall_s']:.1f} s; two hosts together: {two['wall_s']:.1f} s; ratio {ratio:.2f} "
          f"(target <= 0.6) on {device}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
