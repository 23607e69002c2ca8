"""Tune a norm workload: the add_norm template's candidate parameters, verification of each
candidate (and eager) against the float64 reference, and timing, in the worker or in this
process; the winner written to the registry.

>>> cands = candidates(w)                     # [NormCandidate(...), ...]; eager is added by tune_norm
>>> res = tune_norm(w, cands)                 # builds, verifies against float64, times; best first
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from fact_db.kernels.norm.kernel import NormKernel
from fact_db.kernels.norm.workload import ABS_TOL, ELEMENT, ERR_FLOOR, TEMPLATE, TOLERANCE_FACTOR, NormWorkload

@dataclass(frozen=True)
class NormCandidate:
    """The template's tunable parameters for one workload."""

    threads: int
    vec: int
    rows_per_cta: int

    @property
    def label(self) -> str:
        return f"t{self.threads}v{self.vec}r{self.rows_per_cta}"


def params(w: NormWorkload, c: NormCandidate) -> dict:
    return {"kind": w.kind, "element": ELEMENT[w.dtype], "width": w.width, "threads": c.threads, "vec": c.vec,
            "rows_per_cta": c.rows_per_cta, "residual": w.residual, "write_sum": w.write_sum,
            "has_bias": w.kind == "layernorm" and w.has_bias}


def render(w: NormWorkload, c: NormCandidate) -> str:
    from fact_db.kernels import template
    return template.render(TEMPLATE, params(w, c))


MAX_THREADS = 1024           # per CTA, the template's limit
MAX_VALUES = 64              # of the row per thread, in registers
CTA_THREADS = (64, 512)      # the threads per CTA `candidates` tries
MAX_ROW_VALUES = CTA_THREADS[1] * MAX_VALUES  # the longest row any candidate holds


def valid(w: NormWorkload, c: NormCandidate) -> bool:
    """The template's static limits (see kernels_cpp/add_norm.cu.j2), checked before a build."""
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[w.dtype]
    if w.width % c.vec or c.vec * size > 16 or c.threads * c.rows_per_cta > MAX_THREADS:
        return False
    if not ((c.threads <= 32 and 32 % c.threads == 0) or c.threads % 32 == 0):
        return False
    items = -(-(w.width // c.vec) // c.threads)
    if items > MAX_VALUES or items * c.vec > MAX_VALUES:  # registers: at most 64 floats of the row per thread
        return False
    return (w.width // c.vec) >= c.threads // 2  # no thread group more than half idle


MAX_CANDIDATES = 12  # kernel candidates of one norm workload, at most


def candidates(w: NormWorkload, limit: int = MAX_CANDIDATES) -> list[NormCandidate]:
    """Widest vectors first, thread counts that leave each thread 1-8 vectors, rows per CTA so a
    CTA has 128-512 threads. At most `limit`, ordered by a simple preference (no model)."""
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[w.dtype]
    out = []
    for vec in (16 // size, 8 // size, 4 // size, 2 // size, 1):
        if vec < 1 or w.width % vec:
            continue
        for threads in (32, 64, 128, 256, 512, 1024, 16, 8):
            for rows in (1, 2, 4, 8, 16):
                c = NormCandidate(threads, vec, rows)
                if not valid(w, c) or not CTA_THREADS[0] <= threads * rows <= CTA_THREADS[1]:
                    continue
                out.append(c)
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    # Prefer few vectors per thread (1-4) and 128-256 thread CTAs.
    def score(c):
        items = -(-(w.width // c.vec) // c.threads)
        return (-c.vec, abs(items - 2), abs(c.threads * c.rows_per_cta - 256))
    return sorted(uniq, key=score)[:limit]


def build_candidates(w: NormWorkload, cands: list[NormCandidate], arch: str = "sm90a", jobs: int | None = None,
                     progress: bool = True) -> dict:
    """{candidate: Built} for every candidate, compiled in parallel (cached builds return at once)."""
    from fact_db.kernels import build
    sources = [build.Source(TEMPLATE, render(w, c), arch) for c in cands]
    return dict(zip(cands, build.build(sources, jobs=jobs, progress=progress)))


@dataclass
class NormTrial:
    label: str
    status: str               # ok | verify_failed | launch_error | build_failed | skipped (budget spent)
    time_ms: float | None = None
    err: float | None = None
    eager_err: float | None = None
    error: str = ""
    candidate: NormCandidate | None = None
    so: str = ""
    build_key: str = ""


def _err(out, ref) -> float:
    import torch
    o = out.to(torch.float64)
    if not torch.isfinite(o).all():
        return float("nan")
    den = torch.linalg.vector_norm(ref).item()
    return torch.linalg.vector_norm(o - ref).item() / (den if den > 0 else 1.0)


def verify(run, w: NormWorkload, trials: int = 4) -> tuple[bool, float, float, str]:
    """(ok, worst err, eager's err, reason): fresh rand and randn inputs each trial, outputs
    poisoned with NaN first, inputs checked unmodified; accepted when err <= 4 x eager's
    error (floor 1e-7), and for bf16/fp16 also <= 1e-2. y and s are both checked."""
    import torch
    worst, worst_eager = 0.0, 0.0
    for t in range(trials):
        dist = "rand" if t % 2 else "randn"
        inp = w.make_inputs(dist)
        saved = {k: v.clone() for k, v in inp.items()}
        ref_y, ref_s = w.reference(inp)
        ey, es = w.eager(inp)
        try:
            y, s = run(inp, poison=True)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            return False, float("nan"), worst_eager, f"launch failed: {e}"
        for k in inp:
            if not torch.equal(inp[k], saved[k]):
                return False, float("nan"), worst_eager, f"input {k} was modified"
        pairs = [(y, ey, ref_y, "y")] + ([(s, es, ref_s, "sum")] if w.write_sum else [])
        for out, eag, ref, what in pairs:
            if out is None:
                return False, float("nan"), worst_eager, f"no {what} output"
            err, e_err = _err(out, ref), _err(eag, ref)
            bound = TOLERANCE_FACTOR * max(e_err, ERR_FLOOR)
            if w.dtype in ABS_TOL:
                bound = min(bound, ABS_TOL[w.dtype]) if e_err <= ABS_TOL[w.dtype] else bound
            worst, worst_eager = max(worst, err), max(worst_eager, e_err)
            if not err <= bound:
                return False, err, e_err, f"{what} error {err:.3g} > bound {bound:.3g} ({dist}; eager {e_err:.3g})"
    return True, worst, worst_eager, ""


def _runner(w: NormWorkload, kernel: NormKernel | None):
    import torch

    def run(inp, poison=False):
        if kernel is None:
            return w.eager(inp)
        y = torch.full_like(inp["x"], float("nan")) if poison else None
        s = torch.full_like(inp["x"], float("nan")) if poison and w.write_sum else None
        return kernel(inp["x"], inp.get("r"), inp["weight"], inp.get("bias"), out=y, sum_out=s)
    return run


def evaluate_one(w: NormWorkload, so: str | None, trials: int = 4, reps: int = 30) -> dict:
    """Verify and time one candidate (`so` None: eager) in this process. A worker job runs this."""
    import torch
    from fact_db.kernels.bench import time_cuda
    kernel = NormKernel(so, w) if so else None
    run = _runner(w, kernel)
    ok, err, eager_err, reason = verify(run, w, trials)
    res = {"err": err, "eager_err": eager_err, "device": torch.cuda.get_device_name()}
    if not ok:
        return {**res, "status": "launch_error" if reason.startswith("launch failed") else "verify_failed",
                "error": reason}
    sets = [w.make_inputs("randn") for _ in range(3)]
    t = time_cuda(lambda inp: run(inp), sets, reps=reps)
    return {**res, "status": "ok", "time_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "error": ""}


def from_registry(w: NormWorkload, registry, arch: str = "sm90a", gpu: str = "h100") -> NormTrial | None:
    """The registry's current winner for exactly `w` as a NormTrial (candidate None when eager
    won), or None: absent, or stale (tuned in another environment, or the template changed)."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None or hit.stale:
        return None
    rec = hit.record
    cand = NormCandidate(**rec.config) if rec.template == TEMPLATE and rec.config else None
    return NormTrial(rec.label, "ok", rec.time_ms, rec.rel_err, candidate=cand)


def record(w: NormWorkload, trials: list[NormTrial], registry, arch: str = "sm90a", gpu: str = "h100",
           device_name: str = "") -> NormTrial | None:
    """Write the best ok trial of `trials` (eager included) as the workload's registry row, and
    every trial as a trial row, stamped with this environment (`device_name`: the worker's GPU);
    returns the best."""
    from fact_db.core import environment
    from fact_db.kernels.template import source_hash
    from fact_db.store.records import KernelRecord, TrialRecord
    best = next((t for t in trials if t.status == "ok"), None)
    if best is None:
        return None
    env = environment.current()
    if device_name:
        env = env.with_(gpu_sku=device_name)
    key = w.key(arch, gpu)
    eager = next((t for t in trials if t.label == "eager" and t.status == "ok"), None)
    template = lambda t: "eager" if t.candidate is None else TEMPLATE  # noqa: E731
    registry.put(KernelRecord(
        key=key, template=template(best), label=best.label,
        config=asdict(best.candidate) if best.candidate is not None else {}, time_ms=best.time_ms, rel_err=best.err,
        baseline="torch eager" if eager else "", baseline_ms=eager.time_ms if eager else None,
        baseline_rel_err=eager.err if eager else None,
        source_hash=source_hash(render(w, best.candidate)) if best.candidate is not None else "").stamped(env))
    registry.add_trials([TrialRecord(key=key, template=template(t),
                                     config={**(asdict(t.candidate) if t.candidate else {}), "label": t.label},
                                     status=t.status, time_ms=t.time_ms, rel_err=t.err,
                                     error=(t.error or "")[:2000]).stamped(env) for t in trials])
    return best


def tune_norm(w: NormWorkload, cands: list[NormCandidate] | None = None, *, arch: str = "sm90a",
              jobs: int | None = None, built: dict | None = None, in_process: bool = False,
              progress: bool = True, registry=None, gpu: str = "", device_name: str = "",
              gpus: list[int] | None = None) -> list[NormTrial]:
    """Build, verify and time every candidate and eager; trials best first (ok ones by time).

    Candidates run in the worker subprocess (fact_db.kernels.worker: a faulting kernel takes down only
    the worker) unless `in_process`. With `registry`, the winner is written there."""
    cands = candidates(w) if cands is None else cands
    built = built if built is not None else build_candidates(w, cands, arch=arch, jobs=jobs, progress=progress)
    trials: list[NormTrial] = []
    jobs_list = [("eager", None, None)]
    for c in cands:
        b = built[c]
        if not b.ok:  # past the tuning budget (deferred) is not a failure: tried on a later run
            trials.append(NormTrial(c.label, "skipped" if b.deferred else "build_failed", error=b.error, candidate=c))
            continue
        jobs_list.append((c.label, c, b))
    if in_process:
        results = [evaluate_one(w, str(b.path) if b else None) for _, _, b in jobs_list]
    else:
        from fact_db.kernels.pool import shared_pool
        pool = shared_pool(gpus)
        payload = [{"id": i, "kind": "norm", "so": str(b.path) if b else "", "workload": asdict(w)}
                   for i, (_, _, b) in enumerate(jobs_list)]
        results = pool.run(payload)
    for (label, c, b), r in zip(jobs_list, results):
        trials.append(NormTrial(label, r.get("status", "crashed"), r.get("time_ms"), r.get("err"), r.get("eager_err"),
                                r.get("error", ""), c, str(b.path) if b else "", b.key if b else ""))
    ok = sorted((t for t in trials if t.status == "ok"), key=lambda t: t.time_ms)
    trials = ok + [t for t in trials if t.status != "ok"]
    if registry is not None:
        device_name = device_name or next((r.get("device", "") for r in results if r.get("device")), "")
        record(w, trials, registry, arch, gpu, device_name)
    return trials
