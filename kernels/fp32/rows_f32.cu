// The fp32 backend's row ops: embedding, RMSNorm, RoPE, SwiGLU x routing weight, MoE row permutation. Each
// mirrors its CPU twin (src/cpu) operation for operation; weight gradients are summed by one thread per column
// in token order, so results repeat bit for bit.
#include <cmath>
#include <string>

#include "cuda_context.cuh"
#include "fp32/cuda_f32_ops.hpp"
#include "fp32/f32_common.cuh"

namespace mxt {

namespace {

using cuda::block_sum_f64;
using cuda::f32k::kRowThreads;
using cuda::f32k::row_grid;

// ---- embedding --------------------------------------------------------------------------------------------
__global__ void gather_kernel(const int32_t* __restrict__ ids, const float* __restrict__ table, float* __restrict__ out,
                              int64_t T, int64_t V, int64_t d) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t id = ids[t];
    const bool ok = id >= 0 && id < V;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[t * d + j] = ok ? table[id * d + j] : 0.f;
  }
}

// One thread per column walks the tokens in order: no two threads write the same element.
__global__ void embedding_grad_kernel(const int32_t* __restrict__ ids, const float* __restrict__ dout,
                                      float* __restrict__ dtable, int64_t T, int64_t V, int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids[t];
    if (id >= 0 && id < V) dtable[id * d + j] += dout[t * d + j];
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------------------
__global__ void rmsnorm_fwd_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps,
                                   float* __restrict__ y, float* __restrict__ rstd, int64_t T, int64_t d) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* xr = x + t * d;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
    ss = block_sum_f64(ss);
    const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
    if (threadIdx.x == 0) rstd[t] = r;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) y[t * d + j] = w[j] * (xr[j] * r);
  }
}

__global__ void rmsnorm_bwd_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ w, const float* __restrict__ rstd,
                                   float* __restrict__ dx, int64_t T, int64_t d) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float *xr = x + t * d, *gr = dy + t * d;
    const double r = rstd[t];
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += static_cast<double>(w[j]) * gr[j] * xr[j];
    dot = block_sum_f64(dot);
    const double c = r * r * r * dot / static_cast<double>(d);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
      dx[t * d + j] = static_cast<float>(r * w[j] * gr[j] - c * xr[j]);
  }
}

__global__ void rmsnorm_dw_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                  const float* __restrict__ rstd, float* __restrict__ dw, int64_t T, int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double acc = 0.0;
  for (int64_t t = 0; t < T; ++t) acc += static_cast<double>(dy[t * d + j]) * x[t * d + j] * rstd[t];
  dw[j] += static_cast<float>(acc);
}

// ---- RoPE -------------------------------------------------------------------------------------------------
constexpr int kMaxHalf = 256;
struct InvFreq {
  float v[kMaxHalf];
};

// One thread per (token, head, pair i); cos / sin of the fp32 angle in fp64, as the CPU twin.
__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos, const InvFreq inv, float sign,
                            int64_t T, int64_t H, int64_t half) {
  const int64_t n = T * H * half;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, th = e / half, t = th / H;
    const float a = static_cast<float>(pos[t]) * inv.v[i];
    const float c = static_cast<float>(cos(static_cast<double>(a)));
    const float s = sign * static_cast<float>(sin(static_cast<double>(a)));
    float* r = x + th * 2 * half;
    const float x1 = r[i], x2 = r[i + half];
    r[i] = x1 * c - x2 * s;
    r[i + half] = x2 * c + x1 * s;
  }
}

// ---- SwiGLU x routing weight ------------------------------------------------------------------------------
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void swiglu_fwd_kernel(const float* __restrict__ h13, const float* __restrict__ wp, float* __restrict__ a,
                                  int64_t R, int64_t f) {
  const int64_t n = R * f;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / f, i = e % f;
    const float g = h13[r * 2 * f + i], u = h13[r * 2 * f + f + i];
    a[e] = g * sigmoid(g) * u * wp[r];
  }
}

__global__ void swiglu_bwd_kernel(const float* __restrict__ da, const float* __restrict__ h13,
                                  const float* __restrict__ wp, float* __restrict__ dh13, float* __restrict__ dwp,
                                  int64_t R, int64_t f) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float *gate = h13 + r * 2 * f, *up = gate + f, *gr = da + r * f;
    float *dgate = dh13 + r * 2 * f, *dup = dgate + f;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < f; i += blockDim.x) {
      const float s = sigmoid(gate[i]), silu = gate[i] * s;
      acc += static_cast<double>(gr[i]) * silu * up[i];
      dgate[i] = gr[i] * wp[r] * up[i] * s * (1.f + gate[i] * (1.f - s));
      dup[i] = gr[i] * wp[r] * silu;
    }
    acc = block_sum_f64(acc);
    if (threadIdx.x == 0) dwp[r] = static_cast<float>(acc);
  }
}

// ---- MoE permutation --------------------------------------------------------------------------------------
__global__ void permute_kernel(const float* __restrict__ x, const int32_t* __restrict__ perm, int64_t n, int k,
                               int64_t d, float* __restrict__ xp) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int32_t s = perm[p];
    const bool ok = s >= 0 && s < n;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) xp[p * d + j] = ok ? x[(s / k) * d + j] : 0.f;
  }
}

__global__ void inverse_kernel(const int32_t* __restrict__ perm, int64_t n, int32_t* __restrict__ inv) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = perm[p];
    if (s >= 0 && s < n) inv[s] = static_cast<int32_t>(p);
  }
}

// out[t] = the sum of its k slots' rows, in ascending permuted position as the CPU twin adds them.
__global__ void unpermute_kernel(const float* __restrict__ yp, const int32_t* __restrict__ inv, int64_t T, int k,
                                 int64_t d, float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    int32_t ps[8];
    const int kk = k < 8 ? k : 8;
    for (int j = 0; j < kk; ++j) ps[j] = inv[t * k + j];
    for (int a = 1; a < kk; ++a)  // insertion sort of at most 8
      for (int b = a; b > 0 && ps[b - 1] > ps[b]; --b) {
        const int32_t tmp = ps[b];
        ps[b] = ps[b - 1];
        ps[b - 1] = tmp;
      }
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = 0.f;
      for (int q = 0; q < kk; ++q)
        if (ps[q] >= 0) acc += yp[static_cast<int64_t>(ps[q]) * d + j];
      out[t * d + j] = acc;
    }
  }
}

int64_t lead(const Tensor& t) { return t.ndim ? t.shape[0] : 0; }

}  // namespace

void CudaF32Ops::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const char* op = "embedding_forward";
  const int64_t T = ids.numel(), V = lead(table), d = V ? table.numel() / V : 0;
  const int32_t* idp = cuda::i32(ids, op, "ids");
  const float* tab = cuda::f32(table, op, "table");
  float* o = cuda::f32(out, op, "out");
  cuda::expect_rows(out, T, d, op, "out");
  if (T == 0 || d == 0) return;
  gather_kernel<<<row_grid(T), kRowThreads, 0, ctx_->stream>>>(idp, tab, o, T, V, d);
  cuda::check_launch(op);
}

void CudaF32Ops::embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const char* op = "embedding_backward";
  const int64_t T = ids.numel(), V = lead(dtable), d = V ? dtable.numel() / V : 0;
  const int32_t* idp = cuda::i32(ids, op, "ids");
  const float* g = cuda::f32(dout, op, "dout");
  float* dt = cuda::f32(dtable, op, "dtable");
  cuda::expect_rows(dout, T, d, op, "dout");
  if (T == 0 || d == 0) return;
  embedding_grad_kernel<<<cuda::blocks_for(d, kRowThreads), kRowThreads, 0, ctx_->stream>>>(idp, g, dt, T, V, d);
  cuda::check_launch(op);
}

void CudaF32Ops::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const int64_t d = w.numel(), T = lead(x);
  cuda::expect_rows(x, T, d, op, "x");
  cuda::expect_rows(y, T, d, op, "y");
  cuda::expect_numel(rstd, T, op, "rstd");
  const float *xp = cuda::f32(x, op, "x"), *wp = cuda::f32(w, op, "w");
  float *yp = cuda::f32(y, op, "y"), *rp = cuda::f32(rstd, op, "rstd");
  if (T == 0 || d == 0) return;
  rmsnorm_fwd_kernel<<<row_grid(T), kRowThreads, 0, ctx_->stream>>>(xp, wp, eps, yp, rp, T, d);
  cuda::check_launch(op);
}

void CudaF32Ops::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                  const Tensor& dx, const Tensor& dw) {
  const char* op = "rmsnorm_backward";
  const int64_t d = w.numel(), T = lead(x);
  cuda::expect_rows(x, T, d, op, "x");
  cuda::expect_rows(dy, T, d, op, "dy");
  cuda::expect_rows(dx, T, d, op, "dx");
  cuda::expect_numel(rstd, T, op, "rstd");
  cuda::expect_numel(dw, d, op, "dw");
  const float *g = cuda::f32(dy, op, "dy"), *xp = cuda::f32(x, op, "x"), *wp = cuda::f32(w, op, "w");
  const float* rp = cuda::f32(rstd, op, "rstd");
  float *dxp = cuda::f32(dx, op, "dx"), *dwp = cuda::f32(dw, op, "dw");
  if (T == 0 || d == 0) return;
  rmsnorm_bwd_kernel<<<row_grid(T), kRowThreads, 0, ctx_->stream>>>(g, xp, wp, rp, dxp, T, d);
  cuda::check_launch(op);
  rmsnorm_dw_kernel<<<cuda::blocks_for(d, kRowThreads), kRowThreads, 0, ctx_->stream>>>(g, xp, rp, dwp, T, d);
  cuda::check_launch(op);
}

static void rope_f32(cudaStream_t stream, const Tensor& x, const Tensor& pos, float theta, float sign,
                     const char* op) {
  if (x.ndim != 3) cuda::fail(op, "x must be [T, n_heads, head_dim], got " + x.shape_str());
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2], half = D / 2;
  if (D % 2 || half > kMaxHalf)
    cuda::fail(op, "head_dim must be even and at most " + std::to_string(2 * kMaxHalf) + ", got " + std::to_string(D));
  cuda::expect_numel(pos, T, op, "pos");
  float* xp = cuda::f32(x, op, "x");
  const int32_t* pp = cuda::i32(pos, op, "pos");
  InvFreq inv{};  // on the host in fp32, exactly as the CPU twin and HF compute it
  for (int64_t i = 0; i < half; ++i)
    inv.v[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  if (T * H * half == 0) return;
  rope_kernel<<<cuda::blocks_for(T * H * half, kRowThreads), kRowThreads, 0, stream>>>(xp, pp, inv, sign, T, H, half);
  cuda::check_launch(op);
}

void CudaF32Ops::rope_forward(const Tensor& x, const Tensor& pos, float theta) {
  rope_f32(ctx_->stream, x, pos, theta, 1.f, "rope_forward");
}

void CudaF32Ops::rope_backward(const Tensor& dx, const Tensor& pos, float theta) {
  rope_f32(ctx_->stream, dx, pos, theta, -1.f, "rope_backward");
}

void CudaF32Ops::swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) {
  const char* op = "swiglu_forward";
  const int64_t R = wp.numel(), f = R ? a.numel() / R : 0;
  cuda::expect_rows(a, R, f, op, "a");
  cuda::expect_rows(h13, R, 2 * f, op, "h13");
  const float *h = cuda::f32(h13, op, "h13"), *w = cuda::f32(wp, op, "wp");
  float* o = cuda::f32(a, op, "a");
  if (R * f == 0) return;
  swiglu_fwd_kernel<<<cuda::blocks_for(R * f, kRowThreads), kRowThreads, 0, ctx_->stream>>>(h, w, o, R, f);
  cuda::check_launch(op);
}

void CudaF32Ops::swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                                 const Tensor& dwp) {
  const char* op = "swiglu_backward";
  const int64_t R = wp.numel(), f = R ? da.numel() / R : 0;
  cuda::expect_rows(da, R, f, op, "da");
  cuda::expect_rows(h13, R, 2 * f, op, "h13");
  cuda::expect_rows(dh13, R, 2 * f, op, "dh13");
  cuda::expect_numel(dwp, R, op, "dwp");
  const float *g = cuda::f32(da, op, "da"), *h = cuda::f32(h13, op, "h13"), *w = cuda::f32(wp, op, "wp");
  float *dh = cuda::f32(dh13, op, "dh13"), *dw = cuda::f32(dwp, op, "dwp");
  if (R == 0) return;
  swiglu_bwd_kernel<<<row_grid(R), kRowThreads, 0, ctx_->stream>>>(g, h, w, dh, dw, R, f);
  cuda::check_launch(op);
}

void CudaF32Ops::moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) {
  const char* op = "moe_permute";
  const int64_t T = lead(x), n = perm.numel();
  if (k < 1 || T * k != n) cuda::fail(op, "perm has " + std::to_string(n) + " entries, x " + x.shape_str());
  const int64_t d = T ? x.numel() / T : 0;
  cuda::expect_rows(xp, n, d, op, "xp");
  const float* xs = cuda::f32(x, op, "x");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  float* o = cuda::f32(xp, op, "xp");
  if (n == 0 || d == 0) return;
  permute_kernel<<<row_grid(n), kRowThreads, 0, ctx_->stream>>>(xs, pm, n, k, d, o);
  cuda::check_launch(op);
}

void CudaF32Ops::moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) {
  const char* op = "moe_unpermute";
  const int64_t T = lead(out), n = perm.numel();
  if (k < 1 || k > 8 || T * k != n)
    cuda::fail(op, "perm has " + std::to_string(n) + " entries, out " + out.shape_str() + ", k " + std::to_string(k) +
                       " (1 to 8)");
  const int64_t d = T ? out.numel() / T : 0;
  cuda::expect_rows(yp, n, d, op, "yp");
  const float* ys = cuda::f32(yp, op, "yp");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  float* o = cuda::f32(out, op, "out");
  if (n == 0 || d == 0) return;
  auto* inv = static_cast<int32_t*>(ctx_->scratch("f32_unpermute_inverse", sizeof(int32_t) * n));
  cuda::check(cudaMemsetAsync(inv, 0xff, sizeof(int32_t) * n, ctx_->stream), op, "memset");  // -1: no slot
  inverse_kernel<<<cuda::blocks_for(n, kRowThreads), kRowThreads, 0, ctx_->stream>>>(pm, n, inv);
  cuda::check_launch(op);
  unpermute_kernel<<<row_grid(T), kRowThreads, 0, ctx_->stream>>>(ys, inv, T, k, d, o);
  cuda::check_launch(op);
}

void CudaF32Ops::no_mx(const char* op) {
  cuda::fail(op, "backend=cuda-fp32 has no MXFP8 path (fp8_config.enabled needs backend=cuda)");
}

std::unique_ptr<Ops> make_cuda_f32_ops(int device) { return std::make_unique<CudaF32Ops>(device); }

}  // namespace mxt
