// A region kernel as the language model would propose it for Linear -> ReLU in float32:
// out[m, n] = relu(sum_k x[m, k] * w[n, k] + b[n]), one thread per output, strides honoured.
// Used by tests/test_agent_kernels.py and benchmarks/agent_demo.py.
#include <cuda_runtime.h>
#include <cstdint>

__global__ void linear_relu(const float* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ b, float* __restrict__ out,
                            int64_t M, int64_t N, int64_t K,
                            int64_t sxm, int64_t sxk, int64_t swn, int64_t swk, int64_t sb) {
  int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t m = blockIdx.y;
  if (n >= N || m >= M) return;
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc = fmaf(x[m * sxm + k * sxk], w[n * swn + k * swk], acc);
  acc += b[n * sb];
  out[m * N + n] = acc > 0.f ? acc : 0.f;
}

extern "C" int fact_region_launch(const void* const* inputs, const int64_t* const* shapes,
                                  const int64_t* const* strides, const int* ranks, int n_inputs,
                                  void* out, const int64_t* out_shape, int out_rank,
                                  cudaStream_t stream) {
  if (n_inputs != 3 || ranks[0] != 2 || ranks[1] != 2 || ranks[2] != 1 || out_rank != 2) return 1;
  const int64_t M = shapes[0][0], K = shapes[0][1], N = shapes[1][0];
  if (shapes[1][1] != K || shapes[2][0] != N || out_shape[0] != M || out_shape[1] != N || M > 65535) return 2;
  dim3 block(128), grid((unsigned)((N + 127) / 128), (unsigned)M);
  linear_relu<<<grid, block, 0, stream>>>(
      static_cast<const float*>(inputs[0]), static_cast<const float*>(inputs[1]),
      static_cast<const float*>(inputs[2]), static_cast<float*>(out), M, N, K,
      strides[0][0], strides[0][1], strides[1][0], strides[1][1], strides[2][0]);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : 1000 + static_cast<int>(err);
}
