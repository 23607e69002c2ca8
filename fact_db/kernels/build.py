"""Build: rendered CUTLASS sources -> shared libraries, cached by content, in parallel.

Each source is compiled by nvcc with the flags of DESIGN.md (`-DNDEBUG`, the arch's
`-gencode`), into `$FACTDB_HOME/build/<hash>/kernel.so`, where the hash covers the source,
the flags and the toolchain. A cached library is reused; a failed compile leaves
`error.txt` (the nvcc command and its first error) beside it and is not retried unless
`force=True`; a compile that ran out of time is not cached (the limit, not the source, may be
at fault). Libraries are written under a temporary name and renamed into place, so an
interrupted build never leaves a half-written `.so` in the cache.

>>> [b] = build([Source("gemm_sm90", src, arch="sm90a")])
>>> b.ok, b.path, b.cached
"""
from __future__ import annotations

import contextvars
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fact_db.core import paths, toolchain
from fact_db.core.errors import FactError

GENCODE = {
    "sm90a": ["arch=compute_90a,code=sm_90a"],
    "sm80": ["arch=compute_80,code=sm_80"],
}
FLAGS = ["-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-Xcompiler=-fPIC", "-shared",
         "-lineinfo", "-Xcompiler=-Wno-psabi"]
# Extra include roots some templates need (see kernels_cpp/examples.yaml).
TEMPLATE_INCLUDES = {
    "fmha_sm80": ["cutlass_examples", "kernels_cpp_include"],
    "dual_gemm_sm80": ["cutlass_examples"],
    "gemm_softmax_sm80": ["cutlass_examples"],
    "fmha_sm90": ["cutlass_examples", "cutlass_example_88"],
}


class BuildError(FactError):
    """The toolchain is missing or unusable (no nvcc, no CUTLASS headers)."""


@dataclass(frozen=True)
class Source:
    """One rendered kernel to build: its template name, CUDA source and target arch."""

    template: str
    code: str
    arch: str = "sm90a"


@dataclass
class Built:
    source: Source
    key: str            # content hash: source + flags + toolchain
    path: Path | None   # the .so, when the build succeeded
    cached: bool = False
    error: str = ""     # first error line(s) when it failed
    command: str = ""   # the nvcc command line
    seconds: float = 0.0
    log: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.path is not None

    @property
    def deferred(self) -> bool:
        """Not built because the tuning budget was spent: not a failure of the source."""
        return self.error == BUDGET_SPENT


BUDGET_SPENT = "not built: the tuning budget was spent"


def nvcc_path() -> str:
    exe = os.environ.get("FACTDB_NVCC") or shutil.which("nvcc")
    if not exe:
        cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        cand = Path(cuda) / "bin" / "nvcc"
        exe = str(cand) if cand.is_file() else None
    if not exe:
        raise BuildError("nvcc not found: install the CUDA toolkit (12.4 or newer, for sm90a), put nvcc on PATH, "
                         "or set FACTDB_NVCC=/path/to/nvcc")
    return exe


def cutlass_root() -> Path:
    """The installed nvidia-cutlass package's source tree (include/, tools/util/include/, examples/)."""
    examples = paths.cutlass_examples_dir()
    root = examples.parent if examples else None
    if root is None or not (root / "include" / "cutlass" / "cutlass.h").is_file():
        raise BuildError("CUTLASS headers not found: install them with `pip install nvidia-cutlass==4.2.0.0`")
    return root


def include_dirs(template: str) -> list[str]:
    root = cutlass_root()
    dirs = [root / "include", root / "tools" / "util" / "include"]
    for extra in TEMPLATE_INCLUDES.get(template, []):
        if extra == "cutlass_examples":
            dirs.append(root / "examples")
        elif extra == "cutlass_example_88":  # example 88's headers include "collective/...", "kernel/..."
            dirs.append(root / "examples" / "88_hopper_fmha")
        else:
            dirs.append(paths.templates_dir() / "include")
    return [str(d) for d in dirs]


def command(src: Path, out: Path, template: str, arch: str) -> list[str]:
    if arch not in GENCODE:
        raise BuildError(f"unsupported arch '{arch}': supported are {', '.join(sorted(GENCODE))}")
    cmd = [nvcc_path(), *FLAGS]
    cmd += [f"-gencode={g}" for g in GENCODE[arch]]
    cmd += [f"-I{d}" for d in include_dirs(template)]
    return cmd + [str(src), "-o", str(out)]


def cache_dir() -> Path:
    """Where built kernels are kept, by content key: $FACTDB_BUILD_CACHE (a cache shared by
    several homes, or built on another host with the same toolchain), else $FACTDB_HOME/build."""
    shared = os.environ.get("FACTDB_BUILD_CACHE")
    return Path(shared) if shared else paths.home() / "build"


def content_key(source: Source) -> str:
    tc = toolchain.current()
    h = hashlib.sha256()
    for part in (source.code, source.arch, " ".join(FLAGS), " ".join(GENCODE.get(source.arch, [])),
                 tc.nvcc, tc.cutlass, " ".join(TEMPLATE_INCLUDES.get(source.template, []))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def first_error(log: str) -> str:
    """The first `error` line of an nvcc log (with the line after it), else its last line."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\berror\b", line, re.IGNORECASE):
            return "\n".join(lines[i:i + 2]).strip()
    return lines[-1].strip() if lines else "nvcc failed with no output"


def _build_one(source: Source, force: bool, timeout: float) -> Built:
    hit = None if force else cached(source)
    if hit is not None:
        return hit
    key = content_key(source)
    d = cache_dir() / key
    so, err = d / "kernel.so", d / "error.txt"
    if err.is_file() and not force:
        text = err.read_text()
        cmd, _, first = text.partition("\n")
        return Built(source, key, None, cached=True, error=first.strip(), command=cmd)
    d.mkdir(parents=True, exist_ok=True)
    cu = d / "kernel.cu"
    cu.write_text(source.code)
    fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=d)
    os.close(fd)
    cmd = command(cu, Path(tmp), source.template, source.arch)
    shown = " ".join(cmd)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        log, rc = f"nvcc timed out after {timeout:.0f} s", -1
    seconds = time.perf_counter() - t0
    if rc == 0 and os.path.getsize(tmp) > 0:
        os.replace(tmp, so)
        (d / "command.txt").write_text(shown)
        return Built(source, key, so, command=shown, seconds=seconds, log=log)
    Path(tmp).unlink(missing_ok=True)
    first = first_error(log)
    if rc == -1:  # a timeout says nothing about the source: not cached, a longer limit may build it
        (d / "build.log").write_text(log)
        return Built(source, key, None, error=first, command=shown, seconds=seconds, log=log)
    (d / "build.log").write_text(log)
    tmp_err = d / "error.txt.tmp"
    tmp_err.write_text(f"{shown}\n{first}\n")
    os.replace(tmp_err, err)
    return Built(source, key, None, error=first, command=shown, seconds=seconds, log=log)


FETCHED = "fetched from the team registry's shared binaries"  # command.txt of a kernel no nvcc built here
_SHARED: contextvars.ContextVar = contextvars.ContextVar("factdb_shared_binaries", default=None)


@contextmanager
def sharing(registry):
    """Within the block, build() first looks for each kernel it would compile among `registry`'s
    shared binaries (fetch_shared), where the registry shares them; a no-op otherwise."""
    on = registry is not None and getattr(registry, "shares_binaries", lambda: False)()
    token = _SHARED.set(registry if on else None)
    try:
        yield
    finally:
        _SHARED.reset(token)


_DEADLINE: contextvars.ContextVar = contextvars.ContextVar("factdb_compile_deadline", default=None)


@contextmanager
def compile_deadline(deadline: float | None):
    """Within the block, build() starts no compile past `deadline` (a time.perf_counter()
    value: the tuning budget) unless its caller passes its own; what is in the build cache is
    still returned, so a tuner past the budget runs the candidates already built."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def cached(source: Source) -> Built | None:
    """`source`'s library from the build cache (no nvcc), or None where it was never built."""
    key = content_key(source)
    d = cache_dir() / key
    if not (d / "kernel.so").is_file():
        return None
    cmd = d / "command.txt"
    return Built(source, key, d / "kernel.so", cached=True, command=cmd.read_text() if cmd.is_file() else "")


def fetch_shared(source: Source, registry) -> Built | None:
    """`source`'s kernel from the team registry's shared binaries into the build cache (no nvcc),
    where the registry shares them (Registry.shares_binaries) and holds this build key; None
    otherwise, or where the cache has it already. The bytes are checked against their digest
    (Registry.get_binary) and written atomically."""
    if registry is None or not getattr(registry, "shares_binaries", lambda: False)():
        return None
    key = content_key(source)
    d = cache_dir() / key
    so = d / "kernel.so"
    if so.is_file():
        return None
    data = registry.get_binary(key)
    if data is None:
        return None
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.cu").write_text(source.code)
    fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=d)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, so)
    (d / "command.txt").write_text(FETCHED)
    return Built(source, key, so, cached=True, command=FETCHED)


_PUT: set = set()  # build keys this process stored: a winner the GEMM tuner shared is not read and sent again by realize


def share_built(registry, built_key: str, so: str | os.PathLike | None, arch: str) -> bool:
    """Put a kernel this host built (a tuning's winner) into the team registry's shared binaries
    for the other hosts; False where sharing is off, the file is missing, or it is there already
    (stored by this process before, or by another host)."""
    if registry is None or not so or built_key in _PUT or not getattr(registry, "shares_binaries", lambda: False)():
        return False
    try:
        data = Path(so).read_bytes()
    except OSError:
        return False
    stored = registry.put_binary(built_key, data, arch=arch)
    if stored:
        _PUT.add(built_key)
    return stored


NVCC_PEAK_BYTES = int(3.5 * 2**30)  # one CUTLASS sm90 kernel's nvcc at its peak (cicc: 3.2 GiB for a conv)


def _memory_available() -> int | None:
    """Bytes this process may still fill: MemAvailable, and at most FACTDB_MAX_MEMORY_MB (the
    limit a sandbox put on it and its children); None where neither is known."""
    caps = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    caps.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    limit = os.environ.get("FACTDB_MAX_MEMORY_MB")
    if limit and limit.isdigit():
        caps.append(int(limit) * 2**20 * 3 // 4)  # the rest for the process that builds, and its model
    return min(caps) if caps else None


def default_jobs() -> int:
    """nvcc processes at a time: FACTDB_BUILD_JOBS where set; else the cores this process may
    run on (its affinity, not the host's count), and no more than memory holds at
    NVCC_PEAK_BYTES each (64 compiles of ResNet's convolutions at once passed 96 GiB)."""
    env = os.environ.get("FACTDB_BUILD_JOBS", "")
    if env.strip():
        if not env.strip().isdigit() or int(env) < 1:
            raise BuildError(f"FACTDB_BUILD_JOBS={env!r}: give a whole number of compiles at a time, 1 or more")
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    mem = _memory_available()
    return max(1, min(cores, mem // NVCC_PEAK_BYTES) if mem is not None else cores)


def build(sources: list[Source], jobs: int | None = None, force: bool = False, progress: bool = True,
          timeout: float = 900.0, deadline: float | None = None) -> list[Built]:
    """Build every source (cached ones return at once), `jobs` nvcc processes at a time. No
    compile starts past `deadline` (a time.perf_counter() value: the tuning budget; by default
    the one compile_deadline() set): those sources come back unbuilt (`deferred`), not cached
    as failures, and cached ones still come back built. Progress: a bar on a terminal, else a
    line per kernel on stderr (a log or a pipe shows no bar)."""
    if not sources:
        return []
    deadline = deadline if deadline is not None else _DEADLINE.get()
    nvcc_path(), cutlass_root()  # fail early, with the install hint, before starting threads
    jobs = max(1, jobs or default_jobs())
    bar, t0, finished = None, time.perf_counter(), []
    if progress and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(sources), desc="compile", unit="kernel", leave=False)
    elif progress:
        print(f"[build] compiling {len(sources)} kernel(s), {min(jobs, len(sources))} at a time", file=sys.stderr,
              flush=True)
    results: list[Built | None] = [None] * len(sources)
    shared = None if force else _SHARED.get()  # (the pool's threads do not see the caller's context)

    def work(i: int) -> None:
        fetched = fetch_shared(sources[i], shared) if shared is not None else None
        if fetched is not None:
            results[i] = fetched
        elif deadline is not None and time.perf_counter() > deadline:
            results[i] = (None if force else cached(sources[i])) or Built(sources[i], content_key(sources[i]), None,
                                                                          error=BUDGET_SPENT)
        else:
            results[i] = _build_one(sources[i], force, timeout)
        if bar is not None:
            bar.update(1)
        elif progress:
            b = results[i]
            finished.append(i)
            what = ("from the team registry" if b.command == FETCHED else "cached" if b.cached and b.ok else
                    "built in %.0f s" % b.seconds if b.ok else b.error if b.deferred else "failed: " + b.error)
            print(f"[build] {len(finished)}/{len(sources)} {sources[i].template}: {what.splitlines()[0][:160]} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(work, range(len(sources))))
    if bar is not None:
        bar.close()
    return [r for r in results if r is not None]
