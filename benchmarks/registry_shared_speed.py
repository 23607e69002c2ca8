"""Time the team registry: a lookup answered by the local cache, and one answered by the
PostgreSQL server on the loopback interface.

Writes benchmarks/results/team-registry-<date>.json with the machine, date and commit:

- `cache_hit_ms`: Registry.lookup on a team registry for keys its cache already holds (exact,
  usable rows), one call after another as a model's regions are looked up: the cache's
  connection lingers between calls (fact_db.store.shared.LINGER_S). `cache_hit_cold_ms`: the
  same after the linger let the connection go (the DuckDB file opened again). Target: < 5 ms.
- `server_hit_ms`: Registry.lookup straight on the server (`cache=False`), exact keys, pooled
  connections. `server_nearest_ms`: shapes moved within their divisibility class. Target: < 20 ms.
- `cache_miss_ms`: a team lookup of a key the cache lacks: the cache, the server, and the row
  written into the cache.
- `put_ms`: a team put (merged in the server, copied into the cache); `claim_ms`: taking and
  releasing a workload's lease.

The server holds `--rows` synthetic kernel rows. Without `--url`, a throwaway server is started
from the installed PostgreSQL binaries (tests/pg.py), on 127.0.0.1 only.

    python benchmarks/registry_shared_speed.py [--rows 20000] [--lookups 200] [--url URL] [--out PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _provenance import commit, machine  # noqa: E402  (benchmarks/ is on sys.path)

from fact_db.store import shared  # noqa: E402
from fact_db.store.registry import SYNTHETIC_ENV, KernelKey, Registry, synthetic_records, synthetic_rows  # noqa: E402

ENV = SYNTHETIC_ENV
TH = {"gemm_sm90": "synthetic", "gemm_sm80": "synthetic"}


def stats_ms(xs: list[float]) -> dict:
    xs = sorted(x * 1e3 for x in xs)
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "p10": round(xs[len(xs) // 10], 3),
            "p90": round(xs[9 * len(xs) // 10], 3), "min": round(xs[0], 3)}


def timed(fn, items) -> list[float]:
    out = []
    for x in items:
        t = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--lookups", type=int, default=200)
    ap.add_argument("--url", help="a PostgreSQL URL to use (an empty database or schema); default: start one")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    server = None
    if args.url:
        url = args.url
    else:
        import pg as pg_mod
        if pg_mod.find_bin() is None:
            print("skipped: no PostgreSQL here; pass --url postgresql+psycopg://... or install the postgresql package")
            return 0
        server = pg_mod.PgServer.start()
        url = server.new_schema()
    tmp = Path(tempfile.mkdtemp(prefix="factdb-shared-bench-"))
    try:
        direct = Registry.open(url, seed=False, cache=False)
        t = time.perf_counter()
        rows = list(synthetic_rows(args.rows, seed=3))
        direct.bulk_insert_rows(rows, chunk=5000)
        fill_s = time.perf_counter() - t
        step = max(1, len(rows) // args.lookups)
        keys = [KernelKey(**json.loads(r["key"])) for r in rows[::step]][: args.lookups]
        near = [k.with_(m=k.m * 2) if k.m * 2 <= 65536 else k.with_(m=k.m // 2) for k in keys]
        team = Registry.open(url, seed=False, cache=tmp / "cache.duckdb")

        def look(reg):
            return lambda k: reg.lookup(k, env=ENV, template_hashes=TH)
        miss = timed(look(team), keys)                         # each key's first lookup: filled from the server
        assert all(team.lookup(k, env=ENV, template_hashes=TH).exact for k in keys[:5])
        hit = timed(look(team), keys)
        cold = []
        for k in keys[:10]:
            time.sleep(shared.LINGER_S + 0.5)                  # the lingering connection closes
            cold += timed(look(team), [k])
        server_hit = timed(look(direct), keys)
        server_near = timed(look(direct), near)
        new = list(synthetic_records(50, seed=99))
        put = timed(lambda r: team.put(r, env=ENV, template_hashes=TH), new)
        claim = []
        for k in keys[:50]:
            t = time.perf_counter()
            with team.claim(k):
                pass
            claim.append(time.perf_counter() - t)
        team.close()
        direct.close()
        pg_version = _server_version(url)
    finally:
        if server is not None:
            server.destroy()
    now = datetime.datetime.now(datetime.timezone.utc)
    import psycopg
    import sqlalchemy
    doc = {"benchmark": "registry_shared_speed", "date": now.isoformat(timespec="seconds"),
           "commit": commit(["fact_db/store/"], "+uncommitted registry changes"),
           "machine": machine(psycopg=psycopg.__version__, sqlalchemy=sqlalchemy.__version__,
                              postgresql=pg_version),
           "server": "PostgreSQL on 127.0.0.1 (loopback)", "rows": args.rows, "fill_s": round(fill_s, 2),
           "cache_hit_ms": stats_ms(hit), "cache_hit_cold_ms": stats_ms(cold), "cache_miss_ms": stats_ms(miss),
           "server_hit_ms": stats_ms(server_hit), "server_nearest_ms": stats_ms(server_near),
           "put_ms": stats_ms(put), "claim_ms": stats_ms(claim),
           "targets": {"cache_hit_ms": 5, "server_hit_ms": 20}}
    out = args.out or HERE / "results" / f"team-registry-{now.date().isoformat()}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for name in ("cache_hit_ms", "cache_hit_cold_ms", "cache_miss_ms", "server_hit_ms", "server_nearest_ms", "put_ms",
                 "claim_ms"):
        print(f"{name:18} median {doc[name]['median']:8.3f}  p90 {doc[name]['p90']:8.3f}")
    print(f"wrote {out}")
    return 0


def _server_version(url: str) -> str:
    import sqlalchemy as sa
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return c.execute(sa.text("show server_version")).scalar()
    finally:
        eng.dispose()


if __name__ == "__main__":
    sys.exit(main())
