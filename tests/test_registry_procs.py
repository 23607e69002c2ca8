"""Real processes on one registry file: concurrent writers, a writer killed mid-stream, a held lock."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_registry import ENV, TH, make_key, make_rec

from fact_db.store.registry import Registry, RegistryBusy

ROOT = Path(__file__).resolve().parent.parent

# Every test here starts child processes (writers holding one file): seconds each.
pytestmark = pytest.mark.subprocess

# Children load fact_db.store.registry without fact_db/__init__.py, which imports discovery and torch
# (seconds per process on the CI machine); the registry code they run is the same.
PRELUDE = f"""
import sys, types, time
pkg = types.ModuleType("fact_db"); pkg.__path__ = [{str(ROOT / "fact_db")!r}]; pkg.__version__ = "0.1.0"
sys.modules["fact_db"] = pkg
from fact_db.store.registry import Registry, KernelKey, KernelRecord
from fact_db.core.environment import Environment
ENV = Environment(cutlass="4.2.0.0", nvcc="13.0.88")
TH = {{"gemm_sm90": "aaaa"}}

def rec(gpu, m, time_ms):
    key = KernelKey(rule="gemm", arch="sm90a", gpu=gpu, dtype_in="float32", dtype_acc="float32",
                    dtype_out="float32", layout_a="row", layout_b="col", m=m, n=4096, k=4096, batch=1,
                    epilogue="none", policy="tf32")
    return KernelRecord(key=key, template="gemm_sm90", config={{"m": m}}, time_ms=time_ms, env=ENV,
                        template_hash="aaaa")
"""

WRITER = PRELUDE + """
path, gpu, n, shared_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
reg = Registry.open(path, timeout=120, seed=False, cache=False)
print("ready", flush=True)
sys.stdin.readline()  # start together
for i in range(n):
    reg.put(rec(gpu, 64 * (i + 1), 1.0), env=ENV, template_hashes=TH)
    # both writers also race on one shared key: the faster row must win
    if i % 5 == 0:
        reg.put(rec("h100", 8192, shared_ms + i / 1000), env=ENV, template_hashes=TH)
    print(rec(gpu, 64 * (i + 1), 1.0).digest, flush=True)
"""


def child(code, *args, **kw):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FACTDB_SEED": ""}, **kw)


@pytest.mark.parametrize("backend", ["duckdb", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_writer_processes_both_land(tmp_path, backend, request):
    path = tmp_path / f"shared.{backend}"
    url = request.getfixturevalue("pg").new_schema() if backend == "postgres" else f"{backend}:///{path}"
    Registry.open(url, seed=False).close()
    n = 20
    procs = [child(WRITER, url, "h100", n, 0.5), child(WRITER, url, "h200", n, 0.3)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    printed = [line for out, _ in outs for line in out.split() if len(line) == 16]
    assert len(printed) == 2 * n
    with Registry.open(url, seed=False, cache=False) as reg:
        digests = {r.digest for r in reg.rows()}
        assert set(printed) <= digests and len(digests) == 2 * n + 1    # + the shared key, once
        assert reg.get(make_key(m=8192)).time_ms == pytest.approx(0.3)  # the faster writer's first row


def test_writer_killed_mid_stream_loses_nothing_committed(tmp_path):
    path = tmp_path / "killed.duckdb"
    code = PRELUDE + """
reg = Registry.open(sys.argv[1], seed=False)
for i in range(100000):
    r = rec("h100", 8 * (i + 1), 1.0)
    reg.put(r, env=ENV, template_hashes=TH)
    print(r.digest, flush=True)
"""
    p = child(code, path)
    printed = []
    deadline = time.monotonic() + 120
    while len(printed) < 12 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        printed.append(line.strip())
    time.sleep(0.02)   # let it get into the next write
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert len(printed) >= 12, p.stderr.read()
    with Registry.open(str(path), seed=False) as reg:
        digests = {r.digest for r in reg.rows()}
        assert set(printed) <= digests
        assert len(digests) <= len(printed) + 1     # at most the one in flight, and only whole
        reg.put(make_rec(make_key(m=3)), env=ENV, template_hashes=TH)   # still writable
        assert reg.count() == len(digests) + 1


def test_a_writer_that_waits_too_long_says_who_holds_the_file(tmp_path):
    path = tmp_path / "held.duckdb"
    early = Registry.open(str(path), timeout=0.3, seed=False)   # opened before the lock is taken
    early.put(make_rec(), env=ENV, template_hashes=TH)
    holder = child("import duckdb, sys, time\nc = duckdb.connect(sys.argv[1])\nprint('locked', flush=True)\n"
                   "sys.stdin.readline()\nc.close()\nprint('released', flush=True)\n", path)
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        t = time.monotonic()
        with pytest.raises(RegistryBusy) as ei:
            Registry.open(str(path), timeout=0.5, seed=False)
        waited = time.monotonic() - t
        msg = str(ei.value)
        assert 0.5 <= waited < 5
        assert msg.startswith(f"registry {path} is busy: process {holder.pid} holds it and it stayed locked for 0.5 s")
        assert "FACTDB_DB_TIMEOUT" in msg and "timeout" in msg and "\n" not in msg
        # an operation on a registry opened earlier waits and fails the same way
        with pytest.raises(RegistryBusy, match=f"process {holder.pid} holds it .* for 0.3 s"):
            early.put(make_rec(make_key(m=64)), env=ENV, template_hashes=TH)
        with pytest.raises(RegistryBusy):
            early.lookup(make_key(), env=ENV, template_hashes=TH)   # readers wait for a writer too
        early.close()
        # a writer with enough patience gets in once the holder lets go
        holder.stdin.write("go\n")
        holder.stdin.flush()
        with Registry.open(str(path), timeout=30, seed=False) as reg:
            assert reg.put(make_rec(make_key(m=64)), env=ENV, template_hashes=TH) == "inserted"
            assert reg.count() == 2
    finally:
        holder.kill()
        holder.wait()
