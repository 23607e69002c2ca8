// A region kernel as a language model might propose it for Linear -> ReLU in float32, for
// any M, N, K: out[m, n] = relu(sum_k x[m, k] * w[n, k] + b[n]). Each block of 256 threads
// computes a 64x64 output tile, 4x4 outputs per thread, K in steps of 16 through shared
// memory; strides honoured. Where the GEMM is small in K and N (a memory-bound GEMM), writing
// the output once with the ReLU applied saves the eager ReLU's read and write of it.
// Used by tests/test_agent_kernels.py and benchmarks/agent_demo.py.
#include <cuda_runtime.h>
#include <cstdint>

namespace {
constexpr int BM = 64, BN = 64, BK = 16, THREADS = 256;

__global__ void __launch_bounds__(THREADS)
linear_relu_tiled(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                  float* __restrict__ out, int64_t M, int64_t N, int64_t K,
                  int64_t sxm, int64_t sxk, int64_t swn, int64_t swk, int64_t sb) {
  __shared__ float xs[BK][BM + 4];  // xs[k][m]
  __shared__ float ws[BK][BN + 4];  // ws[k][n]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t m0 = blockIdx.x * (int64_t)BM, n0 = blockIdx.y * (int64_t)BN;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += THREADS) {
      const int r = i / BK, c = i % BK;
      const int64_t gk = k0 + c, gm = m0 + r, gn = n0 + r;
      xs[c][r] = (gm < M && gk < K) ? x[gm * sxm + gk * sxk] : 0.f;
      ws[c][r] = (gn < N && gk < K) ? w[gn * swn + gk * swk] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][ty * 4 + i];
        v[i] = ws[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t gm = m0 + ty * 4 + i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gn = n0 + tx * 4 + j;
      if (gn < N) {
        const float s = acc[i][j] + b[gn * sb];
        out[gm * N + gn] = s > 0.f ? s : 0.f;
      }
    }
  }
}
}  // namespace

extern "C" int fact_region_launch(const void* const* inputs, const int64_t* const* shapes,
                                  const int64_t* const* strides, const int* ranks, int n_inputs,
                                  void* out, const int64_t* out_shape, int out_rank,
                                  cudaStream_t stream) {
  if (n_inputs != 3 || ranks[0] != 2 || ranks[1] != 2 || ranks[2] != 1 || out_rank != 2) return 1;
  const int64_t M = shapes[0][0], K = shapes[0][1], N = shapes[1][0];
  if (shapes[1][1] != K || shapes[2][0] != N || out_shape[0] != M || out_shape[1] != N) return 2;
  if ((M + BM - 1) / BM > 2147483647LL || (N + BN - 1) / BN > 65535) return 3;
  dim3 grid((unsigned)((M + BM - 1) / BM), (unsigned)((N + BN - 1) / BN));
  linear_relu_tiled<<<grid, THREADS, 0, stream>>>(
      static_cast<const float*>(inputs[0]), static_cast<const float*>(inputs[1]),
      static_cast<const float*>(inputs[2]), static_cast<float*>(out), M, N, K,
      strides[0][0], strides[0][1], strides[1][0], strides[1][1], strides[2][0]);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : 1000 + static_cast<int>(err);
}
