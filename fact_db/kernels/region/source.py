"""The contract a kernel the language model writes for a region must meet: the C ABI it
exports, and the source policy checked before anything compiles.

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

    >>> why = check_source(src)              # "" or the reason it is refused
"""
from __future__ import annotations

import re

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
