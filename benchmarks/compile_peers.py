"""fact-db against torch.compile, in one process on one GPU, for one problem file: eager at the
policy, torch.compile (default and max-autotune-no-cudagraphs, and reduce-overhead where
fact-db's module replays a CUDA graph), the module `fact_db.optimize` returns, and
`torch.compile(model, backend="factdb")` (after optimize, so the registry holds the kernels
it tuned; and in max-autotune-no-cudagraphs mode where that is a peer, and reduce-overhead
where fact-db's module replays a CUDA graph, as like with like against its choice), and at
fp32 PyTorch's default (cuDNN on TF32). Per variant: time (median of seven rounds, each variant
in a block of its runs), error against the float64 model, peak and held memory, compile time
(the first call here, and for torch.compile and the backend also `compile_cold_s`: each from
nothing in a fresh process, as like with like). The torch.compile peers are the modules
optimize's choice compiled (one compile a mode; a mode it did not compile is compiled here).
Run on an H100/H200:

    python benchmarks/compile_peers.py benchmarks/problems/hf_llama_decoder_4x2048.py --policy bf16
    python benchmarks/compile_peers.py benchmarks/problems/relu_self_attention.py --policy fp32 \\
        --out benchmarks/results/h100-DATE-compile-peers-relu_self_attention-fp32.json

Writes a results JSON with device, date, commit and torch version (default:
benchmarks/results/<gpu>-<date>-compile-peers-<problem>-<policy>.json).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from datetime import date, datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# Seven rounds, not three: the 2026-11-29 Llama decoder at bf16 timed one compiled module, as the
# peer and again as its own variant, at 1.46-1.55 ms a round (medians of three 1.501 and 1.538),
# so a median of three rounds could not tell 0.98x from 1.00x at that size.
ROUNDS = 7


def lent_candidate(fast, name: str):
    """The candidate `name` of fast's choice where it holds a compiled module that verified or
    was timed (choice.Candidate), else None."""
    choice = getattr(getattr(fast, "report", None), "choice", None)
    c = choice.candidate(name) if choice is not None else None
    return c if c is not None and c.compiled is not None and c.compile_s is not None else None


def _variants(model_p, fast, policy: str, peers: tuple, with_reduce_overhead: bool, registry) -> list:
    """(name, make) per variant; make() -> the callable, taking inputs at the policy's dtype."""
    from fact_db.composition.module import run_at_policy

    def at_policy(m):
        return lambda *x: run_at_policy(m, policy, x)
    from fact_db.pipeline.measure import TF32_DEFAULT, pytorch_default
    out = [("eager", lambda: at_policy(model_p))]
    if policy == "fp32":  # what the user had: cuDNN on TF32, with its error (issue 27's honest fp32)
        out.append((TF32_DEFAULT, lambda: pytorch_default(model_p)))

    def peer(name, mode=None):
        # The choice's own torch.compile of the model in that mode, lent as pipeline/measure.py
        # lends it: one compile a mode, so the peer and a returned torch.compile are one module
        # (compiled twice, max-autotune timed 0.491 and 0.525 ms on llama_block at bf16), and a
        # row of a large model spends its minutes of GEMM autotuning once, not twice.
        c = lent_candidate(fast, name)
        return lambda: at_policy(c.compiled if c is not None else torch.compile(model_p, mode=mode))
    if "compile" in peers:
        out.append(("torch.compile", peer("torch.compile")))
    if "max-autotune" in peers:
        out.append(("torch.compile max-autotune-no-cudagraphs",
                    peer("torch.compile max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")))
    if with_reduce_overhead:  # fact-db replays a CUDA graph: compare with torch.compile's
        out.append(("torch.compile reduce-overhead",
                    lambda: (lambda c: lambda *x: run_at_policy(c, policy, x).clone())(
                        torch.compile(model_p, mode="reduce-overhead"))))
    out.append((f"fact-db ({fast.choice})", lambda: (lambda *x: fast(*x))))
    chosen = fast.report.choice.candidate(fast.choice) if fast.report.choice is not None else None
    if chosen is not None and chosen.run is not None:
        # what optimize's choice timed for it (the graph or compiled module called directly, not
        # through the returned module): the two differ only by the module's own call path
        out.append((f"fact-db ({fast.choice}), as the choice timed it", lambda: chosen.run))
    def backend(**mode):
        return lambda: at_policy(torch.compile(model_p, backend="factdb",
                                               options={"policy": policy, "registry": registry, **mode}))
    out.append(('torch.compile(backend="factdb")', backend()))
    if "max-autotune" in peers:  # like with like against optimize's choice under max-autotune
        out.append(('torch.compile(backend="factdb") max-autotune-no-cudagraphs',
                    backend(mode="max-autotune-no-cudagraphs")))
    if lent_candidate(fast, fast.choice) is not None and fast.choice in {n for n, _ in out}:
        # the returned module is a peer's own compile: that peer once more, at another place in
        # each round, so the rows show what two callables of one module differ by here (the
        # 2026-11-28 Llama decoder at bf16: the returned module and the choice's runner of it
        # 4-6% behind the peer). tables.py counts it among the peers: the best of the two.
        out.append((f"{fast.choice}, timed again", peer(fast.choice)))
    if with_reduce_overhead:  # and against a choice that replays a CUDA graph (outputs cloned, as above)
        out.append(('torch.compile(backend="factdb") reduce-overhead',
                    lambda: (lambda c: lambda *x: run_at_policy(c, policy, x).clone())(
                        torch.compile(model_p, backend="factdb",
                                      options={"policy": policy, "registry": registry, "mode": "reduce-overhead"}))))
    return out


COLD = r"""
import json, sys, time, torch
from fact_db.composition.module import cast_floats, policy_dtype, run_at_policy
from fact_db.discovery.trace import load_problem
from fact_db.pipeline.run import at_policy
problem, policy, which, db, device = sys.argv[1:6]
prob = load_problem(problem)
torch.manual_seed(0)
with torch.device(device):
    model = prob.make_model().eval()
    x = tuple(prob.make_inputs())
model_p = at_policy(model, policy)
dt = policy_dtype(policy)
x = cast_floats(x, dt) if dt else x
if device == "cuda":
    torch.cuda.synchronize()
# From the torch.compile call on, for both: plain torch.compile imports Inductor when it is
# called (1.7 s on a 2-core CPU), the backend at its first graph. Timed from the first call
# alone (before 2026-11-29), torch.compile's import fell outside its time and inside the backend's.
prof = None
if len(sys.argv) > 6 and sys.argv[6]:  # where the timed block's profile goes (backend_cold.py --profile)
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
import gc
gcs = []  # (generation, seconds) of each collection in the timed block
def _gc(phase, info, _t=[0.0]):
    if phase == "start":
        _t[0] = time.perf_counter()
    else:
        gcs.append((info["generation"], time.perf_counter() - _t[0]))
gc.callbacks.append(_gc)
marks = {}  # seconds of each step of the timed block, in order
t = last = time.perf_counter()
def mark(name):
    global last
    now = time.perf_counter()
    marks[name] = now - last
    last = now
if which == "factdb":  # as a user would: the registry named (default: $FACTDB_HOME's), opened by the backend
    from fact_db.pipeline import backend as fb
    fb.register()
    mark("import fact-db's backend")
    c = torch.compile(model_p, backend="factdb", options={"policy": policy, "registry": db or None})
else:
    c = torch.compile(model_p)
mark("the torch.compile call")
with torch.no_grad():
    run_at_policy(c, policy, x)
if device == "cuda":
    torch.cuda.synchronize()
mark("the first call")
out = {"compile_s": time.perf_counter() - t, "marks_s": marks,
       "gc_s": {f"gen{g}": sum(s for gg, s in gcs if gg == g) for g in sorted({g for g, _ in gcs})}}
gc.callbacks.remove(_gc)
if prof is not None:
    prof.disable()
    prof.dump_stats(sys.argv[6])
    import io, pstats
    text = io.StringIO()
    pstats.Stats(sys.argv[6], stream=text).sort_stats("cumulative").print_stats(60)
    pstats.Stats(sys.argv[6], stream=text).sort_stats("tottime").print_stats(40)
    open(sys.argv[6] + ".txt", "w").write(text.getvalue())
if which == "factdb":  # where the backend's time went, per graph and phase; the kernels it put in
    out["phases_s"] = [g.seconds for g in fb.report().graphs]
    out["kernels"] = sum(len(g.kernels) for g in fb.report().graphs)
print(json.dumps(out))
"""


def cold_compile_s(problem: str, policy: str, which: str, db: str | None = None, device: str = "cuda",
                   profile: str = "") -> dict:
    """torch.compile(model) (`which` "inductor") or torch.compile(model, backend="factdb")
    (`which` "factdb": the registry's kernels, none tuned), from the torch.compile call through
    the end of the first call, in a fresh process with empty Inductor and Triton caches: both
    compile from nothing, where in this process torch.compile's graph was already in Inductor's
    cache from optimize's choice, and the backend's was not. {"compile_s"} (the backend's also
    "phases_s" and "kernels"; both "marks_s", the seconds of each step, and "gc_s", the garbage
    collector's by generation) or {"error"}. `profile`: a path for cProfile's statistics of the
    timed block (and PATH.txt, the top 60 by cumulative time and 40 by own time); profiling slows
    what it times."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="factdb-cold-") as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton",
               "PYTHONPATH": os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)}
        r = subprocess.run([sys.executable, "-c", COLD, problem, policy, which, db or "", device, profile],
                           env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem")
    ap.add_argument("--policy", default="bf16")
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--budget", type=float, default=None, help="minutes of tuning")
    ap.add_argument("--db", default=None, help="registry URL (default: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb)")
    ap.add_argument("--max-held", default="eager", help="optimize's held-memory bound: eager, none, or MiB")
    ap.add_argument("--peers", default="compile,max-autotune",
                    help="torch.compile modes timed, and offered to optimize's choice: compile, max-autotune")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compile_peers.py times on a GPU (H100/H200); none is visible")
    sys.path.insert(0, str(HERE))
    from _provenance import commit

    from fact_db.composition.module import cast_floats, policy_dtype
    from fact_db.core.environment import device_info, toolchain_info
    from fact_db.discovery.trace import load_problem
    from fact_db.kernels.bench import held_mib, peak_mib, timer_of_many
    from fact_db.kernels.agreement import tree_err
    from fact_db.pipeline import backend
    from fact_db.composition.module import GRAPHED
    from fact_db.pipeline.run import at_policy, optimize
    from fact_db.store.registry import Registry
    backend.register()
    registry = Registry.open(a.db)
    problem = load_problem(a.problem)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = problem.make_model().eval()
        sets = [tuple(problem.make_inputs()) for _ in range(3)]
    max_held = None if a.max_held == "none" else a.max_held if a.max_held == "eager" else float(a.max_held)
    peers = tuple(p for p in a.peers.split(",") if p)

    def make_inputs():
        with torch.device("cuda"):
            return problem.make_inputs()
    t0 = time.perf_counter()
    fast = optimize(model, sets[0], policy=a.policy, registry=registry, max_candidates=a.max_candidates,
                    budget=a.budget, bench=False, save=False, make_inputs=make_inputs, name=problem.name,
                    max_held=max_held, progress=True, peers=peers)
    optimize_s = time.perf_counter() - t0
    model_p = at_policy(model, a.policy)
    dt = policy_dtype(a.policy)
    sets_p = [cast_floats(x, dt) for x in sets] if dt else sets
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in sets[0]])
    rows, fns = [], []
    # like with like: torch.compile's CUDA-graph mode wherever the returned module replays a graph
    # (also "composed + torch.compile, CUDA graph": the 2026-11-28 Llama fp32 row lacked the peer)
    graphs = fast.choice.endswith(GRAPHED)
    for name, make in _variants(model_p, fast, a.policy, peers, graphs, registry):
        row = {"name": name, "ms": None, "err": None, "peak_mib": None, "held_mib": None, "compile_s": None,
               "round_ms": [], "note": ""}
        try:
            with torch.no_grad():
                fn = make()
                t1 = time.perf_counter()
                row["held_mib"] = held_mib(lambda: fn(*sets_p[0]))  # the first call: compiles, captures
                row["compile_s"] = time.perf_counter() - t1
                if name.startswith("fact-db"):  # warmed by optimize already: what its choice measured
                    row["held_mib"] = fast.report.choice.candidate(fast.choice).held_mib
                    row["compile_s"] = fast.report.choice.candidate(fast.choice).compile_s
                elif (lent := lent_candidate(fast, name)) is not None:  # the choice's own compile of it (peer())
                    row["held_mib"], row["compile_s"] = lent.held_mib, lent.compile_s
                    row["note"] = "compiled once, by optimize's choice (its compile_s and held_mib)"
                out = fn(*sets_p[0])
                row["err"] = tree_err(cast_floats(out, torch.float64), ref)
                row["peak_mib"] = peak_mib(lambda: fn(*sets_p[0])) + row["held_mib"]
            fns.append((row, fn))
        except Exception as e:  # noqa: BLE001  (a variant that fails is a row with its error)
            row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(row)
    with torch.no_grad():
        many = timer_of_many()
        for _ in range(ROUNDS):  # each variant in a block of its runs from an idle GPU, as optimize's choice times
            times = many([fn for _, fn in fns], sets_p)
            for (row, _), t in zip(fns, times):
                row["round_ms"].append(t.median_ms)
    for row, _ in fns:
        row["ms"] = statistics.median(row["round_ms"])
    # compile times like with like: torch.compile and the backend each from nothing, in a fresh
    # process (the first-call times above are warm for torch.compile: optimize's choice compiled it)
    for row in rows:
        which = "inductor" if row["name"] == "torch.compile" else \
            "factdb" if row["name"] == 'torch.compile(backend="factdb")' else None
        if which:
            got = cold_compile_s(a.problem, a.policy, which, a.db)
            row["compile_cold_s"] = got.get("compile_s")
            if got.get("phases_s"):
                row["compile_cold_phases_s"] = got["phases_s"]
            if "error" in got:
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"cold compile: {got['error']}"
    eager = rows[0]["ms"]
    for row in rows:
        row["speedup_vs_eager"] = eager / row["ms"] if eager and row["ms"] else None
    info = device_info(torch.device("cuda"))
    doc = {"problem": Path(a.problem).stem, "policy": a.policy, "device": info["name"], "gpu": info["gpu"],
           "date": date.today().isoformat(), "time": datetime.now(timezone.utc).strftime("%H:%M:%SZ"),
           "commit": commit(), "torch": torch.__version__, "compile_cold_from": "the torch.compile call",
           "toolchain": toolchain_info(), "optimize_s": optimize_s, "returned": fast.choice,
           "choice": fast.report.choice.as_dict() if fast.report.choice is not None else None,
           "variants": rows, "backend_report": str(backend.report()), "notes": fast.report.notes}
    out = Path(a.out) if a.out else HERE / "results" / \
        f"{info['gpu']}-{date.today().isoformat()}-compile-peers-{Path(a.problem).stem}-{a.policy}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    for row in rows:
        print(f"{row['name']:<45} {row['ms'] or float('nan'):9.3f} ms  err {row['err'] or float('nan'):.2e}  "
              f"held {row['held_mib'] or 0:8.1f} MiB  compile {row['compile_s'] or 0:6.1f} s  {row['note']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
