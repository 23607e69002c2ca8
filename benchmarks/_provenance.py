"""What every benchmark result records about where it came from: the machine and the commit.

Imported by the scripts beside it (they run as `python benchmarks/<name>.py`, so this folder
is on sys.path).
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine(**versions) -> dict:
    """This CPU machine: model name, cores, Python, plus the package `versions` a script names."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": "cpu", "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), **versions}


def commit(paths: list[str] | None = None, dirty_note: str = "+dirty") -> str:
    """HEAD, with `dirty_note` appended when tracked files (or just `paths`) differ from it,
    so results from uncommitted code say so; "unknown" outside a git checkout. A copy of the
    tree without .git (a GPU host's) names its commit in FACTDB_COMMIT."""
    if os.environ.get("FACTDB_COMMIT"):
        return os.environ["FACTDB_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *(paths or [])],
                               cwd=HERE.parent, capture_output=True, text=True, check=True).stdout.strip()
        return head + (dirty_note if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
