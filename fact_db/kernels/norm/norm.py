"""Norms: LayerNorm and RMSNorm over the last dimension, with the residual add before them fused in.

The workload (`NormWorkload`: kind, rows, width, residual, write_sum, eps, dtype, policy),
its float64 reference and eager form, the kernel (`NormKernel`: a `kernels_cpp/add_norm.cu.j2`
build loaded through ctypes, `as_op()` a torch custom op named from the build key with a fake
implementation), the template's candidate parameters, and verification + timing of candidates
(eager always among them) in a worker or in this process.

>>> w = NormWorkload("layernorm", rows=128 * 512, width=768, residual=True, write_sum=True,
...                  dtype="float32", policy="fp32")
>>> cands = candidates(w)                     # [NormCandidate(...), ...]; eager is added by tune_norm
>>> res = tune_norm(w, cands)                 # builds, verifies against float64, times; best first
"""
from __future__ import annotations

import ctypes
import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fact_db.core.errors import FactError
from fact_db.kernels.abi import launch_status, raw_stream
from fact_db.kernels.ops import factdb_op

TEMPLATE = "add_norm"
ELEMENT = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
KINDS = ("layernorm", "rmsnorm")
# bf16/fp16 policies also need KernelBench's tolerance; fp32: the norm stays in fp32 arithmetic.
ABS_TOL = {"bfloat16": 1e-2, "float16": 1e-2}
TOLERANCE_FACTOR = 4.0
ERR_FLOOR = 1e-7


class NormError(FactError):
    """A norm workload, candidate or kernel is invalid or failed."""


def _torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


@dataclass(frozen=True)
class NormWorkload:
    """`y = norm(x + r)` over the last dim of [rows, width]; `s = x + r` returned too when write_sum."""

    kind: str                 # layernorm | rmsnorm
    rows: int
    width: int
    residual: bool = False
    write_sum: bool = False
    eps: float = 1e-5
    dtype: str = "float32"
    policy: str = "fp32"
    has_bias: bool = True     # layernorm only (nn.LayerNorm(bias=False) has none)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise NormError(f"norm kind '{self.kind}' is not one of {', '.join(KINDS)}")
        if self.dtype not in ELEMENT:
            raise NormError(f"norm dtype '{self.dtype}' is not one of {', '.join(ELEMENT)}")
        if self.rows < 0 or self.width <= 0:
            raise NormError(f"norm shape rows={self.rows} width={self.width}: rows >= 0 and width > 0 needed")
        if self.write_sum and not self.residual:
            raise NormError("write_sum needs residual=True (without a residual add there is no sum to write)")

    def key(self) -> dict:
        """The registry key's fields (one row per distinct key)."""
        d = asdict(self)
        d["has_bias"] = self.has_bias and self.kind == "layernorm"
        return d

    def as_dict(self) -> dict:
        return asdict(self)

    def key_string(self) -> str:
        k = self.key()
        return (f"{k['kind']}:{k['rows']}x{k['width']}:res={int(k['residual'])}:sum={int(k['write_sum'])}"
                f":bias={int(k['has_bias'])}:eps={k['eps']:g}:{k['dtype']}:{k['policy']}")

    # ------------------------------------------------------------------------------------
    def make_inputs(self, dist: str = "randn", device: str = "cuda", generator=None) -> dict:
        """Fresh inputs: x, r (residual), weight, bias. `rand` all-positive, `randn` zero-mean."""
        import torch
        dt = _torch_dtype(self.dtype)
        draw = torch.rand if dist == "rand" else torch.randn
        mk = lambda *shape: draw(*shape, device=device, generator=generator).to(dt)  # noqa: E731
        inp = {"x": mk(self.rows, self.width)}
        if self.residual:
            inp["r"] = mk(self.rows, self.width)
        inp["weight"] = (1.0 + 0.5 * draw(self.width, device=device, generator=generator)).to(dt)
        if self.kind == "layernorm" and self.has_bias:
            inp["bias"] = mk(self.width)
        return inp

    def reference(self, inputs: dict) -> tuple:
        """(y, s) in float64; s is the sum rounded to the dtype as eager rounds it (None without residual)."""
        import torch
        x = inputs["x"]
        s = (x + inputs["r"]) if self.residual else x  # eager's rounding of the sum is part of the function
        s64 = s.to(torch.float64)
        w = inputs["weight"].to(torch.float64)
        if self.kind == "layernorm":
            b = inputs.get("bias")
            y = torch.nn.functional.layer_norm(s64, (self.width,), w, None if b is None else b.to(torch.float64),
                                               self.eps)
        else:
            y = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + self.eps) * w
        return y, (s64 if self.write_sum else None)

    def eager(self, inputs: dict) -> tuple:
        """What PyTorch runs unfused: `x + r` then `layer_norm` / `rms_norm`."""
        import torch
        x = inputs["x"]
        s = x + inputs["r"] if self.residual else x
        if self.kind == "layernorm":
            y = torch.nn.functional.layer_norm(s, (self.width,), inputs["weight"], inputs.get("bias"), self.eps)
        else:
            y = torch.nn.functional.rms_norm(s, (self.width,), inputs["weight"], self.eps)
        return y, (s if self.write_sum else None)


# ----------------------------------------------------------------------------------------
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


def valid(w: NormWorkload, c: NormCandidate) -> bool:
    """The template's static limits (see kernels_cpp/add_norm.cu.j2), checked before a build."""
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[w.dtype]
    if w.width % c.vec or c.vec * size > 16 or c.threads * c.rows_per_cta > 1024:
        return False
    if not ((c.threads <= 32 and 32 % c.threads == 0) or c.threads % 32 == 0):
        return False
    items = -(-(w.width // c.vec) // c.threads)
    if items > 64 or items * c.vec > 64:  # registers: at most 64 floats of the row per thread
        return False
    return (w.width // c.vec) >= c.threads // 2  # no thread group more than half idle


def candidates(w: NormWorkload, limit: int = 12) -> list[NormCandidate]:
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
                if not valid(w, c) or not 64 <= threads * rows <= 512:
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


# ----------------------------------------------------------------------------------------
STATUS = {1: "misaligned operand", 4: "invalid problem (n differs from the kernel's width, or a pointer missing)"}


class NormKernel:
    """A loaded add_norm build. `k(x, r, weight, bias)` -> (y, s or None)."""

    def __init__(self, path: str | Path, workload: NormWorkload, build_key: str = ""):
        self.path = Path(path)
        self.workload = workload
        self.build_key = build_key
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise NormError(f"cannot load norm kernel {self.path}: {e} (built for another GPU arch?)") from None
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self._launch = self._lib.fact_add_norm_launch
        self._launch.argtypes = [vp] * 6 + [i64, i64, ctypes.c_float, vp]
        self._launch.restype = ctypes.c_int
        self._op = None

    def __call__(self, x, r=None, weight=None, bias=None, out=None, sum_out=None):
        import torch
        w = self.workload
        dt = _torch_dtype(w.dtype)
        if x.shape[-1] != w.width or x.dtype != dt:
            raise NormError(f"norm kernel takes {w.dtype} [..., {w.width}], got {x.dtype} {tuple(x.shape)}")
        if w.residual and (r is None or r.shape != x.shape or r.dtype != dt):
            raise NormError(f"this norm kernel adds a residual: pass r of shape {tuple(x.shape)} and dtype {w.dtype}")
        shape = x.shape
        x2 = x.contiguous().view(-1, w.width)
        r2 = r.contiguous().view(-1, w.width) if w.residual else None
        wt = weight.to(dt).contiguous()
        b = bias.to(dt).contiguous() if (bias is not None and w.kind == "layernorm" and w.has_bias) else None
        if w.kind == "layernorm" and w.has_bias and b is None:
            raise NormError("this LayerNorm kernel adds a bias: pass bias")
        y = torch.empty_like(x2) if out is None else out.view(-1, w.width)
        s = (torch.empty_like(x2) if sum_out is None else sum_out.view(-1, w.width)) if w.write_sum else None
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        rc = self._launch(ptr(x2), ptr(r2), ptr(wt), ptr(b), ptr(y), ptr(s), x2.shape[0], w.width, w.eps,
                          raw_stream(x.device))
        if rc != 0:
            what = launch_status(rc, STATUS)
            raise NormError(f"norm kernel {self.path.parent.name} refused or failed the launch: {what} "
                            f"(rows={x2.shape[0]} width={w.width})")
        return y.view(shape), (s.view(shape) if s is not None else None)

    @property
    def op_name(self) -> str:
        """`n_<hash>` of the build key (or the library's bytes) and the workload, never the path."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        w = self.workload
        h = hashlib.sha256(f"{ident}|{TEMPLATE}|{w.kind}|{w.width}|{w.residual}|{w.write_sum}|{w.has_bias}|"
                           f"{w.eps!r}|{w.dtype}".encode()).hexdigest()[:12]
        return f"n_{h}"

    def as_op(self):
        """`torch.ops.factdb.<op_name>(x, r, weight, bias) -> (y, s)`; s is an empty tensor when
        the kernel does not write the sum. Has a fake implementation for torch.compile/export."""
        if self._op is not None:
            return self._op
        import torch
        kernel, w = self, self.workload

        def run(x, r, weight, bias):
            y, s = kernel(x, r, weight, bias)
            return y, (s if s is not None else x.new_empty(0))

        def fake(x, r, weight, bias):
            return torch.empty_like(x), (torch.empty_like(x) if w.write_sum else x.new_empty(0))

        self._op = factdb_op(self.op_name, "(Tensor x, Tensor? r, Tensor weight, Tensor? bias) -> (Tensor, Tensor)",
                             run, fake)
        return self._op


# ----------------------------------------------------------------------------------------
def build_candidates(w: NormWorkload, cands: list[NormCandidate], arch: str = "sm90a", jobs: int | None = None,
                     progress: bool = True) -> dict:
    """{candidate: Built} for every candidate, compiled in parallel (cached builds return at once)."""
    from fact_db.kernels import build
    sources = [build.Source(TEMPLATE, render(w, c), arch) for c in cands]
    return dict(zip(cands, build.build(sources, jobs=jobs, progress=progress)))


@dataclass
class NormTrial:
    label: str
    status: str               # ok | verify_failed | launch_error | build_failed
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


def from_registry(w: NormWorkload, registry, arch: str = "sm90a", gpu: str = "") -> NormTrial | None:
    """The registry's winner for `w` as a NormTrial (candidate None when eager won), or None.
    A kernel row whose template source changed since it was tuned is not returned (stale)."""
    row = registry.norm_get(w, arch, gpu)
    if row is None:
        return None
    cand = NormCandidate(**row["config"]) if row["config"] else None
    if cand is not None:
        from fact_db.kernels.template import source_hash
        if row["source_hash"] and row["source_hash"] != source_hash(render(w, cand)):
            return None
    return NormTrial(row["label"], "ok", row["time_ms"], row["rel_err"], candidate=cand)


def record(w: NormWorkload, trials: list[NormTrial], registry, arch: str = "sm90a", gpu: str = "",
           device_name: str = "") -> NormTrial | None:
    """Write the best ok trial of `trials` (eager included) to the registry; returns it."""
    best = next((t for t in trials if t.status == "ok"), None)
    if best is None:
        return None
    from fact_db.kernels.template import source_hash
    sh = source_hash(render(w, best.candidate)) if best.candidate is not None else ""
    registry.norm_put(w, arch, best, trials, gpu=gpu, device_name=device_name, source_hash=sh)
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
        if not b.ok:
            trials.append(NormTrial(c.label, "build_failed", error=b.error, candidate=c))
            continue
        jobs_list.append((c.label, c, b))
    if in_process:
        results = [evaluate_one(w, str(b.path) if b else None) for _, _, b in jobs_list]
    else:
        from fact_db.kernels.worker import shared_pool
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
