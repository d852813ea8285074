// The fp32 backend's causal GQA attention, forward and backward: one block per query row (forward, dQ) or key
// row (dK / dV), scores recomputed from the saved log-sum-exp as in the CPU twin (src/cpu/attention.cpp),
// whose per-element arithmetic it repeats; keys or (head, query) pairs go through shared memory in chunks, so
// any sequence length works. O(S^2) work per head with no tiling: a checking path, not a fast one.
#include <cfloat>
#include <string>

#include "cuda_context.cuh"
#include "fp32/cuda_f32_ops.hpp"
#include "fp32/f32_common.cuh"

namespace mxt {

namespace {

using cuda::block_max;
using cuda::block_sum_f64;

constexpr int kThreads = 128;  // also the chunk of keys / pairs a block holds at once
constexpr int kMaxD = 256;

struct Geo {
  int64_t B, S, H, KVH, D, group;
  float scale;
  const int32_t* doc;  // null: plain causal
  __device__ int64_t at(int64_t b, int64_t s, int64_t h, int64_t heads) const { return ((b * S + s) * heads + h) * D; }
  __device__ bool visible(int64_t b, int64_t i, int64_t j) const {
    return j <= i && (!doc || doc[b * S + j] == doc[b * S + i]);
  }
};

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// grid (S, H, B): query i of head h in batch row b.
__global__ void __launch_bounds__(kThreads) fwd_kernel(Geo g, const float* __restrict__ q, const float* __restrict__ k,
                                                       const float* __restrict__ v, float* __restrict__ out,
                                                       float* __restrict__ lse) {
  __shared__ float p[kThreads];
  __shared__ double acc[kMaxD];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / g.group;
  const float* qi = q + g.at(b, i, h, g.H);
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    if (g.visible(b, i, j)) m = fmaxf(m, dot(qi, k + g.at(b, j, kv, g.KVH), g.D) * g.scale);
  m = block_max(m);  // key i itself is always visible: m is finite
  for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) acc[d] = 0.0;
  double sum = 0.0;
  for (int64_t j0 = 0; j0 <= i; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float pj = 0.f;
    if (g.visible(b, i, j)) pj = expf(dot(qi, k + g.at(b, j, kv, g.KVH), g.D) * g.scale - m);
    sum += pj;
    __syncthreads();  // the previous chunk's readers are done
    p[threadIdx.x] = pj;
    __syncthreads();
    const int64_t n = i - j0 + 1 < kThreads ? i - j0 + 1 : kThreads;
    for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) {
      double a = acc[d];
      for (int64_t c = 0; c < n; ++c) a += static_cast<double>(p[c]) * v[g.at(b, j0 + c, kv, g.KVH) + d];
      acc[d] = a;
    }
  }
  sum = block_sum_f64(sum);
  float* oi = out + g.at(b, i, h, g.H);
  for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) oi[d] = static_cast<float>(acc[d] / sum);
  if (threadIdx.x == 0) lse[(b * g.H + h) * g.S + i] = m + static_cast<float>(log(sum));
}

// grid (S, H, B): delta_i = dO_i . O_i, and dQ_i = scale * sum_j dS_ij K_j.
__global__ void __launch_bounds__(kThreads) dq_kernel(Geo g, const float* __restrict__ dout, const float* __restrict__ q,
                                                      const float* __restrict__ k, const float* __restrict__ v,
                                                      const float* __restrict__ out, const float* __restrict__ lse,
                                                      float* __restrict__ delta, float* __restrict__ dq) {
  __shared__ float ds[kThreads];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / g.group;
  const float *qi = q + g.at(b, i, h, g.H), *gi = dout + g.at(b, i, h, g.H);
  const float Di = dot(gi, out + g.at(b, i, h, g.H), g.D);
  const float lse_i = lse[(b * g.H + h) * g.S + i];
  if (threadIdx.x == 0) delta[(b * g.H + h) * g.S + i] = Di;
  float acc[kMaxD / kThreads] = {};
  for (int64_t j0 = 0; j0 <= i; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float dsj = 0.f;
    if (g.visible(b, i, j)) {
      const float pij = expf(dot(qi, k + g.at(b, j, kv, g.KVH), g.D) * g.scale - lse_i);
      dsj = pij * (dot(gi, v + g.at(b, j, kv, g.KVH), g.D) - Di) * g.scale;
    }
    __syncthreads();
    ds[threadIdx.x] = dsj;
    __syncthreads();
    const int64_t n = i - j0 + 1 < kThreads ? i - j0 + 1 : kThreads;
    for (int64_t d = threadIdx.x, a = 0; d < g.D; d += blockDim.x, ++a)
      for (int64_t c = 0; c < n; ++c) acc[a] += ds[c] * k[g.at(b, j0 + c, kv, g.KVH) + d];
  }
  float* dqi = dq + g.at(b, i, h, g.H);
  for (int64_t d = threadIdx.x, a = 0; d < g.D; d += blockDim.x, ++a) dqi[d] = acc[a];
}

// grid (S, KVH, B): key j of kv head kv; sums over the (query head, query) pairs that see it, head-major.
__global__ void __launch_bounds__(kThreads) dkv_kernel(Geo g, const float* __restrict__ dout,
                                                       const float* __restrict__ q, const float* __restrict__ k,
                                                       const float* __restrict__ v, const float* __restrict__ lse,
                                                       const float* __restrict__ delta, float* __restrict__ dk,
                                                       float* __restrict__ dv) {
  __shared__ float p[kThreads], ds[kThreads];
  __shared__ int64_t row[kThreads];  // the pair's element offset in q / dout (-1: none)
  const int64_t j = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  const float *kj = k + g.at(b, j, kv, g.KVH), *vj = v + g.at(b, j, kv, g.KVH);
  const int64_t per_head = g.S - j, pairs = g.group * per_head;
  float ak[kMaxD / kThreads] = {}, av[kMaxD / kThreads] = {};
  for (int64_t c0 = 0; c0 < pairs; c0 += kThreads) {
    const int64_t c = c0 + threadIdx.x;
    float pc = 0.f, dsc = 0.f;
    int64_t r = -1;
    if (c < pairs) {
      const int64_t h = kv * g.group + c / per_head, i = j + c % per_head;
      if (g.visible(b, i, j)) {
        r = g.at(b, i, h, g.H);
        const int64_t st = (b * g.H + h) * g.S + i;
        pc = expf(dot(q + r, kj, g.D) * g.scale - lse[st]);
        dsc = pc * (dot(dout + r, vj, g.D) - delta[st]) * g.scale;
      }
    }
    __syncthreads();
    p[threadIdx.x] = pc;
    ds[threadIdx.x] = dsc;
    row[threadIdx.x] = r;
    __syncthreads();
    const int64_t n = pairs - c0 < kThreads ? pairs - c0 : kThreads;
    for (int64_t d = threadIdx.x, a = 0; d < g.D; d += blockDim.x, ++a)
      for (int64_t e = 0; e < n; ++e) {
        if (row[e] < 0) continue;
        av[a] += p[e] * dout[row[e] + d];
        ak[a] += ds[e] * q[row[e] + d];
      }
  }
  float *dkj = dk + g.at(b, j, kv, g.KVH), *dvj = dv + g.at(b, j, kv, g.KVH);
  for (int64_t d = threadIdx.x, a = 0; d < g.D; d += blockDim.x, ++a) {
    dkj[d] = ak[a];
    dvj[d] = av[a];
  }
}

Geo check(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
          const char* op) {
  if (s.batch < 0 || s.seq < 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads)
    cuda::fail(op, "bad AttnShape (heads " + std::to_string(s.n_heads) + ", kv heads " + std::to_string(s.n_kv_heads) +
                       ", head_dim " + std::to_string(s.head_dim) + ")");
  if (s.head_dim > kMaxD) cuda::fail(op, "head_dim " + std::to_string(s.head_dim) + " above " + std::to_string(kMaxD));
  if (s.batch > 65535 || s.n_heads > 65535) cuda::fail(op, "batch or heads above 65535");
  const int64_t T = s.batch * s.seq;
  cuda::expect_rows(q, T, s.n_heads * s.head_dim, op, "q");
  cuda::expect_rows(k, T, s.n_kv_heads * s.head_dim, op, "k");
  cuda::expect_rows(v, T, s.n_kv_heads * s.head_dim, op, "v");
  cuda::expect_rows(o, T, s.n_heads * s.head_dim, op, "out");
  cuda::expect_numel(lse, s.batch * s.n_heads * s.seq, op, "lse");
  const int32_t* doc = nullptr;
  if (s.doc_ids.data) {
    cuda::expect_numel(s.doc_ids, T, op, "doc_ids");
    doc = cuda::i32(s.doc_ids, op, "doc_ids");
  }
  return {s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim, s.n_heads / s.n_kv_heads,
          1.0f / std::sqrt(static_cast<float>(s.head_dim)), doc};
}

}  // namespace

void CudaF32Ops::attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  const Geo g = check(s, q, k, v, out, lse, op);
  if (g.B * g.S == 0) return;
  fwd_kernel<<<dim3(g.S, g.H, g.B), kThreads, 0, ctx_->stream>>>(g, cuda::f32(q, op, "q"), cuda::f32(k, op, "k"),
                                                                 cuda::f32(v, op, "v"), cuda::f32(out, op, "out"),
                                                                 cuda::f32(lse, op, "lse"));
  cuda::check_launch(op);
}

void CudaF32Ops::attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  const Geo g = check(s, q, k, v, out, lse, op);
  const int64_t T = g.B * g.S;
  cuda::expect_rows(dout, T, g.H * g.D, op, "dout");
  cuda::expect_rows(dq, T, g.H * g.D, op, "dq");
  cuda::expect_rows(dk, T, g.KVH * g.D, op, "dk");
  cuda::expect_rows(dv, T, g.KVH * g.D, op, "dv");
  if (T == 0) return;
  auto* delta = static_cast<float*>(ctx_->scratch("f32_attention_delta", sizeof(float) * g.B * g.H * g.S));
  const float *gp = cuda::f32(dout, op, "dout"), *qp = cuda::f32(q, op, "q"), *kp = cuda::f32(k, op, "k");
  const float *vp = cuda::f32(v, op, "v"), *lp = cuda::f32(lse, op, "lse");
  dq_kernel<<<dim3(g.S, g.H, g.B), kThreads, 0, ctx_->stream>>>(g, gp, qp, kp, vp, cuda::f32(out, op, "out"), lp, delta,
                                                                cuda::f32(dq, op, "dq"));
  cuda::check_launch(op);
  dkv_kernel<<<dim3(g.S, g.KVH, g.B), kThreads, 0, ctx_->stream>>>(g, gp, qp, kp, vp, lp, delta,
                                                                   cuda::f32(dk, op, "dk"), cuda::f32(dv, op, "dv"));
  cuda::check_launch(op);
}

}  // namespace mxt
