"""Region kernel: a CUDA/C++ source the language model proposed for one region of the graph
(any elementwise or GEMM-epilogue chain the rules do not cover), and everything that stands
between it and the registry: the C ABI it must export, the source policy, the region as data
(its ATen ops, evaluated in float64 for the reference and at the policy's dtype for eager),
the worker jobs that compile, verify and time it, and the ctypes loader.

The C ABI (also in the prompt the model sees, and in the README):

    extern "C" int fact_region_launch(
        const void* const* inputs,      // n_inputs device pointers, in the order of the region's `inputs`
        const int64_t* const* shapes,   // shapes[i]: ranks[i] sizes of input i
        const int64_t* const* strides,  // strides[i]: ranks[i] strides of input i, in elements
        const int* ranks,               // ranks[i]: number of dimensions of input i (0 for a scalar)
        int n_inputs,
        void* out,                      // the region's output, contiguous (row-major), never aliased
        const int64_t* out_shape, int out_rank,
        cudaStream_t stream);           // launch on this stream; do not synchronize
    // returns 0 on success; anything else is a refusal or failure (1000 + cudaError_t by convention)

Every floating tensor is the region's dtype: `float` under the fp32, tf32 and tf32x3
policies, `__nv_bfloat16` under bf16, `__half` under fp16. Shape and pointer arrays live on
the host; the data on the device. Inputs must not be written.

Source policy (checked before anything compiles): `#include <...>` only of CUDA and C++
standard headers and of `cutlass/...` and `cute/...`; no quoted or computed includes, no
directives other than include, define, undef, the conditionals, pragma (unroll, once,
diagnostics), error and warning; no `__attribute__((constructor))` or other code that runs at
load time, and no calls that reach the operating system (`system(`,
`popen(`, `exec*(`, `fork(`, `dlopen(`, `fopen(`, `syscall(` ...). The check reads the source
as the preprocessor does (comments removed, backslash-newlines spliced). It is lexical: the
worker subprocess and its time limit stay the boundary. nvcc gets only the CUTLASS include
roots.

    >>> spec = RegionSpec.from_graph(report.graph, ["linear", "relu"], "fp32")
    >>> why = check_source(src)              # "" or the reason it is refused
    >>> spec.reference(spec.make_inputs("randn"))   # float64
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fact_db.core.policy import POLICY_DTYPE
from fact_db.kernels.abi import KernelError, launch_status, raw_stream
from fact_db.core.errors import FactError
from fact_db.kernels.ops import factdb_op

ENTRY = "fact_region_launch"
TEMPLATE = "llm_region"  # the build cache's name for these sources (no template file: the model wrote it)
C_TYPE = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}

ABI = """extern "C" int fact_region_launch(
    const void* const* inputs,      // n_inputs device pointers, in the order of `inputs` below
    const int64_t* const* shapes,   // shapes[i]: ranks[i] sizes of input i (host memory)
    const int64_t* const* strides,  // strides[i]: ranks[i] strides of input i, in elements (host memory)
    const int* ranks,               // ranks[i]: dimensions of input i (0 for a scalar)
    int n_inputs,
    void* out,                      // the region's output: contiguous row-major, of out_shape, never aliased
    const int64_t* out_shape, int out_rank,
    cudaStream_t stream);           // launch on this stream, do not synchronize
// returns 0 on success, anything else is a failure (1000 + cudaError_t by convention)"""

# Headers a proposed source may include: CUDA's, the C++ standard library's, CUTLASS and CuTe.
_CUDA_HEADERS = {
    "cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h",
    "cuda_pipeline.h", "cuda_awbarrier.h", "cooperative_groups.h", "mma.h", "math_constants.h",
    "device_launch_parameters.h", "vector_types.h", "vector_functions.h", "cuda_fp16.hpp", "cuda_bf16.hpp",
    "crt/math_functions.h", "sm_90_rt.h", "cuda/barrier", "cuda/pipeline", "cuda/atomic", "cuda/annotated_ptr",
}
_CUDA_PREFIXES = ("cooperative_groups/", "cuda/std/", "cub/", "cutlass/", "cute/")
_STD_HEADERS = {
    "algorithm", "array", "atomic", "bit", "cassert", "cfloat", "climits", "cmath", "cstddef", "cstdint", "cstdio",
    "cstdlib", "cstring", "functional", "initializer_list", "iterator", "limits", "numeric", "tuple", "type_traits",
    "utility", "assert.h", "float.h", "limits.h", "math.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "string.h",
}
# Calls that reach the operating system or run code at load time: never in a kernel.
_FORBIDDEN = [
    (re.compile(r"\b(system|popen|pclose|execl|execlp|execle|execv|execvp|execvpe|execve|fork|vfork|"
                r"posix_spawnp?|dlopen|dlsym|fopen|freopen|open|openat|creat|unlink|remove|rename|syscall|"
                r"socket|connect|getenv|setenv|putenv|kill|ptrace|mmap|chmod|chown)\s*\("),
     "calls `{0}(`, which reaches the operating system"),
    (re.compile(r"__attribute__\s*\(\(\s*(constructor|destructor)"), "has a `__attribute__(({0}))` function, "
     "which would run when the library loads"),
    (re.compile(r"^[ \t]*#[ \t]*(?!(?:include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|warning)\b)"
                r"(\w+)", re.M), "uses the directive `#{0}` (allowed: include, define, undef, if/ifdef/ifndef/elif/"
     "else/endif, pragma, error, warning)"),
    (re.compile(r"(incbin)"), "mentions `.{0}` (an assembler directive that reads a file)"),
    (re.compile(r"\b_Pragma\s*\("), "uses `_Pragma(` (a pragma built at compile time)"),
    (re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+"
                r"(?!unroll\b|once\b|nv_diag_suppress\b|nv_diag_default\b|diag_suppress\b)(\w+)", re.M),
     "uses `#pragma {0}` (only unroll, once and diagnostic pragmas are allowed)"),
]
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b[ \t]*(.*)$", re.M)


class RegionKernelError(FactError):
    """A region cannot be given to a proposed kernel (an op fact-db cannot evaluate, a non-float input)."""


def allowed_header(name: str) -> bool:
    if ".." in name or name.startswith("/") or "\\" in name:
        return False
    return name in _CUDA_HEADERS or name in _STD_HEADERS or name.startswith(_CUDA_PREFIXES)


def _as_preprocessed(source: str) -> str:
    """The text the preprocessor reads: lines spliced at a backslash-newline, comments replaced
    by a space (so `#/**/include` and `#inc\\<newline>lude` are seen as the includes they are).
    Newlines inside block comments are kept, so line numbers still match the source."""
    spliced = re.sub(r"\\\r?\n", "", source)
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: " " + "\n" * m.group(0).count("\n"), spliced, flags=re.S)


def check_source(source: str) -> str:
    """"" when `source` follows the source policy (module docstring), else why it is refused,
    naming the line. Also checks that it defines the entry point."""
    source = _as_preprocessed(source)
    for m in _INCLUDE.finditer(source):
        line = source.count("\n", 0, m.start()) + 1
        arg = m.group(1).strip()
        inc = re.fullmatch(r"<([^<>\s]+)>", arg)
        if inc is None:
            return (f"line {line}: `#include {arg}` is refused: only `#include <header>` of CUDA and C++ standard "
                    "headers, `cutlass/...` and `cute/...` is allowed")
        if not allowed_header(inc.group(1)):
            return (f"line {line}: `#include <{inc.group(1)}>` is outside the allowed headers (CUDA and C++ standard "
                    "headers, `cutlass/...`, `cute/...`)")
    for pat, why in _FORBIDDEN:
        m = pat.search(source)
        if m:
            line = source.count("\n", 0, m.start()) + 1
            return f"line {line}: the source " + why.format(*[g or "" for g in m.groups()])
    if not re.search(rf"extern\s+\"C\"[^;{{]*?\b{ENTRY}\s*\(", source, re.S) and \
            not re.search(rf"extern\s+\"C\"\s*\{{.*\b{ENTRY}\s*\(", source, re.S):
        return f"the source does not define `extern \"C\" int {ENTRY}(...)` (the ABI in the prompt)"
    return ""


# ------------------------------------------------------------------------------------------
# The region as data.

def _encode(a, inside: set, names: list):
    from fact_db.discovery.trace import Node
    if isinstance(a, Node):
        if a.name not in inside and a.name not in names:
            names.append(a.name)
        return {"ref": a.name}
    if isinstance(a, (list, tuple)):
        return [_encode(x, inside, names) for x in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise RegionKernelError(f"argument {a!r} ({type(a).__name__}) cannot be written down for a worker")


@dataclass
class RegionSpec:
    """A region of the traced graph as plain data: its external tensor inputs (in ABI order),
    its ATen ops in topological order (args in schema order, tensors as {"ref": name}), the
    output node, and the dtype every floating tensor has at `policy`."""

    inputs: list            # [{"name", "kind", "shape", "dtype"}]
    ops: list               # [{"name", "op", "overload", "args", "arg_names"}]
    output: str
    out_shape: list
    policy: str
    dtype: str
    nodes: list = field(default_factory=list)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph, names: list, policy: str) -> RegionSpec:
        """The region of `graph` made of the call nodes `names` (its output: the last of them in
        graph order). Refused (RegionKernelError) when an op is not ATen, an inner value is read
        outside the region, or an input is not floating point."""
        if policy not in POLICY_DTYPE:
            raise RegionKernelError(f"policy {policy!r} is not one of {', '.join(POLICY_DTYPE)}")
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        missing = [x for x in names if x not in order]
        if missing:
            raise RegionKernelError(f"region nodes {missing} are not in the graph")
        nodes = sorted({graph[x] for x in names}, key=lambda n: order[n.name])
        inside = {n.name for n in nodes}
        out = nodes[-1]
        ops, ext = [], []
        for n in nodes:
            if not n.op.startswith("aten."):
                raise RegionKernelError(f"node {n.name} is {n.op}, not an ATen op a worker can evaluate")
            if n is not out and any(u.name not in inside for u in n.users):
                raise RegionKernelError(f"node {n.name} is also read outside the region "
                                        f"({', '.join(u.name for u in n.users if u.name not in inside)})")
            ops.append({"name": n.name, "op": n.op, "overload": n.overload or "default",
                        "args": _encode(n.args, inside, ext), "arg_names": list(n.arg_names)})
        inputs = []
        for x in ext:
            nd = graph[x]
            if nd.shape is None or nd.dtype not in ("float32", "float16", "bfloat16", "float64"):
                raise RegionKernelError(f"region input {x} is {nd.dtype or 'not a tensor'}; a region kernel takes "
                                        "floating-point tensors only")
            inputs.append({"name": x, "kind": nd.op, "shape": list(nd.shape), "dtype": POLICY_DTYPE[policy]})
        if out.shape is None:
            raise RegionKernelError(f"region output {out.name} has no tensor shape")
        return cls(inputs, ops, out.name, list(out.shape), policy, POLICY_DTYPE[policy], [n.name for n in nodes])

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RegionSpec:
        return cls(**d)

    def digest(self, arch: str, gpu: str) -> str:
        """The registry key: the ops with their constant arguments, the input shapes, dtype,
        policy, arch and GPU (node names do not count: the same region elsewhere is the same key)."""
        from fact_db.core.device import canonical_gpu
        rename = {x["name"]: f"in{i}" for i, x in enumerate(self.inputs)}
        rename.update({o["name"]: f"op{i}" for i, o in enumerate(self.ops)})

        def canon(a):
            if isinstance(a, dict) and "ref" in a:
                return {"ref": rename[a["ref"]]}
            return [canon(x) for x in a] if isinstance(a, list) else a
        key = {"ops": [[o["op"], o["overload"], canon(o["args"])] for o in self.ops],
               "inputs": [x["shape"] for x in self.inputs], "out": self.out_shape, "dtype": self.dtype,
               "policy": self.policy, "arch": arch, "gpu": canonical_gpu(gpu) if gpu else ""}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]

    def summary(self) -> str:
        return " -> ".join(o["op"] for o in self.ops)

    def contract(self) -> dict:
        """What the prompt tells the model about the kernel it may write for this region."""
        return {"abi": ABI, "entry": ENTRY, "element_type": C_TYPE[self.dtype],
                "inputs": [{"index": i, "name": x["name"], "kind": x["kind"], "shape": x["shape"]}
                           for i, x in enumerate(self.inputs)],
                "output": {"name": self.output, "shape": self.out_shape, "layout": "contiguous row-major"},
                "computes": [f"{o['name']} = {o['op']}.{o['overload']}({_show_args(o)})" for o in self.ops],
                "includes": "only <...> of CUDA and C++ standard headers, cutlass/..., cute/...; no file, process "
                            "or network calls; no code that runs at load time",
                "arch": "compiled with nvcc -std=c++17 -O3 -DNDEBUG for sm_90a (CUTLASS and CuTe on the include path)"}

    # -- the verify.verify() workload protocol ---------------------------------------------
    def make_inputs(self, dist: str = "randn", device="cuda", generator=None) -> dict:
        import torch
        dt = getattr(torch, self.dtype)
        draw = torch.randn if dist == "randn" else torch.rand
        return {x["name"]: draw(*x["shape"], generator=generator, device=device, dtype=torch.float32).to(dt)
                for x in self.inputs}

    def _evaluate(self, env: dict):
        import torch
        for o in self.ops:
            op = getattr(getattr(torch.ops.aten, o["op"].split(".", 1)[1]), o["overload"])
            schema = op._schema.arguments
            pos, kw = [], {}
            for i, a in enumerate(o["args"]):
                v = _decode(a, env, schema[i] if i < len(schema) else None)
                if i < len(schema) and schema[i].kwarg_only:
                    kw[schema[i].name] = v
                else:
                    pos.append(v)
            env[o["name"]] = op(*pos, **kw)
        return env[self.output]

    def reference(self, inputs: dict):
        """The region in float64 on the same inputs."""
        import torch
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return self._evaluate({k: v.to(torch.float64) for k, v in inputs.items()})

    def eager(self, inputs: dict, policy: str | None = None):
        """The region in eager PyTorch at the policy (tf32 on for tf32 and tf32x3's baseline)."""
        import torch
        pol = policy or self.policy
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = pol in ("tf32",)
        try:
            return self._evaluate(dict(inputs)).to(getattr(torch, self.dtype))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old


def _decode(a, env, arg_schema):
    import torch
    if isinstance(a, dict) and "ref" in a:
        return env[a["ref"]]
    if isinstance(a, list):
        return [_decode(x, env, None) for x in a]
    if isinstance(a, str) and arg_schema is not None and "ScalarType" in str(arg_schema.type):
        return getattr(torch, a)
    if isinstance(a, str) and arg_schema is not None and "Device" in str(arg_schema.type):
        return torch.device(a)
    return a


def _show_args(o) -> str:
    def show(a):
        if isinstance(a, dict) and "ref" in a:
            return a["ref"]
        if isinstance(a, list):
            return "[" + ", ".join(show(x) for x in a) + "]"
        return repr(a)
    return ", ".join(f"{n}={show(a)}" for n, a in zip(o["arg_names"], o["args"]))


# ------------------------------------------------------------------------------------------
# Loading and calling a built kernel.

class RegionKernel:
    """A built region kernel: `k(inputs, out)` launches it on tensors in ABI order."""

    def __init__(self, path: str | Path, spec: RegionSpec, build_key: str = ""):
        self.path, self.spec, self.build_key = Path(path), spec, build_key
        self._op = None
        try:
            self._lib = ctypes.CDLL(str(self.path))
            self._fn = getattr(self._lib, ENTRY)
        except (OSError, AttributeError) as e:
            raise KernelError(f"cannot load region kernel {self.path}: {e}") from None
        P = ctypes.POINTER
        self._fn.argtypes = [P(ctypes.c_void_p), P(P(ctypes.c_int64)), P(P(ctypes.c_int64)), P(ctypes.c_int),
                             ctypes.c_int, ctypes.c_void_p, P(ctypes.c_int64), ctypes.c_int, ctypes.c_void_p]
        self._fn.restype = ctypes.c_int

    def __call__(self, inputs: list, out):
        n = len(inputs)
        i64 = ctypes.c_int64
        shapes = [(i64 * max(t.dim(), 1))(*t.shape) for t in inputs]
        strides = [(i64 * max(t.dim(), 1))(*t.stride()) for t in inputs]
        ptrs = (ctypes.c_void_p * n)(*[t.data_ptr() for t in inputs])
        sp = (ctypes.POINTER(i64) * n)(*[ctypes.cast(s, ctypes.POINTER(i64)) for s in shapes])
        st = (ctypes.POINTER(i64) * n)(*[ctypes.cast(s, ctypes.POINTER(i64)) for s in strides])
        ranks = (ctypes.c_int * n)(*[t.dim() for t in inputs])
        oshape = (i64 * max(out.dim(), 1))(*out.shape)
        rc = self._fn(ptrs, sp, st, ranks, n, out.data_ptr(), oshape, out.dim(), raw_stream(out.device))
        if rc != 0:
            what = launch_status(rc, {})
            raise KernelError(f"region kernel {self.path.parent.name} refused or failed the launch: {what}")
        return out


    @property
    def op_name(self) -> str:
        """`r_<hash>` of the build key (or the library's bytes) and the region: the same kernel
        for the same region gets the same name wherever its `.so` lies (build cache, artifact)."""
        ident = self.build_key or hashlib.sha256(self.path.read_bytes()).hexdigest()
        region = json.dumps(self.spec.as_dict(), sort_keys=True)
        return "r_" + hashlib.sha256(f"{ident}|{region}".encode()).hexdigest()[:12]

    def as_op(self):
        """This kernel as `torch.ops.factdb.<op_name>(Tensor[] inputs) -> Tensor`, inputs in ABI
        order. Inputs are made contiguous first (the kernel was verified on contiguous tensors;
        a no-op for the usual ones), and a call with shapes other than the region's is refused:
        the kernel was verified at those shapes only."""
        if self._op is not None:
            return self._op
        import torch

        kernel, spec = self, self.spec
        shapes = [list(x["shape"]) for x in spec.inputs]
        out_shape, out_dt = list(spec.out_shape), getattr(torch, spec.dtype)

        def run(inputs):
            got = [list(t.shape) for t in inputs]
            if got != shapes:
                raise KernelError(f"region kernel {kernel.path.parent.name} takes inputs of shapes {shapes}, "
                                  f"got {got}")
            xs = [t.contiguous() for t in inputs]
            return kernel(xs, torch.empty(out_shape, dtype=out_dt, device=xs[0].device))

        self._op = factdb_op(self.op_name, "(Tensor[] inputs) -> Tensor", run,
                             lambda inputs: inputs[0].new_empty(out_shape, dtype=out_dt))
        return self._op


# ------------------------------------------------------------------------------------------
# Worker jobs (fact_db/kernels/worker.py runs them in its subprocess; the parent never compiles).

def compile_job(job: dict) -> dict:
    """{"source", "name", "arch", "timeout"} -> {"status": ok|compile_error|timeout|no_toolchain,
    "so", "build_key", "error", "command", "seconds"}. nvcc runs under `timeout` seconds."""
    from fact_db.kernels import build as build_mod
    try:
        [b] = build_mod.build([build_mod.Source(TEMPLATE, job["source"], job.get("arch", "sm90a"))], jobs=1,
                              progress=False, timeout=float(job.get("timeout", 300)))
    except build_mod.BuildError as e:
        return {"id": job["id"], "status": "no_toolchain", "error": str(e)}
    if b.ok:
        return {"id": job["id"], "status": "ok", "so": str(b.path), "build_key": b.key, "command": b.command,
                "seconds": b.seconds, "cached": b.cached, "error": ""}
    status = "timeout" if b.error.startswith("nvcc timed out") else "compile_error"
    return {"id": job["id"], "status": status, "build_key": b.key, "error": b.error, "command": b.command,
            "seconds": b.seconds}


def run_job(job: dict) -> dict:
    """{"so", "region", "trials", "reps"} -> verify against float64 and time against eager on
    the GPU: {"status": ok|verify_failed|launch_error|needs_gpu, "err", "eager_err", "time_ms",
    "eager_ms", "device", "error"}."""
    import torch
    if not torch.cuda.is_available():
        return {"id": job["id"], "status": "needs_gpu",
                "error": "needs a GPU: no CUDA device is visible to the worker, so it was neither verified "
                         "nor timed"}
    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.verify import verify
    spec = RegionSpec.from_dict(job["region"])
    k = RegionKernel(job["so"], spec)
    names = [x["name"] for x in spec.inputs]

    def run(inputs, out=None):
        if out is None:
            out = torch.empty(spec.out_shape, dtype=getattr(torch, spec.dtype), device="cuda")
        return k([inputs[n] for n in names], out)

    res = {"id": job["id"], "device": torch.cuda.get_device_name()}
    v = verify(run, spec, trials=job.get("trials", 5))
    res.update(err=v.err, eager_err=v.eager_err)
    if not v.ok:
        return {**res, "status": "launch_error" if v.reason.startswith("launch failed") else "verify_failed",
                "error": v.reason}
    sets = [spec.make_inputs("randn") for _ in range(3)]
    t = time_cuda(run, sets, reps=job.get("reps", 20))
    e = time_cuda(lambda x: spec.eager(x), sets, reps=job.get("reps", 20))
    return {**res, "status": "ok", "time_ms": t.median_ms, "eager_ms": e.median_ms, "error": ""}


# ------------------------------------------------------------------------------------------
# The pipeline the agent runs a kernel proposal through (its default kernel hooks).

class NeedsGPU(Exception):
    """Verification or timing needs a GPU the worker does not have."""


class NoToolchain(Exception):
    """nvcc or the CUTLASS headers are missing where the worker runs."""


class Pipeline:
    """compile -> verify -> bench -> store for proposals of one region, each step a worker job.

    `runner(jobs) -> results` replaces the worker pool, as in the tuner (tests inject one that
    passes compile jobs to a real worker and answers the GPU jobs). `compile_timeout` bounds
    nvcc (and, with a margin, the worker job); `registry` receives the winner.
    """

    def __init__(self, spec: RegionSpec, *, arch: str = "sm90a", gpu: str = "", registry=None, runner=None,
                 compile_timeout: float = 300.0, run_timeout: float = 120.0, model: str = "", explanation: str = ""):
        self.spec, self.arch, self.gpu, self.registry = spec, arch, gpu, registry
        self.runner, self.compile_timeout, self.run_timeout = runner, compile_timeout, run_timeout
        self.model, self.explanation = model, explanation
        self.result: dict = {}
        self._pools: dict = {}

    def _run(self, job: dict, timeout: float) -> dict:
        if self.runner is not None:
            return self.runner([job])[0]
        from fact_db.kernels.worker import WorkerPool
        pool = self._pools.get(timeout)
        if pool is None:
            pool = self._pools[timeout] = WorkerPool(timeout=timeout)
        return pool.run([job])[0]

    def close(self) -> None:
        for p in self._pools.values():
            p.close()
        self._pools.clear()

    def compile(self, source: str, name: str) -> dict:
        job = {"id": 0, "kind": "region_compile", "source": source, "name": name, "arch": self.arch,
               "timeout": self.compile_timeout}
        r = self._run(job, self.compile_timeout + 30)
        if r["status"] == "ok":
            return {**r, "name": name}
        if r["status"] == "timeout":
            raise TimeoutError(f"compile over {self.compile_timeout:g} s: {r.get('error', '')}")
        if r["status"] == "no_toolchain":
            raise NoToolchain(r.get("error", ""))
        cmd = f"\n$ {r['command']}" if r.get("command") else ""
        raise RuntimeError(f"{r.get('error') or r['status']}{cmd}")

    def verify(self, handle: dict):
        job = {"id": 1, "kind": "region_run", "so": handle["so"], "region": self.spec.as_dict(), "trials": 5, "reps": 20}
        r = self.result = self._run(job, self.run_timeout)
        if r["status"] == "needs_gpu":
            raise NeedsGPU(r.get("error", "needs a GPU"))
        if r["status"] == "timeout":
            raise TimeoutError(r.get("error", ""))
        if r["status"] != "ok":
            return False, r.get("error") or r["status"]
        return True, f"error {r.get('err', 0):.3g} (eager {r.get('eager_err', 0):.3g})"

    def bench(self, handle: dict) -> tuple[float, float]:
        r = self.result  # verify's job timed it too: the library is loaded once
        if r.get("time_ms") is None or r.get("eager_ms") is None:
            raise NeedsGPU("no timing came back from the worker")
        return r["time_ms"] / 1e3, r["eager_ms"] / 1e3

    def store(self, handle: dict, source: str) -> None:
        if self.registry is None:
            return
        r = self.result
        self.registry.region_put(self.spec, self.arch, r.get("device") or self.gpu, name=handle["name"],
                                 source=source, build_key=handle.get("build_key", ""),
                                 time_ms=r.get("time_ms"), eager_ms=r.get("eager_ms"), rel_err=r.get("err"),
                                 eager_rel_err=r.get("eager_err"), device_name=r.get("device", ""),
                                 model=self.model, explanation=self.explanation)

    def hooks(self) -> dict:
        return {"compile": self.compile, "verify": self.verify, "bench": self.bench, "store": self.store}
