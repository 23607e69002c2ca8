"""What every family's loaded kernels share: the launch return codes of the C ABI, the raw
CUDA stream a launch takes, dtype names, and the GPU tuning runs on.

Every template exports launch functions that return 0 or a status code (`launch_status`
says it in words) and take the current stream as a raw `cudaStream_t` (`raw_stream`).

    >>> launch_status(5), launch_status(1002)
    ('not supported', 'CUDA error 2')
"""
from __future__ import annotations

from fact_db.core.errors import FactError

CUTLASS_STATUS = {
    0: "success", 1: "misaligned operand", 2: "invalid data type", 3: "invalid layout",
    4: "invalid problem", 5: "not supported", 6: "workspace null", 7: "internal error",
    8: "arch mismatch", 9: "insufficient driver", 10: "memory allocation", 11: "invalid (alignment or shape)",
}


class KernelError(FactError):
    """A kernel could not be loaded, or refused or failed a launch."""


class NoGPU(FactError):
    """Tuning needs a Hopper GPU and none is visible (or the visible one is not sm90)."""


def launch_status(rc: int, names: dict = CUTLASS_STATUS) -> str:
    """A kernel launch's return code in words: a named status, `CUDA error N` (codes from
    1000 up carry a cudaError_t), or `status N`."""
    return names.get(rc, f"CUDA error {rc - 1000}" if rc >= 1000 else f"status {rc}")


def raw_stream(device) -> int:
    """The current CUDA stream of `device` as a raw handle (Inductor's fast path where torch has it)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None and device.index is not None:
        return raw(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def torch_dtype(name: str):
    """The torch dtype of an operand dtype name (float32, float16, bfloat16)."""
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def current_gpu() -> tuple[str, str]:
    """(canonical short name, full device name) of the current CUDA device; NoGPU if there is
    none or it is not an sm90 part."""
    import torch

    from fact_db.core.device import canonical_gpu
    if not torch.cuda.is_available():
        raise NoGPU("no CUDA GPU is visible: `tune` and `realize` time kernels on a GPU; use --compile-only "
                    "to render and build them here")
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        raise NoGPU(f"{name} is sm_{major}{minor}: fact-db tunes sm90a (H100, H200) kernels; supported arch: sm90a")
    return canonical_gpu(name), name
