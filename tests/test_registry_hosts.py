"""Hosts tuning together through one PostgreSQL server (tests/pg.py): real processes, each with its
own FACTDB_HOME (its own cache), running the GEMM tuner with a stand-in timer (the tuner's
`runner=` in place of the GPU worker pool, and a stand-in builder in place of nvcc), so no GPU
is needed. Each host appends a line to a shared log whenever it actually times a workload.

- four hosts tune an overlapping set of 12 workloads: each is timed exactly once, and every
  host ends with all 12 rows in its cache;
- a host killed with SIGKILL while it holds a lease: another host takes the workload over once
  the lease expires, and nothing is lost or written twice;
- the server stopped mid-run: the hosts go on from their caches, and `factdb registry sync`
  after the restart leaves the server with every row and trial exactly once.
"""
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from fact_db.store.registry import Registry

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(128 * (i + 1), 1024, 512) for i in range(12)]

HOST = r"""
import json, os, sys, time
from pathlib import Path
from fact_db.kernels import build
from fact_db.kernels.gemm import tune as tune_mod
from fact_db.kernels.gemm.workload import GemmWorkload
from fact_db.store.registry import Registry

url, host, log, shapes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
slow = float(os.environ["HOST_SLOW_S"])


def stand_in_build(sources, jobs=None, progress=True, **kw):   # every candidate "builds"; nothing compiles
    return [build.Built(s, build.content_key(s), Path("/nonexistent/kernel.so")) for s in sources]


def stand_in_timer(jobs):                                 # eager 1 ms, candidate i 0.5 + i/100 ms
    with open(log, "a") as f:
        f.write(f"{host} {current}\n")
    print("tuning", current, flush=True)
    time.sleep(slow)
    return [{"id": j["id"], "status": "ok", "time_ms": 1.0 if j["kind"] == "eager" else 0.5 + j["id"] / 100,
             "err": 1e-3, "device": "NVIDIA H100 80GB HBM3"} for j in jobs]


tune_mod.build_mod.build = stand_in_build
reg = Registry.open(url, seed=False)
reg.team.retry_s = 0.5
for m, n, k in shapes:
    w = GemmWorkload(m, n, k, policy="bf16")
    current = w.key("sm90a", "h100").digest()
    r = tune_mod.tune(w, registry=reg, runner=stand_in_timer, gpu="h100", max_candidates=4, progress=False)
    print(json.dumps({"digest": current, "from_registry": r.from_registry, "notes": r.notes}), flush=True)
if os.environ.get("HOST_SYNC") == "1":
    print("done", flush=True)
    sys.stdin.readline()   # every host is done: pull what the others tuned
    print("sync", json.dumps(reg.sync().as_dict()), flush=True)
reg.close()
"""


def start_host(url, home, log, shapes, name, *, slow=0.2, sync=True, ttl=3.0):
    env = {**os.environ, "FACTDB_HOME": str(home), "FACTDB_SEED": "", "FACTDB_LEASE_TTL": str(ttl),
           "HOST_SLOW_S": str(slow), "HOST_SYNC": "1" if sync else "0", "PYTHONPATH": str(ROOT)}
    env.pop("FACTDB_CACHE", None)
    env.pop("FACTDB_DB", None)
    p = subprocess.Popen([sys.executable, "-c", HOST, url, name, str(log), json.dumps(shapes)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    p.lines = []
    p.reader = threading.Thread(target=lambda: p.lines.extend(iter(p.stdout.readline, "")), daemon=True)
    p.reader.start()
    return p


def release(hosts, timeout=300):
    """Wait until every host has tuned its list, then let them all sync."""
    deadline = time.monotonic() + timeout
    for p in hosts:
        while "done\n" not in p.lines:
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:]
            time.sleep(0.05)
    for p in hosts:
        p.stdin.write("go\n")
        p.stdin.flush()


def finish(p, timeout=300):
    if p.stdin:
        p.stdin.close()
    try:
        err = p.stderr.read() if p.wait(timeout) is not None else ""
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    p.reader.join(10)
    assert p.returncode == 0, err[-3000:]
    return [json.loads(line) for line in p.lines if line.startswith("{")], err


def tuned(log) -> collections.Counter:
    return collections.Counter(line.split()[1] for line in Path(log).read_text().splitlines())


def server(url):
    return Registry.open(url, seed=False, cache=False)


def counts(url) -> dict:
    with server(url) as reg, reg.transaction(write=False) as conn:
        q = lambda sql: conn.execute(sa.text(sql)).scalar()  # noqa: E731
        return {"kernels": q("select count(*) from kernels"), "digests": q("select count(distinct digest) from kernels"),
                "trials": q("select count(*) from trials"), "trial_ids": q("select count(distinct id) from trials"),
                "leases": q("select count(*) from leases")}


def cache_digests(home) -> set:
    import duckdb
    (path,) = (Path(home) / "cache").glob("registry-*.duckdb")
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("select digest from kernels").fetchall()}
    finally:
        con.close()


def digests(shapes) -> set:
    from fact_db.kernels.gemm.tune import with_rule
    from fact_db.kernels.gemm.workload import GemmWorkload
    return {with_rule(GemmWorkload(*s, policy="bf16")).key("sm90a", "h100").digest() for s in shapes}


def test_four_hosts_tune_twelve_workloads_each_exactly_once(pg, tmp_path):
    url = pg.new_schema()
    server(url).close()   # migrated once here, so the hosts' start-up is not part of the race
    log = tmp_path / "tuned.log"
    log.touch()
    # host h tunes 9 of the 12, starting at 3h: every workload is wanted by three hosts
    plans = [[SHAPES[(3 * h + j) % 12] for j in range(9)] for h in range(4)]
    hosts = [start_host(url, tmp_path / f"home{h}", log, plans[h], f"host{h}") for h in range(4)]
    release(hosts)
    outs = [finish(p)[0] for p in hosts]
    times = tuned(log)
    assert set(times) == digests(SHAPES) and set(times.values()) == {1}, times       # each timed exactly once
    c = counts(url)
    per_tune = c["trials"] // 12
    assert c["kernels"] == c["digests"] == 12 and c["trials"] == c["trial_ids"] == 12 * per_tune and per_tune >= 2
    assert c["leases"] == 0
    for h, out in enumerate(outs):
        assert len(out) == 9
        assert sum(not o["from_registry"] for o in out) == sum(1 for line in log.read_text().splitlines()
                                                                if line.startswith(f"host{h} "))
        assert cache_digests(tmp_path / f"home{h}") == digests(SHAPES)             # all 12 rows on every host


def test_a_host_killed_holding_a_lease_is_taken_over_after_it_expires(pg, tmp_path):
    url = pg.new_schema()
    server(url).close()
    log = tmp_path / "tuned.log"
    log.touch()
    shape = [SHAPES[0]]
    a = start_host(url, tmp_path / "home-a", log, shape, "a", slow=120, ttl=2.0, sync=False)
    deadline = time.monotonic() + 180
    while not any(line.startswith("tuning") for line in a.lines):
        assert a.poll() is None and time.monotonic() < deadline, a.stderr.read()[-3000:]
        time.sleep(0.1)
    b = start_host(url, tmp_path / "home-b", log, shape, "b", slow=0.2, ttl=2.0, sync=False)
    while not (tmp_path / "home-b" / "cache").is_dir():     # b is up and about to claim the workload a holds
        assert b.poll() is None and time.monotonic() < deadline, b.stderr.read()[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)
    with server(url) as reg:
        (held,) = reg.leases.held()
    assert held["pid"] == a.pid
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    t_kill = time.monotonic()
    (out,), _ = finish(b)
    took = time.monotonic() - t_kill
    assert not out["from_registry"]
    assert any(n.startswith(f"took over the lease of {held['holder']}") for n in out["notes"]), out["notes"]
    assert took < 60
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["a", "b"]   # a never finished
    c = counts(url)
    assert c["kernels"] == 1 and c["trials"] == c["trial_ids"] and c["leases"] == 0
    with server(url) as reg:
        trials = reg.trials(next(iter(digests(shape))))
    assert len(trials) == c["trials"] and len({t.config_hash for t in trials}) == len(trials)  # b's, once each


def test_the_server_stopped_mid_run_then_sync_leaves_every_row_once(own_pg, tmp_path):
    url = own_pg.new_schema()
    server(url).close()
    log = tmp_path / "tuned.log"
    log.touch()
    homes = [tmp_path / f"home{h}" for h in range(3)]
    plans = [SHAPES[4 * h:] + SHAPES[:4 * h] for h in range(3)]   # all 12 each, starting apart
    hosts = [start_host(url, homes[h], log, plans[h], f"host{h}", slow=0.4, sync=False, ttl=2.0)
             for h in range(3)]
    deadline = time.monotonic() + 240
    while sum(1 for _ in log.read_text().splitlines()) < 3:
        assert all(p.poll() is None for p in hosts) and time.monotonic() < deadline
        time.sleep(0.05)
    own_pg.stop()
    errs = [finish(p)[1] for p in hosts]
    for err in errs:   # each host said once that it works from its cache
        assert err.count("ServerOfflineWarning") == 1 and "local cache" in err, err[-2000:]
    own_pg.restart()
    for home in homes:
        env = {**os.environ, "FACTDB_HOME": str(home), "FACTDB_DB": url, "FACTDB_SEED": "", "PYTHONPATH": str(ROOT)}
        env.pop("FACTDB_CACHE", None)
        r = subprocess.run([sys.executable, "-c", "from fact_db.cli.main import main; main()", "registry", "sync"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0 and "pushed" in r.stdout, r.stderr[-2000:]
    c = counts(url)
    timed = sum(tuned(log).values())
    assert c["kernels"] == c["digests"] == 12
    per_tune = c["trials"] // timed
    assert c["trials"] == c["trial_ids"] == timed * per_tune                   # every trial of every tune, once
    assert timed >= 12
    for home in homes:
        assert cache_digests(home) == digests(SHAPES)
