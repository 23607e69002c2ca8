"""GPUs and arches: the one table of what fact-db knows about a device, and how names are spelled.

    >>> canonical_gpu("NVIDIA H100 80GB HBM3"), canonical_gpu("NVIDIA A100-SXM4-80GB")
    ('h100', 'a100')
    >>> build_arch("sm90"), model_arch("sm90a")
    ('sm90a', 'sm90')
    >>> device("NVIDIA H200").bandwidth
    4300000000000.0

Keys use the short model name (`h100`); the full device name (`NVIDIA H100 80GB HBM3`, which
tells an SXM card from a PCIe or NVL one) is part of the registry's environment key
(fact_db.core.environment). Hopper is spelled `sm90` where discovery's roofline models it and
`sm90a` where kernels are built for it (wgmma and TMA need the `a` features).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fact_db.core.errors import FactError

ARCHES = ("sm90", "sm90a", "sm80")  # every command accepts both spellings of Hopper
_ARCH = re.compile(r"sm_?\d{2,3}[a-z]?")
_GPU_MODELS = re.compile(r"(?<![a-z0-9])(gb300|gb200|gh200|b300|b200|b100|h200|h100|h800|h20|a100|a800|a10g|a10|a16|"
                         r"a30|a40|a2|l40s|l40|l4|v100|p100|t4)(?![a-z0-9])")


class DeviceError(FactError, ValueError):
    """A GPU or arch name fact-db cannot read."""


def canonical_gpu(name: str) -> str:
    """The short GPU name used in keys, from torch.cuda.get_device_name() or a short name.

    >>> canonical_gpu("NVIDIA GeForce RTX 4090")
    'geforce-rtx-4090'
    """
    low = (name or "").strip().lower()
    m = _GPU_MODELS.search(low)
    if m:
        return m.group(1)
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"^nvidia\b", "", low)).strip("-")
    if not slug:
        raise DeviceError(f"GPU name {name!r} is empty; pass torch.cuda.get_device_name() or a short name such as h100")
    return slug


def canonical_arch(arch: str) -> str:
    """`sm_90a` -> `sm90a`; DeviceError for anything that is not a compute capability."""
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise DeviceError(f"arch {arch!r} is not a compute capability such as sm90a or sm80")
    return arch.replace("_", "")


def build_arch(arch: str) -> str:
    """The arch kernels are built for: Hopper (`sm90`, `sm_90`) is built as sm90a."""
    a = canonical_arch(arch)
    return "sm90a" if a == "sm90" else a


def model_arch(arch: str) -> str:
    """The arch discovery's roofline knows: sm90a is sm90."""
    a = canonical_arch(arch)
    return "sm90" if a == "sm90a" else a


@dataclass(frozen=True)
class Device:
    """A GPU as the roofline and the tuner's cost model see it."""

    name: str
    arch: str
    tflops: dict               # math mode -> peak TFLOP/s (dense)
    bandwidth: float           # bytes/s, HBM copy
    sms: int = 132
    smem: int = 227 * 1024     # shared memory a block may use
    launch_s: float = 3e-6     # one kernel launch plus tail, as seen from eager PyTorch


# H100 SXM: bf16 about 790 TFLOP/s, tf32 about 400, fp32 (no tensor cores) about 51, HBM
# copy about 3 TB/s, measured; H200: same math, about 4.3 TB/s. A100 SXM 80GB: datasheet.
DEVICES = {
    "h100": Device("H100", "sm90", {"bf16": 790.0, "fp16": 790.0, "tf32": 400.0, "fp32": 51.0}, 3.0e12),
    "h200": Device("H200", "sm90", {"bf16": 790.0, "fp16": 790.0, "tf32": 400.0, "fp32": 51.0}, 4.3e12),
    "a100": Device("A100", "sm80", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 2.039e12,
                   sms=108, smem=163 * 1024),
}
DEFAULT_DEVICE = {"sm90": "h100", "sm90a": "h100", "sm80": "a100"}
EPILOGUE_SMEM = 32 * 1024  # what an sm90 GEMM's epilogue keeps in shared memory beside the mainloop's stages


def device(gpu: str | None, arch: str = "sm90") -> Device:
    """The device for a GPU named as the registry keys it (`h200`) or as CUDA reports it
    (`NVIDIA H200`, `NVIDIA H100 80GB HBM3`); an unknown or missing name takes the arch's default."""
    name = (gpu or "").lower()
    for key, dev in DEVICES.items():
        if key in name.split() or key == name or name.replace("nvidia", "").strip().startswith(key):
            return dev
    return DEVICES[DEFAULT_DEVICE.get(arch, "h100")]
