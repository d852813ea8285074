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
#include <initializer_list>
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
// kAdd: dx holds the residual path's gradient, and gets dx + bf16(the norm's dx) (the same thread reads each
// element before writing it).
template <bool kAdd>
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
      const float v = r * __bfloat162float(w[j]) * gv - c * xv;
      dxr[j] = kAdd ? __float2bfloat16(__fadd_rn(__bfloat162float(dxr[j]), __bfloat162float(__float2bfloat16(v))))
                    : __float2bfloat16(v);
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

template <bool kAdd>
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
      if (kAdd) {
        float res[8];
        cuda::load8(dx + t * d + j, res);
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = __fadd_rn(res[k], __bfloat162float(__float2bfloat16(o[k])));
      }
      cuda::store8(dx + t * d + j, o);
    }
  }
  __syncthreads();
  float* out = dw_partials + static_cast<int64_t>(blockIdx.x) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = dw_acc[j];
}

// dw[j] += sum over b of partials[b, j] in fp64: kReduceLanes lanes per column each add every kReduceLanes-th
// partial in order of b, then lane 0 adds the lanes' sums in lane order (a fixed order: the same bits every run).
// One thread per column summing all 512 partials ran on only d / 256 blocks, bound by load latency.
constexpr int kReduceCols = 32, kReduceLanes = kThreads / kReduceCols;
__global__ void rmsnorm_dw_reduce_kernel(const float* __restrict__ partials, int nparts, float* __restrict__ dw,
                                         int64_t d) {
  __shared__ double lane_sum[kReduceLanes][kReduceCols];
  const int c = static_cast<int>(threadIdx.x) % kReduceCols, lane = static_cast<int>(threadIdx.x) / kReduceCols;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kReduceCols + c;
  double s = 0.0;
  if (j < d)
    for (int b = lane; b < nparts; b += kReduceLanes) s += partials[static_cast<int64_t>(b) * d + j];
  lane_sum[lane][c] = s;
  __syncthreads();
  if (lane != 0 || j >= d) return;
  double total = 0.0;
  for (int q = 0; q < kReduceLanes; ++q) total += lane_sum[q][c];
  dw[j] = static_cast<float>(static_cast<double>(dw[j]) + total);
}

// The backward with its rows in registers, for d % 8 == 0 and d / 8 <= 1024 (every model shape but the widest):
// one thread per 8 columns, kBwdRows rows per block and step, each row read once. The kernel above reads a row
// twice around the reduction and synchronises per row: 0.57 of the copy rate at 8x7B against 0.66 for this one
// (bench_memops, session 38; the same layout for the forward measured no faster, 0.62 against 0.63, and was
// dropped). Per element the arithmetic is the kernel above's; only the order of the row and dw sums differs.
constexpr int kBwdRows = 2;  // x, dy and the residual of 2 rows fit 64 registers
constexpr int kMaxRowThreads = 1024;

using cuda::block_sums;
using cuda::unpack8;

// Block b takes rows [b kBwdRows, b kBwdRows + kBwdRows), then kBwdRows gridDim.x on; its dw partial stays in
// registers (one thread per 8 columns) and goes to dw_partials[b] at the end.
template <bool kAdd>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_backward_rows_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                 const bf16* __restrict__ w, const float* __restrict__ rstd, bf16* __restrict__ dx,
                                 float* __restrict__ dw_partials, int64_t T, int64_t d) {
  const int64_t j = static_cast<int64_t>(threadIdx.x) * 8;
  const bool on = j < d;
  float dwa[8] = {};
  const uint4 wq = on ? *reinterpret_cast<const uint4*>(w + j) : make_uint4(0, 0, 0, 0);  // packed: registers
  const int64_t step = static_cast<int64_t>(gridDim.x) * kBwdRows;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * kBwdRows; t0 < T; t0 += step) {
    uint4 xq[kBwdRows], gq[kBwdRows], rq[kBwdRows];
    float rr[kBwdRows], dot[kBwdRows];
#pragma unroll
    for (int r = 0; r < kBwdRows; ++r) {
      const bool ok = on && t0 + r < T;
      const int64_t at = (t0 + r) * d + j;
      xq[r] = ok ? *reinterpret_cast<const uint4*>(x + at) : make_uint4(0, 0, 0, 0);
      gq[r] = ok ? *reinterpret_cast<const uint4*>(dy + at) : make_uint4(0, 0, 0, 0);
      if (kAdd) rq[r] = ok ? *reinterpret_cast<const uint4*>(dx + at) : make_uint4(0, 0, 0, 0);
      rr[r] = t0 + r < T ? rstd[t0 + r] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < kBwdRows; ++r) {
      float xv[8], gv[8], wv[8];
      unpack8(xq[r], xv);
      unpack8(gq[r], gv);
      unpack8(wq, wv);
      dot[r] = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        dot[r] = fmaf(wv[k] * gv[k], xv[k], dot[r]);
        if (t0 + r < T) dwa[k] = fmaf(gv[k] * xv[k], rr[r], dwa[k]);
      }
    }
    block_sums(dot);
#pragma unroll
    for (int r = 0; r < kBwdRows; ++r) {
      const int64_t t = t0 + r;
      if (t >= T || !on) break;
      const float c = rr[r] * rr[r] * rr[r] * dot[r] / static_cast<float>(d);
      float xv[8], gv[8], wv[8], o[8];
      unpack8(xq[r], xv);
      unpack8(gq[r], gv);
      unpack8(wq, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = rr[r] * wv[k] * gv[k] - c * xv[k];
      if (kAdd) {
        float res[8];
        unpack8(rq[r], res);
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = __fadd_rn(res[k], __bfloat162float(__float2bfloat16(o[k])));
      }
      cuda::store8(dx + t * d + j, o);
    }
  }
  if (!on) return;
  float4* out = reinterpret_cast<float4*>(dw_partials + static_cast<int64_t>(blockIdx.x) * d + j);
  out[0] = make_float4(dwa[0], dwa[1], dwa[2], dwa[3]);
  out[1] = make_float4(dwa[4], dwa[5], dwa[6], dwa[7]);
}

// Threads of the row kernel for rows of d (a warp multiple), or 0 where they do not apply.
int row_threads(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0 || d / 8 > kMaxRowThreads) return 0;
  for (const void* p : ptrs)
    if (!cuda::aligned16(p)) return 0;
  return static_cast<int>((d / 8 + 31) / 32 * 32);
}

// The backward's grid: a function of T and d only, so dw's summation order (and bits) is the same every run;
// about 2 blocks per SM at 512 threads.
int backward_rows_grid(int64_t T, int threads) {
  const int64_t steps = (T + kBwdRows - 1) / kBwdRows, cap = 131072 / threads;
  return static_cast<int>(steps < cap ? steps : cap);
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

namespace {

void rmsnorm_backward_launch(const char* op, bool add, const Tensor& dy, const Tensor& x, const Tensor& w,
                             const Tensor& rstd, const Tensor& dx, const Tensor& dw, CudaContext& ctx) {
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

  if (const int threads = row_threads(d, {gp, xp, wp, dxp})) {
    const int nblocks = backward_rows_grid(T, threads);
    auto* partials = static_cast<float*>(
        ctx.scratch("rmsnorm_backward", sizeof(float) * static_cast<size_t>(nblocks) * static_cast<size_t>(d)));
    (add ? rmsnorm_backward_rows_kernel<true> : rmsnorm_backward_rows_kernel<false>)<<<nblocks, threads, 0,
                                                                                        ctx.stream>>>(
        gp, xp, wp, rp, dxp, partials, T, d);
    cuda::check_launch(op);
    rmsnorm_dw_reduce_kernel<<<cuda::blocks_for(d, kReduceCols), kThreads, 0, ctx.stream>>>(partials, nblocks,
                                                                                            dwp, d);
    cuda::check_launch(op);
    return;
  }
  const size_t smem = sizeof(float) * static_cast<size_t>(d);
  int max_optin = 0;
  cuda::check(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device), op,
              "shared memory limit");
  // block_sum's 32 floats of static shared memory come on top of the dynamic part.
  if (smem + 32 * sizeof(float) > static_cast<size_t>(max_optin))
    cuda::fail(op, "hidden size " + std::to_string(d) + " too large for the shared-memory dw partial");
  const bool vec = d % 8 == 0 && cuda::aligned16(gp) && cuda::aligned16(xp) && cuda::aligned16(wp) &&
                   cuda::aligned16(dxp);
  const auto kernel = vec ? (add ? rmsnorm_backward_vec_kernel<true> : rmsnorm_backward_vec_kernel<false>)
                          : (add ? rmsnorm_backward_kernel<true> : rmsnorm_backward_kernel<false>);
  if (smem > 48 * 1024)
    cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                op, "cudaFuncSetAttribute");

  const int nblocks = static_cast<int>(T < kMaxBwdBlocks ? T : kMaxBwdBlocks);
  auto* partials = static_cast<float*>(
      ctx.scratch("rmsnorm_backward", sizeof(float) * static_cast<size_t>(nblocks) * static_cast<size_t>(d)));
  kernel<<<nblocks, kThreads, smem, ctx.stream>>>(gp, xp, wp, rp, dxp, partials, T, d);
  cuda::check_launch(op);
  rmsnorm_dw_reduce_kernel<<<cuda::blocks_for(d, kReduceCols), kThreads, 0, ctx.stream>>>(partials, nblocks, dwp,
                                                                                          d);
  cuda::check_launch(op);
}

}  // namespace

void CudaOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const Tensor& dx, const Tensor& dw) {
  rmsnorm_backward_launch("rmsnorm_backward", false, dy, x, w, rstd, dx, dw, ctx());
}

// One pass instead of rmsnorm_backward into tmp and an add: the norm's dx is rounded to bf16 and added to dx_acc
// in the same kernel (the same bits as the two ops).
void CudaOps::rmsnorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                   const Tensor& dx_acc, const Tensor& dw, const Tensor& tmp) {
  if (dx_acc.dtype != DType::BF16) return Ops::rmsnorm_backward_add(dy, x, w, rstd, dx_acc, dw, tmp);
  rmsnorm_backward_launch("rmsnorm_backward_add", true, dy, x, w, rstd, dx_acc, dw, ctx());
}

}  // namespace mxt
