// The fp32 backend's expert GEMMs over rows grouped by expert, offsets read on the device (no host sync, so
// they run inside CUDA graphs too): plain 16 x 16 shared-memory tiles, fp32 products and sums (no tensor cores).
// grid z is the expert; a block whose tile lies past its expert's rows returns at once.
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "fp32/cuda_f32_ops.hpp"

namespace mxt {

namespace {

constexpr int kTile = 16;

// Expert e's row range [r0, r1), clamped into [0, R] (the offsets are not checked on the host).
__device__ __forceinline__ void expert_rows(const int32_t* off, int e, int64_t R, int64_t& r0, int64_t& r1) {
  r0 = min(max(static_cast<int64_t>(off[e]), int64_t{0}), R);
  r1 = min(max(static_cast<int64_t>(off[e + 1]), r0), R);
}

// C[r, n] = sum_k A[r, k] B_e(k, n) for rows r of expert e; B_e(k, n) = W[e * wstride + k * sk + n * sn].
// Forward: A = x [R, in], B_e(k = i, n = o) = W[e][o][i]. Dgrad: A = dy [R, out], B_e(k = o, n = i) = W[e][o][i].
__global__ void __launch_bounds__(kTile* kTile) rows_kernel(const float* __restrict__ A, const float* __restrict__ W,
                                                            const int32_t* __restrict__ off, float* __restrict__ C,
                                                            int64_t R, int64_t K, int64_t N, int64_t wstride,
                                                            int64_t sk, int64_t sn) {
  __shared__ float As[kTile][kTile + 1], Bs[kTile][kTile + 1];
  int64_t r0, r1;
  expert_rows(off, blockIdx.z, R, r0, r1);
  const int64_t m0 = r0 + static_cast<int64_t>(blockIdx.y) * kTile;
  if (m0 >= r1) return;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t m = m0 + ty, n = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const float* B = W + blockIdx.z * wstride;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    As[ty][tx] = m < r1 && k0 + tx < K ? A[m * K + k0 + tx] : 0.f;
    const int64_t bn = static_cast<int64_t>(blockIdx.x) * kTile + tx;
    Bs[ty][tx] = k0 + ty < K && bn < N ? B[(k0 + ty) * sk + bn * sn] : 0.f;
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kTile; ++c) acc += As[ty][c] * Bs[c][tx];
    __syncthreads();
  }
  if (m < r1 && n < N) C[m * N + n] = acc;
}

// Rows past offsets[E] (capacity padding) come out as zeros.
__global__ void zero_tail_kernel(const int32_t* __restrict__ off, int E, int64_t R, int64_t N, float* __restrict__ C) {
  const int64_t used = min(max(static_cast<int64_t>(off[E]), int64_t{0}), R);
  for (int64_t e = used * N + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < R * N;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    C[e] = 0.f;
}

// dW[e][o][i] += sum over rows r of e of dy[r, o] x[r, i]; grid (in tiles, out tiles, E).
__global__ void __launch_bounds__(kTile* kTile) wgrad_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                                             const int32_t* __restrict__ off, float* __restrict__ dW,
                                                             int64_t R, int64_t out, int64_t in) {
  __shared__ float Gs[kTile][kTile + 1], Xs[kTile][kTile + 1];  // [row][o], [row][i]
  int64_t r0, r1;
  expert_rows(off, blockIdx.z, R, r0, r1);
  if (r0 == r1) return;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t o0 = static_cast<int64_t>(blockIdx.y) * kTile, i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc = 0.f;
  for (int64_t k0 = r0; k0 < r1; k0 += kTile) {
    const int64_t r = k0 + ty;
    Gs[ty][tx] = r < r1 && o0 + tx < out ? dy[r * out + o0 + tx] : 0.f;
    Xs[ty][tx] = r < r1 && i0 + tx < in ? x[r * in + i0 + tx] : 0.f;
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kTile; ++c) acc += Gs[c][ty] * Xs[c][tx];
    __syncthreads();
  }
  if (o0 + ty < out && i0 + tx < in) dW[(blockIdx.z * out + o0 + ty) * in + i0 + tx] += acc;
}

struct Groups {
  int64_t E, out, in;
  const int32_t* off;
};

Groups check_groups(const Tensor& W, const Tensor& offsets, const char* op) {
  if (W.ndim != 3) cuda::fail(op, "expert weights must be [E, out, in], got " + W.shape_str());
  if (W.shape[0] > 65535) cuda::fail(op, "more than 65535 experts");
  cuda::expect_numel(offsets, W.shape[0] + 1, op, "offsets");
  return {W.shape[0], W.shape[1], W.shape[2], cuda::i32(offsets, op, "offsets")};
}

void rows_by_expert(cudaStream_t st, const char* op, const Tensor& A, const char* a_name, const Tensor& W,
                    bool forward, const Tensor& offsets, const Tensor& C, const char* c_name) {
  const int64_t R = A.ndim ? A.shape[0] : 0;
  const Groups g = check_groups(W, offsets, op);
  const int64_t K = forward ? g.in : g.out, N = forward ? g.out : g.in;
  cuda::expect_rows(A, R, K, op, a_name);
  cuda::expect_rows(C, R, N, op, c_name);
  const float *ap = cuda::f32(A, op, a_name), *wp = cuda::f32(W, op, "W");
  float* cp = cuda::f32(C, op, c_name);
  if (R == 0 || N == 0) return;
  const int64_t sk = forward ? 1 : g.in, sn = forward ? g.in : 1;
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile), static_cast<unsigned>((R + kTile - 1) / kTile),
                  static_cast<unsigned>(g.E));
  if (grid.y > 65535) cuda::fail(op, "more than " + std::to_string(65535 * kTile) + " rows");
  rows_kernel<<<grid, kTile * kTile, 0, st>>>(ap, wp, g.off, cp, R, K, N, g.out * g.in, sk, sn);
  cuda::check_launch(op);
  zero_tail_kernel<<<cuda::blocks_for(R * N, 256), 256, 0, st>>>(g.off, static_cast<int>(g.E), R, N, cp);
  cuda::check_launch(op);
}

}  // namespace

void CudaF32Ops::grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) {
  rows_by_expert(ctx_->stream, "grouped_gemm", x, "x", W, true, offsets, y, "y");
}

void CudaF32Ops::grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) {
  rows_by_expert(ctx_->stream, "grouped_gemm_dgrad", dy, "dy", W, false, offsets, dx, "dx");
}

void CudaF32Ops::grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) {
  const char* op = "grouped_gemm_wgrad";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(dW, offsets, op);
  cuda::expect_rows(dy, R, g.out, op, "dy");
  cuda::expect_rows(x, R, g.in, op, "x");
  const float *gp = cuda::f32(dy, op, "dy"), *xp = cuda::f32(x, op, "x");
  float* dwp = cuda::f32(dW, op, "dW");
  if (R == 0 || g.out * g.in == 0) return;
  const dim3 grid(static_cast<unsigned>((g.in + kTile - 1) / kTile), static_cast<unsigned>((g.out + kTile - 1) / kTile),
                  static_cast<unsigned>(g.E));
  if (grid.y > 65535) cuda::fail(op, "expert output width above " + std::to_string(65535 * kTile));
  wgrad_kernel<<<grid, kTile * kTile, 0, ctx_->stream>>>(gp, xp, g.off, dwp, R, g.out, g.in);
  cuda::check_launch(op);
}

}  // namespace mxt
