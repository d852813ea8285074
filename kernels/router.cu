// MoE router on the device: softmax over experts (fp32), top-k with ties to the lower index, renormalised
// weights; its backward; the load-balancing statistics; and the broadcast of the aux-loss coefficients.
// One warp per token: lane l holds experts l, l+32, ..., so E <= 256 (kMaxPerLane * 32).
//
// Indices cannot be validated on the host without a sync: a topk_idx entry outside [0, E) is skipped by the
// backward and the statistics (never read or written out of bounds).
#include <cfloat>
#include <climits>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace {

constexpr int kMaxPerLane = 8;                  // experts per lane
constexpr int kMaxExperts = 32 * kMaxPerLane;  // 256
constexpr int kWarpsPerBlock = 4;               // tokens per block
constexpr unsigned kFull = 0xffffffffu;

// t must have `rows` leading rows and rows*cols elements (like the CPU twin's expect_2d).
using cuda::expect_rows;

unsigned warp_blocks(int64_t T) { return static_cast<unsigned>((T + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// ---- forward ------------------------------------------------------------------------------------------

__global__ void router_forward_kernel(const float* __restrict__ logits, int64_t T, int E, int k,
                                      float* __restrict__ probs, int32_t* __restrict__ topk_idx,
                                      float* __restrict__ topk_w) {
  __shared__ float sel[kWarpsPerBlock][kMaxExperts];  // the selected probabilities, in selection order
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= T) return;  // whole warps leave together; no block-wide barrier below
  const float* l = logits + t * E;
  float* p = probs + t * E;

  float v[kMaxPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    m = fmaxf(m, v[i]);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? expf(v[i] - m) : 0.f;
    s += v[i];
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  const float inv = 1.f / s;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      v[i] *= inv;
      p[e] = v[i];
    }
  }

  // Repeated arg-max over the stored probabilities: larger value first, the lower index on ties.
  unsigned taken = 0;  // bit i: expert lane + 32 i already chosen
  float wsum = 0.f;
  for (int j = 0; j < k; ++j) {
    float bv = -1.f;  // probabilities are >= 0, so any untaken expert beats this
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !(taken & (1u << i)) && v[i] > bv) {  // ascending e: strict '>' keeps the lower index
        bv = v[i];
        bi = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oi = __shfl_xor_sync(kFull, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    // Every lane now holds the same (bv, bi); k <= E guarantees bi is a real expert.
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == 0) {
      topk_idx[t * k + j] = bi;
      sel[warp][j] = bv;
    }
    wsum += bv;
  }
  __syncwarp();
  for (int j = lane; j < k; j += 32) topk_w[t * k + j] = sel[warp][j] / wsum;
}

// ---- backward -----------------------------------------------------------------------------------------

// w_i = p_i / S (S = sum of the top-k probs) => dp_i = (g_i - sum_j g_j w_j) / S inside the top-k set, plus
// the optional extra gradient; then dlogit = p * (dp - sum(p * dp)). Accumulated in fp64 like the CPU twin.
__global__ void router_backward_kernel(const float* __restrict__ dtopk_w, const float* __restrict__ probs,
                                       const int32_t* __restrict__ topk_idx, const float* __restrict__ topk_w,
                                       const float* __restrict__ extra, float* __restrict__ dlogits, int64_t T,
                                       int E, int k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= T) return;
  const float* p = probs + t * E;
  const int32_t* ix = topk_idx + t * k;
  const float* g = dtopk_w + t * k;
  const float* w = topk_w + t * k;

  // S and sum_j g_j w_j: lanes take strided j, then a warp sum.
  double S = 0.0, gw = 0.0;
  for (int j = lane; j < k; j += 32) {
    const int e = ix[j];
    if (e < 0 || e >= E) continue;
    S += p[e];
    gw += static_cast<double>(g[j]) * w[j];
  }
  for (int o = 16; o > 0; o >>= 1) {
    S += __shfl_xor_sync(kFull, S, o);
    gw += __shfl_xor_sync(kFull, gw, o);
  }

  float pv[kMaxPerLane];
  double dp[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    pv[i] = e < E ? p[e] : 0.f;
    dp[i] = (e < E && extra != nullptr) ? static_cast<double>(extra[t * E + e]) : 0.0;
  }
  // Every lane walks the k selections (broadcast loads) and adds the ones it owns.
  for (int j = 0; j < k; ++j) {
    const int e = ix[j];
    const bool mine = e >= 0 && e < E && (e & 31) == lane;
    const double add = mine ? (static_cast<double>(g[j]) - gw) / S : 0.0;
    // Predicated adds over the whole register array (an indexed dp[e >> 5] would go to local memory).
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) dp[i] += (mine && (e >> 5) == i) ? add : 0.0;
  }
  double pdp = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) pdp += pv[i] * dp[i];
  for (int o = 16; o > 0; o >>= 1) pdp += __shfl_xor_sync(kFull, pdp, o);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < E) dlogits[t * E + e] = static_cast<float>(pv[i] * (dp[i] - pdp));
  }
}

// ---- load-balancing statistics ------------------------------------------------------------------------

// Deterministic: block c sums its own rows / slots into partials (fp64 sums, integer counts via shared-memory
// integer atomics, which are order-independent), and one final pass adds the partials in chunk order.
constexpr int kStatsThreads = 256;
constexpr int64_t kStatsRowsPerChunk = 128;
constexpr int64_t kStatsMaxChunks = 1024;
constexpr int64_t kStatsMaxExperts = 12 * 1024;  // 48 KiB of int32 histogram

__global__ void router_stats_partial_kernel(const float* __restrict__ probs, int64_t T, int E,
                                            const int32_t* __restrict__ idx, int64_t n, int64_t rows_per_chunk,
                                            int64_t slots_per_chunk, double* __restrict__ part_sum,
                                            int32_t* __restrict__ part_count) {
  extern __shared__ int32_t hist[];  // [E]
  const int64_t c = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t s0 = c * slots_per_chunk, s1 = min(n, s0 + slots_per_chunk);
  for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
    const int e = idx[s];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
  }
  const int64_t r0 = c * rows_per_chunk, r1 = min(T, r0 + rows_per_chunk);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double acc = 0.0;
    for (int64_t r = r0; r < r1; ++r) acc += probs[r * E + e];  // consecutive threads: consecutive e
    part_sum[c * E + e] = acc;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) part_count[c * E + e] = hist[e];
}

__global__ void router_stats_final_kernel(const double* __restrict__ part_sum,
                                          const int32_t* __restrict__ part_count, int64_t chunks, int E,
                                          float* __restrict__ prob_sum, float* __restrict__ count) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double acc = 0.0;
  int64_t cnt = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    acc += part_sum[c * E + e];
    cnt += part_count[c * E + e];
  }
  prob_sum[e] += static_cast<float>(acc);
  count[e] += static_cast<float>(cnt);
}

__global__ void broadcast_rows_kernel(const float* __restrict__ coef, float* __restrict__ out, int64_t T,
                                      int64_t E) {
  const int64_t n = T * E;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = coef[i % E];
}

}  // namespace

void CudaOps::router_forward(const Tensor& logits, int k, const Tensor& probs, const Tensor& topk_idx,
                             const Tensor& topk_w) {
  const char* op = "router_forward";
  const int64_t T = logits.ndim ? logits.shape[0] : 0, E = T ? logits.numel() / T : logits.dim(-1);
  if (E < 1 || E > kMaxExperts)
    cuda::fail(op, "supports 1.." + std::to_string(kMaxExperts) + " experts, got " + std::to_string(E));
  if (k < 1 || k > E) cuda::fail(op, "k = " + std::to_string(k) + " with " + std::to_string(E) + " experts");
  expect_rows(logits, T, E, op, "logits");
  expect_rows(probs, T, E, op, "probs");
  expect_rows(topk_idx, T, k, op, "topk_idx");
  expect_rows(topk_w, T, k, op, "topk_w");
  const float* lg = cuda::f32(logits, op, "logits");
  float* pr = cuda::f32(probs, op, "probs");
  int32_t* ix = cuda::i32(topk_idx, op, "topk_idx");
  float* tw = cuda::f32(topk_w, op, "topk_w");
  if (T == 0) return;
  router_forward_kernel<<<warp_blocks(T), 32 * kWarpsPerBlock, 0, ctx().stream>>>(lg, T, static_cast<int>(E), k,
                                                                                   pr, ix, tw);
  cuda::check_launch(op);
}

void CudaOps::router_backward(const Tensor& dtopk_w, const Tensor& probs, const Tensor& topk_idx,
                              const Tensor& topk_w, const Tensor& dprobs_extra, const Tensor& dlogits) {
  const char* op = "router_backward";
  const int64_t T = probs.ndim ? probs.shape[0] : 0, E = T ? probs.numel() / T : probs.dim(-1);
  const int64_t k = T ? topk_idx.numel() / T : topk_idx.dim(-1);
  if (E < 1 || E > kMaxExperts)
    cuda::fail(op, "supports 1.." + std::to_string(kMaxExperts) + " experts, got " + std::to_string(E));
  if (k < 1 || k > E) cuda::fail(op, "k = " + std::to_string(k) + " with " + std::to_string(E) + " experts");
  expect_rows(dtopk_w, T, k, op, "dtopk_w");
  expect_rows(topk_idx, T, k, op, "topk_idx");
  expect_rows(topk_w, T, k, op, "topk_w");
  expect_rows(dlogits, T, E, op, "dlogits");
  const bool has_extra = dprobs_extra.numel() != 0;
  if (has_extra) expect_rows(dprobs_extra, T, E, op, "dprobs_extra");
  const float* g = cuda::f32(dtopk_w, op, "dtopk_w");
  const float* pr = cuda::f32(probs, op, "probs");
  const int32_t* ix = cuda::i32(topk_idx, op, "topk_idx");
  const float* tw = cuda::f32(topk_w, op, "topk_w");
  const float* ex = has_extra ? cuda::f32(dprobs_extra, op, "dprobs_extra") : nullptr;
  float* dl = cuda::f32(dlogits, op, "dlogits");
  if (T == 0) return;
  router_backward_kernel<<<warp_blocks(T), 32 * kWarpsPerBlock, 0, ctx().stream>>>(
      g, pr, ix, tw, ex, dl, T, static_cast<int>(E), static_cast<int>(k));
  cuda::check_launch(op);
}

void CudaOps::router_aux_stats(const Tensor& probs, const Tensor& topk_idx, const Tensor& prob_sum,
                               const Tensor& count) {
  const char* op = "router_aux_stats";
  const int64_t E = prob_sum.numel(), T = probs.ndim ? probs.shape[0] : 0, n = topk_idx.numel();
  if (E < 1) cuda::fail(op, "prob_sum must have one element per expert, got " + prob_sum.shape_str());
  if (E > kStatsMaxExperts)  // the per-block histogram lives in (default-sized) shared memory
    cuda::fail(op, "supports up to " + std::to_string(kStatsMaxExperts) + " experts, got " + std::to_string(E));
  expect_rows(probs, T, E, op, "probs");
  cuda::expect_numel(count, E, op, "count");
  const float* pr = cuda::f32(probs, op, "probs");
  const int32_t* ix = cuda::i32(topk_idx, op, "topk_idx");
  float* ps = cuda::f32(prob_sum, op, "prob_sum");
  float* cn = cuda::f32(count, op, "count");
  if (T == 0 && n == 0) return;
  // Chunks of ~128 rows (at most 1024 chunks); the slots are split into the same number of chunks.
  int64_t chunks = (T + kStatsRowsPerChunk - 1) / kStatsRowsPerChunk;
  if (chunks > kStatsMaxChunks) chunks = kStatsMaxChunks;
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = (T + chunks - 1) / chunks, slots_per_chunk = (n + chunks - 1) / chunks;
  const size_t sum_bytes = static_cast<size_t>(chunks * E) * sizeof(double);
  char* scratch = static_cast<char*>(ctx().scratch("router_aux_stats", sum_bytes + chunks * E * sizeof(int32_t)));
  double* part_sum = reinterpret_cast<double*>(scratch);
  int32_t* part_count = reinterpret_cast<int32_t*>(scratch + sum_bytes);
  const size_t smem = static_cast<size_t>(E) * sizeof(int32_t);
  router_stats_partial_kernel<<<static_cast<unsigned>(chunks), kStatsThreads, smem, ctx().stream>>>(
      pr, T, static_cast<int>(E), ix, n, rows_per_chunk, slots_per_chunk, part_sum, part_count);
  cuda::check_launch(op);
  router_stats_final_kernel<<<cuda::blocks_for(E, 256), 256, 0, ctx().stream>>>(part_sum, part_count, chunks,
                                                                                 static_cast<int>(E), ps, cn);
  cuda::check_launch(op);
}

void CudaOps::broadcast_rows(const Tensor& coef, const Tensor& dprobs) {
  const char* op = "broadcast_rows";
  const int64_t E = coef.numel(), T = dprobs.ndim ? dprobs.shape[0] : 0;
  expect_rows(dprobs, T, E, op, "dprobs");
  const float* c = cuda::f32(coef, op, "coef");
  float* d = cuda::f32(dprobs, op, "dprobs");
  if (T * E == 0) return;
  broadcast_rows_kernel<<<cuda::blocks_for(T * E, 256), 256, 0, ctx().stream>>>(c, d, T, E);
  cuda::check_launch(op);
}

}  // namespace mxt
