#pragma once
// Shared by every CUDA op: error checks that name the op, typed device pointers with dtype checks, bf16
// conversions, launch geometry.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "mxtrain/tensor.hpp"
#include "mxtrain/trace.hpp"

namespace mxt::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] void fail(const char* op, const std::string& msg);
void check(cudaError_t err, const char* op, const char* what);
// After a launch: reports configuration errors at once (asynchronous faults surface at the next sync), and marks
// the launch for op-level stage timing (MXTRAIN_STAGE_TIMING=ops; a null check otherwise).
inline void check_launch(const char* op) {
  check(cudaGetLastError(), op, "kernel launch");
  stage_mark(op);
}

// Typed device pointers; fail unless t is a CUDA tensor of that dtype.
float* f32(const Tensor& t, const char* op, const char* arg);
bf16* bf16p(const Tensor& t, const char* op, const char* arg);
int32_t* i32(const Tensor& t, const char* op, const char* arg);
void expect_numel(const Tensor& t, int64_t n, const char* op, const char* arg);
// t is [rows, ...] with rows * cols elements; else an error naming arg and both shapes.
void expect_rows(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg);
void expect_dtype(const Tensor& t, DType d, const char* op, const char* arg);

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b));
}

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// 8 bf16 <-> 8 floats through one 16-byte access (p 16-byte aligned): the vector paths of the elementwise and
// row kernels.
__device__ __forceinline__ void unpack8(const uint4& q, float (&x)[8]) {  // 8 bf16 already in registers
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[2 * j] = __uint_as_float(w[j] << 16);
    x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

__device__ __forceinline__ void load8(const bf16* p, float (&x)[8]) { unpack8(*reinterpret_cast<const uint4*>(p), x); }

// 8 floats rounded to bf16 (round to nearest even), packed into 16 bytes.
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x[2 * j], x[2 * j + 1]);
    w[j] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store8(bf16* p, const float (&x)[8]) { *reinterpret_cast<uint4*>(p) = pack8(x); }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// N block-wide sums at once (one pair of barriers for all), for blockDim.x a multiple of 32 and <= 1024; every
// thread gets the results.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N]) {
  __shared__ float partial[N][32];
#pragma unroll
  for (int r = 0; r < N; ++r)
    for (int o = 16; o > 0; o >>= 1) v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = (blockDim.x + 31) / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < N; ++r) partial[r][warp] = v[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < N; ++r) {
    v[r] = lane < nwarps ? partial[r][lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
  }
}

// Block-wide sum (block_sums of one value).
__device__ __forceinline__ float block_sum(float v) {
  float a[1] = {v};
  block_sums(a);
  return a[0];
}

// The same for the maximum (lanes past the block's warps count as -inf).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? partial[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The same in fp64: sums that must not round in fp32 (squared norms, the fp32 backend's row statistics).
__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace mxt::cuda
