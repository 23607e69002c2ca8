// A deliberately broken kernel with the GEMM-family C ABI, for the worker-isolation GPU
// test: built with -DFACT_HANG it spins forever; without, it writes to an illegal address.
#include <cstdint>
#include <cstddef>
#include <cuda_runtime.h>

__global__ void broken(float* d, int64_t n) {
#ifdef FACT_HANG
  const long long start = clock64();
  while (clock64() - start < (1LL << 60)) {}
#else
  float* wild = reinterpret_cast<float*>(0x10);
  wild[threadIdx.x] = 1.0f;
#endif
  if (n < 0) d[0] = 0.0f;
}

extern "C" {
size_t fact_broken_workspace_size(int64_t, int64_t, int64_t, int64_t) { return 0; }
int fact_broken_launch(const void*, const void*, const void*, const void*, void* d, int64_t m,
                       int64_t n, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, float, float, void*, cudaStream_t stream) {
  broken<<<1, 32, 0, stream>>>(static_cast<float*>(d), m * n);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : 1000 + static_cast<int>(err);
}
}
