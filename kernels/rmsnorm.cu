// RMSNorm, HF Mixtral rounding order:
//   x32 = x.float(); r = rsqrt(mean(x32^2) + eps); n = bf16(x32 * r); y = bf16(w * n)   (bf16 * bf16 is an
//   fp32 product rounded to bf16, as torch computes it)
// rstd [T] F32 is saved for the backward.
//
// Backward (with g = w*dy, r = rstd, straight through the bf16 rounding, as the CPU twin):
//   dx = r*g - (r^3/d) * x * sum_j(g*x)       dw += sum_t dy * x * r
// dw is deterministic: block b of a fixed-size grid (depending only on T) owns rows b, b+G, ..., accumulates
// its dw partial in shared memory (each column owned by one thread), writes it to scratch, and a second
// kernel sums the G partials per column in a fixed order. Rows of a multiple of 8 elements move through
// 16-byte accesses (the _vec kernels).
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {

namespace {

using cuda::bf16;

constexpr int kThreads = 256;
constexpr int kMaxBwdBlocks = 512;

__global__ void rmsnorm_forward_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, float eps,
                                       bf16* __restrict__ y, float* __restrict__ rstd, int64_t T, int64_t d) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const bf16* xr = x + t * d;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = __bfloat162float(xr[j]);
      ss = fmaf(v, v, ss);
    }
    ss = cuda::block_sum(ss);
    // torch: variance = pow(2).mean(-1) in fp32; rsqrt(variance + eps) in fp32.
    const float var = __fdiv_rn(ss, static_cast<float>(d));
    const float r = __frsqrt_rn(__fadd_rn(var, eps));
    if (threadIdx.x == 0) rstd[t] = r;
    bf16* yr = y + t * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float n = __bfloat162float(__float2bfloat16(__fmul_rn(__bfloat162float(xr[j]), r)));
      yr[j] = __float2bfloat16(__fmul_rn(__bfloat162float(w[j]), n));
    }
  }
}

// Dynamic shared memory: d floats (this block's dw partial). Block b handles rows b, b + gridDim.x, ...
__global__ void rmsnorm_backward_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                        const bf16* __restrict__ w, const float* __restrict__ rstd,
                                        bf16* __restrict__ dx, float* __restrict__ dw_partials, int64_t T,
                                        int64_t d) {
  extern __shared__ float dw_acc[];
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dw_acc[j] = 0.f;  // column j: only this thread
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const bf16* xr = x + t * d;
    const bf16* gr = dy + t * d;
    const float r = rstd[t];
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float xv = __bfloat162float(xr[j]), gv = __bfloat162float(gr[j]);
      dot = fmaf(__bfloat162float(w[j]) * gv, xv, dot);
      dw_acc[j] = fmaf(gv * xv, r, dw_acc[j]);
    }
    dot = cuda::block_sum(dot);
    const float c = r * r * r * dot / static_cast<float>(d);
    bf16* dxr = dx + t * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float xv = __bfloat162float(xr[j]), gv = __bfloat162float(gr[j]);
      dxr[j] = __float2bfloat16(r * __bfloat162float(w[j]) * gv - c * xv);
    }
  }
  float* out = dw_partials + static_cast<int64_t>(blockIdx.x) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = dw_acc[j];
}

// The same two kernels with 16-byte accesses, 8 columns per thread and step (d % 8 == 0, aligned tensors: every
// model shape); the arithmetic per element is the scalar kernels'.
__global__ void rmsnorm_forward_vec_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, float eps,
                                           bf16* __restrict__ y, float* __restrict__ rstd, int64_t T, int64_t d) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const bf16* xr = x + t * d;
    float ss = 0.f;
    for (int64_t j = threadIdx.x * 8; j < d; j += static_cast<int64_t>(blockDim.x) * 8) {
      float v[8];
      cuda::load8(xr + j, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss = fmaf(v[k], v[k], ss);
    }
    ss = cuda::block_sum(ss);
    const float var = __fdiv_rn(ss, static_cast<float>(d));
    const float r = __frsqrt_rn(__fadd_rn(var, eps));
    if (threadIdx.x == 0) rstd[t] = r;
    for (int64_t j = threadIdx.x * 8; j < d; j += static_cast<int64_t>(blockDim.x) * 8) {
      float v[8], wv[8], o[8];
      cuda::load8(xr + j, v);
      cuda::load8(w + j, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(wv[k], __bfloat162float(__float2bfloat16(__fmul_rn(v[k], r))));
      cuda::store8(y + t * d + j, o);
    }
  }
}

__global__ void rmsnorm_backward_vec_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                            const bf16* __restrict__ w, const float* __restrict__ rstd,
                                            bf16* __restrict__ dx, float* __restrict__ dw_partials, int64_t T,
                                            int64_t d) {
  extern __shared__ float dw_acc[];
  const int64_t step = static_cast<int64_t>(blockDim.x) * 8;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dw_acc[j] = 0.f;
  __syncthreads();  // columns are owned in groups of 8 below, not one by one as when zeroed
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const bf16* xr = x + t * d;
    const bf16* gr = dy + t * d;
    const float r = rstd[t];
    float dot = 0.f;
    for (int64_t j = threadIdx.x * 8; j < d; j += step) {
      float xv[8], gv[8], wv[8];
      cuda::load8(xr + j, xv);
      cuda::load8(gr + j, gv);
      cuda::load8(w + j, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        dot = fmaf(wv[k] * gv[k], xv[k], dot);
        dw_acc[j + k] = fmaf(gv[k] * xv[k], r, dw_acc[j + k]);
      }
    }
    dot = cuda::block_sum(dot);
    const float c = r * r * r * dot / static_cast<float>(d);
    for (int64_t j = threadIdx.x * 8; j < d; j += step) {
      float xv[8], gv[8], wv[8], o[8];
      cuda::load8(xr + j, xv);
      cuda::load8(gr + j, gv);
      cuda::load8(w + j, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = r * wv[k] * gv[k] - c * xv[k];
      cuda::store8(dx + t * d + j, o);
    }
  }
  __syncthreads();
  float* out = dw_partials + static_cast<int64_t>(blockIdx.x) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = dw_acc[j];
}

// dw[j] += sum over b of partials[b, j], summed in fp64 in order of b.
__global__ void rmsnorm_dw_reduce_kernel(const float* __restrict__ partials, int nparts, float* __restrict__ dw,
                                         int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double s = 0.0;
  for (int b = 0; b < nparts; ++b) s += partials[static_cast<int64_t>(b) * d + j];
  dw[j] = static_cast<float>(static_cast<double>(dw[j]) + s);
}

using cuda::expect_rows;

unsigned row_grid(int64_t T) { return static_cast<unsigned>(T < 65535 * 16 ? T : 65535 * 16); }

}  // namespace

void CudaOps::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const int64_t d = w.numel(), T = x.ndim ? x.shape[0] : 0;
  const bf16* xp = cuda::bf16p(x, op, "x");
  const bf16* wp = cuda::bf16p(w, op, "w");
  bf16* yp = cuda::bf16p(y, op, "y");
  float* rp = cuda::f32(rstd, op, "rstd");
  expect_rows(x, T, d, op, "x");
  expect_rows(y, T, d, op, "y");
  cuda::expect_numel(rstd, T, op, "rstd");
  if (T == 0) return;
  if (d == 0) cuda::fail(op, "w is empty");
  if (d % 8 == 0 && cuda::aligned16(xp) && cuda::aligned16(wp) && cuda::aligned16(yp))
    rmsnorm_forward_vec_kernel<<<row_grid(T), kThreads, 0, ctx_->stream>>>(xp, wp, eps, yp, rp, T, d);
  else
    rmsnorm_forward_kernel<<<row_grid(T), kThreads, 0, ctx_->stream>>>(xp, wp, eps, yp, rp, T, d);
  cuda::check_launch(op);
}

void CudaOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const Tensor& dx, const Tensor& dw) {
  const char* op = "rmsnorm_backward";
  const int64_t d = w.numel(), T = x.ndim ? x.shape[0] : 0;
  const bf16* gp = cuda::bf16p(dy, op, "dy");
  const bf16* xp = cuda::bf16p(x, op, "x");
  const bf16* wp = cuda::bf16p(w, op, "w");
  const float* rp = cuda::f32(rstd, op, "rstd");
  bf16* dxp = cuda::bf16p(dx, op, "dx");
  float* dwp = cuda::f32(dw, op, "dw");
  expect_rows(x, T, d, op, "x");
  expect_rows(dy, T, d, op, "dy");
  expect_rows(dx, T, d, op, "dx");
  cuda::expect_numel(rstd, T, op, "rstd");
  cuda::expect_numel(dw, d, op, "dw");
  if (T == 0 || d == 0) return;

  const size_t smem = sizeof(float) * static_cast<size_t>(d);
  int max_optin = 0;
  cuda::check(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx_->device), op,
              "shared memory limit");
  // block_sum's 32 floats of static shared memory come on top of the dynamic part.
  if (smem + 32 * sizeof(float) > static_cast<size_t>(max_optin))
    cuda::fail(op, "hidden size " + std::to_string(d) + " too large for the shared-memory dw partial");
  const bool vec = d % 8 == 0 && cuda::aligned16(gp) && cuda::aligned16(xp) && cuda::aligned16(wp) &&
                   cuda::aligned16(dxp);
  const auto kernel = vec ? rmsnorm_backward_vec_kernel : rmsnorm_backward_kernel;
  if (smem > 48 * 1024)
    cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                op, "cudaFuncSetAttribute");

  const int nblocks = static_cast<int>(T < kMaxBwdBlocks ? T : kMaxBwdBlocks);
  auto* partials = static_cast<float*>(
      ctx_->scratch("rmsnorm_backward", sizeof(float) * static_cast<size_t>(nblocks) * static_cast<size_t>(d)));
  kernel<<<nblocks, kThreads, smem, ctx_->stream>>>(gp, xp, wp, rp, dxp, partials, T, d);
  cuda::check_launch(op);
  rmsnorm_dw_reduce_kernel<<<cuda::blocks_for(d, kThreads), kThreads, 0, ctx_->stream>>>(partials, nblocks, dwp,
                                                                                         d);
  cuda::check_launch(op);
}

}  // namespace mxt
