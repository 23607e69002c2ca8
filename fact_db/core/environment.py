"""The environment a timing was measured in: the registry's environment key.

A kernel's time, its baseline's time and a "the library wins" decision hold only where they
were measured (DESIGN.md, "The registry's environment key"). Every registry row records:

    gpu_sku   the full device name: `NVIDIA H100 80GB HBM3` (SXM), `NVIDIA H100 PCIe`, `NVIDIA H200`
    driver    the NVIDIA kernel driver, `580.159.04`
    cuda      the CUDA runtime torch was built with, `13.0`
    torch     `2.11.0+cu130`
    cublas    the cuBLAS package, `13.1.0.3` (the library's baselines and library candidates)
    cudnn     cuDNN as torch reports it, `91200`
    cutlass   the nvidia-cutlass package the kernel was built against, `4.2.0.0`
    nvcc      nvcc's release, `13.0.88`

A row whose environment differs from the one here is stale: shown as such, never silently
reused (`factdb registry revalidate` re-checks it). Where this machine has no GPU (planning
on a laptop or in CI) the GPU side (SKU, driver, CUDA, torch, cuBLAS, cuDNN) cannot be known
for the target, so only the build side (CUTLASS, nvcc) is compared, and `Environment.mismatch`
says so.

    >>> here = current()                      # probed once per process; no torch import needed
    >>> here.mismatch(row_env)                # "" when the row is current here
    'torch 2.11.0+cu130 then, 2.13.0 now'

Probing reads files (`/proc/driver/nvidia`, torch's `version.py`, package metadata) rather
than importing torch, so commands that need no tracing stay fast; where torch is already
imported and a GPU is visible, the current device's own name is used.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, fields, replace
from importlib.metadata import PackageNotFoundError, version

from fact_db.core import toolchain

FIELDS = ("gpu_sku", "driver", "cuda", "torch", "cublas", "cudnn", "cutlass", "nvcc")
GPU_SIDE = ("gpu_sku", "driver", "cuda", "torch", "cublas", "cudnn")
LABELS = {"gpu_sku": "GPU", "driver": "driver", "cuda": "CUDA runtime", "torch": "torch", "cublas": "cuBLAS",
          "cudnn": "cuDNN", "cutlass": "CUTLASS", "nvcc": "nvcc"}


@dataclass(frozen=True)
class Environment:
    """The fields a registry row's measurements depend on besides the workload ("" = unknown)."""

    gpu_sku: str = ""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    cublas: str = ""
    cudnn: str = ""
    cutlass: str = ""
    nvcc: str = ""

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                object.__setattr__(self, f.name, "")
            elif not isinstance(v, str):
                object.__setattr__(self, f.name, str(v))

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_sku)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Environment:
        d = d or {}
        return cls(**{f: d.get(f, "") or "" for f in FIELDS})

    def with_(self, **changes) -> Environment:
        return replace(self, **changes)

    def digest(self) -> str:
        """16 hex digits over every field: rows measured in one environment share it."""
        return hashlib.sha256(json.dumps([getattr(self, f) for f in FIELDS]).encode()).hexdigest()[:16]

    def mismatch(self, row: Environment) -> str:
        """Why a row recorded in `row` is stale here (this environment), or "" when it is current.

        A field the row does not know (recorded before fact-db kept it) is a mismatch. Without a
        GPU here, the GPU-side fields are not compared: they are the target's, unknown here."""
        why = []
        for f in FIELDS:
            if not self.has_gpu and f in GPU_SIDE:
                continue
            then, now = getattr(row, f), getattr(self, f)
            if then == now or (f == "cudnn" and cudnn_number(then) == cudnn_number(now)):
                continue
            if not then:
                why.append(f"{LABELS[f]} not recorded (a row from before the environment key), now {now or 'unknown'}")
            else:
                why.append(f"{LABELS[f]} {then} then, {now or 'unknown'} now")
        return "; ".join(why)

    def describe(self) -> str:
        """One line: `NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, ...`."""
        parts = [self.gpu_sku or "no GPU"]
        parts += [f"{LABELS[f]} {getattr(self, f) or '?'}" for f in FIELDS if f != "gpu_sku"]
        return ", ".join(parts)


# --------------------------------------------------------------------------------------
# probing

def cudnn_number(v: str) -> str:
    """cuDNN's version as torch reports it (`91900`), from that or from the wheel's version
    (`9.19.0.56`: major * 10000 + minor * 100 + patch); anything else as given. A process that
    probes before importing torch reads the wheel, one that probes after reads torch: both must
    give one key, or a row one process writes is stale in the next."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.\d+)*", v or "")
    return str(int(m.group(1)) * 10000 + int(m.group(2)) * 100 + int(m.group(3))) if m else (v or "")


def _pkg(*names: str) -> str:
    for n in names:
        try:
            return version(n)
        except PackageNotFoundError:
            continue
    return ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _torch_version_file() -> tuple[str, str]:
    """(torch version, CUDA version) read from torch's version.py without importing torch."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "", ""
    text = _read(list(spec.submodule_search_locations)[0] + "/version.py")
    v = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    c = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    return (v.group(1) if v else ""), (c.group(1) if c else "")


def _nvidia_smi() -> tuple[str, str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "", ""
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "", ""
    first = out.strip().splitlines()[0] if out.strip() else ""
    name, _, drv = first.partition(",")
    return name.strip(), drv.strip()


def _gpu_and_driver() -> tuple[str, str]:
    name = ""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                name = torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001  (a broken CUDA setup is "no GPU" here, not a crash)
            name = ""
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", _read("/proc/driver/nvidia/version"))
    driver = m.group(1) if m else ""
    if not name:
        for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
            mm = re.search(r"^Model:\s*(.+)$", _read(info), re.M)
            if mm:
                name = mm.group(1).strip()
                break
    if not name or not driver:
        smi_name, smi_driver = _nvidia_smi()
        name, driver = name or smi_name, driver or smi_driver
    if name and not name.lower().startswith("nvidia"):
        name = f"NVIDIA {name}"
    return name, driver


@functools.lru_cache(maxsize=None)
def _probe() -> Environment:
    gpu, driver = _gpu_and_driver()
    torch = sys.modules.get("torch")
    if torch is not None:
        tv, cuda = torch.__version__, torch.version.cuda or ""
    else:
        tv, cuda = _torch_version_file()
    cudnn = ""
    if torch is not None and gpu:
        try:
            cudnn = str(torch.backends.cudnn.version() or "")
        except Exception:  # noqa: BLE001
            cudnn = ""
    cudnn = cudnn_number(cudnn or _pkg("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn"))
    cublas = _pkg("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas")
    if not gpu:  # the GPU side is the target's, unknown here
        driver = cuda_rt = cublas = cudnn = ""
    else:
        cuda_rt = cuda
    tc = toolchain.current()
    return Environment(gpu_sku=gpu, driver=driver, cuda=cuda_rt, torch=tv, cublas=cublas, cudnn=cudnn,
                       cutlass=tc.cutlass, nvcc=tc.nvcc)


def current() -> Environment:
    """The environment of this process (probed once; see the module docstring)."""
    return _probe()


def device_info(device=None) -> dict:
    """{"name", "gpu", "capability"} of a CUDA device (the current one by default); the CPU's
    {"name": "cpu", "gpu": None, "capability": None} otherwise. Imports torch."""
    import torch

    from fact_db.core.device import canonical_gpu
    if (device is not None and getattr(device, "type", str(device)) != "cuda") or not torch.cuda.is_available():
        return {"name": "cpu", "gpu": None, "capability": None}
    idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(idx)
    cap = torch.cuda.get_device_capability(idx)
    return {"name": name, "gpu": canonical_gpu(name), "capability": f"{cap[0]}.{cap[1]}"}


def toolchain_info() -> dict:
    """The versions a report and an artifact record: CUTLASS, nvcc, fact-db, torch, CUDA, and the
    environment key's other fields."""
    env = current()
    return {**toolchain.current().as_dict(), "torch": env.torch or _torch_version_file()[0],
            "cuda": env.cuda or _torch_version_file()[1], "environment": env.as_dict()}
