// SwiGLU fused with the routing weight on the device: a = silu(gate) * up * wp, h13 = [gate | up] per row.
// BF16 in and out, fp32 math, one rounding per output; dwp is a deterministic per-row block reduction. Rows of a
// multiple of 8 elements (every model shape) move through 16-byte accesses.
#include <cstdint>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace {

using cuda::expect_rows;

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// a[r,i] = silu(g) * u * wp[r]
__global__ void swiglu_forward_kernel(const cuda::bf16* __restrict__ h13, const float* __restrict__ wp,
                                      cuda::bf16* __restrict__ a, int64_t R, int64_t f) {
  const int64_t n = R * f;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / f, i = idx - r * f;
    const float g = cuda::ld(h13, r * 2 * f + i), u = cuda::ld(h13, r * 2 * f + f + i);
    cuda::st(a, idx, g * sigmoidf(g) * u * wp[r]);
  }
}

// The vector kernels below need f % 8 == 0 and 16-byte aligned tensors; the scalar kernels above take
// everything else.
using cuda::load8;
using cuda::store8;

// The forward, 8 outputs per vector (same arithmetic per element as swiglu_forward_kernel): blockIdx.y walks the
// rows and each thread takes kVecs vectors of one, loads first. A flat index took a 64-bit division per vector
// and ran at 0.82 of the copy rate at 8x7B (bench_memops, session 38).
constexpr int kFwdThreads = 128, kVecs = 2;

__global__ void swiglu_forward_vec_kernel(const cuda::bf16* __restrict__ h13, const float* __restrict__ wp,
                                          cuda::bf16* __restrict__ a, int64_t R, int64_t f) {
  const int64_t f8 = f / 8;
  for (int64_t r = blockIdx.y; r < R; r += gridDim.y) {
    const cuda::bf16* gate = h13 + r * 2 * f;
    uint4 gq[kVecs], uq[kVecs];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t v = (static_cast<int64_t>(blockIdx.x) * kVecs + u) * kFwdThreads + threadIdx.x;
      if (v < f8) {
        gq[u] = reinterpret_cast<const uint4*>(gate)[v];
        uq[u] = reinterpret_cast<const uint4*>(gate + f)[v];
      }
    }
    const float w = wp[r];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t v = (static_cast<int64_t>(blockIdx.x) * kVecs + u) * kFwdThreads + threadIdx.x;
      if (v >= f8) break;
      float g[8], up[8], o[8];
      cuda::unpack8(gq[u], g);
      cuda::unpack8(uq[u], up);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = g[j] * sigmoidf(g[j]) * up[j] * w;
      store8(a + r * f + 8 * v, o);
    }
  }
}

// One block per row (grid-stride): dgate = da*wp*u*silu'(g), dup = da*wp*silu(g), silu'(g) = s(1 + g(1 - s));
// dwp[r] = sum_i da*silu(g)*u, per-thread fp32 partials in a fixed order, then block_sum (fixed tree).
__global__ void swiglu_backward_kernel(const cuda::bf16* __restrict__ da, const cuda::bf16* __restrict__ h13,
                                       const float* __restrict__ wp, cuda::bf16* __restrict__ dh13,
                                       float* __restrict__ dwp, int64_t R, int64_t f) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float w = wp[r];
    const cuda::bf16* gate = h13 + r * 2 * f;
    const cuda::bf16* up = gate + f;
    const cuda::bf16* gr = da + r * f;
    cuda::bf16* dgate = dh13 + r * 2 * f;
    cuda::bf16* dup = dgate + f;
    float acc = 0.f;
    for (int64_t i = threadIdx.x; i < f; i += blockDim.x) {
      const float g = cuda::ld(gate, i), u = cuda::ld(up, i), d = cuda::ld(gr, i);
      const float s = sigmoidf(g), silu = g * s;
      acc += d * silu * u;
      cuda::st(dgate, i, d * w * u * s * (1.f + g * (1.f - s)));
      cuda::st(dup, i, d * w * silu);
    }
    acc = cuda::block_sum(acc);
    if (threadIdx.x == 0) dwp[r] = acc;
  }
}

// The backward, 8 columns per thread and step (same arithmetic per element as swiglu_backward_kernel; dwp's
// per-thread partials run over the thread's columns in a fixed order).
__global__ void swiglu_backward_vec_kernel(const cuda::bf16* __restrict__ da, const cuda::bf16* __restrict__ h13,
                                           const float* __restrict__ wp, cuda::bf16* __restrict__ dh13,
                                           float* __restrict__ dwp, int64_t R, int64_t f) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float w = wp[r];
    const cuda::bf16* gate = h13 + r * 2 * f;
    float acc = 0.f;
    for (int64_t i = threadIdx.x * 8; i < f; i += static_cast<int64_t>(blockDim.x) * 8) {
      float g[8], u[8], d[8], dg[8], du[8];
      load8(gate + i, g);
      load8(gate + f + i, u);
      load8(da + r * f + i, d);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float sg = sigmoidf(g[j]), silu = g[j] * sg;
        acc += d[j] * silu * u[j];
        dg[j] = d[j] * w * u[j] * sg * (1.f + g[j] * (1.f - sg));
        du[j] = d[j] * w * silu;
      }
      store8(dh13 + r * 2 * f + i, dg);
      store8(dh13 + r * 2 * f + f + i, du);
    }
    acc = cuda::block_sum(acc);
    if (threadIdx.x == 0) dwp[r] = acc;
  }
}

bool vec_ok(int64_t f, const void* a, const void* b, const void* c) {
  return f % 8 == 0 && cuda::aligned16(a) && cuda::aligned16(b) && cuda::aligned16(c);
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > (1LL << 30) ? (1LL << 30) : rows));
}

}  // namespace

void CudaOps::swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) {
  const char* op = "swiglu_forward";
  const int64_t R = wp.numel(), f = R ? a.numel() / R : (a.ndim ? a.dim(-1) : 0);
  expect_rows(a, R, f, op, "a");
  expect_rows(h13, R, 2 * f, op, "h13");
  const cuda::bf16* h = cuda::bf16p(h13, op, "h13");
  const float* w = cuda::f32(wp, op, "wp");
  cuda::bf16* o = cuda::bf16p(a, op, "a");
  if (R * f == 0) return;
  if (vec_ok(f, h, o, o))
    swiglu_forward_vec_kernel<<<dim3(static_cast<unsigned>((f / 8 + kFwdThreads * kVecs - 1) / (kFwdThreads * kVecs)),
                                     static_cast<unsigned>(R < 65535 ? R : 65535)),
                                kFwdThreads, 0, ctx().stream>>>(h, w, o, R, f);
  else
    swiglu_forward_kernel<<<cuda::blocks_for(R * f, kThreads), kThreads, 0, ctx().stream>>>(h, w, o, R, f);
  cuda::check_launch(op);
}

void CudaOps::swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                              const Tensor& dwp) {
  const char* op = "swiglu_backward";
  const int64_t R = wp.numel(), f = R ? da.numel() / R : (da.ndim ? da.dim(-1) : 0);
  expect_rows(da, R, f, op, "da");
  expect_rows(h13, R, 2 * f, op, "h13");
  expect_rows(dh13, R, 2 * f, op, "dh13");
  cuda::expect_numel(dwp, R, op, "dwp");
  const cuda::bf16* g = cuda::bf16p(da, op, "da");
  const cuda::bf16* h = cuda::bf16p(h13, op, "h13");
  const float* w = cuda::f32(wp, op, "wp");
  cuda::bf16* dh = cuda::bf16p(dh13, op, "dh13");
  float* dw = cuda::f32(dwp, op, "dwp");
  if (R == 0) return;
  // f == 0 still launches: every dwp[r] is overwritten with 0.
  if (vec_ok(f, g, h, dh))
    swiglu_backward_vec_kernel<<<row_blocks(R), kThreads, 0, ctx().stream>>>(g, h, w, dh, dw, R, f);
  else
    swiglu_backward_kernel<<<row_blocks(R), kThreads, 0, ctx().stream>>>(g, h, w, dh, dw, R, f);
  cuda::check_launch(op);
}

}  // namespace mxt
