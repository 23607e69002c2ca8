"""The index's vocabulary: document kinds, arch and dtype tags (and the words a search matches
them by), and the compound terms joined alike in documents and queries.

    >>> norm_arch("SM_90a"), norm_arch("ampere"), norm_dtype("bfloat16")
    ('sm90', 'sm80', 'bf16')
    >>> lexical_normalize("a split-K GEMM")
    'a splitk gemm'
"""
from __future__ import annotations

import functools
import re

from fact_db.core.errors import FactError

KINDS = ("rule", "example", "kernel")


class IndexError_(FactError):
    """The index cannot be built or read as asked."""


ARCH_ALIASES = {
    "volta": "sm70", "v100": "sm70", "turing": "sm75", "t4": "sm75",
    "ampere": "sm80", "a100": "sm80", "a10": "sm80", "a10g": "sm80", "a30": "sm80", "a40": "sm80",
    "ada": "sm89", "l4": "sm89", "l40": "sm89", "l40s": "sm89",
    "hopper": "sm90", "h100": "sm90", "h200": "sm90", "h800": "sm90", "gh200": "sm90", "h20": "sm90",
    "blackwell": "sm100", "b200": "sm100", "b100": "sm100", "gb200": "sm100",
    "b300": "sm103", "gb300": "sm103", "geforce-blackwell": "sm120", "rtx5090": "sm120",
}
# architecture -> family used for tags and filters: CUTLASS writes one kernel for Sm80
# that serves all Ampere parts, and the 'a'/'f' suffixes select features, not hardware
_ARCH_FAMILY = {"sm86": "sm80", "sm87": "sm80", "sm121": "sm120", "sm101": "sm100", "sm110": "sm100"}
ARCH_WORDS = {
    "sm50": "maxwell", "sm60": "pascal P100", "sm70": "volta V100", "sm75": "turing T4",
    "sm80": "ampere A100 A10 RTX 3090", "sm89": "ada L40S L4 RTX 4090",
    "sm90": "hopper H100 H200 H800", "sm100": "blackwell B200 GB200 datacenter",
    "sm103": "blackwell ultra B300 GB300", "sm120": "blackwell geforce RTX 5090 RTX PRO 6000 DGX Spark",
}
DTYPE_ALIASES = {
    "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
    "f32": "f32", "fp32": "f32", "float32": "f32", "float": "f32", "single": "f32",
    "tf32": "tf32", "tfloat32": "tf32", "tf32x3": "tf32", "3xtf32": "tf32",
    "f64": "f64", "fp64": "f64", "float64": "f64", "double": "f64",
    "fp8": "fp8", "f8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8", "mxfp8": "fp8",
    "fp6": "fp6", "mxfp6": "fp6", "e3m2": "fp6", "e2m3": "fp6",
    "fp4": "fp4", "f4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "e2m1": "fp4",
    "int8": "int8", "s8": "int8", "i8": "int8", "u8": "int8", "uint8": "int8",
    "int4": "int4", "s4": "int4", "u4": "int4", "int32": "int32",
    "complex": "complex", "b1": "b1", "binary": "b1",
}
DTYPE_WORDS = {
    "f16": "fp16 half float16", "bf16": "bf16 bfloat16", "f32": "fp32 float32 single precision",
    "tf32": "tf32 tensorfloat-32", "f64": "fp64 double precision", "fp8": "fp8 float8 e4m3 e5m2",
    "fp6": "fp6 mxfp6", "fp4": "fp4 nvfp4 mxfp4 e2m1", "int8": "int8 8-bit integer",
    "int4": "int4 4-bit integer", "int32": "int32", "complex": "complex", "b1": "binary 1-bit",
}
_TORCH_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8", "int32": "int32"}


def norm_arch(value: str) -> str:
    """An architecture family tag: `sm90a` -> `sm90`, `hopper` or `h100` -> `sm90`, `sm86` -> `sm80`.

    >>> norm_arch("SM_90a"), norm_arch("ampere"), norm_arch("sm86")
    ('sm90', 'sm80', 'sm80')
    """
    v = (value or "").strip().lower().replace("_", "").replace(" ", "")
    if v in ARCH_ALIASES:
        return ARCH_ALIASES[v]
    m = re.fullmatch(r"(?:sm|compute)?(\d{2,3})[af]?", v)
    if not m:
        raise IndexError_(f"arch {value!r} is not an architecture; write e.g. sm80, sm90a, sm100, or hopper")
    a = f"sm{m.group(1)}"
    return _ARCH_FAMILY.get(a, a)


def norm_dtype(value: str) -> str:
    """A dtype tag: `float16`/`fp16`/`half` -> `f16`, `e4m3` -> `fp8`, ...

    >>> norm_dtype("bfloat16"), norm_dtype("float8_e4m3fn")
    ('bf16', 'fp8')
    """
    v = (value or "").strip().lower()
    if v not in DTYPE_ALIASES:
        raise IndexError_(f"dtype {value!r} is not known; use one of f16, bf16, f32, tf32, f64, fp8, fp6, fp4, "
                          "int8, int4 (or torch names such as float16)")
    return DTYPE_ALIASES[v]


_COMPOUNDS = [
    (re.compile(r"\bsplit[\s_-]*k\b", re.IGNORECASE), "splitk"),
    (re.compile(r"\bstream[\s_-]*k\b", re.IGNORECASE), "streamk"),
    (re.compile(r"\bwarp[\s_-]*speciali[sz]ed\b", re.IGNORECASE), "warpspecialized"),
    (re.compile(r"\bping[\s_-]*pong\b", re.IGNORECASE), "pingpong"),
    (re.compile(r"\b3x[\s_-]*tf32\b", re.IGNORECASE), "3xtf32"),
    (re.compile(r"\bflash[\s_-]*attention\b", re.IGNORECASE), "flashattention fmha"),
    (re.compile(r"\bmulti[\s_-]*head[\s_-]*attention\b", re.IGNORECASE), "multiheadattention fmha"),
    (re.compile(r"\blayer[\s_-]*norm\b", re.IGNORECASE), "layernorm"),
    (re.compile(r"\brms[\s_-]*norm\b", re.IGNORECASE), "rmsnorm"),
    (re.compile(r"\bsoft[\s_-]*max\b", re.IGNORECASE), "softmax"),
    (re.compile(r"\bfp[\s_-]*(8|6|4|16|32|64)\b", re.IGNORECASE), r"fp\1"),
    (re.compile(r"\bsm[\s_-]*(\d{2,3})a?\b", re.IGNORECASE), r"sm\1"),
    (re.compile(r"\bgemm(s)?\b", re.IGNORECASE), "gemm"),
    (re.compile(r"\bmatmul(s)?\b|\bmatrix[\s_-]*multipl\w*", re.IGNORECASE), "gemm matmul"),
]


@functools.lru_cache(maxsize=8192)  # kernels of one description share their text
def lexical_normalize(text: str) -> str:
    """Join the domain's compound terms (`split-K` -> `splitk`) the same way in documents and queries."""
    for pat, rep in _COMPOUNDS:
        text = pat.sub(rep, text)
    return text
