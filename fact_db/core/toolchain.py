"""The toolchain a kernel was built with: CUTLASS, nvcc, fact-db, and template hashes.

A registry row records these; when any of them differs from what is installed now, the
row is stale (DESIGN.md, "Stores"): reported as such, never silently reused.
"""
from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

from fact_db.core import paths


@dataclass(frozen=True)
class Toolchain:
    cutlass: str   # nvidia-cutlass package version, e.g. "4.2.0.0"; "" if not installed
    nvcc: str      # nvcc release, e.g. "13.0.88"; "" if nvcc is not on PATH
    factdb: str    # fact-db version

    def as_dict(self) -> dict:
        return asdict(self)


def _pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str | None = None) -> str:
    """nvcc's release as `13.0.88`, or "" when nvcc cannot be found or run."""
    exe = nvcc or shutil.which("nvcc")
    if not exe:
        return ""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else ""


def current() -> Toolchain:
    """The toolchain installed now."""
    from fact_db import __version__
    return Toolchain(cutlass=_pkg_version("nvidia-cutlass"), nvcc=nvcc_version(), factdb=__version__)


def template_hash(name: str) -> str:
    """sha256 (first 16 hex digits) of `kernels_cpp/<name>.cu.j2` and every shared piece it
    includes (`{% include "_x.j2" %}`, transitively), or "" if there is no such template."""
    root = paths.templates_dir()
    path = root / f"{name}.cu.j2"
    if not path.is_file():
        return ""
    h = hashlib.sha256()
    seen: set[str] = set()
    todo = [path.name]
    while todo:
        fname = todo.pop(0)
        if fname in seen or not (root / fname).is_file():
            continue
        seen.add(fname)
        text = (root / fname).read_bytes()
        h.update(fname.encode() + b"\0" + text + b"\0")
        todo += re.findall(r"""{%-?\s*include\s+["']([^"']+)["']""", text.decode(errors="replace"))
    return h.hexdigest()[:16]
