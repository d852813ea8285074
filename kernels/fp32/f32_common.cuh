#pragma once
// Shared by the fp32 backend's kernels (kernels/fp32): a block-wide fp64 sum and max, for row statistics
// summed the way the CPU twin sums them.
#include <cfloat>

#include "cuda_common.cuh"

namespace mxt::cuda::f32k {

constexpr int kRowThreads = 256;

// Every thread gets the block's sum; blockDim.x a multiple of 32, <= 1024.
__device__ __forceinline__ double block_sum_d(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // a previous call's readers are done with partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? partial[lane] : -FLT_MAX;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline unsigned row_grid(int64_t rows) { return static_cast<unsigned>(rows < 65535 * 16 ? (rows < 1 ? 1 : rows) : 65535 * 16); }

}  // namespace mxt::cuda::f32k
