#pragma once
// Shared by every CUDA op: error checks that name the op, typed device pointers with dtype checks, bf16
// conversions, launch geometry.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "mxtrain/tensor.hpp"

namespace mxt::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] void fail(const char* op, const std::string& msg);
void check(cudaError_t err, const char* op, const char* what);
// After a launch: reports configuration errors at once (asynchronous faults surface at the next sync).
inline void check_launch(const char* op) { check(cudaGetLastError(), op, "kernel launch"); }

// Typed device pointers; fail unless t is a CUDA tensor of that dtype.
float* f32(const Tensor& t, const char* op, const char* arg);
bf16* bf16p(const Tensor& t, const char* op, const char* arg);
int32_t* i32(const Tensor& t, const char* op, const char* arg);
void expect_numel(const Tensor& t, int64_t n, const char* op, const char* arg);
void expect_dtype(const Tensor& t, DType d, const char* op, const char* arg);

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b));
}

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// Block-wide sum for blockDim.x a multiple of 32 and <= 1024; every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace mxt::cuda
