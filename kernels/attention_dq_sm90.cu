// Attention backward dQ on Hopper (sm_90a) with wgmma: the counterpart of attention_dkv_sm90.cu (same shapes and
// conditions, same tiles and descriptors) with the roles of queries and keys swapped. P is recomputed from the
// forward's lse, dS = P * (dP - delta), dQ = scale dS K, accumulated in registers over the key tiles.
//
// CTA: 2 warpgroups (256 threads), one per (128-query tile, batch, head), the last query tiles (most keys)
// first. Thread 0 loads the CTA's Q and dO tiles once and streams the K and V tiles of 64 keys through a
// 3-stage ring (refilled two steps ahead, as in the dK/dV kernel). Each warpgroup owns 64 queries; per key tile:
// S = Q K^T and dP = dO V^T (wgmma m64n64k16 from shared memory), the causal mask, P and dS in registers,
// then dQ += dS K (m64n128k16, dS as the register A operand, K read N-major). The row statistics (lse2, delta)
// of a thread's two rows stay in registers.
//
// Ping-pong variant (MXTRAIN_ATTENTION_DQ_SCHED=pingpong, the default since measured faster): a producer warpgroup streams K
// and V, and the two warpgroups take turns to issue their S and dP GEMMs (named barriers), so one's dS (an exp per
// score) runs while the other's GEMMs do. dQ += dS K stays in the step (holding dS over the next step's GEMMs, as
// the forward holds P, took more registers than the 168 a 384-thread CTA has). The same bits as the serial kernel.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "attention_sm90.hpp"
#include "attention_sm90_common.cuh"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

namespace mxt::cuda::attn {
namespace {

using sm90k::kBox;
using sm90k::kD;
using sm90k::TMaps;
constexpr int kBM = 128;                 // queries per CTA: 2 warpgroups x 64
constexpr int kBN = 64;                  // keys per step
constexpr int kStages = 3;
constexpr int kOffDO = 4 * kBox;         // Q: boxes [warpgroup][d chunk], then dO the same
constexpr int kOffStages = 8 * kBox;
constexpr int kStageK = 0, kStageV = 2 * kBox;  // as sm90k::load_kv_tile / produce_kv lay a stage out
static_assert(kStageK == 0 && kStageV == 2 * kBox, "the ring's stage layout is sm90k::produce_kv's");
constexpr int kStageBytes = 4 * kBox;
constexpr int kOffBar = kOffStages + kStages * kStageBytes;
constexpr int kSmem = kOffBar + (2 * kStages + 1) * 8 + 1024;  // + slack for 1024-byte alignment
constexpr int kThreads = 256;
constexpr int kPpThreads = 384;  // ping-pong: two consumer warpgroups and a producer warpgroup
// Registers, moved from the producer warpgroup to the consumers (128 x 56 + 256 x 224 = 168 x 384): 9 or more
// warps at 168 each left the dQ consumers spilling.
constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;
constexpr uint32_t kTurnBar = 1;  // named barriers kTurnBar + w: "warpgroup w may issue"

// One thread: the CTA's Q and dO tiles (two 64-row boxes each per warpgroup).
__device__ __forceinline__ void load_q_do(const TMaps& maps, uint32_t smem, uint64_t* q_full,
                                          const sm90k::QueryTile& t, int S) {
  sm90::mbar_arrive_expect_tx(q_full, 8 * kBox);
  const uint32_t qb = sm90::smem_u32(q_full);
  for (int w = 0; w < 2; ++w)
    for (int c = 0; c < 2; ++c) {
      sm90::tma_load_2d(smem + (2 * w + c) * kBox, &maps.q, qb, t.h * kD + 64 * c, t.b * S + t.q0 + 64 * w);
      sm90::tma_load_2d(smem + kOffDO + (2 * w + c) * kBox, &maps.dout, qb, t.h * kD + 64 * c,
                        t.b * S + t.q0 + 64 * w);
    }
}

// dS = P (dP - delta) into pa from the scores sa and dP pa of one key tile; keys after the query are masked (a
// select, no branch).
__device__ __forceinline__ void ds_tile(const float (&sa)[32], float (&pa)[32], float scale_log2, float lse_a,
                                        float lse_b, float dl_a, float dl_b, int row0, int n0, int c4) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hi = e >> 1;
      const int q = row0 + 8 * hi, key = n0 + 8 * j + 2 * c4 + (e & 1);
      float pr = fast_exp2(fmaf(sa[4 * j + e], scale_log2, -(hi ? lse_b : lse_a)));
      pr = key <= q ? pr : 0.f;
      pa[4 * j + e] = pr * (pa[4 * j + e] - (hi ? dl_b : dl_a));
    }
}

__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_dq_sm90_kernel(const __grid_constant__ TMaps maps, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring ring = sm90k::ring_smem(smem_raw, kOffBar, kStages);
  const uint32_t smem = ring.base;
  uint64_t *full = ring.full, *empty = ring.empty, *q_full = ring.once;

  const int S = p.S;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int b = t.b, h = t.h, q0 = t.q0, n_steps = t.n_steps;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(full, empty, kStages, q_full);
  __syncthreads();

  auto issue = [&](int step, int st_i) {
    sm90k::load_kv_tile(maps, &full[st_i], smem + kOffStages + st_i * kStageBytes + kStageK, kStageV - kStageK, t, S,
                        step * kBN);
  };
  if (tid == 0) {
    load_q_do(maps, smem, q_full, t, S);
    for (int i = 0; i < kStages && i < n_steps; ++i) issue(i, i);
  }

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int row0 = q0 + 64 * w + 16 * warp + g;  // this thread's queries: row0 and row0 + 8
  const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * S + row0;
  const float lse_a = p.lse2[stat], lse_b = p.lse2[stat + 8];
  const float dl_a = p.delta[stat], dl_b = p.delta[stat + 8];
  float dq[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
  const uint32_t qa = smem + (2 * w) * kBox, da = smem + kOffDO + (2 * w) * kBox;
  mbar_wait(q_full, 0);

  int s = 0;
  uint32_t phase = 0;
  for (int step = 0; step < n_steps; ++step) {
    const int n0 = step * kBN;
    if (tid == 0 && step >= 1 && step - 1 + kStages < n_steps) {
      const int rs = (step - 1) % kStages;  // released by both warpgroups at the end of step - 1
      mbar_wait(&empty[rs], static_cast<uint32_t>((step - 1) / kStages) & 1u);
      issue(step - 1 + kStages, rs);
    }
    __syncwarp();
    mbar_wait(&full[s], phase);
    const uint32_t st = smem + kOffStages + s * kStageBytes;

    // S = Q K^T, dP = dO V^T: 64 queries x 64 keys each, contracted over d in two 64-wide boxes.
    float sa[32], pa[32];
    wgmma_fence();
    sm90k::mma_rows_d(sa, qa, st + kStageK);
    sm90k::mma_rows_d(pa, da, st + kStageV);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      fence_operand(sa[i]);
      fence_operand(pa[i]);
    }

    ds_tile(sa, pa, p.scale_log2, lse_a, lse_b, dl_a, dl_b, row0, n0, c4);
    uint32_t fd[4][4];
    sm90k::pack_a_frags(pa, fd);
    wgmma_fence();
    sm90k::mma_regs_k64(dq, fd, st + kStageK);
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
  for (int i = 0; i < 64; ++i) fence_operand(dq[i]);

  sm90k::store_dq(p, b, h, row0, dq, c4);  // dQ = scale * dq: bf16 pairs straight from the accumulators
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

// The ping-pong schedule (see the top of the file).
__global__ void __launch_bounds__(kPpThreads, 1)
    attn_bwd_dq_sm90_pp_kernel(const __grid_constant__ TMaps maps, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring ring = sm90k::ring_smem(smem_raw, kOffBar, kStages);
  const uint32_t smem = ring.base;
  uint64_t *full = ring.full, *empty = ring.empty, *q_full = ring.once;
  const int S = p.S;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int n_steps = t.n_steps;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(full, empty, kStages, q_full);
  __syncthreads();
  if (tid >= 256) {  // the producer warpgroup (one thread works); no block-wide barrier follows
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 256) {
      load_q_do(maps, smem, q_full, t, S);
      sm90k::produce_kv(maps, ring, kStages, kOffStages, kStageBytes, t, S);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int row0 = t.q0 + 64 * w + 16 * warp + g;  // this thread's queries: row0 and row0 + 8
  const int64_t stat = (static_cast<int64_t>(t.b) * p.H + t.h) * S + row0;
  const float lse_a = p.lse2[stat], lse_b = p.lse2[stat + 8];
  const float dl_a = p.delta[stat], dl_b = p.delta[stat + 8];
  float dq[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
  const uint32_t qa = smem + (2 * w) * kBox, da = smem + kOffDO + (2 * w) * kBox;
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[stage]);
  };
  mbar_wait(q_full, 0);

  // Turns as in the forward: warpgroup 1 arrives once up front and skips its last arrival.
  if (w == 1) named_barrier_arrive(kTurnBar, 256);
  int s = 0;
  uint32_t phase = 0;
  for (int step = 0; step < n_steps; ++step) {
    mbar_wait(&full[s], phase);
    const uint32_t st = smem + kOffStages + s * kStageBytes;
    float sa[32], pa[32];
    named_barrier_sync(kTurnBar + w, 256);
    wgmma_fence();
    sm90k::mma_rows_d(sa, qa, st + kStageK);
    sm90k::mma_rows_d(pa, da, st + kStageV);
    wgmma_commit();
    if (w == 0 || step + 1 < n_steps) named_barrier_arrive(kTurnBar + 1 - w, 256);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      fence_operand(sa[i]);
      fence_operand(pa[i]);
    }
    ds_tile(sa, pa, p.scale_log2, lse_a, lse_b, dl_a, dl_b, row0, step * kBN, c4);
    uint32_t fd[4][4];
    sm90k::pack_a_frags(pa, fd);
    wgmma_fence();
    sm90k::mma_regs_k64(dq, fd, st + kStageK);
    wgmma_commit();
    wgmma_wait<0>();
    release(s);
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(dq[i]);
  sm90k::store_dq(p, t.b, t.h, row0, dq, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

}  // namespace

bool try_dq_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream) {
  static std::atomic<int> cache[64];
  static std::atomic<bool> smem_set{false}, pp_smem_set{false};
  const int64_t blocks = static_cast<int64_t>(G.S / kBM) * G.B * G.H;
  if (sm90k::env_schedule("MXTRAIN_ATTENTION_DQ_SCHED", "attention_backward"))
    return sm90k::try_launch(attn_bwd_dq_sm90_pp_kernel, "MXTRAIN_ATTENTION_DQ", "dQ", G, p, device, stream, cache,
                             pp_smem_set, blocks, kPpThreads, kSmem);
  return sm90k::try_launch(attn_bwd_dq_sm90_kernel, "MXTRAIN_ATTENTION_DQ", "dQ", G, p, device, stream, cache,
                           smem_set, blocks, kThreads, kSmem);
}

}  // namespace mxt::cuda::attn
