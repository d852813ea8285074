#pragma once
// Flash-attention backward for causal GQA (FlashAttention-2 recipe, deterministic: no atomics). P is
// recomputed from the forward's lse; with delta = rowsum(dO * O): dS = P * (dO V^T - delta),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
//   attn_bwd_prep_kernel:     delta and lse * log2(e) per (batch, head, query), fp32 scratch.
//   attn_bwd_dq_flash_kernel: a block owns 128 query rows of one (batch, head) and streams K/V tiles
//                             (two cp.async stages): S and dP recomputed, dQ accumulated in registers.
//   attn_bwd_dkv_flash_kernel: a block owns BN keys of one (batch, kv head) and streams the Q/dO tiles of
//                             every query head sharing it (two stages): dK and dV accumulated in registers,
//                             so the GQA sum over heads needs no atomics either.
// Both recompute Q K^T and dO V^T (7 tile products instead of FA2's 5 with atomic dQ): the price of
// determinism without a dQ reduction buffer.
#include "attention_device.cuh"

namespace mxt::cuda::attn {

struct BwdParams {
  const uint16_t* q;     // [B*S, H, D]
  const uint16_t* k;     // [B*S, KVH, D]
  const uint16_t* v;     // [B*S, KVH, D]
  const uint16_t* dout;  // [B*S, H, D]
  const uint16_t* out;   // [B*S, H, D]
  const float* lse;      // [B, H, S] natural log
  float* lse2;           // [B, H, S] scratch: lse * log2(e)
  float* delta;          // [B, H, S] scratch: rowsum(dO * O)
  uint16_t* dq;          // [B*S, H, D]
  uint16_t* dk;          // [B*S, KVH, D]
  uint16_t* dv;          // [B*S, KVH, D]
  const int32_t* doc;    // [B*S] or null
  uint16_t* ds;          // null, or the Hopper dK/dV kernel stores its dS^T tiles here (mxtrain/attention_ds.hpp)
  int B, S, H, KVH;
  float scale, scale_log2;
};

// ---- prep: delta and lse2 ---------------------------------------------------------------------------------
template <int D>
struct PrepCfg {
  static constexpr int NT = 256;
  static constexpr int TPR = D / 8;  // threads per (token, head) row, 16 bytes each
  static constexpr int RPB = NT / TPR;
  static int64_t grid(int64_t rows) { return (rows + RPB - 1) / RPB; }
};

template <int D>
__global__ void __launch_bounds__(PrepCfg<D>::NT) attn_bwd_prep_kernel(const BwdParams p) {
  using Cfg = PrepCfg<D>;
  const int64_t rows = static_cast<int64_t>(p.B) * p.S * p.H;
  const int64_t ri = static_cast<int64_t>(blockIdx.x) * Cfg::RPB + threadIdx.x / Cfg::TPR;
  const int part = threadIdx.x % Cfg::TPR;
  float acc = 0.f;
  if (ri < rows) {
    const uint4 a = ldg(reinterpret_cast<const uint4*>(p.dout + ri * D + part * 8));
    const uint4 o = ldg(reinterpret_cast<const uint4*>(p.out + ri * D + part * 8));
    acc = bf16_lo(a.x) * bf16_lo(o.x) + bf16_hi(a.x) * bf16_hi(o.x) + bf16_lo(a.y) * bf16_lo(o.y) +
          bf16_hi(a.y) * bf16_hi(o.y) + bf16_lo(a.z) * bf16_lo(o.z) + bf16_hi(a.z) * bf16_hi(o.z) +
          bf16_lo(a.w) * bf16_lo(o.w) + bf16_hi(a.w) * bf16_hi(o.w);
  }
#pragma unroll
  for (int off = Cfg::TPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (ri < rows && part == 0) {
    const int64_t t = ri / p.H;
    const int h = static_cast<int>(ri % p.H);
    const int64_t b = t / p.S, s = t % p.S;
    const int64_t at = (b * p.H + h) * p.S + s;
    stg(p.delta + at, acc);
    stg(p.lse2 + at, ldg(p.lse + at) * kLog2e);
  }
}

// ---- dQ ---------------------------------------------------------------------------------------------------
template <int D_, int MT_, int BN_>
struct DqCfg {
  static constexpr int D = D_, MT = MT_, BN = BN_;
  static constexpr int BM = 128;
  static constexpr int NW = BM / (16 * MT);
  static constexpr int NT = NW * 32;
  static constexpr int MIN_BLOCKS = NT <= 128 ? 2 : 1;
  // Q and dO tiles, two K and two V stages, two stages of key documents, reduction scratch.
  static constexpr size_t smem_bytes =
      static_cast<size_t>(2 * BM + 4 * BN) * D * 2 + 2 * BN * sizeof(int32_t) + NW * sizeof(int32_t);
  __host__ __device__ static int64_t n_qtiles(int S) { return (S + BM - 1) / BM; }
  static int64_t grid(int B, int H, int S) { return n_qtiles(S) * B * H; }
  static_assert(BN % 16 == 0 && D % 64 == 0, "tile shape");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::NT, Cfg::MIN_BLOCKS) attn_bwd_dq_flash_kernel(const BwdParams p) {
  constexpr int D = Cfg::D, MT = Cfg::MT, BN = Cfg::BN, BM = Cfg::BM, NT = Cfg::NT;
  constexpr int KD = D / 16, ND = D / 8, NS = BN / 8, WR = 16 * MT;
  MXT_ATTN_DYN_SMEM(smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [BM][D]; at the end, the dQ staging tile
  uint16_t* dOs = Qs + BM * D;                          // [BM][D]
  uint16_t* Ks = dOs + BM * D;                          // [2][BN][D]
  uint16_t* Vs = Ks + 2 * BN * D;                       // [2][BN][D]
  int32_t* kdoc_s = reinterpret_cast<int32_t*>(Vs + 2 * BN * D);  // [2][BN]
  int* red = kdoc_s + 2 * BN;                                     // [NW]

  const int S = p.S;
  const int n_bh = p.B * p.H;
  const int qt = static_cast<int>(Cfg::n_qtiles(S)) - 1 - static_cast<int>(blockIdx.x) / n_bh;
  const int bh = static_cast<int>(blockIdx.x) % n_bh;
  const int b = bh / p.H, h = bh % p.H;
  const int kvh = h / (p.H / p.KVH);
  const int q0 = qt * BM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const LdsmOff<D> la(lane);
  const int64_t q_stride = static_cast<int64_t>(p.H) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.KVH) * D;
  const int64_t q_off = static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  const int64_t kv_off = static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int64_t stat_off = (static_cast<int64_t>(b) * p.H + h) * S;
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  const int q_last = min(q0 + BM, S) - 1;
  int kv_lo = 0, rs_last = 0;
  if (docb) {
    rs_last = block_run_start<NT>(docb, q_last, red);
    kv_lo = rs_last <= q0 ? rs_last : block_run_start<NT>(docb, q0, red);
  }
  const int t_first = kv_lo / BN;
  const int n_tiles = q_last / BN - t_first + 1;

  auto load_kv = [&](int t, int stage) {
    const int n0 = (t_first + t) * BN;
    load_tile_async<D, BN, NT>(Ks + stage * BN * D, p.k + kv_off, kv_stride, n0, S, tid);
    load_tile_async<D, BN, NT>(Vs + stage * BN * D, p.v + kv_off, kv_stride, n0, S, tid);
    if (docb)
      for (int i = tid; i < BN; i += NT) cp_async4(kdoc_s + stage * BN + i, docb + min(n0 + i, S - 1), n0 + i < S);
  };
  load_tile_async<D, BM, NT>(Qs, p.q + q_off, q_stride, q0, S, tid);
  load_tile_async<D, BM, NT>(dOs, p.dout + q_off, q_stride, q0, S, tid);
  load_kv(0, 0);
  cp_async_commit();

  const int wrow = warp * WR;
  float lse2[MT][2], dlt[MT][2];
  int32_t rdoc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = q0 + wrow + mt * 16 + g + 8 * hf;
      const bool in = r < S;
      lse2[mt][hf] = in ? ldg(p.lse2 + stat_off + r) : 0.f;
      dlt[mt][hf] = in ? ldg(p.delta + stat_off + r) : 0.f;
      rdoc[mt][hf] = docb && in ? ldg(docb + r) : 0;
    }

  float acc[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < ND; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < n_tiles) {
      load_kv(t + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int n0 = (t_first + t) * BN;
    const uint16_t* Kt = Ks + stage * BN * D;
    const uint16_t* Vt = Vs + stage * BN * D;
    const bool need_mask = n0 + BN - 1 > q0 || (docb && n0 < rs_last);
    if (n0 <= q0 + wrow + WR - 1) {
      // S = Q K^T and dP = dO V^T.
      float s[MT][NS][4], dp[MT][NS][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = dp[mt][j][e] = 0.f;
#pragma unroll 1  // four k-steps unrolled at a time: bounds how far ptxas hoists fragment loads (spills)
      for (int k4 = 0; k4 < KD; k4 += 4)
#pragma unroll
      for (int kk = k4; kk < k4 + 4; ++kk) {
        uint32_t qa[MT][4], ga[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4(qa[mt], Qs + la(wrow + mt * 16, kk * 16));
          ldsm_x4(ga[mt], dOs + la(wrow + mt * 16, kk * 16));
        }
#pragma unroll
        for (int jp = 0; jp < NS / 2; ++jp) {
          uint32_t kf[4], vf[4];
          ldsm_x4(kf, Kt + la(jp * 16, kk * 16));
          ldsm_x4(vf, Vt + la(jp * 16, kk * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(s[mt][2 * jp], qa[mt], kf[0], kf[2]);
            mma16816(s[mt][2 * jp + 1], qa[mt], kf[1], kf[3]);
            mma16816(dp[mt][2 * jp], ga[mt], vf[0], vf[2]);
            mma16816(dp[mt][2 * jp + 1], ga[mt], vf[1], vf[3]);
          }
        }
      }
      // dS = P * (dP - delta), kept in s.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int hf = e >> 1;
            float pr = fast_exp2(fmaf(s[mt][j][e], p.scale_log2, -lse2[mt][hf]));
            if (need_mask) {
              const int kc = j * 8 + 2 * c + (e & 1);
              const int row = q0 + wrow + mt * 16 + g + 8 * hf;
              bool ok = n0 + kc <= row && row < S;
              if (docb) ok = ok && lds(kdoc_s + stage * BN + kc) == rdoc[mt][hf];
              if (!ok) pr = 0.f;
            }
            s[mt][j][e] = pr * (dp[mt][j][e] - dlt[mt][hf]);
          }
      // dQ += dS K (K read transposed: B[k = key][n = d]).
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t da[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          da[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          da[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          da[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          da[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          uint32_t kf[4];
          ldsm_x4_t(kf, Kt + la(kk * 16, dp2 * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(acc[mt][2 * dp2], da[mt], kf[0], kf[1]);
            mma16816(acc[mt][2 * dp2 + 1], da[mt], kf[2], kf[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  // dQ = scale * acc, staged in the Q tile, 16-byte stores.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int rl = wrow + mt * 16 + g + 8 * hf;
#pragma unroll
      for (int j = 0; j < ND; ++j)
        sts(reinterpret_cast<uint32_t*>(Qs + swz<D>(rl, j * 8 + 2 * c)),
            pack_bf16(acc[mt][j][2 * hf] * p.scale, acc[mt][j][2 * hf + 1] * p.scale));
    }
  __syncthreads();
  store_tile<D, BM, NT>(p.dq + q_off, q_stride, Qs, q0, S, tid);
}

// ---- dK, dV -----------------------------------------------------------------------------------------------
template <int D_, int MT_, int NW_, int BM_>
struct DkvCfg {
  static constexpr int D = D_, MT = MT_, NW = NW_, BM = BM_;
  static constexpr int BN = NW * 16 * MT;  // keys per block
  static constexpr int NT = NW * 32;
  static constexpr int MIN_BLOCKS = NT <= 128 ? 2 : 1;
  // K and V tiles, two Q and two dO stages, two stages of per-query lse2 / delta / document, scratch.
  static constexpr size_t smem_bytes = static_cast<size_t>(2 * BN + 4 * BM) * D * 2 + 2 * 3 * BM * 4 + NW * 4;
  __host__ __device__ static int64_t n_ktiles(int S) { return (S + BN - 1) / BN; }
  static int64_t grid(int B, int KVH, int S) { return n_ktiles(S) * B * KVH; }
  static_assert(BM % 16 == 0 && D % 64 == 0, "tile shape");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::NT, Cfg::MIN_BLOCKS) attn_bwd_dkv_flash_kernel(const BwdParams p) {
  constexpr int D = Cfg::D, MT = Cfg::MT, BN = Cfg::BN, BM = Cfg::BM, NT = Cfg::NT;
  constexpr int KD = D / 16, ND = D / 8, NQ = BM / 8, WK = 16 * MT;
  MXT_ATTN_DYN_SMEM(smem);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);  // [BN][D]; at the end, the dK staging tile
  uint16_t* Vs = Ks + BN * D;                           // [BN][D]; at the end, the dV staging tile
  uint16_t* Qs = Vs + BN * D;                           // [2][BM][D]
  uint16_t* dOs = Qs + 2 * BM * D;                      // [2][BM][D]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * BM * D);  // [2][BM] lse2 of the tile's queries
  float* dlt_s = lse_s + 2 * BM;                               // [2][BM]
  int32_t* qdoc_s = reinterpret_cast<int32_t*>(dlt_s + 2 * BM);  // [2][BM]
  int* red = qdoc_s + 2 * BM;                                    // [NW]

  // Block -> (key tile, batch, kv head): the first key tiles (which see the most queries) first.
  const int S = p.S;
  const int n_bk = p.B * p.KVH;
  const int kt = static_cast<int>(blockIdx.x) / n_bk;
  const int bk = static_cast<int>(blockIdx.x) % n_bk;
  const int b = bk / p.KVH, kvh = bk % p.KVH;
  const int group = p.H / p.KVH;
  const int k0 = kt * BN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const LdsmOff<D> la(lane);
  const int64_t q_stride = static_cast<int64_t>(p.H) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.KVH) * D;
  const int64_t kv_off = static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  // Queries that may see these keys: [k0, q_end). With documents, none past the last key's document.
  const int k_last = min(k0 + BN, S) - 1;
  const int q_end = docb ? block_run_end<NT>(docb, k_last, S, red) + 1 : S;
  const int m_first = k0 / BM;                 // first query tile
  const int n_qt = (q_end - 1) / BM - m_first + 1;  // query tiles per head
  const int n_steps = group * n_qt;
  const int32_t kdoc0 = docb ? ldg(docb + k0) : 0;

  auto load_q = [&](int step, int stage) {
    const int hh = step / n_qt;
    const int m0 = (m_first + step % n_qt) * BM;
    const int h = kvh * group + hh;
    const int64_t q_off = static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
    const int64_t stat_off = (static_cast<int64_t>(b) * p.H + h) * S;
    load_tile_async<D, BM, NT>(Qs + stage * BM * D, p.q + q_off, q_stride, m0, S, tid);
    load_tile_async<D, BM, NT>(dOs + stage * BM * D, p.dout + q_off, q_stride, m0, S, tid);
    for (int i = tid; i < 3 * BM; i += NT) {
      const int which = i / BM, r = i % BM;
      const bool in = m0 + r < S;
      const int rr = in ? m0 + r : 0;
      if (which == 0) cp_async4(lse_s + stage * BM + r, p.lse2 + stat_off + rr, in);
      else if (which == 1) cp_async4(dlt_s + stage * BM + r, p.delta + stat_off + rr, in);
      else if (docb) cp_async4(qdoc_s + stage * BM + r, docb + rr, in);
    }
  };
  load_tile_async<D, BN, NT>(Ks, p.k + kv_off, kv_stride, k0, S, tid);
  load_tile_async<D, BN, NT>(Vs, p.v + kv_off, kv_stride, k0, S, tid);
  load_q(0, 0);
  cp_async_commit();

  // This thread's keys (C-fragment rows) and their documents.
  const int wkey = warp * WK;  // first key of the warp inside the tile
  int32_t kdoc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = k0 + wkey + mt * 16 + g + 8 * hf;
      kdoc[mt][hf] = docb && key < S ? ldg(docb + key) : 0;
    }

  float dka[MT][ND][4], dva[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < ND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dka[mt][j][e] = dva[mt][j][e] = 0.f;

  for (int step = 0; step < n_steps; ++step) {
    const int stage = step & 1;
    if (step + 1 < n_steps) {
      load_q(step + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int m0 = (m_first + step % n_qt) * BM;
    const uint16_t* Qt = Qs + stage * BM * D;
    const uint16_t* dOt = dOs + stage * BM * D;
    const float* lse_t = lse_s + stage * BM;
    const float* dlt_t = dlt_s + stage * BM;
    const int32_t* qdoc_t = qdoc_s + stage * BM;
    // No mask needed when every query of the tile is at or after every key, inside S, in the keys' document.
    const bool need_mask =
        !(m0 >= k0 + BN - 1 && m0 + BM <= S && (!docb || lds(qdoc_t + BM - 1) == kdoc0));
    if (m0 + BM - 1 >= k0 + wkey) {  // else every query of the tile is before this warp's keys
      // S^T = K Q^T and dP^T = V dO^T (rows: this warp's keys; columns: the tile's queries).
      float st[MT][NQ][4], dpt[MT][NQ][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NQ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[mt][j][e] = dpt[mt][j][e] = 0.f;
#pragma unroll 1  // four k-steps unrolled at a time: bounds how far ptxas hoists fragment loads (spills)
      for (int k4 = 0; k4 < KD; k4 += 4)
#pragma unroll
      for (int kk = k4; kk < k4 + 4; ++kk) {
        uint32_t ka[MT][4], va[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4(ka[mt], Ks + la(wkey + mt * 16, kk * 16));
          ldsm_x4(va[mt], Vs + la(wkey + mt * 16, kk * 16));
        }
#pragma unroll
        for (int jp = 0; jp < NQ / 2; ++jp) {
          uint32_t qf[4], gf[4];
          ldsm_x4(qf, Qt + la(jp * 16, kk * 16));
          ldsm_x4(gf, dOt + la(jp * 16, kk * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(st[mt][2 * jp], ka[mt], qf[0], qf[2]);
            mma16816(st[mt][2 * jp + 1], ka[mt], qf[1], qf[3]);
            mma16816(dpt[mt][2 * jp], va[mt], gf[0], gf[2]);
            mma16816(dpt[mt][2 * jp + 1], va[mt], gf[1], gf[3]);
          }
        }
      }
      // P^T (kept in st) and dS^T = P^T * (dP^T - delta) (kept in dpt).
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        const int qc = j * 8 + 2 * c;  // this thread's two query columns: qc, qc + 1
        const float2 l2 = lds(reinterpret_cast<const float2*>(lse_t + qc));
        const float2 dl = lds(reinterpret_cast<const float2*>(dlt_t + qc));
        int32_t qd0 = 0, qd1 = 0;
        if (need_mask && docb) qd0 = lds(qdoc_t + qc), qd1 = lds(qdoc_t + qc + 1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int hf = e >> 1, odd = e & 1;
            float pr = fast_exp2(fmaf(st[mt][j][e], p.scale_log2, -(odd ? l2.y : l2.x)));
            if (need_mask) {
              const int q = m0 + qc + odd;
              const int key = k0 + wkey + mt * 16 + g + 8 * hf;
              bool ok = q >= key && q < S;
              if (docb) ok = ok && (odd ? qd1 : qd0) == kdoc[mt][hf];
              if (!ok) pr = 0.f;
            }
            st[mt][j][e] = pr;
            dpt[mt][j][e] = pr * (dpt[mt][j][e] - (odd ? dl.y : dl.x));
          }
      }
      // dV += P^T dO, dK += dS^T Q (dO and Q read transposed: B[k = query][n = d]).
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t pa[MT][4], da[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = pack_bf16(st[mt][2 * kk][0], st[mt][2 * kk][1]);
          pa[mt][1] = pack_bf16(st[mt][2 * kk][2], st[mt][2 * kk][3]);
          pa[mt][2] = pack_bf16(st[mt][2 * kk + 1][0], st[mt][2 * kk + 1][1]);
          pa[mt][3] = pack_bf16(st[mt][2 * kk + 1][2], st[mt][2 * kk + 1][3]);
          da[mt][0] = pack_bf16(dpt[mt][2 * kk][0], dpt[mt][2 * kk][1]);
          da[mt][1] = pack_bf16(dpt[mt][2 * kk][2], dpt[mt][2 * kk][3]);
          da[mt][2] = pack_bf16(dpt[mt][2 * kk + 1][0], dpt[mt][2 * kk + 1][1]);
          da[mt][3] = pack_bf16(dpt[mt][2 * kk + 1][2], dpt[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          uint32_t gf[4], qf[4];
          ldsm_x4_t(gf, dOt + la(kk * 16, dp2 * 16));
          ldsm_x4_t(qf, Qt + la(kk * 16, dp2 * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(dva[mt][2 * dp2], pa[mt], gf[0], gf[1]);
            mma16816(dva[mt][2 * dp2 + 1], pa[mt], gf[2], gf[3]);
            mma16816(dka[mt][2 * dp2], da[mt], qf[0], qf[1]);
            mma16816(dka[mt][2 * dp2 + 1], da[mt], qf[2], qf[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  // dK = scale * dka, dV = dva: staged in the K / V tiles (no longer read), 16-byte stores.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int rl = wkey + mt * 16 + g + 8 * hf;
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        sts(reinterpret_cast<uint32_t*>(Ks + swz<D>(rl, j * 8 + 2 * c)),
            pack_bf16(dka[mt][j][2 * hf] * p.scale, dka[mt][j][2 * hf + 1] * p.scale));
        sts(reinterpret_cast<uint32_t*>(Vs + swz<D>(rl, j * 8 + 2 * c)),
            pack_bf16(dva[mt][j][2 * hf], dva[mt][j][2 * hf + 1]));
      }
    }
  __syncthreads();
  store_tile<D, BN, NT>(p.dk + kv_off, kv_stride, Ks, k0, S, tid);
  store_tile<D, BN, NT>(p.dv + kv_off, kv_stride, Vs, k0, S, tid);
}

}  // namespace mxt::cuda::attn
