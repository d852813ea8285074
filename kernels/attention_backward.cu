// CudaOps::attention_backward: flash-attention backward for causal GQA (bf16 in/out, fp32 accumulation,
// tensor-core mma.sync m16n8k16), deterministic (no atomics), P recomputed from the saved lse.
//   1. attn_bwd_delta_kernel: delta[b,h,s] = sum_d dO * O (fp32, in ctx().scratch).
//   2. attn_bwd_dq_kernel:    per 64-row Q tile of one (b, h): loop over 32-key K/V tiles,
//                             dS = P * (dO V^T - delta), dQ = scale * dS K.
//   3. attn_bwd_dkv_kernel:   per 64-key K/V tile of one (b, kv head): loop over the H/KVH query heads sharing
//                             it and over 32-row Q tiles, dV = P^T dO, dK = scale * dS^T Q, summed in registers.
#include <cmath>

#include "attention_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace cuda::attn {

constexpr int kBwdThreads = 128;  // 4 warps, each owning 16 rows (queries for dQ, keys for dK/dV)
constexpr int kDqBM = 64, kDqBN = 32;
constexpr int kDkvBN = 64, kDkvBM = 32;

template <int D>
constexpr size_t dq_smem_bytes() {  // Q, dO tiles [64][LD]; K, V tiles [32][LD]
  return static_cast<size_t>((2 * kDqBM + 2 * kDqBN) * (D + 8)) * sizeof(uint16_t);
}
template <int D>
constexpr size_t dkv_smem_bytes() {  // K, V tiles [64][LD]; Q, dO tiles [32][LD]; lse, delta [32] fp32
  return static_cast<size_t>((2 * kDkvBN + 2 * kDkvBM) * (D + 8)) * sizeof(uint16_t) +
         2 * kDkvBM * sizeof(float);
}

// One warp per (token, head) row: delta[(b*H + h)*S + s] = dot(dO[t,h,:], O[t,h,:]), t = b*S + s.
__global__ void attn_bwd_delta_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                      float* __restrict__ delta, int64_t rows, int S, int H, int D) {
  const int64_t rowi = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (rowi >= rows) return;  // whole warp leaves together
  const bf16* a = dout + rowi * D;
  const bf16* o = out + rowi * D;
  float acc = 0.f;
  for (int d = 2 * lane; d < D; d += 64) {
    const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(a + d));
    const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + d));
    acc += x.x * y.x + x.y * y.y;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t t = rowi / H;
    const int h = static_cast<int>(rowi % H);
    const int64_t b = t / S, s = t % S;
    delta[(b * H + h) * S + s] = acc;
  }
}

// grid (ceil(S/64), H, B).
template <int D>
__global__ void __launch_bounds__(kBwdThreads) attn_bwd_dq_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    bf16* __restrict__ dq, int S, int H, int KVH, float scale, float scale_log2) {
  constexpr int BM = kDqBM, BN = kDqBN, LD = D + 8;
  constexpr int KD = D / 16, ND = D / 8, NS = BN / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Qs = smem;
  uint16_t* dOs = Qs + BM * LD;
  uint16_t* Ks = dOs + BM * LD;
  uint16_t* Vs = Ks + BN * LD;

  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (H / KVH);
  const int q0 = qt * BM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int64_t q_stride = static_cast<int64_t>(H) * D;
  const int64_t kv_stride = static_cast<int64_t>(KVH) * D;
  const int64_t q_off = static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  const int64_t kv_off = static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int64_t stat_off = (static_cast<int64_t>(b) * H + h) * S;

  load_tile<D, LD>(Qs, q + q_off, q_stride, q0, BM, S, tid, kBwdThreads);
  load_tile<D, LD>(dOs, dout + q_off, q_stride, q0, BM, S, tid, kBwdThreads);

  const int wr = warp * 16;  // warp's first row inside the tile
  const int row[2] = {q0 + wr + g, q0 + wr + g + 8};
  float lse2[2], dlt[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lse2[i] = row[i] < S ? lse[stat_off + row[i]] * kLog2e : 0.f;
    dlt[i] = row[i] < S ? delta[stat_off + row[i]] : 0.f;
  }

  float acc[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const int n_end = min(S, q0 + BM);
  for (int n0 = 0; n0 < n_end; n0 += BN) {
    __syncthreads();  // previous K/V tile consumed (and, the first time, nothing pending)
    load_tile<D, LD>(Ks, k + kv_off, kv_stride, n0, BN, S, tid, kBwdThreads);
    load_tile<D, LD>(Vs, v + kv_off, kv_stride, n0, BN, S, tid, kBwdThreads);
    __syncthreads();

    // s = Q K^T, dp = dO V^T (16 rows x BN keys per warp).
    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qa[4], ga[4];
      load_a(qa, Qs, LD, wr, kk * 16, g, c);
      load_a(ga, dOs, LD, wr, kk * 16, g, c);
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        uint32_t b0, b1;
        load_b_t(b0, b1, Ks, LD, j * 8, kk * 16, g, c);
        mma16816(s[j], qa, b0, b1);
        load_b_t(b0, b1, Vs, LD, j * 8, kk * 16, g, c);
        mma16816(dp[j], ga, b0, b1);
      }
    }

    // P from lse, dS = P * (dP - delta) (kept in s).
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + 2 * c + (e & 1);
        const int i = e >> 1;
        const bool ok = key <= row[i] && row[i] < S;
        const float p = ok ? exp2f(s[j][e] * scale_log2 - lse2[i]) : 0.f;
        s[j][e] = p * (dp[j][e] - dlt[i]);
      }
    }

    // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t da[4];
      da[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      da[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      da[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      da[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        uint32_t b0, b1;
        load_b_n(b0, b1, Ks, LD, j * 8, kk * 16, g, c);
        mma16816(acc[j], da, b0, b1);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= S) continue;
    bf16* dst = dq + q_off + static_cast<int64_t>(row[i]) * q_stride;
#pragma unroll
    for (int j = 0; j < ND; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * c) =
          pack_bf16(acc[j][2 * i] * scale, acc[j][2 * i + 1] * scale);
  }
}

// grid (ceil(S/64), KVH, B).
template <int D>
__global__ void __launch_bounds__(kBwdThreads) attn_bwd_dkv_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    bf16* __restrict__ dk, bf16* __restrict__ dv, int S, int H, int KVH, float scale, float scale_log2) {
  constexpr int BN = kDkvBN, BM = kDkvBM, LD = D + 8;
  constexpr int KD = D / 16, ND = D / 8, NM = BM / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Ks = smem;
  uint16_t* Vs = Ks + BN * LD;
  uint16_t* Qs = Vs + BN * LD;
  uint16_t* dOs = Qs + BM * LD;
  float* lse_s = reinterpret_cast<float*>(dOs + BM * LD);  // lse of the tile's queries, log2 units
  float* dlt_s = lse_s + BM;

  const int kt = gridDim.x - 1 - blockIdx.x;  // early key tiles see the most queries: start them first
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int group = H / KVH;
  const int k0 = kt * BN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int64_t q_stride = static_cast<int64_t>(H) * D;
  const int64_t kv_stride = static_cast<int64_t>(KVH) * D;
  const int64_t kv_off = static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;

  load_tile<D, LD>(Ks, k + kv_off, kv_stride, k0, BN, S, tid, kBwdThreads);
  load_tile<D, LD>(Vs, v + kv_off, kv_stride, k0, BN, S, tid, kBwdThreads);

  const int wr = warp * 16;
  const int key[2] = {k0 + wr + g, k0 + wr + g + 8};  // this thread's two keys (C layout rows)

  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[j][e] = dva[j][e] = 0.f;

  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    const int64_t q_off = static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
    const int64_t stat_off = (static_cast<int64_t>(b) * H + h) * S;
    // Queries before k0 never see these keys (causal); k0 is a multiple of BM.
    for (int m0 = k0; m0 < S; m0 += BM) {
      __syncthreads();  // previous Q/dO tile consumed
      load_tile<D, LD>(Qs, q + q_off, q_stride, m0, BM, S, tid, kBwdThreads);
      load_tile<D, LD>(dOs, dout + q_off, q_stride, m0, BM, S, tid, kBwdThreads);
      for (int i = tid; i < BM; i += kBwdThreads) {
        const bool in = m0 + i < S;
        lse_s[i] = in ? lse[stat_off + m0 + i] * kLog2e : 0.f;
        dlt_s[i] = in ? delta[stat_off + m0 + i] : 0.f;
      }
      __syncthreads();

      // sT = K Q^T, dpT = V dO^T (16 keys x BM queries per warp).
      float st[NM][4], dpt[NM][4];
#pragma unroll
      for (int j = 0; j < NM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, Ks, LD, wr, kk * 16, g, c);
        load_a(va, Vs, LD, wr, kk * 16, g, c);
#pragma unroll
        for (int j = 0; j < NM; ++j) {
          uint32_t b0, b1;
          load_b_t(b0, b1, Qs, LD, j * 8, kk * 16, g, c);
          mma16816(st[j], ka, b0, b1);
          load_b_t(b0, b1, dOs, LD, j * 8, kk * 16, g, c);
          mma16816(dpt[j], va, b0, b1);
        }
      }

      // pT (kept in st) and dsT = pT * (dpT - delta) (kept in dpt).
#pragma unroll
      for (int j = 0; j < NM; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = j * 8 + 2 * c + (e & 1);  // query index inside the tile
          const int qry = m0 + qi;
          const bool ok = qry >= key[e >> 1] && qry < S;
          const float p = ok ? exp2f(st[j][e] * scale_log2 - lse_s[qi]) : 0.f;
          st[j][e] = p;
          dpt[j][e] = p * (dpt[j][e] - dlt_s[qi]);
        }
      }

      // dV += pT dO, dK += dsT Q.
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t pa[4], da[4];
        pa[0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
        pa[1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
        pa[2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
        pa[3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
        da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
        da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          uint32_t b0, b1;
          load_b_n(b0, b1, dOs, LD, j * 8, kk * 16, g, c);
          mma16816(dva[j], pa, b0, b1);
          load_b_n(b0, b1, Qs, LD, j * 8, kk * 16, g, c);
          mma16816(dka[j], da, b0, b1);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= S) continue;
    const int64_t off = kv_off + static_cast<int64_t>(key[i]) * kv_stride;
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      *reinterpret_cast<uint32_t*>(dk + off + j * 8 + 2 * c) =
          pack_bf16(dka[j][2 * i] * scale, dka[j][2 * i + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + j * 8 + 2 * c) = pack_bf16(dva[j][2 * i], dva[j][2 * i + 1]);
    }
  }
}

struct BwdArgs {
  const bf16 *q, *k, *v, *dout;
  const float *lse, *delta;
  bf16 *dq, *dk, *dv;
};

template <int D>
void launch_bwd(const Geom& G, const BwdArgs& a, cudaStream_t stream) {
  const char* op = "attention_backward";
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float scale_log2 = scale * kLog2e;

  const size_t smem_dq = dq_smem_bytes<D>();
  set_smem(attn_bwd_dq_kernel<D>, smem_dq, op);
  const dim3 grid_dq((G.S + kDqBM - 1) / kDqBM, G.H, G.B);
  attn_bwd_dq_kernel<D><<<grid_dq, kBwdThreads, smem_dq, stream>>>(a.q, a.k, a.v, a.dout, a.lse, a.delta, a.dq,
                                                                    G.S, G.H, G.KVH, scale, scale_log2);
  check_launch(op);

  const size_t smem_dkv = dkv_smem_bytes<D>();
  set_smem(attn_bwd_dkv_kernel<D>, smem_dkv, op);
  const dim3 grid_dkv((G.S + kDkvBN - 1) / kDkvBN, G.KVH, G.B);
  attn_bwd_dkv_kernel<D><<<grid_dkv, kBwdThreads, smem_dkv, stream>>>(
      a.q, a.k, a.v, a.dout, a.lse, a.delta, a.dk, a.dv, G.S, G.H, G.KVH, scale, scale_log2);
  check_launch(op);
}

}  // namespace cuda::attn

void CudaOps::attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv) {
  using namespace cuda::attn;
  const char* op = "attention_backward";
  const Geom G = check_geom(s, q, k, v, out, lse, op);
  cuda::expect_numel(dout, G.T * G.H * G.D, op, "dout");
  cuda::expect_numel(dq, G.T * G.H * G.D, op, "dq");
  cuda::expect_numel(dk, G.T * G.KVH * G.D, op, "dk");
  cuda::expect_numel(dv, G.T * G.KVH * G.D, op, "dv");
  BwdArgs a;
  a.dout = cuda::bf16p(dout, op, "dout");
  a.q = cuda::bf16p(q, op, "q");
  a.k = cuda::bf16p(k, op, "k");
  a.v = cuda::bf16p(v, op, "v");
  const cuda::bf16* outp = cuda::bf16p(out, op, "out");
  a.lse = cuda::f32(lse, op, "lse");
  a.dq = cuda::bf16p(dq, op, "dq");
  a.dk = cuda::bf16p(dk, op, "dk");
  a.dv = cuda::bf16p(dv, op, "dv");
  if (G.T == 0) return;
  expect_aligned16(a.dout, op, "dout");
  expect_aligned16(a.q, op, "q");
  expect_aligned16(a.k, op, "k");
  expect_aligned16(a.v, op, "v");
  expect_aligned16(outp, op, "out");
  expect_aligned16(a.dq, op, "dq");
  expect_aligned16(a.dk, op, "dk");
  expect_aligned16(a.dv, op, "dv");

  cudaStream_t st = ctx().stream;
  const int64_t rows = G.T * G.H;
  float* delta = static_cast<float*>(ctx().scratch("attn_bwd_delta", static_cast<size_t>(rows) * sizeof(float)));
  a.delta = delta;
  {
    constexpr int kThreads = 256;  // 8 rows per block
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    if (blocks > 0x7fffffffLL) cuda::fail(op, "too many rows for the delta kernel");
    attn_bwd_delta_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(a.dout, outp, delta, rows, G.S, G.H,
                                                                              G.D);
    cuda::check_launch(op);
  }
  switch (G.D) {
    case 16: launch_bwd<16>(G, a, st); break;
    case 32: launch_bwd<32>(G, a, st); break;
    case 64: launch_bwd<64>(G, a, st); break;
    case 128: launch_bwd<128>(G, a, st); break;
    default: cuda::fail(op, "unsupported head_dim " + std::to_string(G.D));
  }
}

}  // namespace mxt
