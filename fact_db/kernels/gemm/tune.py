"""Tune: candidates from a rule's parameter space -> build -> verify -> time -> best,
with the eager/library implementation always one of the candidates, and every trial
written to the registry.

    result = tune(GemmWorkload(4096, 4096, 4096, policy="tf32"), registry=reg)
    result.winner.candidate.label, result.winner.time_ms, result.speedup

Candidates are pruned by the arch's limits before anything is compiled: shared memory
(at least three pipeline stages must fit), the accumulator register budget of a schedule
(cooperative: two consumer warpgroups share the tile; ping-pong: one owns it), TMA's
16-byte alignment, and schedule pairings (stream-K needs the cooperative schedule). A
simple cost model (waves over the SMs, padding waste, tile arithmetic intensity, the
roofline of the policy's math) ranks the rest; the best `max_candidates - 1` run, spread
over compiled configurations and over the tile scheduler's run-time options (raster order,
swizzle, split-K / stream-K decomposition), which share one build.

The registry is asked first: a verified, current row for the exact key is reused (its
kernel rebuilt from the build cache, so nothing compiles when the cache has it); configs
that failed before in the same environment are not tried again.
"""
from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass, field

from fact_db.kernels import build as build_mod, template
from fact_db.core import environment
from fact_db.core.errors import FactError
from fact_db.store.records import KernelRecord, TrialRecord, config_hash
from fact_db.core.device import DEVICES, EPILOGUE_SMEM, device
from fact_db.core.policy import ELEMENT_BYTES
from fact_db.kernels.abi import current_gpu  # noqa: F401  (tune() and the CLI ask it)
from fact_db.kernels.gemm.workload import GemmWorkload

# The sm90 limits candidates are pruned by (the device table's H100/H200 entry).
SM90 = {"sms": DEVICES["h100"].sms, "smem": DEVICES["h100"].smem, "epilogue_smem": EPILOGUE_SMEM}

# The rule a GEMM workload belongs to, by epilogue (and, for `none`, by shape).
RULE_FOR_EPILOGUE = {"bias": "gemm-bias", "bias_relu": "gemm-bias-relu", "bias_gelu": "gemm-bias-gelu",
                     "bias_gelu_tanh": "gemm-bias-gelu-tanh", "bias_silu": "gemm-bias-silu",
                     "residual": "gemm-residual"}
# Rule tuner names -> CUTLASS types.
SCHEDULES = template.SCHEDULES
OPTION_NAMES = ("raster", "swizzle", "splits", "decomposition")
DECOMPOSITION = {0: "heuristic", 1: "data-parallel", 2: "split-K", 3: "stream-K"}


class TuneError(FactError):
    """Tuning cannot start: no GPU, an unsupported policy or arch, or no candidate at all."""


def rule_for(w: GemmWorkload) -> str:
    if w.epilogue != "none":
        return RULE_FOR_EPILOGUE[w.epilogue]
    if w.batch > 1:
        return "batched-gemm"
    if w.k >= 8 * max(w.m, w.n) and w.m * w.n <= 1 << 20:
        return "gemm-large-k"
    return "gemm"


@dataclass
class Candidate:
    template: str              # kernels_cpp template, or "eager" for PyTorch's own path
    params: dict               # template parameters (empty for eager)
    options: tuple | None      # run-time scheduler options (raster, swizzle, splits, decomposition)
    arch: str
    predicted_ms: float
    label: str

    @property
    def config(self) -> dict:
        return {"template": self.template, "params": self.params, "options": list(self.options or ())}

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)


@dataclass
class Trial:
    candidate: Candidate
    status: str                # ok, compile_error, verify_failed, launch_error, timeout, crashed, skipped;
    #                            with --compile-only: built or cached
    time_ms: float | None = None
    err: float | None = None
    eager_err: float | None = None
    error: str = ""
    so: str = ""
    build_key: str = ""
    source_hash: str = ""
    device: str = ""
    gpu: str = ""              # the worker's CUDA_VISIBLE_DEVICES: which GPU verified and timed it

    def as_dict(self) -> dict:
        d = asdict(self)
        d["candidate"] = {**self.candidate.config, "label": self.candidate.label,
                          "predicted_ms": self.candidate.predicted_ms, "config_hash": self.candidate.config_hash}
        return d


@dataclass
class TuneResult:
    workload: GemmWorkload
    rule: str
    arch: str
    gpu: str
    winner: Trial | None
    eager: Trial | None
    trials: list = field(default_factory=list)
    from_registry: bool = False
    registry_built: bool = False   # a registry hit whose kernel was not in the build cache, built here
    notes: list = field(default_factory=list)
    compile_s: float = 0.0
    bench_s: float = 0.0

    @property
    def speedup(self) -> float | None:
        if self.winner and self.eager and self.winner.time_ms and self.eager.time_ms:
            return self.eager.time_ms / self.winner.time_ms
        return None

    def as_dict(self) -> dict:
        return {"workload": self.workload.as_dict(), "rule": self.rule, "arch": self.arch, "gpu": self.gpu,
                "from_registry": self.from_registry, "notes": self.notes,
                "winner": self.winner.as_dict() if self.winner else None,
                "eager": self.eager.as_dict() if self.eager else None,
                "speedup": self.speedup, "compile_s": self.compile_s, "bench_s": self.bench_s,
                "trials": [t.as_dict() for t in self.trials]}


# ------------------------------------------------------------------------------------------
# Candidates.

# The kernel families that serve each policy: (template, fixed parameters, share of the
# candidate budget). promote_depth is the K depth the tensor cores sum before an FADD
# promotion. fp32tc `split3` is offered under `fp32` too, promoted every 32 of K:
# verification keeps it only where its error stays within 4x of eager fp32's (on an H100 it
# measured below cuBLAS SGEMM's own: 4.0e-7 against 1.15e-6 at 4096^3). `presplit` makes
# split3's products with the lo parts written by a pass before the kernel: it is built for
# K-major operands (the raw operand serves as hi), and an MN-major one is copied to K-major on
# the way in (KernelBench L1-16 to L1-18, the transposed matmuls: the in-mainloop transpose of
# split3 cost a third, and cuBLAS SGEMM served them); where it yields no candidate the next
# family takes its share. `regsplit` makes the same products with A split in registers (RS
# wgmma) and only B's lo parts from the pass: no pass over A, which for a narrow GEMM (N = 768,
# minGPT's MLP-out) cost more than a quarter of presplit's time on an H100.
FAMILIES = {
    "bf16": [("gemm_sm90", {}, 1.0)],
    "fp16": [("gemm_sm90", {}, 1.0)],
    # promoted too: unpromoted, the tensor cores' truncating sums drift on all-positive inputs
    # (5.5e-5 at K = 8192 against eager tf32's 4.1e-6, measured on an H100)
    "tf32": [("gemm_fp32tc_sm90", {"transform": "round", "promote_depth": 256}, 1.0)],
    "tf32x3": [("gemm_fp32tc_sm90", {"transform": "regsplit", "promote_depth": 64}, 0.25),
               ("gemm_fp32tc_sm90", {"transform": "presplit", "promote_depth": 64}, 0.25),
               ("gemm_tf32x3_sm90", {}, 0.25),
               ("gemm_fp32tc_sm90", {"transform": "split3", "promote_depth": 64}, 0.25)],
    "fp32": [("gemm_fp32tc_sm90", {"transform": "regsplit", "promote_depth": 32}, 0.4),
             ("gemm_fp32tc_sm90", {"transform": "presplit", "promote_depth": 32}, 0.35),
             ("gemm_fp32tc_sm90", {"transform": "split3", "promote_depth": 32}, 0.25)],
}
FP32TC_TILE_K = (16, 32)
PASS_TRANSFORMS = ("presplit", "regsplit")  # built K-major, with a lo pass before the kernel


def predict_ms(w: GemmWorkload, tm: int, tn: int, schedule: str, scheduler: str, splits: int, gpu: str,
               tmpl: str = "gemm_sm90", transform: str = "") -> float:
    """A rough time for ranking: the policy's math peak, scaled by wave quantization, padding
    waste and the tile's arithmetic intensity, or the memory floor if that is larger, plus
    any pass before the kernel (fp32tc `presplit`'s and `regsplit`'s)."""
    dev = device(gpu)
    peaks = dev.tflops
    peak = peaks["bf16"] if w.dtype != "float32" else peaks["tf32"]
    split3 = w.policy in ("tf32x3", "fp32")
    flops = w.flops * (3 if split3 else 1)
    tiles_m, tiles_n = math.ceil(w.m / tm), math.ceil(w.n / tn)
    tiles = tiles_m * tiles_n * w.batch
    waste = (tiles_m * tm * tiles_n * tn) / (w.m * w.n)
    units = tiles * max(splits, 1)
    sms = SM90["sms"]
    if scheduler == "stream_k" and splits <= 1:
        util = 0.9  # stream-K spreads the K iterations of every tile over all SMs
    else:
        util = units / (math.ceil(units / sms) * sms)
    ai = tm * tn / (tm + tn)
    tile_eff = min(1.0, 0.55 + ai / 190) * (1.0 if schedule == "cooperative" else 0.97)
    if tmpl == "gemm_fp32tc_sm90" and transform not in PASS_TRANSFORMS:
        tile_eff *= 0.85  # the in-mainloop transform shares shared memory's bandwidth with the wgmma
    t_math = flops * waste / (peak * 1e12 * util * tile_eff)
    bw = dev.bandwidth
    nbytes = w.min_bytes
    if tmpl == "gemm_tf32x3_sm90":  # the split pass reads A and B once and writes them twice
        nbytes += 3 * 4 * (w.m * w.k + w.k * w.n) * w.batch
    if splits > 1:
        nbytes += 2 * 4 * w.m * w.n * w.batch * splits
    pre = 0.0
    if transform in PASS_TRANSFORMS:  # the lo pass reads A and B (regsplit: B) and writes their lo parts; the kernel reads those too
        operands = 4 * ((w.m * w.k if transform == "presplit" else 0) + w.k * w.n) * w.batch
        pre = 2 * operands / bw
        nbytes += operands
        # an MN-major operand is first copied to K-major (read and written once more)
        copied = 4 * w.batch * ((w.m * w.k if w.layout_a != "row" else 0) + (w.k * w.n if w.layout_b != "col" else 0))
        pre += 2 * copied / bw
    return (max(t_math, nbytes / bw) + pre) * 1e3 + 0.004


def kernel_layouts(w: GemmWorkload, tmpl: str, transform: str = "") -> tuple[str, str]:
    """The operand layouts a kernel is compiled for. TF32 wgmma reads only K-major operands:
    gemm_sm90 on float32 and gemm_fp32tc_sm90's `presplit` and `regsplit` (the raw operand is
    the hi part) are built row x col, and the other layouts are copied on the way in (GemmKernel._prepare:
    a cost the tuner times); gemm_tf32x3_sm90 transposes inside its split pass, and
    gemm_fp32tc_sm90's other transforms inside their mainloop."""
    if w.dtype == "float32" and (tmpl == "gemm_sm90" or (tmpl == "gemm_fp32tc_sm90" and transform in PASS_TRANSFORMS)):
        return "row", "col"
    return w.layout_a, w.layout_b


def _stage_bytes(w: GemmWorkload, tmpl: str, fixed: dict, tm: int, tn: int, tk: int, la: str, lb: str) -> int:
    """Shared memory one pipeline stage takes (the fp32tc mainloop keeps hi/lo copies beside the raw tile)."""
    eb = ELEMENT_BYTES[w.dtype]
    if tmpl != "gemm_fp32tc_sm90":
        return (tm + tn) * tk * eb
    split = fixed.get("transform") in ("split3", "presplit", "regsplit")
    a_lo = split and fixed.get("transform") != "regsplit"  # regsplit splits A in registers
    return 4 * tk * (tm * (1 + (la == "col") + a_lo) + tn * (1 + (lb == "row") + split))


def _sm90_configs(w: GemmWorkload, space: dict, gpu: str, tmpl: str,
                  fixed: dict | None = None) -> list[tuple[dict, float, str, str]]:
    fixed = fixed or {}
    eb = ELEMENT_BYTES[w.dtype]
    la, lb = kernel_layouts(w, tmpl, fixed.get("transform", ""))
    fp32tc = tmpl == "gemm_fp32tc_sm90"
    elem = "float" if fp32tc else template.CUTLASS_DTYPE[w.dtype]
    if fp32tc:
        tks = list(FP32TC_TILE_K)
    else:
        tks = sorted({int(t) for t in space.get("tile_k", [32, 64]) + [128 // eb] if int(t) * eb in (128, 256)})
    depth = int(fixed.get("promote_depth", 0))
    transform = fixed.get("transform", "")
    out = []
    for tm, tn, tk, cm, cn, ks, ts in itertools.product(
            space.get("tile_m", [128]), space.get("tile_n", [128]), tks, space.get("cluster_m", [1]),
            space.get("cluster_n", [1]), space.get("kernel_schedule", ["cooperative"]),
            space.get("tile_scheduler", ["persistent"])):
        tm, tn, tk, cm, cn = int(tm), int(tn), int(tk), int(cm), int(cn)
        if ks not in SCHEDULES or ts not in ("persistent", "stream_k"):
            continue
        if cm * cn > 2:
            continue
        if ks == "cooperative" and tm < 128:
            continue
        if ks == "pingpong" and (tm > 128 or ts == "stream_k"):
            continue
        threads = 256 if ks == "cooperative" else 128  # consumer threads holding one tile's accumulators
        acc_sets = 2 if fp32tc and depth else 1      # promotion keeps a second (temporary) accumulator
        if tm * tn / threads * acc_sets > 128:
            continue  # over the register budget: the accumulators would spill
        if 3 * _stage_bytes(w, tmpl, fixed, tm, tn, tk, la, lb) + SM90["epilogue_smem"] > SM90["smem"]:
            continue  # fewer than three pipeline stages would fit
        kernel_schedule, epilogue_schedule = SCHEDULES[ks]
        cls = template.GemmFp32TcParams if fp32tc else template.GemmSm90Params
        extra = {}
        if fp32tc:
            extra = {"transform": fixed["transform"], "promote_every": max(1, depth // tk) if depth else 0,
                     "hi_from_raw": bool(fixed.get("hi_from_raw", True))}
        params = asdict(cls(
            element_a=elem, element_b=elem,
            element_c=("float" if w.dtype == "float32" else elem) if w.epilogue == "residual" else "void",
            element_d="float" if w.dtype == "float32" else elem, element_bias="float" if w.dtype == "float32" else elem,
            element_accumulator="float",
            layout_a=template.LAYOUT[la], layout_b=template.LAYOUT[lb],
            tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=cn,
            kernel_schedule=kernel_schedule, epilogue_schedule=epilogue_schedule, stages="auto",
            tile_scheduler=ts, epilogue=w.epilogue, bias_axis=w.bias_axis, **extra))
        pred = predict_ms(w, tm, tn, ks, ts, 1, gpu, tmpl, transform)
        out.append((params, pred, ks, ts))
    return out


def _label(tmpl: str, p: dict, opts, copies: list[str]) -> str:
    s = (f"{p['tile_m']}x{p['tile_n']}x{p['tile_k']} c{p['cluster_m']}x{p['cluster_n']} "
         f"{'coop' if 'Cooperative' in p['kernel_schedule'] else 'pingpong'} {p['tile_scheduler']}")
    if tmpl == "gemm_fp32tc_sm90":
        s = f"{p['transform']}" + (f" promote/{p['promote_every']}" if p["promote_every"] else "") + " " + s
    elif tmpl == "gemm_tf32x3_sm90":
        s = "2-GEMM split-pass " + s
    if copies:
        s += f" +copy {'/'.join(copies)} to K-major"
    if opts:
        r, sw, sp, dec = opts
        extra = []
        if r:
            extra.append("raster-" + ("M" if r == 1 else "N"))
        if sw > 1:
            extra.append(f"swizzle{sw}")
        if dec:
            extra.append(DECOMPOSITION[dec] + (f"x{sp}" if dec == 2 else ""))
        if extra:
            s += " " + " ".join(extra)
    return s


def _family(w: GemmWorkload, space: dict, arch: str, gpu: str, tmpl: str, fixed: dict,
            budget: int) -> list[Candidate]:
    """Up to `budget` candidates of one template: distinct builds first, then run-time variants."""
    configs = sorted(_sm90_configs(w, space, gpu, tmpl, fixed), key=lambda c: c[1])
    if not configs or budget <= 0:
        return []
    la, lb = kernel_layouts(w, tmpl, fixed.get("transform", ""))
    copies = [name for name, have, want in (("A", w.layout_a, la), ("B", w.layout_b, lb)) if have != want]
    splits_space = [int(s) for s in space.get("splits", [2, 4, 8, 16])]
    transform = fixed.get("transform", "")
    # Distinct tile shapes (tile, schedule, scheduler), best predicted first, taken round-robin
    # over the (schedule, scheduler) groups so every pairing the rule allows is tried.
    by_shape: dict[tuple, list] = {}
    for params, pred, ks, ts in configs:
        by_shape.setdefault((params["tile_m"], params["tile_n"], params["tile_k"], ks, ts), []).append((params, pred))
    groups: dict[tuple, list] = {}
    for shape, items in by_shape.items():
        groups.setdefault(shape[3:], []).append((min(p for _, p in items), shape))
    queues = [sorted(v) for v in sorted(groups.values(), key=lambda v: min(v)[0])]
    n_shapes = max(1, min(6, budget // 3))
    shapes = []
    while len(shapes) < n_shapes and any(queues):
        for q in queues:
            if q and len(shapes) < n_shapes:
                shapes.append(q.pop(0)[1])
    chosen = []  # (params, pred, ks, ts): the builds
    for shape in shapes:  # one build per shape, the smallest cluster first
        params, pred = sorted(by_shape[shape], key=lambda x: x[0]["cluster_m"] * x[0]["cluster_n"])[0]
        chosen.append((params, pred, shape[3], shape[4]))
    for shape in shapes[:2]:  # cluster variants of the two best shapes (TMA multicast)
        for params, pred in by_shape[shape]:
            if params["cluster_m"] * params["cluster_n"] > 1 and len(chosen) < max(n_shapes + 4, 1):
                chosen.append((params, pred, shape[3], shape[4]))
    chosen.sort(key=lambda c: c[1])

    out: list[Candidate] = []
    for params, pred, ks, ts in chosen:
        out.append(Candidate(tmpl, params, (0, 1, 1, 0), arch, pred, _label(tmpl, params, (0, 1, 1, 0), copies)))
    # Run-time variants of the builds: they share its .so.
    variants = []
    n_persistent = 0
    for params, pred, ks, ts in chosen:
        tm, tn = params["tile_m"], params["tile_n"]
        tiles = math.ceil(w.m / tm) * math.ceil(w.n / tn) * w.batch
        if ts == "stream_k":
            variants.append((predict_ms(w, tm, tn, ks, ts, 1, gpu, tmpl, transform), params, (0, 1, 1, 3)))
            for s in splits_space:
                if s > 1 and tiles * s <= 2 * SM90["sms"]:
                    variants.append((predict_ms(w, tm, tn, ks, ts, s, gpu, tmpl, transform), params, (0, 1, s, 2)))
        elif n_persistent < 2:
            n_persistent += 1
            for opts in ((2, 1, 1, 0), (0, 2, 1, 0), (1, 4, 1, 0)):
                variants.append((pred * 1.001, params, opts))
    for pred, params, opts in sorted(variants, key=lambda v: v[0]):
        if len(out) >= budget:
            break
        out.append(Candidate(tmpl, params, opts, arch, pred, _label(tmpl, params, opts, copies)))
    return out[:budget]


def candidates(w: GemmWorkload, space: dict, arch: str = "sm90a", gpu: str = "h100",
               max_candidates: int = 24) -> tuple[list[Candidate], list[str]]:
    """The candidates to try (eager first), and notes on what was left out and why."""
    notes: list[str] = []
    eager = Candidate("eager", {}, None, arch, float("nan"), f"torch eager ({w.policy})")
    if arch != "sm90a":
        notes.append(f"arch {arch}: only sm90a kernels run here (sm80 kernels are built, not tuned, on Hopper)")
        return [eager], notes
    ok, why = w.alignment_ok()
    if not ok:
        notes.append(f"{why}: no TMA kernel applies, so the eager path serves this shape (padding is not implemented)")
        return [eager], notes
    budget = max_candidates - 1
    out: list[Candidate] = []
    families = FAMILIES[w.policy]
    for i, (tmpl, fixed, share) in enumerate(families):
        left = budget - len(out)
        n = left if i == len(families) - 1 else min(left, max(1, round(budget * share)))
        out += _family(w, space, arch, gpu, tmpl, fixed, n)
    if w.policy == "fp32":
        notes.append("policy fp32: 3xTF32 kernels (tensor-core sums promoted into fp32 every 32 of K) are candidates; "
                     "each is kept only if its error stays within 4x of eager fp32's (cuBLAS SGEMM), which serves "
                     "otherwise")
    if budget <= 0:
        notes.append(f"max_candidates {max_candidates}: eager only, no kernel tried")
    elif not out:
        notes.append("every configuration in the rule's parameter space was pruned by the arch limits")
    return [eager] + out, notes


# ------------------------------------------------------------------------------------------
# Tuning.

def with_rule(w: GemmWorkload) -> GemmWorkload:
    """w with its rule resolved: a plain or unnamed GEMM gets the rule its epilogue implies."""
    return w.with_(rule=w.rule if w.rule not in ("", "gemm") else rule_for(w))


def rule_space(rule: str, rules=None) -> tuple[dict, list[str]]:
    """The tuner's parameter space from `rule`'s realize.params (the default GEMM space, with a
    note, for a rule that does not exist), and the notes."""
    if rules is None:
        from fact_db.discovery.rules import load_rules
        rules = load_rules()
    try:
        return dict(rules.get(rule).realize.get("params", {})), []
    except KeyError:
        return (dict(rules.get("gemm").realize.get("params", {})),
                [f"no rule '{rule}': using the default GEMM parameter space"])


def spec_of(w: GemmWorkload, c: Candidate) -> dict:
    """What the worker's GemmKernel expects: the layouts the kernel was built for (the wrapper
    copies an operand held in another layout)."""
    la, lb = kernel_layouts(w, c.template, (c.params or {}).get("transform", ""))
    return {"dtype": w.dtype, "layout_a": la, "layout_b": lb, "epilogue": w.epilogue, "bias_axis": w.bias_axis}


def build_candidates(cands: list[Candidate], jobs: int | None = None, progress: bool = True,
                     deadline: float | None = None) -> dict:
    """Render and build every non-eager candidate; {config_hash: Built} (shared builds built once;
    none started past `deadline`, a time.perf_counter() value)."""
    sources, owners = {}, {}
    for c in cands:
        if c.template == "eager":
            continue
        code = template.render(c.template, c.params)
        src = build_mod.Source(c.template, code, c.arch)
        sources.setdefault(code, src)
        owners[c.config_hash] = code
    built = build_mod.build(list(sources.values()), jobs=jobs, progress=progress, deadline=deadline)
    by_code = {b.source.code: b for b in built}
    return {h: by_code[code] for h, code in owners.items()}


@dataclass
class Evaluation:
    trials: list
    compile_s: float
    bench_s: float


def evaluate(w: GemmWorkload, cands: list[Candidate], *, gpus: list[int] | None = None, runner=None,
             jobs: int | None = None, compile_only: bool = False, progress: bool = True, timeout: float = 120.0,
             trials: int = 5, reps: int = 20) -> Evaluation:
    """Build every candidate (in parallel, cached), then verify and time the ones that built, in
    worker processes (one per GPU). Failures are trials with a status, never exceptions.

    >>> ev = evaluate(GemmWorkload(4096, 4096, 4096, policy="tf32"), cands)
    >>> [(t.candidate.label, t.status, t.time_ms) for t in ev.trials]
    """
    out: list[Trial] = []
    t0 = time.perf_counter()
    built = build_candidates(cands, jobs=jobs, progress=progress) if any(c.template != "eager" for c in cands) else {}
    compile_s = time.perf_counter() - t0
    runnable = []
    for c in cands:
        if c.template == "eager":
            runnable.append((c, None))
            continue
        b = built[c.config_hash]
        if b.deferred:  # past the tuning budget: not a failure, tried on a later run
            out.append(Trial(c, "skipped", error=b.error, build_key=b.key))
        elif not b.ok:
            out.append(Trial(c, "compile_error", error=f"{b.error}\n$ {b.command}", build_key=b.key))
        else:
            runnable.append((c, b))
    if compile_only:  # built (or found in the build cache), not run: eager is "skipped"
        for c, b in runnable:
            status = "skipped" if b is None else "cached" if b.cached else "built"
            out.append(Trial(c, status, error="--compile-only" if b is None else "", so=str(b.path) if b else "",
                             build_key=b.key if b else ""))
        return Evaluation(out, compile_s, 0.0)
    jobs_ = []
    for i, (c, b) in enumerate(runnable):
        jobs_.append({"id": i, "kind": "eager" if c.template == "eager" else "cutlass",
                      "so": str(b.path) if b else "", "template": c.template, "spec": spec_of(w, c),
                      "options": list(c.options) if c.options else None, "workload": w.as_dict(),
                      "trials": trials, "reps": reps})
    t0 = time.perf_counter()
    res = _run_jobs(jobs_, runner, gpus, timeout, progress)
    bench_s = time.perf_counter() - t0
    for (c, b), r in zip(runnable, res):
        out.append(Trial(c, r.get("status", "crashed"), r.get("time_ms"), r.get("err"), r.get("eager_err"),
                         r.get("error", ""), so=str(b.path) if b else "", build_key=b.key if b else "",
                         source_hash=template.source_hash(b.source.code) if b else "", device=r.get("device", ""),
                         gpu=str(r.get("gpu", ""))))
    return Evaluation(out, compile_s, bench_s)


def tune(w: GemmWorkload, *, arch: str = "sm90a", gpu: str | None = None, registry=None, rules=None,
         max_candidates: int = 24, gpus: list[int] | None = None, runner=None, jobs: int | None = None,
         compile_only: bool = False, force: bool = False, progress: bool = True, timeout: float = 120.0,
         trials: int = 5, reps: int = 20) -> TuneResult:
    """Tune one workload. `runner(jobs) -> results` replaces the GPU worker pool (tests inject one).

    With a team registry, the workload is claimed first (registry.claim): while another host
    tunes it this one waits, then uses the row that host stored, or tunes it when that host's
    lease expired without one."""
    w = with_rule(w)
    rule = w.rule
    device_name = ""
    if gpu is None:
        if compile_only:
            gpu = "h100"
        elif runner is None:
            gpu, device_name = current_gpu()
        else:
            gpu = "h100"
    result = TuneResult(w, rule, arch, gpu, None, None)
    key = w.key(arch, gpu) if registry is not None else None

    # 1. The registry first (with --compile-only too: a kernel it has needs no build).
    if registry is not None and not force:
        hit = _from_registry(registry, key, w, result, progress=progress)
        if hit:
            if compile_only:
                hit.notes.append("the registry has a current kernel for this workload: " +
                                 ("its kernel was built, no other candidate" if hit.registry_built else "nothing to build")
                                 + " (--force builds the candidates anyway)")
            return hit

    # 2-5 while holding the workload's lease (a team registry: a host that waited for another
    # one tuning it uses that host's row; a file database: no lease)
    search = dict(arch=arch, gpu=gpu, registry=registry, rules=rules, max_candidates=max_candidates, gpus=gpus,
                  runner=runner, jobs=jobs, compile_only=compile_only, progress=progress, timeout=timeout,
                  trials=trials, reps=reps)
    if registry is None or compile_only:
        return _search(w, key, result, device_name, **search)
    with registry.claim(key) as claim:
        result.notes += claim.notes()
        if claim.coordinated and not force:
            hit = _from_registry(registry, key, w, result)
            if hit:
                return hit
        return _search(w, key, result, device_name, **search)


def _search(w: GemmWorkload, key, result: TuneResult, device_name: str, *, arch, gpu, registry, rules,
            max_candidates, gpus, runner, jobs, compile_only, progress, timeout, trials, reps) -> TuneResult:
    """Steps 2-5 of tune: candidates, build, verify and time, and the registry rows."""
    # 2. Candidates.
    cands, notes = candidate_list(w, arch=arch, gpu=gpu, registry=registry, rules=rules,
                                  max_candidates=max_candidates)
    result.notes += notes

    # 3-4. Build, verify and time.
    ev = evaluate(w, cands, gpus=gpus, runner=runner, jobs=jobs, compile_only=compile_only, progress=progress,
                  timeout=timeout, trials=trials, reps=reps)
    result.trials, result.compile_s, result.bench_s = ev.trials, ev.compile_s, ev.bench_s
    result.eager = next((t for t in ev.trials if t.candidate.template == "eager" and t.status != "skipped"), None)
    device_name = device_name or next((t.device for t in ev.trials if t.device), "")
    if compile_only:
        return result
    ok = [t for t in result.trials if t.status == "ok" and t.time_ms is not None]
    result.winner = min(ok, key=lambda t: t.time_ms) if ok else None
    result.trials.sort(key=lambda t: (t.status != "ok", t.time_ms if t.time_ms is not None else math.inf))

    # 5. Remember it.
    if registry is not None:
        _record(registry, key, w, result, device_name)
    return result


def candidate_list(w: GemmWorkload, *, arch: str = "sm90a", gpu: str = "h100", registry=None, rules=None,
                   max_candidates: int = 24) -> tuple[list[Candidate], list[str]]:
    """The candidates `tune` tries for `w` (eager first), with notes: the rule's parameter space,
    pruned and ranked, minus configurations that failed before in this environment (even
    with force: they would fail again)."""
    w = with_rule(w)
    space, notes = rule_space(w.rule, rules)
    cands, more = candidates(w, space, arch, gpu, max_candidates)
    notes += more
    if registry is not None:
        failed = registry.failed_configs(w.key(arch, gpu))
        if failed:
            kept = [c for c in cands if c.config_hash not in failed]
            if len(kept) < len(cands):
                notes.append(f"{len(cands) - len(kept)} configuration(s) that failed before in this "
                             "environment were not tried again")
            cands = kept
    return cands, notes


def prebuild(workloads: list[GemmWorkload], *, arch: str = "sm90a", gpu: str = "h100", registry=None,
             max_candidates: int = 24, force: bool = False, jobs: int | None = None, progress: bool = True,
             deadline: float | None = None) -> set:
    """Build every candidate of every workload in one parallel batch (what `tune` would build
    for each, skipping workloads the registry answers), so a model's regions compile together
    instead of one region at a time; no compile starts past `deadline` (the tuning budget).
    Returns the workloads (as given) with a candidate built or found cached."""
    owners: dict[str, list] = {}  # config hash -> the workloads whose candidate it is
    cands = []
    for given in workloads:
        w = with_rule(given)
        if registry is not None and not force:
            hit = registry.lookup(w.key(arch, gpu))
            if hit is not None and hit.exact and not hit.stale and hit.record.status == "verified":
                continue
        for c in candidate_list(w, arch=arch, gpu=gpu, registry=registry, max_candidates=max_candidates)[0]:
            if c.template != "eager":
                cands.append(c)
                owners.setdefault(c.config_hash, []).append(given)
    if not cands:
        return set()
    built = build_candidates(cands, jobs=jobs, progress=progress, deadline=deadline)
    return {w for h, b in built.items() if b.ok for w in owners[h]}


def _run_jobs(jobs: list[dict], runner, gpus, timeout: float, progress: bool) -> list[dict]:
    if runner is not None:
        return runner(jobs)
    from fact_db.kernels.pool import shared_pool
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(jobs), desc="verify+time", unit="cand", leave=False)
    res = shared_pool(gpus, timeout).run(jobs, progress=(lambda r: bar.update(1)) if bar else None)
    if bar is not None:
        bar.close()
    return res


def from_registry(w: GemmWorkload, registry, *, arch: str = "sm90a", gpu: str = "h100",
                  cached_only: bool = False) -> TuneResult | None:
    """The registry's verified, current row for exactly `w` on `gpu` as a TuneResult (its kernel
    from the build cache, or rebuilt unless `cached_only`), or None: what a run out of tuning
    budget, or a call on new input shapes, may still use."""
    w = with_rule(w)
    result = TuneResult(w, w.rule, arch, gpu, None, None)
    return _from_registry(registry, w.key(arch, gpu), w, result, cached_only=cached_only)


def _from_registry(registry, key, w: GemmWorkload, result: TuneResult, cached_only: bool = False,
                   progress: bool = False) -> TuneResult | None:
    """The registry's row for `key` as a TuneResult, its kernel loaded from the build cache, or
    built (said on stderr with `progress`; `compile_s` then counts it) where the cache lacks it;
    with `cached_only`, None where it would have to be built."""
    hit = registry.lookup(key, nearest=False)  # only the exact row serves (a nearer shape's would not run)
    if hit is None or not hit.exact:
        return None
    rec = hit.record
    if hit.stale:
        result.notes.append(f"registry row {key.digest()} is stale ({hit.stale_reason}); tuning again")
        return None
    if rec.status != "verified":
        return None
    cfg = rec.config or {}
    c = Candidate(cfg.get("template", rec.template), cfg.get("params", {}), tuple(cfg.get("options") or ()) or None,
                  key.arch, float("nan"), cfg.get("label", "") or "from registry")
    so, bkey, built, fetched = "", "", "", False
    if c.template != "eager":
        src = build_mod.Source(c.template, template.render(c.template, c.params), c.arch)
        in_cache = (build_mod.cache_dir() / build_mod.content_key(src) / "kernel.so").is_file()
        fetched = not in_cache and build_mod.fetch_shared(src, registry) is not None  # another host's build
        in_cache = in_cache or fetched
        if cached_only and not in_cache:
            return None
        if not in_cache and progress:
            print(f"registry hit {key.digest()} ({w.shape}): its kernel is not in the build cache here; building it "
                  "(nvcc, tens of seconds)", file=sys.stderr, flush=True)
        b = build_candidates([c], progress=progress)[c.config_hash]
        if b.deferred:
            result.notes.append(f"registry row {key.digest()}: its kernel is not built here and the tuning budget is "
                                "spent")
            return None
        if not b.ok:
            result.notes.append(f"registry row {key.digest()} no longer builds: {b.error}; tuning again")
            return None
        so, bkey = str(b.path), b.key
        if not b.cached:
            result.compile_s, result.registry_built = b.seconds, True
            built = f"; its kernel was not in the build cache and was built ({b.seconds:.0f} s)"
    result.winner = Trial(c, "ok", rec.time_ms, rec.rel_err, rec.baseline_rel_err, so=so, build_key=bkey,
                          device=rec.device_name)
    result.eager = Trial(Candidate("eager", {}, None, key.arch, float("nan"), rec.baseline or "torch eager"),
                         "ok", rec.baseline_ms, rec.baseline_rel_err, device=rec.device_name)
    result.from_registry = True
    result.notes.append(f"registry hit {key.digest()}: tuned {rec.created_at} on {rec.device_name}; nothing timed"
                        + (built or (", its kernel from the team registry's shared binaries" if c.template != "eager" and fetched
                                     else ", its kernel from the build cache" if c.template != "eager" else ""))
                        + " (use --force to tune again)")
    return result


def _record(registry, key, w: GemmWorkload, result: TuneResult, device_name: str) -> None:
    """The winner as a kernel row (merged by key), and every candidate as a trial row, each
    stamped with the environment they were measured in (this machine's, and the worker's GPU)."""
    env = environment.current()
    if device_name:
        env = env.with_(gpu_sku=device_name)
    registry.add_trials([
        TrialRecord(key=key, template=t.candidate.template, config={**t.candidate.config, "label": t.candidate.label},
                    status=t.status, time_ms=t.time_ms, rel_err=t.err, error=t.error[:2000],
                    config_hash=t.candidate.config_hash).stamped(env)
        for t in result.trials])
    win = result.winner
    if win is None:
        return
    eager = result.eager
    registry.put(kernel_record(
        key, win.candidate, win.time_ms, win.err, win.source_hash, env,
        baseline=eager.candidate.label if eager else "", baseline_ms=eager.time_ms if eager else None,
        baseline_rel_err=eager.err if eager else None, notes="; ".join(result.notes)[:2000]))
    if win.build_key and win.so:  # the other hosts load the winner instead of compiling it (where shared)
        build_mod.share_built(registry, win.build_key, win.so, win.candidate.arch)


def kernel_record(key, c: Candidate, time_ms: float, err: float | None, source_hash: str, env=None, *,
                  baseline: str, baseline_ms: float | None, baseline_rel_err: float | None, notes: str,
                  provenance: str = "rule") -> KernelRecord:
    """The verified registry row of winning candidate `c`, stamped with `env` (default: this
    machine's environment) and the template's hash now."""
    return KernelRecord(
        key=key, template=c.template, config={**c.config, "label": c.label}, time_ms=time_ms, baseline=baseline,
        baseline_ms=baseline_ms, rel_err=err, baseline_rel_err=baseline_rel_err, status="verified",
        provenance=provenance, source_hash=source_hash, notes=notes).stamped(env)
