#pragma once
// Flash-attention forward for causal GQA on sm_80+ tensor cores (FlashAttention-2 scheme): a block owns BM = 128
// query rows of one (batch, head); each warp owns 16 * MT of them. K/V tiles of BN keys stream through a
// two-stage cp.async ring (the next tile loads while this one is computed), fragments come from swizzled
// shared memory through ldmatrix, the online softmax stays in registers (exp2 of log2e-prescaled scores) and
// P feeds P V straight from the accumulators. Only tiles on the diagonal or at a document edge pay for the
// element mask; tiles wholly above the diagonal or before the document start of the block's rows are skipped.
#include "attention_device.cuh"

namespace mxt::cuda::attn {

struct FwdParams {
  const uint16_t* q;    // [B*S, H, D] bf16 bits
  const uint16_t* k;    // [B*S, KVH, D]
  const uint16_t* v;    // [B*S, KVH, D]
  uint16_t* out;        // [B*S, H, D]
  float* lse;           // [B, H, S], natural log
  const int32_t* doc;   // [B*S] document ids, or null (plain causal)
  int B, S, H, KVH;
  float scale_log2;     // log2(e) / sqrt(D)
};

template <int D_, int MT_, int BN_>
struct FwdCfg {
  static constexpr int D = D_, MT = MT_, BN = BN_;
  static constexpr int BM = 128;
  static constexpr int NW = BM / (16 * MT);  // warps
  static constexpr int NT = NW * 32;         // threads
  static constexpr int MIN_BLOCKS = NT <= 128 ? 2 : 1;
  // Q tile, two K and two V stages, two stages of key document ids, reduction scratch.
  static constexpr size_t smem_bytes =
      static_cast<size_t>(BM + 4 * BN) * D * 2 + 2 * BN * sizeof(int32_t) + NW * sizeof(int32_t);
  __host__ __device__ static int64_t n_qtiles(int S) { return (S + BM - 1) / BM; }
  static int64_t grid(int B, int H, int S) { return n_qtiles(S) * B * H; }
  static_assert(BN % 16 == 0 && D % 64 == 0, "tile shape");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::NT, Cfg::MIN_BLOCKS) attn_fwd_flash_kernel(const FwdParams p) {
  constexpr int D = Cfg::D, MT = Cfg::MT, BN = Cfg::BN, BM = Cfg::BM, NT = Cfg::NT;
  constexpr int KD = D / 16;   // k-steps of Q K^T over head_dim
  constexpr int ND = D / 8;    // n8 tiles of O over head_dim
  constexpr int NS = BN / 8;   // n8 tiles of S over the keys of a tile
  constexpr int WR = 16 * MT;  // rows per warp
  MXT_ATTN_DYN_SMEM(smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [BM][D]; at the end, the output staging tile
  uint16_t* Ks = Qs + BM * D;                           // [2][BN][D]
  uint16_t* Vs = Ks + 2 * BN * D;                       // [2][BN][D]
  int32_t* kdoc_s = reinterpret_cast<int32_t*>(Vs + 2 * BN * D);  // [2][BN]
  int* red = kdoc_s + 2 * BN;                                     // [NW]

  // Block -> (query tile, batch, head): the longest (last) query tiles first; the heads of one query tile
  // are adjacent, so the heads sharing a K/V head read it while it is in L2.
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
  const uint16_t* qb = p.q + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  const uint16_t* kb = p.k + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const uint16_t* vb = p.v + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const int32_t* docb = p.doc ? p.doc + static_cast<int64_t>(b) * S : nullptr;

  // Keys this block needs: [kv_lo, q_last]. With documents, rows see nothing before their document start;
  // keys before rs_last (the start of the last row's document) need the element mask.
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
    load_tile_async<D, BN, NT>(Ks + stage * BN * D, kb, kv_stride, n0, S, tid);
    load_tile_async<D, BN, NT>(Vs + stage * BN * D, vb, kv_stride, n0, S, tid);
    if (docb)
      for (int i = tid; i < BN; i += NT) cp_async4(kdoc_s + stage * BN + i, docb + min(n0 + i, S - 1), n0 + i < S);
  };
  load_tile_async<D, BM, NT>(Qs, qb, q_stride, q0, S, tid);
  load_kv(0, 0);
  cp_async_commit();

  // This thread's rows: warp * WR + mt * 16 + g + 8 * half (C-fragment rows), and their documents.
  const int wrow = warp * WR;  // first row of the warp inside the tile
  int32_t rdoc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = q0 + wrow + mt * 16 + g + 8 * hf;
      rdoc[mt][hf] = docb && r < S ? ldg(docb + r) : 0;
    }

  float o[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < ND; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
  float m[MT][2], l[MT][2];  // running max (scaled, log2 units) and this thread's partial row sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < n_tiles) {
      load_kv(t + 1, stage ^ 1);  // its stage was released by the barrier that ended tile t - 1
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int n0 = (t_first + t) * BN;
    const uint16_t* Kt = Ks + stage * BN * D;
    const uint16_t* Vt = Vs + stage * BN * D;
    // Element mask where some key may lie past a row (diagonal, also past S) or before its document.
    const bool need_mask = n0 + BN - 1 > q0 || (docb && n0 < rs_last);
    if (n0 <= q0 + wrow + WR - 1) {  // else every key of the tile is after this warp's rows
      float s[MT][NS][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NS; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
      // S = Q K^T
#pragma unroll 1  // four k-steps unrolled at a time: bounds how far ptxas hoists fragment loads (spills)
      for (int k4 = 0; k4 < KD; k4 += 4)
#pragma unroll
      for (int kk = k4; kk < k4 + 4; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(qa[mt], Qs + la(wrow + mt * 16, kk * 16));
#pragma unroll
        for (int jp = 0; jp < NS / 2; ++jp) {
          uint32_t kf[4];
          ldsm_x4(kf, Kt + la(jp * 16, kk * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(s[mt][2 * jp], qa[mt], kf[0], kf[2]);
            mma16816(s[mt][2 * jp + 1], qa[mt], kf[1], kf[3]);
          }
        }
      }
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int kc = j * 8 + 2 * c + (e & 1);  // key inside the tile
              const int row = q0 + wrow + mt * 16 + g + 8 * (e >> 1);
              bool ok = n0 + kc <= row;
              if (docb) ok = ok && lds(kdoc_s + stage * BN + kc) == rdoc[mt][e >> 1];
              if (!ok) s[mt][j][e] = -INFINITY;
            }
      }
      // Online softmax (log2 units). A row's reference maximum m only moves when the new maximum exceeds it
      // by more than 8: P <= 2^8 is harmless in bf16 and fp32, and the final 1/l is exact for any m. So after
      // the first tiles O is rarely rescaled, and the rescale is skipped when no row of the warp needs it.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float mx = -INFINITY;
#pragma unroll
          for (int j = 0; j < NS; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][hf], mx * p.scale_log2);
          const bool move = m_new > m[mt][hf] + 8.f;  // also the first unmasked score of the row (m = -inf)
          if (__any_sync(0xffffffffu, move)) {
            const float alpha = move ? fast_exp2(m[mt][hf] - m_new) : 1.f;  // 2^-inf = 0 the first time
            if (move) m[mt][hf] = m_new;
            l[mt][hf] *= alpha;
#pragma unroll
            for (int j = 0; j < ND; ++j) o[mt][j][2 * hf] *= alpha, o[mt][j][2 * hf + 1] *= alpha;
          }
          const float base = m[mt][hf] == -INFINITY ? 0.f : m[mt][hf];  // nothing unmasked yet: weights stay 0
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < NS; ++j) {
            s[mt][j][2 * hf] = fast_exp2(fmaf(s[mt][j][2 * hf], p.scale_log2, -base));
            s[mt][j][2 * hf + 1] = fast_exp2(fmaf(s[mt][j][2 * hf + 1], p.scale_log2, -base));
            sum += s[mt][j][2 * hf] + s[mt][j][2 * hf + 1];
          }
          l[mt][hf] += sum;
        }
      }
      // O += P V, P rounded to bf16 straight from the accumulators (packed first: half the registers).
      uint32_t pa[MT][BN / 16][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          pa[mt][kk][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][kk][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][kk][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][kk][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vf[4];
          ldsm_x4_t(vf, Vt + la(kk * 16, dp * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(o[mt][2 * dp], pa[mt][kk], vf[0], vf[1]);
            mma16816(o[mt][2 * dp + 1], pa[mt][kk], vf[2], vf[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is consumed: the next iteration's prefetch may overwrite it
  }

  // Finish: full row sums, normalise, stage O in the Q tile (each warp its own rows, which only it read),
  // then 16-byte coalesced stores; lse in natural log.
  float* lb = p.lse + (static_cast<int64_t>(b) * p.H + h) * S;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int rl = wrow + mt * 16 + g + 8 * hf;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;  // sum >= 1 for every real row (its own key)
#pragma unroll
      for (int j = 0; j < ND; ++j)
        sts(reinterpret_cast<uint32_t*>(Qs + swz<D>(rl, j * 8 + 2 * c)),
            pack_bf16(o[mt][j][2 * hf] * inv, o[mt][j][2 * hf + 1] * inv));
      if (c == 0 && q0 + rl < S) stg(lb + q0 + rl, (m[mt][hf] + log2f(sum)) * kLn2);
    }
  __syncthreads();
  store_tile<D, BM, NT>(p.out + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D, q_stride, Qs,
                        q0, S, tid);
}

}  // namespace mxt::cuda::attn
