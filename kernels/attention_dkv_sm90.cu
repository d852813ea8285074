// Attention backward dK / dV on Hopper (sm_90a) with wgmma, for head_dim 64 and 128, causal, GQA, no document
// mask, S a multiple of 128 (the training shapes); everything else keeps the mma.sync kernel (attention_flash_bwd.cuh),
// whose recipe this follows: P recomputed from the forward's lse, dS = P * (dP - delta), dV = P^T dO,
// dK = scale dS^T Q, the GQA sum over the query heads of a KV head accumulated in registers (no atomics).
//
// CTA: 2 warpgroups (256 threads, up to 255 registers each: at head_dim 128 the 192 fp32 accumulators of a step stay in
// registers and ptxas keeps the wgmmas asynchronous; a third, producer warp would not fit the register file of
// an SM sub-partition at that count), one CTA per (128-key tile, batch, KV head), the first key tiles (most
// queries) first.
//   Thread 0 also issues the TMA loads: the CTA's K and V tiles once, then for every (query head, 64-query tile)
//     step the Q and dO tiles plus the step's 64 lse2 / delta values into a 3-stage ring (full / empty
//     mbarriers); a stage is refilled at the start of the step after the one that used it, once both
//     warpgroups have released it, so loads run two steps ahead.
//   Each warpgroup owns 64 keys. Per step: S^T = K Q^T and dP^T = V dO^T (wgmma m64n64k16, both operands in
//     shared memory), the causal mask and P^T, dS^T in registers, then dV += P^T dO and dK += dS^T Q (wgmma
//     m64n128k16 with P^T / dS^T as the register A operand: an accumulator's n8 blocks are already the A
//     fragment layout, packed to bf16 as the mma.sync kernel does; Q and dO read N-major).
//   With p.ds set, each step's bf16 dS^T (the dK product's operand) is also stored as a [64 keys][64 queries]
//     tile (mxtrain/attention_ds.hpp), so that dQ needs no second pass over the scores (attention_dq_ds_sm90.cu).
// Shared tiles are [64 rows][64 bf16] boxes with 128-byte swizzle (TMA), read through the same descriptors as
// the grouped GEMM: K-major for the first two products, N-major (LBO = one box) for the last two.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "attention_sm90.hpp"
#include "attention_sm90_common.cuh"
#include "mxtrain/attention_ds.hpp"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

namespace mxt::cuda::attn {
namespace {

using sm90k::kBox;
using sm90k::kD;
constexpr int kBN = 128;                 // keys per CTA: 2 consumer warpgroups x 64
constexpr int kBM = 64;                  // queries per step
constexpr int kStages = 3;
constexpr int kThreads = 256;

// Shared memory for head_dim kDim (kC = kDim / 64 boxes per row tile): K boxes [warpgroup][d chunk], then V the
// same, then the ring's stages (Q, dO, lse2[64] and delta[64]).
template <int kDim>
struct Layout {
  static constexpr int kC = kDim / 64;
  static constexpr int kOffV = 2 * kC * kBox;
  static constexpr int kOffStages = 4 * kC * kBox;
  static constexpr int kStageQ = 0, kStageDO = kC * kBox, kStageStat = 2 * kC * kBox;
  static constexpr int kStageBytes = 2 * kC * kBox + 1024;  // stats padded so every stage stays 1024-byte aligned
  static constexpr int kStageTx = 2 * kC * kBox + 2 * kBM * 4;
  static constexpr int kOffBar = kOffStages + kStages * kStageBytes;
  static constexpr int kSmem = kOffBar + (2 * kStages + 1) * 8 + 1024;  // + slack for 1024-byte alignment
};

using sm90k::TMaps;

template <int kDim>
__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_dkv_sm90_kernel(const __grid_constant__ TMaps maps, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  using L = Layout<kDim>;
  constexpr int kC = L::kC, kOffV = L::kOffV, kOffStages = L::kOffStages, kStageQ = L::kStageQ;
  constexpr int kStageDO = L::kStageDO, kStageStat = L::kStageStat, kStageBytes = L::kStageBytes;
  constexpr int kOffBar = L::kOffBar;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* smem_ptr = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t smem = smem_u32(smem_ptr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_ptr + kOffBar);
  uint64_t* empty = full + kStages;
  uint64_t* kv_full = empty + kStages;

  const int S = p.S, group = p.H / p.KVH;
  const int n_bk = p.B * p.KVH;
  const int kt = static_cast<int>(blockIdx.x) / n_bk, bk = static_cast<int>(blockIdx.x) % n_bk;
  const int b = bk / p.KVH, kvh = bk % p.KVH;
  const int k0 = kt * kBN;
  const int m_first = k0 / kBM;
  const int n_qt = S / kBM - m_first;
  const int n_steps = group * n_qt;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(full, empty, kStages, kv_full);
  __syncthreads();

  // Thread 0's loads: K and V once; the Q / dO / statistics of `step` into stage `st_i`.
  auto issue = [&](int step, int st_i) {
    const int h = kvh * group + step / n_qt;
    const int m0 = (m_first + step % n_qt) * kBM;
    mbar_arrive_expect_tx(&full[st_i], L::kStageTx);
    const uint32_t st = smem + kOffStages + st_i * kStageBytes, bar = smem_u32(&full[st_i]);
    for (int c = 0; c < kC; ++c) {
      tma_load_2d(st + kStageQ + c * kBox, &maps.q, bar, h * kDim + 64 * c, b * S + m0);
      tma_load_2d(st + kStageDO + c * kBox, &maps.dout, bar, h * kDim + 64 * c, b * S + m0);
    }
    const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * S + m0;
    bulk_load(st + kStageStat, p.lse2 + stat, kBM * 4, bar);
    bulk_load(st + kStageStat + kBM * 4, p.delta + stat, kBM * 4, bar);
  };
  if (tid == 0) {
    const int32_t row_k = b * S + k0;
    mbar_arrive_expect_tx(kv_full, 4 * kC * kBox);
    const uint32_t kvb = smem_u32(kv_full);
    for (int w = 0; w < 2; ++w)
      for (int c = 0; c < kC; ++c) {
        tma_load_2d(smem + (kC * w + c) * kBox, &maps.k, kvb, kvh * kDim + 64 * c, row_k + 64 * w);
        tma_load_2d(smem + kOffV + (kC * w + c) * kBox, &maps.v, kvb, kvh * kDim + 64 * c, row_k + 64 * w);
      }
    for (int i = 0; i < kStages && i < n_steps; ++i) issue(i, i);
  }

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int key0 = k0 + 64 * w + 16 * warp + g;  // this thread's keys: key0 and key0 + 8
  // dS tiles: this warpgroup's key block, the thread's first key within it.
  uint16_t* const ds_base = p.ds;
  const int nb = S / 64, key_blk = k0 / 64 + w, key_l = 16 * warp + g;
  const int64_t ds_tiles = attention_ds_tiles_per_head(nb);
  constexpr int kAcc = kDim / 2;  // fp32 accumulators per thread of an m64nkDim product
  float dk[kAcc], dv[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.f;
  const uint32_t kb = smem + (kC * w) * kBox, vb = smem + kOffV + (kC * w) * kBox;
  mbar_wait(kv_full, 0);

  int s = 0;
  uint32_t phase = 0;
  for (int step = 0; step < n_steps; ++step) {
    const int m0 = (m_first + step % n_qt) * kBM;
    if (tid == 0 && step >= 1 && step - 1 + kStages < n_steps) {
      const int rs = (step - 1) % kStages;  // released by both warpgroups at the end of step - 1
      mbar_wait(&empty[rs], static_cast<uint32_t>((step - 1) / kStages) & 1u);
      issue(step - 1 + kStages, rs);
    }
    __syncwarp();
    mbar_wait(&full[s], phase);
    const uint32_t st = smem + kOffStages + s * kStageBytes;
    const float* stat = reinterpret_cast<const float*>(smem_ptr + kOffStages + s * kStageBytes + kStageStat);

    // S^T = K Q^T, dP^T = V dO^T: 64 keys x 64 queries each, contracted over d in two 64-wide boxes.
    float sa[32], pa[32];
    wgmma_fence();
    sm90k::mma_rows_d<kDim>(sa, kb, st + kStageQ);
    sm90k::mma_rows_d<kDim>(pa, vb, st + kStageDO);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      fence_operand(sa[i]);
      fence_operand(pa[i]);
    }

    // P^T (in sa) and dS^T = P^T (dP^T - delta) (in pa); keys after the query are masked (a select, no branch).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int qc = 8 * j + 2 * c4;
      const float2 l2 = *reinterpret_cast<const float2*>(stat + qc);
      const float2 dl = *reinterpret_cast<const float2*>(stat + kBM + qc);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = m0 + qc + (e & 1), key = key0 + 8 * (e >> 1);
        float pr = fast_exp2(fmaf(sa[4 * j + e], p.scale_log2, -((e & 1) ? l2.y : l2.x)));
        pr = q >= key ? pr : 0.f;
        sa[4 * j + e] = pr;
        pa[4 * j + e] = pr * (pa[4 * j + e] - ((e & 1) ? dl.y : dl.x));
      }
    }

    // dV += P^T dO, dK += dS^T Q: k = 16 queries per wgmma.
    uint32_t fp[4][4], fd[4][4];
    sm90k::pack_a_frags(sa, fp);
    sm90k::pack_a_frags(pa, fd);
    if (ds_base != nullptr) {  // the bf16 dS^T the dK product uses, for the dQ kernel (attention_dq_ds_sm90.cu)
      const int h = kvh * group + step / n_qt;
      const int64_t t = static_cast<int64_t>(b * p.H + h) * ds_tiles + attention_ds_tile(nb, key_blk, m0 / kBM);
      uint16_t* tile = ds_base + t * (64 * 64) + key_l * 64 + 2 * c4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r)  // fd[kk][r]: keys + 8 (r & 1), queries 8 (2 kk + r / 2) + 2 c4 and + 1
          *reinterpret_cast<uint32_t*>(tile + (r & 1) * 8 * 64 + 8 * (2 * kk + r / 2)) = fd[kk][r];
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t d_do = smem_desc(st + kStageDO + kk * 2048, kBox, 1024);
      const uint64_t d_q = smem_desc(st + kStageQ + kk * 2048, kBox, 1024);
      if constexpr (kDim == 128) {
        wgmma_m64n128k16_rs<1>(dv, fp[kk], d_do, 1u);
        wgmma_m64n128k16_rs<1>(dk, fd[kk], d_q, 1u);
      } else {
        wgmma_m64n64k16_rs<1>(dv, fp[kk], d_do, 1u);
        wgmma_m64n64k16_rs<1>(dk, fd[kk], d_q, 1u);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    fence_operand(dk[i]);
    fence_operand(dv[i]);
  }

  // dK = scale * dk, dV = dv: bf16 pairs straight from the accumulators.
  const int64_t kv_stride = static_cast<int64_t>(p.KVH) * kDim;
  const int64_t r0 = (static_cast<int64_t>(b) * S + key0) * kv_stride + static_cast<int64_t>(kvh) * kDim;
  sm90k::store_acc_bf16(p.dk, r0, r0 + 8 * kv_stride, dk, p.scale, c4);
  sm90k::store_acc_bf16(p.dv, r0, r0 + 8 * kv_stride, dv, 1.f, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

}  // namespace

bool try_dkv_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream) {
  static std::atomic<int> cache[64];
  static std::atomic<bool> smem_set{false}, smem_set64{false};
  const int64_t blocks = static_cast<int64_t>(G.S / kBN) * G.B * G.KVH;
  if (G.D == 64)
    return sm90k::try_launch(attn_bwd_dkv_sm90_kernel<64>, "MXTRAIN_ATTENTION_DKV", "dK/dV", G, p, device, stream,
                             cache, smem_set64, blocks, kThreads, Layout<64>::kSmem, true);
  return sm90k::try_launch(attn_bwd_dkv_sm90_kernel<kD>, "MXTRAIN_ATTENTION_DKV", "dK/dV", G, p, device, stream,
                           cache, smem_set, blocks, kThreads, Layout<kD>::kSmem, true);
}

}  // namespace mxt::cuda::attn
