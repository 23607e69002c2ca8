"""Tune one attention workload: the SDPA backends that apply (flash, efficient, cudnn, math,
each its own candidate), the model's explicit form, and every family module's kernels
(fact_db/kernels/attention/fmha_sm90.py, fmha_fp32wg.py, fmha_fp32tc.py; the contract in FMHA_ABI). Each candidate is
verified against the float64 reference (AttentionWorkload.reference: the causal mask
included, so a kernel that ignores it fails) on zero-mean and all-positive inputs, then
timed; the fastest verified one wins. Kernels run in the worker subprocess the GEMM tuner
uses (fact_db/kernels/worker.py, job kind "attention"), so one that faults cannot take the caller down.

    >>> res = tune(AttentionWorkload(128, 8, 8, 512, 512, 96, 96, causal=True, policy="bf16"))
    >>> res.best.label, res.best.time_ms
"""
from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass, field

from fact_db.kernels.attention.workload import AttentionWorkload, backends_for
from fact_db.core.errors import FactError, first_line

# the candidate budget goes round-robin over them in this order (the wgmma fp32 family's guess
# before the mma.sync one's)
FAMILIES = ("fact_db.kernels.attention.fmha_sm90", "fact_db.kernels.attention.fmha_fp32wg",
            "fact_db.kernels.attention.fmha_fp32tc")
_INPUT_SETS = 3


@dataclass
class AttnCandidate:
    label: str
    kind: str                      # library | eager | kernel
    backend: str = ""              # library: flash | efficient | cudnn | math
    template: str = ""             # kernel: the family's TEMPLATE
    config: dict = field(default_factory=dict)
    source: object = None          # kernel: build.Source
    so: str = ""                   # kernel: the built library
    build_key: str = ""


@dataclass
class AttnTrial:
    label: str
    kind: str
    status: str                    # ok | verify_failed | launch_error | build_failed | crashed | timeout | skipped
    time_ms: float | None = None
    err: float | None = None
    eager_err: float | None = None
    error: str = ""
    template: str = ""
    config: dict = field(default_factory=dict)
    so: str = ""
    build_key: str = ""
    device: str = ""               # the GPU that verified and timed it (the worker's)


@dataclass
class AttnResult:
    workload: AttentionWorkload
    trials: list
    notes: list

    @property
    def best(self) -> AttnTrial | None:
        ok = [t for t in self.trials if t.status == "ok" and t.time_ms is not None]
        return min(ok, key=lambda t: t.time_ms) if ok else None

    def as_dict(self) -> dict:
        b = self.best
        return {"workload": self.workload.as_dict(), "best": asdict(b) if b else None,
                "trials": [asdict(t) for t in self.trials], "notes": list(self.notes)}


def families() -> list:
    """The family modules that are installed (a missing one is skipped)."""
    out = []
    for name in FAMILIES:
        try:
            out.append(importlib.import_module(name))
        except ImportError:
            continue
    return out


def candidates(w: AttentionWorkload, arch: str = "sm90a", max_candidates: int = 8,
               fams: list | None = None) -> tuple[list[AttnCandidate], list[str]]:
    """Library candidates (always) and the family kernels that apply, with a note per family
    that does not."""
    cands = [AttnCandidate("explicit", "eager"), AttnCandidate("sdpa", "library")]  # sdpa: PyTorch's own choice
    cands += [AttnCandidate(f"sdpa-{b}", "library", backend=b) for b in backends_for(w.dtype)]
    notes = []
    budget = max(0, max_candidates)
    lists = []   # (family, its configs, best guess first) of the families that apply
    for fam in (families() if fams is None else fams):
        why = fam.applies(w, arch)
        if why:
            notes.append(f"{fam.TEMPLATE}: {why}")
            continue
        lists.append((fam, fam.configs(w, budget)))
    # the budget round-robin: each family's best guess before any family's second (two fp32
    # families apply to the same workloads, and a small budget must not go to one alone)
    for i in range(max((len(cfgs) for _, cfgs in lists), default=0)):
        for fam, cfgs in lists:
            if i < len(cfgs) and budget > 0:
                cands.append(AttnCandidate(fam.label(cfgs[i]), "kernel", template=fam.TEMPLATE, config=cfgs[i],
                                           source=fam.source(w, cfgs[i])))
                budget -= 1
    return cands, notes


def build_all(cands: list[AttnCandidate], jobs: int | None = None, progress: bool = False) -> list[AttnTrial]:
    """Build every kernel candidate in one parallel batch; the trials of those that failed."""
    from fact_db.kernels import build
    ks = [c for c in cands if c.kind == "kernel"]
    if not ks:
        return []
    failed = []
    for c, b in zip(ks, build.build([c.source for c in ks], jobs=jobs, progress=progress)):
        if b.ok:
            c.so, c.build_key = str(b.path), b.key
        else:
            failed.append(AttnTrial(c.label, c.kind, "skipped" if b.deferred else "build_failed", error=b.error[:500],
                                    template=c.template, config=c.config))
    return failed


def job_for(c: AttnCandidate, w: AttentionWorkload, trials: int = 4, reps: int = 20) -> dict:
    return {"kind": "attention", "cand": c.kind, "backend": c.backend, "so": c.so, "template": c.template,
            "build_key": c.build_key, "workload": w.as_dict(), "trials": trials, "reps": reps}


def run_job(job: dict, cache: dict) -> dict:
    """Verify and time one attention candidate (in the worker process)."""
    import torch

    from fact_db.kernels.attention.workload import library_op
    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import bound_for, rel_err
    from fact_db.core.policy import policy_mode
    w = AttentionWorkload(**job["workload"])
    scale = w.softmax_scale
    if job["cand"] == "eager":
        fn = w.eager
    elif job["cand"] == "library" and not job["backend"]:
        from fact_db.kernels.attention.workload import sdpa
        fn = lambda x: sdpa(x["q"], x["k"], x["v"], scale, w.causal)  # noqa: E731
    elif job["cand"] == "library":
        op = library_op(job["backend"])
        fn = lambda x: op(x["q"], x["k"], x["v"], scale, w.causal)  # noqa: E731
    else:
        from fact_db.kernels.attention.kernel import AttentionKernel
        k = AttentionKernel(job["so"], job["template"], build_key=job.get("build_key", ""))
        fn = lambda x: k(x["q"], x["k"], x["v"], scale=scale, causal=w.causal)  # noqa: E731
    res = {"id": job.get("id"), "device": torch.cuda.get_device_name(),
           "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    err, eager_err = 0.0, 0.0
    try:
        for t in range(job.get("trials", 4)):
            dist = "randn" if t % 2 == 0 else "rand"
            gen = torch.Generator(device="cuda")
            gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1))
            x = w.make_inputs(dist, device="cuda", generator=gen)
            ref = w.reference(x)
            e_eager = rel_err(w.eager(x), ref)
            e_tf32 = rel_err(w.eager(x, policy="tf32"), ref) if w.policy == "tf32x3" else 0.0
            with policy_mode(w.policy):
                out = fn(x)
            torch.cuda.synchronize()
            e = rel_err(out, ref)
            err, eager_err = max(err, e) if e == e else float("nan"), max(eager_err, e_eager)
            bound = bound_for(w.policy, dist, e_eager, e_tf32)
            if not e <= bound:
                return {**res, "status": "verify_failed", "err": e, "eager_err": e_eager,
                        "error": f"trial {t} ({dist}): error {e:.3g} > bound {bound:.3g}"}
    except (RuntimeError, FactError) as e:  # a backend or kernel (KernelError) that refuses the problem
        msg = first_line(e, 300)
        if "CUDA error" in msg or "illegal" in msg.lower():
            raise
        return {**res, "status": "launch_error", "error": msg}
    wk = json.dumps(job["workload"], sort_keys=True)
    if cache.get("attn_key") != wk:
        cache.clear()
        torch.cuda.empty_cache()
        cache["attn_key"] = wk
        cache["attn_sets"] = [w.make_inputs("randn") for _ in range(_INPUT_SETS)]
    with policy_mode(w.policy):
        t = time_cuda(lambda x, out=None: fn(x), cache["attn_sets"], reps=job.get("reps", 20))
    return {**res, "status": "ok", "time_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
            "err": err, "eager_err": eager_err, "error": ""}


def evaluate(w: AttentionWorkload, cands: list[AttnCandidate], *, pool=None, gpus=None, trials: int = 4,
             reps: int = 20) -> list[AttnTrial]:
    """Run every built candidate in the worker pool; a trial per candidate."""
    from fact_db.kernels import pool as worker_pool
    runnable = [c for c in cands if c.kind != "kernel" or c.so]
    pool = pool or worker_pool.shared_pool(gpus)
    jobs = [{**job_for(c, w, trials, reps), "id": i} for i, c in enumerate(runnable)]
    out = []
    for c, r in zip(runnable, pool.run(jobs)):
        out.append(AttnTrial(c.label, c.kind, r.get("status", "crashed"), r.get("time_ms"), r.get("err"),
                             r.get("eager_err"), r.get("error", ""), c.template, c.config, c.so, c.build_key,
                             r.get("device", "")))
    return out


def tune(w: AttentionWorkload, *, arch: str = "sm90a", gpu: str | None = None, max_candidates: int = 8,
         jobs: int | None = None, pool=None, gpus=None, registry=None, force: bool = False, fams: list | None = None,
         progress: bool = False) -> AttnResult:
    """Registry first (unless `force`), else build, verify and time every candidate; the
    winner is written to `registry` when one is given. Rows are keyed by `gpu` (the current
    device's short name when None), so a winner timed on one GPU never serves another. With a
    team registry the workload is claimed while it is tuned (registry.claim)."""
    device_name = ""
    if registry is not None and gpu is None:
        from fact_db.kernels.abi import current_gpu
        gpu, device_name = current_gpu()
    if registry is not None and not force:
        hit = from_registry(w, registry, arch, gpu or "")
        if hit is not None:
            return AttnResult(w, [hit], ["registry hit"])
    if registry is None:
        return _search(w, arch, max_candidates, fams, jobs, progress, pool, gpus)
    with registry.claim(w.key(arch, gpu or "")) as claim:   # a team registry: one host tunes it at a time
        if claim.coordinated and not force:
            hit = from_registry(w, registry, arch, gpu or "")
            if hit is not None:
                return AttnResult(w, [hit], ["registry hit", *claim.notes()])
        res = _search(w, arch, max_candidates, fams, jobs, progress, pool, gpus)
        res.notes += claim.notes()
        if res.best is not None:
            record(w, res, registry, arch, gpu or "", device_name)
        return res


def _search(w: AttentionWorkload, arch, max_candidates, fams, jobs, progress, pool, gpus) -> AttnResult:
    cands, notes = candidates(w, arch, max_candidates, fams)
    failed = build_all(cands, jobs=jobs, progress=progress)
    return AttnResult(w, failed + evaluate(w, cands, pool=pool, gpus=gpus), notes)


def _template_of(t) -> str:
    """What a trial's row names as its template: the family template of a kernel, else its kind
    (`library`: an SDPA backend or SDPA itself; `eager`: the model's explicit form)."""
    return t.template if t.kind == "kernel" else t.kind


def from_registry(w: AttentionWorkload, registry, arch: str, gpu: str) -> AttnTrial | None:
    """The registry's current winner for exactly `w` on `gpu` as a trial, or None (absent, or
    stale: tuned in another environment, or its template changed since)."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None or hit.stale:
        return None
    rec = hit.record
    kind = rec.template if rec.template in ("library", "eager") else "kernel"
    return AttnTrial(rec.label, kind, "ok", time_ms=rec.time_ms, err=rec.rel_err,
                     template=rec.template if kind == "kernel" else "", config=dict(rec.config))


def record(w: AttentionWorkload, res: AttnResult, registry, arch: str, gpu: str, device_name: str = "") -> None:
    """The winner as the workload's registry row (merged: in one environment the faster row
    stays), every trial as a trial row, stamped with this environment (the worker's GPU)."""
    from fact_db.core import environment
    from fact_db.store.records import KernelRecord, TrialRecord
    env = environment.current()
    device = device_name or next((t.device for t in res.trials if getattr(t, "device", "")), "")
    if device:
        env = env.with_(gpu_sku=device)
    key, best = w.key(arch, gpu), res.best
    explicit = next((t for t in res.trials if t.label == "explicit" and t.status == "ok"), None)
    registry.put(KernelRecord(key=key, template=_template_of(best), label=best.label, config=dict(best.config or {}),
                              time_ms=best.time_ms, rel_err=best.err,
                              baseline="the model's explicit attention" if explicit else "",
                              baseline_ms=explicit.time_ms if explicit else None,
                              baseline_rel_err=explicit.err if explicit else None).stamped(env))
    registry.add_trials([TrialRecord(key=key, template=_template_of(t), config={**(t.config or {}), "label": t.label},
                                     status=t.status, time_ms=t.time_ms, rel_err=t.err,
                                     error=(t.error or "")[:2000]).stamped(env) for t in res.trials])
