#pragma once
// The first, simple attention kernels (mma.sync with plain 32-bit shared-memory fragment loads, no
// pipelining), kept as the reference path: MXTRAIN_ATTENTION=reference selects them, and they serve head
// dims 16 and 32, which the flash kernels do not. Document masks are applied element by element (no tile
// skipping). Forward: a block owns 64 query rows of one (batch, head) and streams 64-key K/V tiles.
// Backward: delta kernel (shared with the flash path), a dQ kernel per 64-row Q tile (32-key K/V tiles) and
// a dK/dV kernel per 64-key tile looping over the query heads of its kv head (32-row Q tiles); no atomics.
#include "attention_device.cuh"

namespace mxt::cuda::attn::ref {

constexpr int kFwdBM = 64, kFwdBN = 64, kFwdThreads = 128;
constexpr int kBwdThreads = 128;  // 4 warps, each owning 16 rows (queries for dQ, keys for dK/dV)
constexpr int kDqBM = 64, kDqBN = 32;
constexpr int kDkvBN = 64, kDkvBM = 32;

template <int D>
constexpr size_t fwd_smem_bytes() {  // K tile + V tile
  return static_cast<size_t>(2 * kFwdBN * (D + 8)) * sizeof(uint16_t);
}
template <int D>
constexpr size_t dq_smem_bytes() {  // Q, dO tiles [64][LD]; K, V tiles [32][LD]
  return static_cast<size_t>((2 * kDqBM + 2 * kDqBN) * (D + 8)) * sizeof(uint16_t);
}
template <int D>
constexpr size_t dkv_smem_bytes() {  // K, V tiles [64][LD]; Q, dO tiles [32][LD]; lse, delta [32] fp32
  return static_cast<size_t>((2 * kDkvBN + 2 * kDkvBM) * (D + 8)) * sizeof(uint16_t) + 2 * kDkvBM * sizeof(float);
}

// Two raw bf16 (as 16-bit values) -> one register.
__device__ __forceinline__ uint32_t pack_raw(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of rows [r0, r0+16), columns [k0, k0+16) of a row-major smem tile with leading dimension ld.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* X, int ld, int r0, int k0, int g, int c) {
  a[0] = lds32(X + (r0 + g) * ld + k0 + 2 * c);
  a[1] = lds32(X + (r0 + g + 8) * ld + k0 + 2 * c);
  a[2] = lds32(X + (r0 + g) * ld + k0 + 8 + 2 * c);
  a[3] = lds32(X + (r0 + g + 8) * ld + k0 + 8 + 2 * c);
}
// B fragment (k [k0,k0+16), n [n0,n0+8)) with B[k][n] = Y[n][k], Y a row-major smem tile (e.g. B = K^T).
__device__ __forceinline__ void load_b_t(uint32_t& b0, uint32_t& b1, const uint16_t* Y, int ld, int n0, int k0,
                                         int g, int c) {
  b0 = lds32(Y + (n0 + g) * ld + k0 + 2 * c);
  b1 = lds32(Y + (n0 + g) * ld + k0 + 8 + 2 * c);
}
// B fragment with B[k][n] = Y[k][n], Y a row-major smem tile (e.g. B = V).
__device__ __forceinline__ void load_b_n(uint32_t& b0, uint32_t& b1, const uint16_t* Y, int ld, int n0, int k0,
                                         int g, int c) {
  const uint16_t* p = Y + (k0 + 2 * c) * ld + n0 + g;
  b0 = pack_raw(p[0], p[ld]);
  b1 = pack_raw(p[8 * ld], p[9 * ld]);
}

// Copies `rows` rows of D bf16 (global row r at src + r * stride elements, for r0 + r < S) into a smem tile
// with leading dimension LD; rows at or past S are zero-filled. All nthreads threads of the block take part.
template <int D, int LD>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t stride, int r0, int rows,
                                          int S, int tid, int nthreads) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = tid; i < rows * kChunks; i += nthreads) {
    const int r = i / kChunks, ch = i % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < S) val = ldg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r0 + r) * stride + ch * 8));
    *reinterpret_cast<uint4*>(dst + r * LD + ch * 8) = val;
  }
}

struct Params {
  const uint16_t *q, *k, *v, *dout;
  uint16_t* out;
  float* lse;
  const float *lse_in, *delta;  // backward: the forward's lse (natural log) and rowsum(dO * O)
  uint16_t *dq, *dk, *dv;
  const int32_t* doc;  // [B*S] or null
  int S, H, KVH;
  float scale, scale_log2;
};

// grid (ceil(S/64), H, B). Query row r of head h in batch b: q[((b*S + r) * H + h) * D + d].
template <int D>
__global__ void __launch_bounds__(kFwdThreads, 1) attn_fwd_ref_kernel(const Params p) {
  constexpr int BM = kFwdBM, BN = kFwdBN, LD = D + 8;
  constexpr int KD = D / 16, ND = D / 8, NS = BN / 8;
  MXT_ATTN_DYN_SMEM(smem_raw);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* Vs = Ks + BN * LD;
  const int S = p.S, H = p.H, KVH = p.KVH;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest (last) query tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (H / KVH);
  const int q0 = qt * BM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(H) * D;
  const int64_t kv_stride = static_cast<int64_t>(KVH) * D;
  const uint16_t* qb = p.q + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  const uint16_t* kb = p.k + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const uint16_t* vb = p.v + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int32_t rdoc[2] = {docb && row[0] < S ? ldg(docb + row[0]) : 0, docb && row[1] < S ? ldg(docb + row[1]) : 0};

  // Q fragments straight from global (zero past S), kept in registers for the whole key loop.
  uint32_t qa[KD][4];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row[i & 1];
      const int col = kk * 16 + (i >> 1) * 8 + 2 * c;
      qa[kk][i] = r < S ? ldg(reinterpret_cast<const uint32_t*>(qb + static_cast<int64_t>(r) * q_stride + col)) : 0u;
    }
  }

  float o[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the scaled scores, log2 units
  float l[2] = {0.f, 0.f};              // this thread's partial row sums

  const int n_end = min(S, q0 + BM);  // causal: keys past the tile's last query are never needed
  for (int n0 = 0; n0 < n_end; n0 += BN) {
    __syncthreads();  // previous tile fully consumed
    load_tile<D, LD>(Ks, kb, kv_stride, n0, BN, S, tid, kFwdThreads);
    load_tile<D, LD>(Vs, vb, kv_stride, n0, BN, S, tid, kFwdThreads);
    __syncthreads();

    float s[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        uint32_t b0, b1;
        load_b_t(b0, b1, Ks, LD, j * 8, kk * 16, g, c);
        mma16816(s[j], qa[kk], b0, b1);
      }
    }

    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + 2 * c + (e & 1);
        const int r = row[e >> 1];
        bool ok = key <= r && key < S;
        if (docb && ok) ok = ldg(docb + key) == rdoc[e >> 1];
        const float val = ok ? s[j][e] * p.scale_log2 : -INFINITY;
        s[j][e] = val;
        mx[e >> 1] = fmaxf(mx[e >> 1], val);
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      base[i] = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = exp2f(m[i] - base[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = exp2f(s[j][e] - base[e >> 1]);
        s[j][e] = pr;
        l[e >> 1] += pr;
      }
    }
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        uint32_t b0, b1;
        load_b_n(b0, b1, Vs, LD, j * 8, kk * 16, g, c);
        mma16816(o[j], pa, b0, b1);
      }
    }
  }

  uint16_t* ob = p.out + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  float* lb = p.lse + (static_cast<int64_t>(b) * H + h) * S;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int r = row[i];
    if (r < S) {
      const float inv = 1.f / l[i];  // l >= 1: the row maximum contributes exp2(0)
      uint16_t* orow = ob + static_cast<int64_t>(r) * q_stride;
#pragma unroll
      for (int j = 0; j < ND; ++j)
        stg(reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * c), pack_bf16(o[j][2 * i] * inv, o[j][2 * i + 1] * inv));
      if (c == 0) stg(lb + r, (m[i] + log2f(l[i])) * kLn2);
    }
  }
}

// grid (ceil(S/64), H, B).
template <int D>
__global__ void __launch_bounds__(kBwdThreads) attn_bwd_dq_ref_kernel(const Params p) {
  constexpr int BM = kDqBM, BN = kDqBN, LD = D + 8;
  constexpr int KD = D / 16, ND = D / 8, NS = BN / 8;
  MXT_ATTN_DYN_SMEM(smem_raw);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* dOs = Qs + BM * LD;
  uint16_t* Ks = dOs + BM * LD;
  uint16_t* Vs = Ks + BN * LD;
  const int S = p.S, H = p.H, KVH = p.KVH;

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
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  load_tile<D, LD>(Qs, p.q + q_off, q_stride, q0, BM, S, tid, kBwdThreads);
  load_tile<D, LD>(dOs, p.dout + q_off, q_stride, q0, BM, S, tid, kBwdThreads);

  const int wr = warp * 16;
  const int row[2] = {q0 + wr + g, q0 + wr + g + 8};
  float lse2[2], dlt[2];
  int32_t rdoc[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lse2[i] = row[i] < S ? ldg(p.lse_in + stat_off + row[i]) * kLog2e : 0.f;
    dlt[i] = row[i] < S ? ldg(p.delta + stat_off + row[i]) : 0.f;
    rdoc[i] = docb && row[i] < S ? ldg(docb + row[i]) : 0;
  }

  float acc[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const int n_end = min(S, q0 + BM);
  for (int n0 = 0; n0 < n_end; n0 += BN) {
    __syncthreads();
    load_tile<D, LD>(Ks, p.k + kv_off, kv_stride, n0, BN, S, tid, kBwdThreads);
    load_tile<D, LD>(Vs, p.v + kv_off, kv_stride, n0, BN, S, tid, kBwdThreads);
    __syncthreads();

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

#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + 2 * c + (e & 1);
        const int i = e >> 1;
        bool ok = key <= row[i] && row[i] < S;
        if (docb && ok) ok = ldg(docb + key) == rdoc[i];
        const float pr = ok ? exp2f(s[j][e] * p.scale_log2 - lse2[i]) : 0.f;
        s[j][e] = pr * (dp[j][e] - dlt[i]);
      }
    }

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
    uint16_t* dst = p.dq + q_off + static_cast<int64_t>(row[i]) * q_stride;
#pragma unroll
    for (int j = 0; j < ND; ++j)
      stg(reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * c), pack_bf16(acc[j][2 * i] * p.scale, acc[j][2 * i + 1] * p.scale));
  }
}

// grid (ceil(S/64), KVH, B).
template <int D>
__global__ void __launch_bounds__(kBwdThreads) attn_bwd_dkv_ref_kernel(const Params p) {
  constexpr int BN = kDkvBN, BM = kDkvBM, LD = D + 8;
  constexpr int KD = D / 16, ND = D / 8, NM = BM / 8;
  MXT_ATTN_DYN_SMEM(smem_raw);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* Vs = Ks + BN * LD;
  uint16_t* Qs = Vs + BN * LD;
  uint16_t* dOs = Qs + BM * LD;
  float* lse_s = reinterpret_cast<float*>(dOs + BM * LD);  // lse of the tile's queries, log2 units
  float* dlt_s = lse_s + BM;
  const int S = p.S, H = p.H, KVH = p.KVH;

  const int kt = gridDim.x - 1 - blockIdx.x;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int group = H / KVH;
  const int k0 = kt * BN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int64_t q_stride = static_cast<int64_t>(H) * D;
  const int64_t kv_stride = static_cast<int64_t>(KVH) * D;
  const int64_t kv_off = static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  load_tile<D, LD>(Ks, p.k + kv_off, kv_stride, k0, BN, S, tid, kBwdThreads);
  load_tile<D, LD>(Vs, p.v + kv_off, kv_stride, k0, BN, S, tid, kBwdThreads);

  const int wr = warp * 16;
  const int key[2] = {k0 + wr + g, k0 + wr + g + 8};
  const int32_t kdoc[2] = {docb && key[0] < S ? ldg(docb + key[0]) : 0, docb && key[1] < S ? ldg(docb + key[1]) : 0};

  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[j][e] = dva[j][e] = 0.f;

  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    const int64_t q_off = static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
    const int64_t stat_off = (static_cast<int64_t>(b) * H + h) * S;
    for (int m0 = k0; m0 < S; m0 += BM) {  // queries before k0 never see these keys
      __syncthreads();
      load_tile<D, LD>(Qs, p.q + q_off, q_stride, m0, BM, S, tid, kBwdThreads);
      load_tile<D, LD>(dOs, p.dout + q_off, q_stride, m0, BM, S, tid, kBwdThreads);
      for (int i = tid; i < BM; i += kBwdThreads) {
        const bool in = m0 + i < S;
        lse_s[i] = in ? ldg(p.lse_in + stat_off + m0 + i) * kLog2e : 0.f;
        dlt_s[i] = in ? ldg(p.delta + stat_off + m0 + i) : 0.f;
      }
      __syncthreads();

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

#pragma unroll
      for (int j = 0; j < NM; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = j * 8 + 2 * c + (e & 1);
          const int qry = m0 + qi;
          bool ok = qry >= key[e >> 1] && qry < S;
          if (docb && ok) ok = ldg(docb + qry) == kdoc[e >> 1];
          const float pr = ok ? exp2f(st[j][e] * p.scale_log2 - lse_s[qi]) : 0.f;
          st[j][e] = pr;
          dpt[j][e] = pr * (dpt[j][e] - dlt_s[qi]);
        }
      }

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
      stg(reinterpret_cast<uint32_t*>(p.dk + off + j * 8 + 2 * c),
          pack_bf16(dka[j][2 * i] * p.scale, dka[j][2 * i + 1] * p.scale));
      stg(reinterpret_cast<uint32_t*>(p.dv + off + j * 8 + 2 * c), pack_bf16(dva[j][2 * i], dva[j][2 * i + 1]));
    }
  }
}

}  // namespace mxt::cuda::attn::ref
