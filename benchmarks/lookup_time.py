"""Where the torch.compile backend's registry lookup spends its time: one exact lookup through
the lean reader (fact_db.store.reader), each in a fresh process, in the states the backend meets
it in. backend_cold.py's profile on an H200 put 0.57 s in the reader's query (twenty-third
session) where the same query takes 5 ms on the 2-core CPU: binding the digest as a parameter
imported pandas there.

    python benchmarks/lookup_time.py --out lookup.json

States, each its own child process: `plain` (Python, the reader, nothing else), `torch` (torch
imported, CUDA initialised), `inductor` (and Inductor's compile workers started, as
torch.compile starts them), `inductor_threads1` (the same, DuckDB told to use one thread). Each
child times opening the reader, its first lookup and a second one, and says whether pandas was
imported: with the digest as a bound parameter (--bound, the reader's query before) DuckDB's
Python client imports pandas and numpy at the first one where they are installed. The registry is a fresh
seeded one in a temporary FACTDB_HOME (a miss); --db names another, --hit looks up a row it holds.
Writes JSON with device, date and commit.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

STATES = ("plain", "torch", "inductor", "inductor_threads1")


def child(state: str, url: str, digest: str, bound: bool) -> dict:
    """One state's timings (seconds), in this process."""
    out = {}
    if state != "plain":
        import torch
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
        if state.startswith("inductor"):
            from torch._inductor.async_compile import AsyncCompile
            t = time.perf_counter()
            AsyncCompile.warm_pool()
            out["warm_pool_s"] = time.perf_counter() - t
    from fact_db.store.reader import Reader
    t = time.perf_counter()
    reader = Reader.open(url)
    out["open_s"] = time.perf_counter() - t
    if reader is None:
        return {**out, "error": "the lean reader cannot serve this registry"}
    if state.endswith("threads1"):
        import duckdb
        real = duckdb.connect

        def one_thread(*a, **k):
            conn = real(*a, **k)
            conn.execute("set threads = 1")
            return conn
        duckdb.connect = one_thread
    for n in ("first", "second"):
        t = time.perf_counter()
        with reader._connection() as conn:
            if bound:   # the reader's query before the twenty-third session
                conn.execute("select * from kernels where digest = ? and status != 'failed'", [digest]).fetchone()
            else:       # as the reader asks now: the digest a literal
                conn.execute(f"select * from kernels where digest = '{digest}' and status != 'failed'").fetchone()
        out.setdefault("pandas_imported", "pandas" in sys.modules)
        out[f"{n}_lookup_s"] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None, help="a registry URL (default: a fresh seeded one)")
    ap.add_argument("--hit", action="store_true", help="look up a row the registry holds (default: a miss)")
    ap.add_argument("--bound", action="store_true",
                    help="the digest as a bound parameter, as the reader asked before (default: a literal, as now)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--digest", default="0" * 64, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.db, a.digest, a.bound)))
        return
    from _provenance import commit
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, FACTDB_HOME=home)
        url = a.db
        if url is None:
            url = f"duckdb:///{home}/fact.duckdb"
            subprocess.run([sys.executable, "-c", "from fact_db.store.registry import Registry; Registry.open(%r)" % url],
                           env=env, check=True)
        digest = a.digest
        if a.hit:
            import duckdb
            from fact_db.store.reader import local_path
            with duckdb.connect(str(local_path(url)), read_only=True) as conn:
                got = conn.execute("select digest from kernels where status != 'failed' limit 1").fetchone()
            if got is None:
                sys.exit(f"--hit: the registry {url} holds no usable row")
            digest = got[0]
        rows = {}
        for state in STATES:
            t = time.perf_counter()
            p = subprocess.run([sys.executable, __file__, "--child", state, "--db", url, "--digest", digest]
                               + (["--bound"] if a.bound else []), env=env,
                               capture_output=True, text=True)
            got = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-500:]}
            rows[state] = {**got, "process_s": time.perf_counter() - t}
            print(state, rows[state], flush=True)
    try:
        import torch
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        device = "cpu"
    doc = {"device": device, "date": date.today().isoformat(), "commit": commit(), "cores": os.cpu_count(),
           "hit": a.hit, "bound": a.bound, "states": rows}
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        print("wrote", a.out)


if __name__ == "__main__":
    main()
