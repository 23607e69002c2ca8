"""The team registry against a real PostgreSQL server (tests/pg.py): the local cache in front of it,
the server going away and coming back, sync, leases, and what `registry status` shows.

Tests that stop the server start one of their own (`own_pg`); the rest share the session's.
"""
import json
import threading
import time
import warnings

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from test_registry import ENV, KW, make_key, make_rec

from fact_db.store import lease as lease_mod
from fact_db.store.registry import (
    Registry,
    RegistryError,
    ServerOfflineWarning,
    ServerUnreachable,
    TrialRecord,
)
from fact_db.store import shared as shared_mod

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _warn_again():
    shared_mod._WARNED.clear()   # "said once" is per process; each test starts afresh
    yield


def team(url, tmp_path, name="a", **kw) -> Registry:
    return Registry.open(url, seed=False, cache=tmp_path / f"{name}.duckdb", **kw)


def cache_rows(reg) -> dict:
    with reg.team.cache.begin(write=False) as conn:
        return dict(conn.execute(sa.text("select digest, time_ms from kernels")).all())


def server_count(url, table="kernels") -> int:
    with Registry.open(url, seed=False, cache=False) as srv, srv.transaction(write=False) as conn:
        return conn.execute(sa.text(f"select count(*) from {table}")).scalar()


def trial(m, i):
    return TrialRecord(key=make_key(m=m), template="gemm_sm90", config={"i": i}, status="timeout",
                       template_hash="aaaa", env=ENV)


# ---------------------------------------------------------------------------------------
# the cache in front of the server

def test_lookups_hit_the_cache_first_and_keep_what_the_server_answers(pg, tmp_path):
    url = pg.new_schema()
    with team(url, tmp_path, "a") as a, team(url, tmp_path, "b") as b:
        assert a.put(make_rec(make_key(m=256), time_ms=2.0), **KW) == "inserted"
        assert cache_rows(a) == {make_key(m=256).digest(): 2.0}          # written through
        assert cache_rows(b) == {}
        hit = b.lookup(make_key(m=256), **KW)                            # a miss here: the server answers
        assert hit.exact and hit.record.time_ms == 2.0
        assert cache_rows(b) == {make_key(m=256).digest(): 2.0}          # and the cache keeps it
        near = b.lookup(make_key(m=512), **KW)                           # the nearest shape, from the server
        assert near.record.key.m == 256 and not near.exact
        # a faster row from host A replaces the server's; B's cache still answers with its copy,
        # until a sync brings the server's
        assert a.put(make_rec(make_key(m=256), time_ms=1.0), **KW) == "replaced"
        assert b.lookup(make_key(m=256), **KW).record.time_ms == 2.0
        rep = b.sync()
        assert (rep.pushed, rep.pulled, rep.removed, rep.pending) == (0, 1, 0, 0)
        assert b.lookup(make_key(m=256), **KW).record.time_ms == 1.0
        # listing, counting and trials read the server: every host's rows
        b.add_trials([trial(256, 1)])
        assert len(a.trials(make_key(m=256))) == 1 and a.count() == 1
        assert [r.digest for r in b.rows()] == [make_key(m=256).digest()]


def test_a_server_that_goes_away_is_said_once_and_the_cache_serves(own_pg, tmp_path):
    url = own_pg.new_schema()
    with team(url, tmp_path) as reg:
        reg.team.retry_s = 0.0      # try the server at every call (the default waits 30 s)
        reg.put(make_rec(make_key(m=64)), **KW)
        own_pg.stop()
        with pytest.warns(ServerOfflineWarning) as seen:
            assert reg.lookup(make_key(m=64), **KW).exact                      # from the cache
            assert reg.put(make_rec(make_key(m=128)), **KW) == "inserted"      # kept for the server
            reg.add_trials([trial(128, i) for i in range(3)])
            assert reg.lookup(make_key(m=128), **KW).exact
            assert reg.count() == 2                                             # the cache's rows
            with reg.claim(make_key(m=192)) as c:                               # nothing to coordinate with
                assert c.held and not c.coordinated
        assert len(seen) == 1, [str(w.message) for w in seen]
        msg = str(seen[0].message)
        assert "unreachable" in msg and "local cache" in msg and "factdb registry sync" in msg
        assert "owner-s3cret" not in msg and "***" in msg
        st = reg.status()
        assert not st["reachable"] and (st["pending_kernels"], st["pending_trials"]) == (1, 3)
        with pytest.raises(ServerUnreachable):
            reg.sync()
        with pytest.raises(RegistryError, match="run it again when the server is back"):
            reg.revalidate(ENV, template_hashes=KW["template_hashes"])
        own_pg.restart()
        rep = reg.sync()
        assert (rep.pushed, rep.pushed_trials, rep.pending) == (1, 3, 0)
    assert server_count(url) == 2 and server_count(url, "trials") == 3


def test_a_push_repeated_stores_nothing_twice(own_pg, tmp_path):
    """A host that dies between the server's commit and emptying its queue pushes again: merged
    by key, trials it already has skipped."""
    url = own_pg.new_schema()
    with team(url, tmp_path) as reg:
        reg.team.retry_s = 0.0
        own_pg.stop()
        with pytest.warns(ServerOfflineWarning):
            reg.put_many([make_rec(make_key(m=64 * i)) for i in (1, 2, 3)], **KW)
            reg.add_trials([trial(64, i) for i in range(4)])
        with reg.team.cache.begin(write=False) as conn:
            queued = conn.execute(sa.text("select kind, id, queued_at from outbox")).all()
        assert len(queued) == 7
        own_pg.restart()
        assert reg.sync().pushed == 3
        with reg.team.cache.begin() as conn:   # the queue as it was before the push emptied it
            conn.execute(sa.text("insert into outbox values (:k, :i, :q)"),
                         [{"k": r.kind, "i": r.id, "q": r.queued_at} for r in queued])
        rep = reg.sync()
        assert (rep.pushed, rep.pushed_trials, rep.pending) == (3, 0, 0)
    assert server_count(url) == 3 and server_count(url, "trials") == 4


def test_opened_while_the_server_is_down_then_pushed_when_it_answers(own_pg, tmp_path):
    url = own_pg.new_schema()
    Registry.open(url, seed=False, cache=False).close()   # the schema exists; the server then goes away
    own_pg.stop()
    with pytest.warns(ServerOfflineWarning):
        reg = team(url, tmp_path)
    with reg:
        reg.team.retry_s = 0.0
        assert reg.lookup(make_key(), **KW) is None
        assert reg.put(make_rec(), **KW) == "inserted"
        own_pg.restart()
        assert reg.lookup(make_key(m=8), **KW) is None    # the server answers again: the queue goes first
        assert reg.status()["pending_kernels"] == 0
    assert server_count(url) == 1


def test_index_reads_the_servers_rows(pg, tmp_path):
    """`factdb index build` indexes what every host added (its documents come from the server)."""
    from fact_db.store.index.docs import kernel_docs
    url = pg.new_schema()
    with team(url, tmp_path, "a") as a, team(url, tmp_path, "b") as b:
        a.put(make_rec(make_key(m=4096)), **KW)
        assert cache_rows(b) == {}
        assert [d.id for d in kernel_docs(b)] == [make_key(m=4096).digest()]


# ---------------------------------------------------------------------------------------
# leases

def test_claims_wait_for_a_live_holder_and_take_over_an_expired_one(pg, tmp_path):
    url = pg.new_schema()
    a = Registry.open(url, seed=False, cache=False)
    b = Registry.open(url, seed=False, cache=False)
    a.leases.ttl = b.leases.ttl = 1.0
    key = make_key(m=1024)
    try:
        with a.claim(key) as ca:
            assert ca.held and ca.coordinated
            with a.claim(key) as again:                     # re-entrant in one process
                assert again.held
            with b.claim(key, wait=False) as cb:
                assert not cb.held and cb.holder == a.leases.holder
            time.sleep(1.5)                                 # past one TTL: the heartbeat keeps it
            with b.claim(key, wait=False) as cb:
                assert not cb.held
            got = {}

            def wait_in_b():
                with b.claim(key) as c:
                    got["claim"] = c
            t = threading.Thread(target=wait_in_b)
            t.start()
            time.sleep(0.6)
            assert "claim" not in got
        t.join(10)
        assert got["claim"].held and got["claim"].waited_s >= 0.5 and not got["claim"].took_over
        assert "waited" in got["claim"].notes()[0]
        assert a.leases.held() == []                        # released on leaving the blocks
        # a holder that stops renewing (killed: here, a lease row nobody renews) is taken over after its TTL
        with a.transaction() as conn:
            conn.execute(sa.text("insert into leases values (:d, 'gemm', '{}', 'gone:1:x', 'gone', 1, "
                                 "clock_timestamp(), clock_timestamp() + interval '1 second')"),
                         {"d": key.digest()})
        t0 = time.monotonic()
        with b.claim(key) as c:
            assert c.held and c.took_over == "gone:1:x" and 0.5 < time.monotonic() - t0 < 10
            assert "took over the lease of gone:1:x" in c.notes()[0]
    finally:
        a.close()
        b.close()


def _as_hosts(regs, work) -> None:
    """Run work(h) for every registry of `regs` at once, each in a thread named host<h> (a
    "host"), then close the registries."""
    try:
        threads = [threading.Thread(target=work, args=(h,), name=f"host{h}") for h in range(len(regs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for r in regs:
            r.close()


def test_each_divides_a_list_between_hosts(pg, tmp_path):
    url = pg.new_schema()
    regs = [Registry.open(url, seed=False, cache=False) for _ in range(2)]
    items = list(range(8))
    done: dict[int, list] = {0: [], 1: []}

    def work(h):
        for i in lease_mod.each(items, lambda i: make_key(m=64 * (i + 1)), regs[h].claim, poll_s=0.05):
            if any(i in d for d in done.values()):
                continue   # the other host did it while this one came back to it
            done[h].append(i)
            time.sleep(0.15)
    _as_hosts(regs, work)
    assert sorted(done[0] + done[1]) == items
    assert done[0] and done[1], done


def test_groups_take_a_few_keys_at_a_time_and_divide_a_list_between_hosts(pg, tmp_path):
    """lease.groups: each host holds up to `size` keys at once; an item of a key its group holds
    already rides along, and one that needs no lease never waits."""
    url = pg.new_schema()
    regs = [Registry.open(url, seed=False, cache=False) for _ in range(2)]
    items = [0, 1, 2, 3, 2, 4, 5, "free", 6, 7]        # 2 twice: one key; "free" needs no lease
    key_of = (lambda i: None if i == "free" else make_key(m=64 * (i + 1)))
    got: dict[int, list] = {0: [], 1: []}
    holding: list = []

    def work(h):
        for group in lease_mod.groups(items, key_of, regs[h].claim, 2, poll_s=0.05):
            keys = {key_of(i).digest() for i in group if i != "free"}
            held = {r["digest"] for r in regs[h].leases.held() if r["holder"] == regs[h].leases.holder}
            holding.append((len(keys), keys <= held))
            new = [i for i in group if not any(i in g for d in got.values() for g in d)]
            if new:     # what the other host did already comes back here, and is found done
                got[h].append(new)
                time.sleep(0.2)
    _as_hosts(regs, work)
    flat = [i for h in (0, 1) for g in got[h] for i in g]
    assert sorted(map(str, flat)) == sorted(map(str, items))          # every item once, none lost
    assert all(n <= 2 and held for n, held in holding), holding      # two keys a group, all held meanwhile
    assert got[0] and got[1], got
    assert any(g.count(2) == 2 for h in (0, 1) for g in got[h])        # the repeated key went with its group
    with pytest.raises(ValueError, match="groups of 0"):
        next(lease_mod.groups(items, key_of, regs[0].claim, 0))


class _FourNorms(__import__("torch").nn.Module):
    """Four LayerNorms of four widths: four norm workloads."""

    def __init__(self):
        import torch
        super().__init__()
        self.lns = torch.nn.ModuleList(torch.nn.LayerNorm(n) for n in (32, 48, 64, 80))

    def forward(self, a, b, c, d):
        import torch
        return tuple(torch.tanh(ln(x)) for ln, x in zip(self.lns, (a, b, c, d)))


def test_team_hosts_take_regions_a_few_at_a_time_and_build_each_few_in_one_batch(pg, tmp_path, monkeypatch):
    """realize_regions on a team registry: each host claims claim_size() workloads at once and
    compiles their candidates in one batch before tuning them (a host taking one at a time
    compiled three candidates on eight cores); every workload is built and tuned once in all."""
    import torch
    from test_norm import _analyse, _standin_norm_impl
    from fact_db.kernels.norm import family as norm_family
    from fact_db.kernels.norm import tune as norm_tune
    from fact_db.realization import realize as realize_mod
    shapes = [torch.randn(4, n) for n in (32, 48, 64, 80)]
    rep = _analyse(_FourNorms().eval(), *shapes)
    assert sum(r.rule == "layernorm" for r in rep.regions) == 4
    url = pg.new_schema()
    regs = [team(url, tmp_path, name=f"h{h}") for h in range(2)]
    batches, tuned, hows = [], [], {0: [], 1: []}
    lock = threading.Lock()
    monkeypatch.setattr(realize_mod, "claim_size", lambda max_candidates: 2)
    monkeypatch.setattr(norm_family, "prebuild",
                        lambda ws, ctx: (batches.append((threading.current_thread().name, list(ws))), set(ws))[1])

    def chooser(reg):
        def choose(w):
            hit = norm_tune.from_registry(w, reg, "sm90a", "h100")
            if hit is not None:
                return [hit], hit, "registry"
            with lock:
                tuned.append(w)
            time.sleep(0.3)
            trials = [norm_tune.NormTrial("eager", "ok", 0.05, 1e-7)]
            norm_tune.record(w, trials, reg, gpu="h100")
            return trials, trials[0], "tuned"
        return choose

    def host(h):
        out = realize_mod.realize_regions(rep, "fp32", registry=regs[h], gpu="h100", max_candidates=4,
                                          progress=False, norm_impl=_standin_norm_impl, norm_chooser=chooser(regs[h]))
        hows[h] = [z.how for z in out]
    _as_hosts(regs, host)
    assert sorted(w.width for w in tuned) == [32, 48, 64, 80], tuned      # each workload tuned once in all
    built = [w for _, ws in batches for w in ws]
    assert sorted(w.width for w in built) == [32, 48, 64, 80], batches    # built once, and only where tuned
    assert all(len(ws) <= 2 for _, ws in batches) and any(len(ws) == 2 for _, ws in batches), batches
    assert {name for name, _ in batches} == {"host0", "host1"}         # the two hosts divided them
    assert all(sorted(hows[h]) and set(hows[h]) <= {"tuned", "registry"} for h in (0, 1)), hows


def test_claims_are_no_ops_on_a_file_database(tmp_path):
    with Registry.open(str(tmp_path / "r.duckdb"), seed=False) as reg:
        assert not reg.coordinated
        with reg.claim(make_key()) as c, reg.claim(make_key()) as d:
            assert c.held and d.held and not c.coordinated and c.notes() == []
        with pytest.raises(RegistryError, match="not a team registry"):
            reg.sync()


# ---------------------------------------------------------------------------------------
# the CLI

def test_registry_status_and_sync_commands_mask_the_password(pg, tmp_path, monkeypatch):
    from fact_db.cli.main import cli
    url = pg.new_schema()
    monkeypatch.setenv("FACTDB_CACHE", str(tmp_path / "cli-cache.duckdb"))
    with team(url, tmp_path, "w") as w:
        w.put(make_rec(), **KW)
    runner = CliRunner()
    r = runner.invoke(cli, ["registry", "status", "--db", url])
    assert r.exit_code == 0, r.output
    assert "owner-s3cret" not in r.output and "factdb_owner:***@127.0.0.1" in r.output
    assert "reachable, 1 kernels" in r.output and "waiting for the server: 0 kernels, 0 trials" in r.output
    assert "0 built kernel(s) shared on the server; this host does not take part" in r.output
    r = runner.invoke(cli, ["registry", "status", "--db", url, "--json"], env={"FACTDB_SHARE_BINARIES": "1"})
    got = json.loads(r.output[r.output.index("{"):])
    assert (got["share_binaries"], got["shared_binaries"]) == (True, 0)
    r = runner.invoke(cli, ["registry", "sync", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["pulled"] == 1
    r = runner.invoke(cli, ["registry", "list", "--db", url])
    assert r.exit_code == 0 and make_key().digest() in r.output and "owner-s3cret" not in r.output
    bad = url.replace("owner-s3cret", "wrong-password")
    r = runner.invoke(cli, ["registry", "status", "--db", bad], env={"FACTDB_CACHE": "off"})
    assert r.exit_code != 0 and "wrong-password" not in r.output and "***" in r.output
    assert "password authentication failed" in r.output and len(r.output.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------
# built kernels shared through the server (opt-in: FACTDB_SHARE_BINARIES)

def test_built_kernels_are_shared_by_build_key_only_where_hosts_opt_in(pg, tmp_path, monkeypatch):
    """Two hosts tuning minGPT together each compiled the winner the other had tuned (50 s of nvcc
    each, of 169 s): with sharing on, a host's winner goes to the server and another host loads
    it. Off by default (the bytes are code every host runs); bytes that do not match their
    digest are never returned; a file registry shares nothing."""
    url = pg.new_schema()
    so = b"\x7fELF stand-in kernel"
    with team(url, tmp_path, "a") as a, team(url, tmp_path, "b") as b:
        monkeypatch.delenv("FACTDB_SHARE_BINARIES", raising=False)
        assert not a.shares_binaries() and a.put_binary("k" * 24, so, arch="sm90a") is False
        monkeypatch.setenv("FACTDB_SHARE_BINARIES", "1")
        assert a.shares_binaries() and b.get_binary("k" * 24) is None
        assert a.put_binary("k" * 24, so, arch="sm90a") is True
        assert b.put_binary("k" * 24, b"other bytes", arch="sm90a") is False   # the first build stays
        assert b.get_binary("k" * 24) == so
        with Registry.open(url, seed=False, cache=False) as srv, srv.transaction() as conn:
            conn.execute(sa.text("update kernel_binaries set data = :d where build_key = :k"),
                         {"d": b"tampered", "k": "k" * 24})
        assert b.get_binary("k" * 24) is None
        assert server_count(url, "kernel_binaries") == 1
    with Registry.open(f"duckdb:///{tmp_path / 'file.duckdb'}", seed=False) as local:
        assert not local.shares_binaries() and local.put_binary("k" * 24, so, arch="sm90a") is False


def test_a_registry_hit_loads_another_hosts_shared_kernel_without_nvcc(pg, tmp_path, monkeypatch):
    """The GEMM tuner on host B, given host A's row and A's shared build, puts the kernel in B's
    build cache and compiles nothing; the row's note says where the kernel came from."""
    from fact_db.kernels import build
    from fact_db.kernels.gemm import tune as tune_mod
    from fact_db.kernels.gemm.workload import GemmWorkload
    url = pg.new_schema()
    monkeypatch.setenv("FACTDB_SHARE_BINARIES", "1")
    w = GemmWorkload(256, 1024, 512, policy="bf16")
    ran = []

    def stand_in_timer(jobs):
        return [{"id": j["id"], "status": "ok", "time_ms": 1.0 if j["kind"] == "eager" else 0.5 + j["id"] / 100,
                 "err": 1e-3, "device": "NVIDIA H100 80GB HBM3"} for j in jobs]

    def stand_in_nvcc(sources, jobs=None, progress=True, **kw):   # host A "compiles": a file per kernel
        out = []
        for s in sources:
            ran.append(s)
            d = build.cache_dir() / build.content_key(s)
            d.mkdir(parents=True, exist_ok=True)
            (d / "kernel.so").write_bytes(b"\x7fELF " + build.content_key(s).encode())
            out.append(build.Built(s, build.content_key(s), d / "kernel.so"))
        return out
    monkeypatch.setattr(tune_mod.build_mod, "build", stand_in_nvcc)
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "host-a"))
    with team(url, tmp_path, "a") as a:
        won = tune_mod.tune(w, registry=a, runner=stand_in_timer, gpu="h100", max_candidates=3, progress=False)
    assert won.winner is not None and won.winner.candidate.template != "eager" and server_count(url, "kernel_binaries") == 1
    ran.clear()

    def no_nvcc(sources, jobs=None, progress=True, **kw):   # host B: every source must be in its cache
        for s in sources:
            ran.append(s)
        return [build.Built(s, build.content_key(s), build.cache_dir() / build.content_key(s) / "kernel.so",
                            cached=True) if (build.cache_dir() / build.content_key(s) / "kernel.so").is_file()
                else build.Built(s, build.content_key(s), None, error="nvcc ran") for s in sources]
    monkeypatch.setattr(tune_mod.build_mod, "build", no_nvcc)
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "host-b"))
    with team(url, tmp_path, "b") as b:
        hit = tune_mod.tune(w, registry=b, runner=stand_in_timer, gpu="h100", max_candidates=3, progress=False)
    assert hit.from_registry and not hit.registry_built
    assert any("its kernel from the team registry's shared binaries" in n for n in hit.notes), hit.notes
    key = build.content_key(ran[0])
    got = build.cache_dir() / key / "kernel.so"
    assert got.read_bytes() == b"\x7fELF " + key.encode()
    assert (build.cache_dir() / key / "command.txt").read_text() == build.FETCHED
