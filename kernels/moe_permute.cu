// MoE permutation on the device: the plan (per-expert counts, offsets, a stable grouping of the T*k slots by
// expert), the BF16 row gathers between token order and expert order, and the F32 routing-weight gathers.
//
// Indices cannot be validated on the host without a sync, so bad ones are made harmless instead of fatal:
// - moe_plan: a topk_idx entry outside [0, E) belongs to no expert; such slots are left out of every group,
//   offsets[E] is then < T*k, and perm[offsets[E] .. T*k) is set to -1 (capacity padding).
// - the gathers / scatters: a perm entry outside [0, T*k) (e.g. that -1) yields a zero row / weight and is
//   never read through or written to.
#include <cstdint>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace {

using cuda::expect_rows;

constexpr int kPlanThreads = 512;  // multiple of 32, <= 1024
constexpr int kPlanItems = 4;      // consecutive slots per thread in the scatter pass
constexpr int kScanThreads = 1024;
constexpr int kRowThreads = 128;

// Exclusive prefix sum over the block (blockDim.x a multiple of 32, <= 1024); *total gets the block's sum.
// All threads must call it; it ends with a barrier so it can be called again at once.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  int x = v;  // inclusive scan inside the warp
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nwarps ? warp_sums[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warp_sums[lane] = w;  // inclusive prefix over warps
  }
  __syncthreads();
  const int before = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[nwarps - 1];
  __syncthreads();
  return before + x - v;
}

// ---- moe_plan -----------------------------------------------------------------------------------------

// Block e counts the slots routed to expert e into offsets[e + 1] (integer sums: order-independent).
__global__ void plan_count_kernel(const int32_t* __restrict__ idx, int64_t n, int32_t* __restrict__ offsets) {
  __shared__ int count;
  const int e = blockIdx.x;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  int c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += idx[i] == e;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (threadIdx.x % 32 == 0) atomicAdd(&count, c);
  __syncthreads();
  if (threadIdx.x == 0) offsets[e + 1] = count;
}

// One block: offsets[1..E] (counts) -> inclusive prefix sums, offsets[0] = 0; then perm[offsets[E] .. n) = -1
// for slots whose expert index was out of range.
__global__ void plan_scan_kernel(int32_t* __restrict__ offsets, int E, int32_t* __restrict__ perm, int64_t n) {
  int carry = 0;
  for (int base = 0; base < E; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int c = e < E ? offsets[e + 1] : 0;
    int total;
    const int excl = block_exclusive_scan(c, &total);
    if (e < E) offsets[e + 1] = carry + excl + c;
    carry += total;
  }
  if (threadIdx.x == 0) offsets[0] = 0;
  for (int64_t p = static_cast<int64_t>(carry) + threadIdx.x; p < n; p += blockDim.x) perm[p] = -1;
}

// Block e walks the slots in order, kPlanItems consecutive ones per thread, and writes those routed to e at
// offsets[e] + (their rank among them): slots ascend within each expert (a stable counting sort).
__global__ void plan_scatter_kernel(const int32_t* __restrict__ idx, int64_t n,
                                    const int32_t* __restrict__ offsets, int32_t* __restrict__ perm) {
  const int e = blockIdx.x;
  int64_t pos = offsets[e];
  const int64_t tile = static_cast<int64_t>(blockDim.x) * kPlanItems;
  for (int64_t s0 = 0; s0 < n; s0 += tile) {
    const int64_t first = s0 + static_cast<int64_t>(threadIdx.x) * kPlanItems;
    bool hit[kPlanItems];
    int c = 0;
#pragma unroll
    for (int q = 0; q < kPlanItems; ++q) {
      hit[q] = first + q < n && idx[first + q] == e;
      c += hit[q];
    }
    int total;
    int at = block_exclusive_scan(c, &total);
#pragma unroll
    for (int q = 0; q < kPlanItems; ++q)
      if (hit[q]) perm[pos + at++] = static_cast<int32_t>(first + q);
    pos += total;
  }
}

// ---- row gathers --------------------------------------------------------------------------------------

// 16-byte copies when rows are 8-element multiples and the bases are 16-byte aligned, else element copies.
bool vec8_ok(int64_t d, const void* a, const void* b) {
  return d % 8 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

// xp[p,:] = x[perm[p] / k,:]  (zero row for an invalid perm entry)
template <bool kVec>
__global__ void permute_rows_kernel(const cuda::bf16* __restrict__ x, const int32_t* __restrict__ perm,
                                    int64_t n, int k, int64_t d, cuda::bf16* __restrict__ xp) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int32_t s = perm[p];
    const bool ok = s >= 0 && s < n;
    const cuda::bf16* src = x + (ok ? static_cast<int64_t>(s / k) : 0) * d;
    cuda::bf16* dst = xp + p * d;
    if (kVec) {
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      uint4* d4 = reinterpret_cast<uint4*>(dst);
      for (int64_t c = threadIdx.x; c < d / 8; c += blockDim.x) d4[c] = ok ? s4[c] : make_uint4(0, 0, 0, 0);
    } else {
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = ok ? src[c] : __float2bfloat16(0.f);
    }
  }
}

// inv[perm[p]] = p for valid entries (inv is preset to -1).
__global__ void invert_perm_kernel(const int32_t* __restrict__ perm, int64_t n, int32_t* __restrict__ inv) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = perm[p];
    if (s >= 0 && s < n) inv[s] = static_cast<int32_t>(p);
  }
}

// out[t,:] = sum_j yp[inv[t*k + j],:], in fp32 in j order, rounded once (missing rows contribute nothing).
// kAdd: out[t,:] = res[t,:] + that rounded sum, rounded (moe_unpermute then add; out may alias res: each element
// is read and written by the same thread).
template <bool kVec, bool kAdd>
__global__ void unpermute_rows_kernel(const cuda::bf16* __restrict__ yp, const int32_t* __restrict__ inv,
                                      int64_t T, int k, int64_t d, const cuda::bf16* res, cuda::bf16* out) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t* rows = inv + t * k;
    cuda::bf16* dst = out + t * d;
    if (kVec) {
      for (int64_t c = threadIdx.x; c < d / 8; c += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < k; ++j) {
          const int32_t p = rows[j];
          if (p < 0) continue;
          // (cuda::load8 here compiles to four 4-byte loads instead of one 16-byte load)
          const uint4 raw = reinterpret_cast<const uint4*>(yp + static_cast<int64_t>(p) * d)[c];
          const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 f = __bfloat1622float2(h2[q]);
            acc[2 * q] += f.x;
            acc[2 * q + 1] += f.y;
          }
        }
        if (kAdd) {
          float rv[8];
          cuda::load8(res + t * d + 8 * c, rv);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[q] = __fadd_rn(rv[q], __bfloat162float(__float2bfloat16(acc[q])));
        }
        cuda::store8(dst + 8 * c, acc);
      }
    } else {
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
          const int32_t p = rows[j];
          if (p >= 0) acc += __bfloat162float(yp[static_cast<int64_t>(p) * d + c]);
        }
        if (kAdd) acc = __fadd_rn(__bfloat162float(res[t * d + c]), __bfloat162float(__float2bfloat16(acc)));
        dst[c] = __float2bfloat16(acc);
      }
    }
  }
}

// ---- weight gathers -----------------------------------------------------------------------------------

__global__ void permute_weights_kernel(const float* __restrict__ w, const int32_t* __restrict__ perm, int64_t n,
                                       float* __restrict__ wp) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = perm[p];
    wp[p] = (s >= 0 && s < n) ? w[s] : 0.f;
  }
}

__global__ void unpermute_weights_kernel(const float* __restrict__ dwp, const int32_t* __restrict__ perm,
                                         int64_t n, float* __restrict__ dw) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = perm[p];
    if (s >= 0 && s < n) dw[s] = dwp[p];
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > (1LL << 30) ? (1LL << 30) : rows));
}

}  // namespace

void CudaOps::moe_plan(const Tensor& topk_idx, int num_experts, const Tensor& offsets, const Tensor& perm) {
  const char* op = "moe_plan";
  const int64_t n = topk_idx.numel(), E = num_experts;
  if (E < 1) cuda::fail(op, "num_experts must be positive");
  if (n > INT32_MAX) cuda::fail(op, "too many slots for I32 offsets: " + std::to_string(n));
  cuda::expect_numel(offsets, E + 1, op, "offsets");
  cuda::expect_numel(perm, n, op, "perm");
  const int32_t* ix = cuda::i32(topk_idx, op, "topk_idx");
  int32_t* off = cuda::i32(offsets, op, "offsets");
  int32_t* pm = cuda::i32(perm, op, "perm");
  cudaStream_t st = ctx().stream;
  plan_count_kernel<<<static_cast<unsigned>(E), kPlanThreads, 0, st>>>(ix, n, off);
  cuda::check_launch(op);
  plan_scan_kernel<<<1, kScanThreads, 0, st>>>(off, static_cast<int>(E), pm, n);
  cuda::check_launch(op);
  if (n == 0) return;
  plan_scatter_kernel<<<static_cast<unsigned>(E), kPlanThreads, 0, st>>>(ix, n, off, pm);
  cuda::check_launch(op);
}

void CudaOps::moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) {
  const char* op = "moe_permute";
  const int64_t T = x.ndim ? x.shape[0] : 0, n = perm.numel();
  if (k < 1 || T * k != n) cuda::fail(op, "perm has " + std::to_string(n) + " entries, x " + x.shape_str());
  const int64_t d = T ? x.numel() / T : 0;
  expect_rows(xp, n, d, op, "xp");
  const cuda::bf16* xs = cuda::bf16p(x, op, "x");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  cuda::bf16* o = cuda::bf16p(xp, op, "xp");
  if (n == 0 || d == 0) return;
  if (vec8_ok(d, xs, o))
    permute_rows_kernel<true><<<row_blocks(n), kRowThreads, 0, ctx().stream>>>(xs, pm, n, k, d, o);
  else
    permute_rows_kernel<false><<<row_blocks(n), kRowThreads, 0, ctx().stream>>>(xs, pm, n, k, d, o);
  cuda::check_launch(op);
}

namespace {

// moe_unpermute, and with res the fused residual add (moe_unpermute_add).
void unpermute_launch(const char* op, const Tensor& yp, const Tensor& perm, int k, const Tensor* res,
                      const Tensor& out, CudaContext& ctx) {
  const int64_t T = out.ndim ? out.shape[0] : 0, n = perm.numel();
  if (k < 1 || T * k != n) cuda::fail(op, "perm has " + std::to_string(n) + " entries, out " + out.shape_str());
  const int64_t d = T ? out.numel() / T : 0;
  expect_rows(yp, n, d, op, "yp");
  const cuda::bf16* ys = cuda::bf16p(yp, op, "yp");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  cuda::bf16* o = cuda::bf16p(out, op, "out");
  const cuda::bf16* rs = nullptr;
  if (res) {
    expect_rows(*res, T, d, op, "res");
    rs = cuda::bf16p(*res, op, "res");
  }
  if (n == 0 || d == 0) return;  // n = T * k: no rows at all
  cudaStream_t st = ctx.stream;
  int32_t* inv = static_cast<int32_t*>(ctx.scratch("moe_unpermute.inv", static_cast<size_t>(n) * sizeof(int32_t)));
  cuda::check(cudaMemsetAsync(inv, 0xff, static_cast<size_t>(n) * sizeof(int32_t), st), op, "memset");
  invert_perm_kernel<<<cuda::blocks_for(n, 256), 256, 0, st>>>(pm, n, inv);
  cuda::check_launch(op);
  const bool vec = vec8_ok(d, ys, o) && (!rs || cuda::aligned16(rs));
  if (vec && rs)
    unpermute_rows_kernel<true, true><<<row_blocks(T), kRowThreads, 0, st>>>(ys, inv, T, k, d, rs, o);
  else if (vec)
    unpermute_rows_kernel<true, false><<<row_blocks(T), kRowThreads, 0, st>>>(ys, inv, T, k, d, nullptr, o);
  else if (rs)
    unpermute_rows_kernel<false, true><<<row_blocks(T), kRowThreads, 0, st>>>(ys, inv, T, k, d, rs, o);
  else
    unpermute_rows_kernel<false, false><<<row_blocks(T), kRowThreads, 0, st>>>(ys, inv, T, k, d, nullptr, o);
  cuda::check_launch(op);
}

}  // namespace

void CudaOps::moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) {
  unpermute_launch("moe_unpermute", yp, perm, k, nullptr, out, ctx());
}

// One pass instead of moe_unpermute into tmp and an add (the same bits).
void CudaOps::moe_unpermute_add(const Tensor& yp, const Tensor& perm, int k, const Tensor& res, const Tensor& out,
                                const Tensor& tmp) {
  if (out.dtype != DType::BF16) return Ops::moe_unpermute_add(yp, perm, k, res, out, tmp);
  unpermute_launch("moe_unpermute_add", yp, perm, k, &res, out, ctx());
}

void CudaOps::moe_permute_weights(const Tensor& w, const Tensor& perm, const Tensor& wp) {
  const char* op = "moe_permute_weights";
  const int64_t n = perm.numel();
  cuda::expect_numel(w, n, op, "w");
  cuda::expect_numel(wp, n, op, "wp");
  const float* ws = cuda::f32(w, op, "w");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  float* o = cuda::f32(wp, op, "wp");
  if (n == 0) return;
  permute_weights_kernel<<<cuda::blocks_for(n, 256), 256, 0, ctx().stream>>>(ws, pm, n, o);
  cuda::check_launch(op);
}

void CudaOps::moe_unpermute_weights(const Tensor& dwp, const Tensor& perm, const Tensor& dw) {
  const char* op = "moe_unpermute_weights";
  const int64_t n = perm.numel();
  cuda::expect_numel(dwp, n, op, "dwp");
  cuda::expect_numel(dw, n, op, "dw");
  const float* g = cuda::f32(dwp, op, "dwp");
  const int32_t* pm = cuda::i32(perm, op, "perm");
  float* o = cuda::f32(dw, op, "dw");
  if (n == 0) return;
  // perm is a permutation, but never leave stale values if it is not (like the CPU twin).
  cuda::check(cudaMemsetAsync(o, 0, static_cast<size_t>(n) * sizeof(float), ctx().stream), op, "memset");
  unpermute_weights_kernel<<<cuda::blocks_for(n, 256), 256, 0, ctx().stream>>>(g, pm, n, o);
  cuda::check_launch(op);
}

}  // namespace mxt
