"""Kernel templates: `kernels_cpp/<name>.cu.j2` rendered from plain parameters.

A template renders with `jinja2.StrictUndefined` (a missing parameter is an error, never
an empty string) from a dataclass or dict of plain values to one `.cu` file that exports
the C ABI `fact_<name>_launch` / `fact_<name>_workspace_size` (DESIGN.md, "Realization
contract"). Templates may `{% include %}` shared pieces (`_*.j2`) from the same folder.

>>> src = render("gemm_sm90", GemmSm90Params(...))
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib

import jinja2

from fact_db.core import paths
from fact_db.core.errors import FactError


class TemplateError(FactError):
    """A template is missing, or its parameters are incomplete or invalid."""


@functools.lru_cache(maxsize=None)
def _env(root: str) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(root), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def names() -> list[str]:
    """The templates shipped in kernels_cpp/ (shared `_*.j2` pieces excluded)."""
    return sorted(p.name[: -len(".cu.j2")] for p in paths.templates_dir().glob("*.cu.j2"))


def render(name: str, params) -> str:
    """Render `kernels_cpp/<name>.cu.j2` with `params` (a dataclass instance or a dict)."""
    values = dataclasses.asdict(params) if dataclasses.is_dataclass(params) else dict(params)
    root = paths.templates_dir()
    if not (root / f"{name}.cu.j2").is_file():
        raise TemplateError(f"no kernel template '{name}' in {root} (have: {', '.join(names())})")
    try:
        return _env(str(root)).get_template(f"{name}.cu.j2").render(**values)
    except jinja2.UndefinedError as e:
        raise TemplateError(f"template {name}: parameter missing ({e.message}); every parameter is required, "
                            f"see the header of kernels_cpp/{name}.cu.j2") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"template {name}: {e}") from None


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------
# The GEMM family's parameters, as the tuner fills them.

# float32 operands run TF32 wgmma; naming them tfloat32_t (same bits) lets CUTLASS's builder
# pick the transposing mainloop for MN-major operands, which TF32 wgmma cannot read directly.
CUTLASS_DTYPE = {"float16": "cutlass::half_t", "bfloat16": "cutlass::bfloat16_t", "float32": "cutlass::tfloat32_t"}
LAYOUT = {"row": "cutlass::layout::RowMajor", "col": "cutlass::layout::ColumnMajor"}
SCHEDULES = {  # rule tuner name -> (kernel schedule, epilogue schedule)
    "cooperative": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                    "cutlass::epilogue::TmaWarpSpecializedCooperative"),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong",
                 "cutlass::epilogue::TmaWarpSpecialized"),
}


@dataclasses.dataclass(frozen=True)
class GemmSm90Params:
    """Parameters of kernels_cpp/gemm_sm90.cu.j2 (documented in its header)."""

    element_a: str
    element_b: str
    element_c: str
    element_d: str
    element_bias: str
    element_accumulator: str
    layout_a: str
    layout_b: str
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    kernel_schedule: str
    epilogue_schedule: str
    stages: object  # int or "auto"
    tile_scheduler: str
    epilogue: str
    bias_axis: str


@dataclasses.dataclass(frozen=True)
class GemmFp32TcParams(GemmSm90Params):
    """Parameters of kernels_cpp/gemm_fp32tc_sm90.cu.j2: gemm_sm90's plus the in-mainloop
    transform (`round` for tf32, `split3` for 3xTF32 split in shared memory, `presplit` for
    3xTF32 with the lo parts written by a pass before the kernel, `regsplit` for 3xTF32 with A
    split in registers and B's lo parts from that pass), the promotion interval in k-tiles
    (0 = never) and, for split3, whether a K-major raw stage serves as the hi part."""

    transform: str = "split3"
    promote_every: int = 0
    hi_from_raw: bool = True
