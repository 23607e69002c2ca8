// Fallback for CUTLASS example 41's unconditional `#include <curand_kernel.h>`.
//
// kernel_forward.h uses cuRAND only under HAS_PYTORCH (dropout), which fact-db never
// defines, but the include itself must resolve, and a minimal CUDA toolkit (nvcc without
// the cuRAND headers, as on the build machines) has no such file. Where the real header
// exists further down the include path it is used; otherwise this file is empty.
// Add `-I<repo>/kernels_cpp/include` to nvcc for templates that include example 41.
#pragma once
#if defined(__has_include_next)
#if __has_include_next(<curand_kernel.h>)
#include_next <curand_kernel.h>
#endif
#endif
