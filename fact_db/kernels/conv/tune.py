"""Tune a convolution workload: candidate configs (tiles, clusters; the 3xTF32 split under fp32 and
tf32x3) pruned by the sm90 limits and ranked by a small cost model, each built, verified against
float64 and timed in the worker, cuDNN (eager at the policy) always among them; the winner and
every trial written to the registry.

>>> cands = candidates(w)                  # [ConvConfig(...), ...]; cuDNN is added by tune_conv
>>> trials = tune_conv(w, registry=reg)    # best first; trials[0].config None: cuDNN won
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

from fact_db.core.device import DEVICES
from fact_db.kernels.conv.kernel import (TEMPLATES, ConvConfig, ConvKernel, prepare_weight, render, source,
                                        to_channels_last, why_not, why_not_gemm)
from fact_db.kernels.conv.workload import ConvWorkload
from fact_db.store.records import config_hash

# A warpgroup holds its part of the accumulator tile in registers: 128 x 128 fp32 is 128 a thread,
# the most that leaves room (64 x 128 where promotion keeps a second copy). CUTLASS's kernel ("ws")
# has one consumer warpgroup, so its tile is that part, as is the ping-pong kernel's ("pingpong": a
# tile a warpgroup); fact-db's cooperative kernel ("coop", and "persistent", the same kernel with a
# CTA an SM: kernels_cpp/_sm90_conv_kernels.j2) has two, splitting tile_m, so its tile is twice that.
MAX_TILE_AREA = 128 * 128
TILES = ((128, 128), (128, 64), (64, 128), (64, 256), (64, 64))
COOP_TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (128, 64))
CLUSTERS = ((1, 1), (2, 1), (1, 2))
COOPERATIVE = ("coop", "persistent")  # two consumer warpgroups on one tile
# What the tuner offers by default, in the order the list alternates them. The ping-pong kernel
# (built in the thirteenth session, compiled in CPU CI) joins once a GPU has run its tests and
# timed it: `benchmarks/conv_realize.py --schedules` offers it meanwhile.
SCHEDULES = ("persistent", "coop", "ws")


def per_warpgroup(c: ConvConfig) -> int:
    """Accumulator elements one consumer warpgroup holds."""
    return c.tile_m * c.tile_n // (2 if c.schedule in COOPERATIVE else 1)


def uses_split(w: ConvWorkload) -> bool:
    """fp32 and tf32x3 run float32 convolutions as 3xTF32 (split3); tf32 as plain TF32."""
    return w.dtype == "float32" and w.policy in ("fp32", "tf32x3")


# The pointwise fp32 kernel (schedule "gemm", conv_gemm_sm90): the GEMM family's `regsplit` tiles
# (with promotion's second accumulator set, 64 x 128 a warpgroup is the register limit): tile_m
# 128 cooperative, 64 ping-pong (a tile a warpgroup, one's promotions and epilogue under the
# other's wgmmas); promoted every k-tile. A pointwise convolution sums few channels (64-256 in a
# ResNet), so eager fp32 is close to exact and the fp32 bound tight: on an H200, promoting every 32
# channels (16 x 2, hi x hi issued first) erred 6-10e-7 against bounds of 4-8e-7; every k-tile with
# the small products first, 1.3-1.8e-7. tile_k 32 timed 2-10% faster than 16 there.
GEMM_MAX = 4  # the pointwise GEMM kernel's configs timed at the most
GEMM_TILE_M = (128, 64)
GEMM_TILE_N = (128, 64)
GEMM_TILE_K = (32, 16)

# k-tiles between promotions of the tensor cores' partial sums, per policy's split3 candidates:
# unpromoted split3 missed the fp32 bound by 3-4x on an H200 (2026-11-26), so fp32 promotes every
# k-tile or every second (the GEMM family's fp32 candidates promote every 32 of K: 1 tile here);
# tf32x3, with a looser bound, every fourth.
PROMOTE = {"fp32": (1, 2), "tf32x3": (4,)}


def _tiles(w: ConvWorkload, c: ConvConfig) -> int:
    """Output tiles of `c` over `w`'s implicit GEMM (pixels x output channels)."""
    return math.ceil(w.n * math.prod(w.output) / c.tile_m) * math.ceil(w.k / c.tile_n)


def _score(w: ConvWorkload, c: ConvConfig) -> float:
    """Higher is better: the share of the last wave used, times the share of tile area that is
    not padding, times a mild preference for larger tiles (operand reuse)."""
    m, n = w.n * math.prod(w.output), w.k
    tiles = _tiles(w, c)
    sms = DEVICES["h100"].sms  # the ranking only needs the size of a wave on an sm90 part
    waves = math.ceil(tiles / sms)
    fill = tiles / (waves * sms)
    pad = (m * n) / (math.ceil(m / c.tile_m) * c.tile_m * math.ceil(n / c.tile_n) * c.tile_n)
    return fill * pad * ((c.tile_m * c.tile_n) / MAX_TILE_AREA) ** 0.25


def _mostly_padding(tile_n: int, w: ConvWorkload) -> bool:
    """A tile wider than 64 that is mostly over output channels that do not exist."""
    return tile_n > 64 and tile_n >= 2 * w.k


def candidates(w: ConvWorkload, limit: int = 8, schedules: tuple = SCHEDULES) -> list[ConvConfig]:
    """At most `limit` configs, best-ranked first; none where the template cannot take `w`
    (kernel.why_not: transposed, grouped, misaligned channels). The schedules alternate (the
    best persistent, the best coop, the best ws, the second persistent, ...), so a small budget
    times each kernel: the cost model cannot tell how much a second consumer warpgroup, or a CTA
    that keeps its SM from tile to tile, buys on a given geometry. The persistent kernel is
    offered only where its best tile leaves more tiles than a wave of SMs (with one wave or less
    it is the coop kernel). `schedules`: the conv kernels offered, in that order (SCHEDULES;
    "pingpong" takes ws's tiles). A pointwise convolution under fp32 or tf32x3 gets the GEMM kernel's
    configs (schedule "gemm", at most GEMM_MAX), which read the activation once where split3
    first writes it three times, and the conv kernels' best config last."""
    if why_not(w):
        return []
    split = uses_split(w)
    tile_k = 32 if w.dtype == "float32" else 64
    m = w.n * math.prod(w.output)
    ranked = {}
    for schedule in schedules:
        out = []
        for tm, tn in (COOP_TILES if schedule in COOPERATIVE else TILES):
            if _mostly_padding(tn, w):
                continue
            for cm, cn in CLUSTERS:
                if (cm > 1 and math.ceil(m / tm) < 2 * cm) or (cn > 1 and math.ceil(w.k / tn) < 2 * cn):
                    continue
                for p in (PROMOTE.get(w.policy, (0,)) if split else (0,)):
                    c = ConvConfig(tm, tn, tile_k, cm, cn, "auto", split, p, schedule)
                    # the two-warpgroup kernels' consumers get 232 registers (setmaxnreg), ws's 255:
                    # a promoted warpgroup there (accumulators and their copy) holds at most 64 x 128
                    if per_warpgroup(c) <= MAX_TILE_AREA // (2 if p and schedule != "ws" else 1):
                        out.append(c)
        # ranked by the tile; among equal tiles the more often promoted first (the fp32 bound is tight)
        ranked[schedule] = sorted(out, key=lambda c: (-_score(w, c), c.promote))
    for many in ("persistent", "pingpong"):  # one wave of tiles or less: coop's or ws's kernel with more setup
        if ranked.get(many) and _tiles(w, ranked[many][0]) <= DEVICES["h100"].sms:
            ranked[many] = []
    merged = [c for row in itertools.zip_longest(*ranked.values()) for c in row if c is not None]
    gemm = gemm_candidates(w)
    if not gemm:
        return merged[:limit]
    # A pointwise convolution: the GEMM kernel's configs, then the conv kernels' best one (on an
    # H200 the GEMM kernel beat the best split3 conv kernel by 1.3-2.7x at all three shapes
    # timed, and every candidate costs five float64 references to verify)
    return (gemm[:max(1, min(GEMM_MAX, limit - 1))] + merged[:1])[:limit]


def gemm_candidates(w: ConvWorkload) -> list[ConvConfig]:
    """The pointwise GEMM kernel's configs for `w` (none where kernel.why_not_gemm says why):
    by tile_k (32 first), then the widest N the output channels fill, the cooperative and the
    ping-pong kernel alternating."""
    if why_not_gemm(w):
        return []
    widths = [tn for tn in GEMM_TILE_N if not _mostly_padding(tn, w)]
    return [ConvConfig(tm, tn, tk, 1, 1, "auto", True, 1, "gemm")
            for tk in GEMM_TILE_K for tn in widths for tm in GEMM_TILE_M]


def build_candidates(w: ConvWorkload, cands: list[ConvConfig], arch: str = "sm90a", jobs: int | None = None,
                     progress: bool = True) -> dict:
    """{config: Built}, compiled in parallel (cached builds return at once)."""
    from fact_db.kernels import build
    sources = [source(w, c, arch) for c in cands]
    return dict(zip(cands, build.build(sources, jobs=jobs, progress=progress)))


@dataclass
class ConvTrial:
    label: str
    status: str               # ok | verify_failed | launch_error | build_failed | crashed | timeout | skipped
    time_ms: float | None = None
    err: float | None = None
    eager_err: float | None = None
    error: str = ""
    config: ConvConfig | None = None   # None: cuDNN (eager at the policy)
    so: str = ""
    build_key: str = ""


def _prepared(w: ConvWorkload, cfg: ConvConfig | None, inputs: dict) -> dict:
    """What a call receives: x as it arrives (channels-last for an `nhwc` workload), the weight
    as the kernel holds it (made once, outside the timing), the vectors and the residual."""
    p = {"raw": inputs, "x": to_channels_last(inputs["x"]) if w.layout == "nhwc" else inputs["x"],
         "bias": inputs.get("bias"), "vecs": [inputs[f"v{i}"] for i in range(len(w.vec_steps))], "r": inputs.get("r")}
    if cfg is not None:
        p["wt"] = prepare_weight(inputs["w"], w, cfg)
    return p


def evaluate_one(w: ConvWorkload, so: str | None, cfg: ConvConfig | None, trials: int = 5, reps: int = 20) -> dict:
    """Verify (kernels.verify: float64 reference, NaN-poisoned output, inputs unmodified, error
    against eager's at the policy) and time one candidate in this process; `so` None: cuDNN.
    A worker job runs this."""
    import torch

    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import verify
    kernel = ConvKernel(so, w, cfg) if so else None

    def call(p, out=None):
        if kernel is None:
            y = w.eager(p["raw"])
            return out.copy_(y) if out is not None else y
        return kernel(p["x"], p["wt"], p["bias"], p["vecs"], p["r"], out=out)

    verdict = verify(lambda inputs, out: call(_prepared(w, cfg, inputs), out), w, trials=trials)
    res = {"err": verdict.err, "eager_err": verdict.eager_err, "device": torch.cuda.get_device_name()}
    if not verdict.ok:
        return {**res, "status": "launch_error" if verdict.reason.startswith("launch failed") else "verify_failed",
                "error": verdict.reason}
    sets = [_prepared(w, cfg, w.make_inputs("randn")) for _ in range(3)]
    t = time_cuda(call, sets, reps=reps)
    return {**res, "status": "ok", "time_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "error": ""}


def from_registry(w: ConvWorkload, registry, arch: str = "sm90a", gpu: str = "h100") -> ConvTrial | None:
    """The registry's current winner for exactly `w` (config None: cuDNN won), or None: absent,
    or stale (another environment, or the template changed)."""
    hit = registry.lookup(w.key(arch, gpu), nearest=False)
    if hit is None or hit.stale:
        return None
    rec = hit.record
    cfg = ConvConfig(**rec.config) if rec.template in TEMPLATES and rec.config else None
    return ConvTrial(rec.label, "ok", rec.time_ms, rec.rel_err, config=cfg)


def record(w: ConvWorkload, trials: list[ConvTrial], registry, arch: str = "sm90a", gpu: str = "h100",
           device_name: str = "") -> ConvTrial | None:
    """The best ok trial as the workload's registry row, every trial as a trial row, stamped with
    this environment (`device_name`: the worker's GPU); returns the best."""
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
    eager = next((t for t in trials if t.config is None and t.status == "ok"), None)
    template = lambda t: "eager" if t.config is None else t.config.template  # noqa: E731
    registry.put(KernelRecord(
        key=key, template=template(best), label=best.label,
        config=asdict(best.config) if best.config is not None else {}, time_ms=best.time_ms, rel_err=best.err,
        baseline="cudnn" if eager else "", baseline_ms=eager.time_ms if eager else None,
        baseline_rel_err=eager.err if eager else None,
        source_hash=source_hash(render(w, best.config)) if best.config is not None else "").stamped(env))
    registry.add_trials([TrialRecord(key=key, template=template(t),
                                     config={**(asdict(t.config) if t.config else {}), "label": t.label},
                                     status=t.status, time_ms=t.time_ms, rel_err=t.err,
                                     error=(t.error or "")[:2000]).stamped(env) for t in trials])
    return best


def tune_conv(w: ConvWorkload, cands: list[ConvConfig] | None = None, *, arch: str = "sm90a",
              jobs: int | None = None, built: dict | None = None, in_process: bool = False, progress: bool = True,
              registry=None, gpu: str = "h100", gpus: list[int] | None = None, limit: int = 8) -> list[ConvTrial]:
    """Build, verify and time every candidate and cuDNN; trials best first (ok ones by time).
    Candidates run in the worker subprocess (a faulting kernel takes down only the worker)
    unless `in_process`; with `registry`, the winner is written there."""
    cands = candidates(w, limit) if cands is None else cands
    if registry is not None:  # configs that failed before in this environment are not tried again
        failed = registry.failed_configs(w.key(arch, gpu))
        cands = [c for c in cands if config_hash({**asdict(c), "label": c.label}) not in failed]
    built = built if built is not None else build_candidates(w, cands, arch=arch, jobs=jobs, progress=progress)
    trials: list[ConvTrial] = []
    runs = [("cudnn", None, None)]
    for c in cands:
        b = built[c]
        if not b.ok:  # past the tuning budget (deferred) is not a failure: tried on a later run
            trials.append(ConvTrial(c.label, "skipped" if b.deferred else "build_failed", error=b.error, config=c))
            continue
        runs.append((c.label, c, b))
    if in_process:
        results = [evaluate_one(w, str(b.path) if b else None, c) for _, c, b in runs]
    else:
        from fact_db.kernels.pool import shared_pool
        payload = [{"id": i, "kind": "conv", "so": str(b.path) if b else "", "workload": w.as_dict(),
                    "config": asdict(c) if c else None} for i, (_, c, b) in enumerate(runs)]
        results = shared_pool(gpus).run(payload)
    for (label, c, b), r in zip(runs, results):
        trials.append(ConvTrial(label, r.get("status", "crashed"), r.get("time_ms"), r.get("err"), r.get("eager_err"),
                                r.get("error", ""), c, str(b.path) if b else "", b.key if b else ""))
    ok = sorted((t for t in trials if t.status == "ok"), key=lambda t: t.time_ms)
    trials = ok + [t for t in trials if t.status != "ok"]
    if registry is not None:
        device = next((r.get("device", "") for r in results if r.get("device")), "")
        record(w, trials, registry, arch, gpu, device)
    return trials
