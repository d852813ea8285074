// Attention forward on Hopper (sm_90a) with wgmma, for the shapes the wgmma backward kernels take (head_dim 128,
// no document mask, seq a multiple of 128): the mma.sync flash forward reaches about 275 TFLOP/s here, wgmma
// with its operands in shared memory goes past that.
//
// CTA: 2 warpgroups (256 threads), one per (128-query tile, batch, head), the last query tiles (most keys)
// first. Thread 0 loads the CTA's Q tile once and streams the K and V tiles of 64 keys through a ring of
// kStages stages (refilled as in the backward kernels). Each warpgroup owns 64 queries; per key tile:
// S = Q K^T (wgmma m64n64k16 from shared memory), the causal mask on the diagonal tile, the online softmax in
// registers (exp2 of log2e-prescaled scores; a row's maximum is shared by the 4 threads holding it), then
// O += P V (m64n128k16, P as the register A operand, V read N-major). A warpgroup skips the key tiles past its
// last query but still releases them. The two warpgroups are not synchronised with each other, so one's
// softmax runs while the other's GEMMs use the tensor cores.
//
// Ping-pong variant (MXTRAIN_ATTENTION_FWD_SCHED=pingpong, the default since measured faster): a producer
// warpgroup of its own streams K and V, and each warpgroup issues step j's S = Q K^T together with step j-1's
// O += P V, then runs step j's softmax; the two warpgroups take turns to issue (named barriers), so one's softmax
// lines up with the other's GEMMs instead of both warpgroups contending for the tensor cores and then both for the
// exp unit. The arithmetic and its order are the same as the serial kernel's: the same bits. Its 128-key form
// (the default, attn_fwd_sm90_pp128_kernel below) halves the steps and so the per-step barriers and rescales.
#include <cuda.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention_flash_fwd.cuh"
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
constexpr int kStages = 4;
constexpr int kOffStages = 4 * kBox;     // Q: boxes [warpgroup][d chunk]
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
constexpr uint32_t kTurnBar = 1;  // ping-pong: named barriers kTurnBar + w, "warpgroup w may issue"
constexpr float kLn2 = 0.693147180559945309f;

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One key tile's online softmax for this thread's two query rows (row0, row0 + 8): raw scores sa -> unnormalised
// probabilities in place (log2 units; keys after the query masked on the diagonal tile), the running maxima m and
// partial row sums l updated, and o rescaled to the new maxima.
// kN: the scores' accumulators per thread, 32 for 64 keys, 64 for 128.
template <int kN>
__device__ __forceinline__ void softmax_tile(float (&sa)[kN], float (&o)[64], float& m_a, float& m_b, float& l_a,
                                             float& l_b, float scale_log2, bool diag, int row0, int n0, int c4) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int j = 0; j < kN / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hi = e >> 1;
      const int q = row0 + 8 * hi, key = n0 + 8 * j + 2 * c4 + (e & 1);
      float x = sa[4 * j + e] * scale_log2;
      if (diag) x = key <= q ? x : -INFINITY;
      sa[4 * j + e] = x;
      if (hi) mx_b = fmaxf(mx_b, x);
      else mx_a = fmaxf(mx_a, x);
    }
  // Every row sees key 0 on the first step, so the running maximum is finite from then on.
  const float mn_a = fmaxf(m_a, quad_max(mx_a)), mn_b = fmaxf(m_b, quad_max(mx_b));
  const float corr_a = fast_exp2(m_a - mn_a), corr_b = fast_exp2(m_b - mn_b);
  m_a = mn_a;
  m_b = mn_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int j = 0; j < kN / 4; ++j) {
    sa[4 * j] = fast_exp2(sa[4 * j] - mn_a);
    sa[4 * j + 1] = fast_exp2(sa[4 * j + 1] - mn_a);
    sa[4 * j + 2] = fast_exp2(sa[4 * j + 2] - mn_b);
    sa[4 * j + 3] = fast_exp2(sa[4 * j + 3] - mn_b);
    sum_a += sa[4 * j] + sa[4 * j + 1];
    sum_b += sa[4 * j + 2] + sa[4 * j + 3];
  }
  l_a = l_a * corr_a + sum_a;
  l_b = l_b * corr_b + sum_b;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[4 * j] *= corr_a;
    o[4 * j + 1] *= corr_a;
    o[4 * j + 2] *= corr_b;
    o[4 * j + 3] *= corr_b;
  }
}

// O = o / l as bf16 pairs straight from the accumulators; lse in natural log.
__device__ __forceinline__ void store_out(const float (&o)[64], float l_a, float l_b, float m_a, float m_b,
                                          const FwdParams& p, int b, int h, int row0, int c4) {
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  const int64_t q_stride = static_cast<int64_t>(p.H) * kD;
  const int64_t r0 = (static_cast<int64_t>(b) * p.S + row0) * q_stride + static_cast<int64_t>(h) * kD;
  const int64_t r1 = r0 + 8 * q_stride;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * c4;
    *reinterpret_cast<uint32_t*>(p.out + r0 + col) = pack_bf16(o[4 * j] * inv_a, o[4 * j + 1] * inv_a);
    *reinterpret_cast<uint32_t*>(p.out + r1 + col) = pack_bf16(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
  }
  if (c4 == 0) {
    const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * p.S + row0;
    p.lse[stat] = (m_a + log2f(l_a)) * kLn2;
    p.lse[stat + 8] = (m_b + log2f(l_b)) * kLn2;
  }
}

// One thread: the CTA's 128 queries (two 64-row boxes per warpgroup) and the K / V tile of `step` into stage st_i.
__device__ __forceinline__ void load_q(const TMaps& maps, const sm90k::Ring& m, const sm90k::QueryTile& t, int S) {
  sm90::mbar_arrive_expect_tx(m.once, 4 * kBox);
  const uint32_t qb = sm90::smem_u32(m.once);
  for (int w = 0; w < 2; ++w)
    for (int c = 0; c < 2; ++c)
      sm90::tma_load_2d(m.base + (2 * w + c) * kBox, &maps.q, qb, t.h * kD + 64 * c, t.b * S + t.q0 + 64 * w);
}
__device__ __forceinline__ void load_kv(const TMaps& maps, const sm90k::Ring& m, const sm90k::QueryTile& t, int S,
                                        int step, int st_i) {
  sm90k::load_kv_tile(maps, &m.full[st_i], m.base + kOffStages + st_i * kStageBytes + kStageK, kStageV - kStageK, t,
                      S, step * kBN);
}

__global__ void __launch_bounds__(kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ TMaps maps, const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring m = sm90k::ring_smem(smem_raw, kOffBar, kStages);
  const uint32_t smem = m.base;
  uint64_t* full = m.full;
  uint64_t* empty = m.empty;

  const int S = p.S;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int b = t.b, h = t.h, q0 = t.q0, n_steps = t.n_steps;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(full, empty, kStages, m.once);
  __syncthreads();

  auto issue = [&](int step, int st_i) { load_kv(maps, m, t, S, step, st_i); };
  if (tid == 0) {
    load_q(maps, m, t, S);
    for (int i = 0; i < kStages && i < n_steps; ++i) issue(i, i);
  }

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int row0 = q0 + 64 * w + 16 * warp + g;  // this thread's queries: row0 and row0 + 8
  const int w_first = q0 + 64 * w, w_last = w_first + 63;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // l: this thread's part of the row sums
  const uint32_t qa = smem + (2 * w) * kBox;
  mbar_wait(m.once, 0);

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
    if (n0 <= w_last) {
      // S = Q K^T: 64 queries x 64 keys, contracted over d in two 64-wide boxes.
      float sa[32];
      wgmma_fence();
      sm90k::mma_rows_d(sa, qa, st + kStageK);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(sa[i]);

      softmax_tile(sa, o, m_a, m_b, l_a, l_b, p.scale_log2, n0 + kBN - 1 > w_first, row0, n0, c4);

      uint32_t fp[4][4];
      sm90k::pack_a_frags(sa, fp);
      wgmma_fence();
      sm90k::mma_regs_k64(o, fp, st + kStageV);
      wgmma_commit();
      wgmma_wait<0>();
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(o[i]);

  store_out(o, l_a, l_b, m_a, m_b, p, b, h, row0, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

// The ping-pong schedule (see the top of the file). Warpgroup 2 produces; warpgroups 0 and 1 consume, each releasing a
// stage once its P V has run (one step later than the serial kernel).
__global__ void __launch_bounds__(kPpThreads, 1)
    attn_fwd_sm90_pp_kernel(const __grid_constant__ TMaps maps, const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring m = sm90k::ring_smem(smem_raw, kOffBar, kStages);
  const int S = p.S;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int n_steps = t.n_steps;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(m.full, m.empty, kStages, m.once);
  __syncthreads();
  if (tid >= 256) {  // the producer warpgroup (one thread works); no block-wide barrier follows
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 256) {
      load_q(maps, m, t, S);
      sm90k::produce_kv(maps, m, kStages, kOffStages, kStageBytes, t, S);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int row0 = t.q0 + 64 * w + 16 * warp + g;  // this thread's queries: row0 and row0 + 8
  const int w_first = t.q0 + 64 * w, w_last = w_first + 63;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  const uint32_t qa = m.base + (2 * w) * kBox;
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&m.empty[stage]);
  };
  mbar_wait(m.once, 0);

  // Turns: warpgroup w waits on barrier kTurnBar + w, then lets the other issue. Each barrier completes once per
  // step: warpgroup 1 arrives once up front and skips its last arrival, so neither is left pending at exit.
  if (w == 1) named_barrier_arrive(kTurnBar, 256);
  // The wgmmas are issued unconditionally inside the loop (ptxas serialises wgmmas on divergent paths): step 0,
  // which every warpgroup has keys in, is peeled off, and warpgroup 0's last tile, the only one without keys for
  // it (kBM = 2 kBN), still has its scores computed, then dropped.
  static_assert(kBM == 2 * kBN, "only warpgroup 0's last key tile may lie past its queries");
  uint32_t fp[4][4];
  int pending = 0;  // the stage whose V the packed P (fp) still has to multiply; -1: none
  {
    mbar_wait(&m.full[0], 0);
    float sa[32];
    named_barrier_sync(kTurnBar + w, 256);
    wgmma_fence();
    sm90k::mma_rows_d(sa, qa, m.base + kOffStages + kStageK);
    wgmma_commit();
    if (w == 0 || n_steps > 1) named_barrier_arrive(kTurnBar + 1 - w, 256);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(sa[i]);
    softmax_tile(sa, o, m_a, m_b, l_a, l_b, p.scale_log2, kBN - 1 > w_first, row0, 0, c4);
    sm90k::pack_a_frags(sa, fp);
  }
  static_assert(kStages > 1, "step 1 uses the next stage");
  int s = 1;
  uint32_t phase = 0;
  for (int step = 1; step < n_steps; ++step) {
    const int n0 = step * kBN;
    const bool active = n0 <= w_last;
    mbar_wait(&m.full[s], phase);
    const uint32_t st = m.base + kOffStages + s * kStageBytes;
    float sa[32];
    named_barrier_sync(kTurnBar + w, 256);
    wgmma_fence();
    sm90k::mma_rows_d(sa, qa, st + kStageK);
    sm90k::mma_regs_k64(o, fp, m.base + kOffStages + pending * kStageBytes + kStageV);
    wgmma_commit();
    if (w == 0 || step + 1 < n_steps) named_barrier_arrive(kTurnBar + 1 - w, 256);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(sa[i]);
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(o[i]);
    release(pending);
    if (active) {
      softmax_tile(sa, o, m_a, m_b, l_a, l_b, p.scale_log2, n0 + kBN - 1 > w_first, row0, n0, c4);
      sm90k::pack_a_frags(sa, fp);
      pending = s;
    } else {  // warpgroup 0's last step
      release(s);
      pending = -1;
    }
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
  if (pending >= 0) {
    wgmma_fence();
    sm90k::mma_regs_k64(o, fp, m.base + kOffStages + pending * kStageBytes + kStageV);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(o[i]);
    release(pending);
  }
  store_out(o, l_a, l_b, m_a, m_b, p, t.b, t.h, row0, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}


// The ping-pong schedule over 128 keys per step (MXTRAIN_ATTENTION_FWD_KEYS=128): S is m64n128 (64 accumulators
// beside O's 64 and the packed P's 32), so each step's softmax rescale, turn barriers and wgmma waits cover twice
// the keys. The diagonal step is the last; warpgroup 0's half of it lies past its queries and is masked, never
// skipped, so both warpgroups take every step and the turns need no inactive branch. A stage holds K as
// [d chunk][key half] (one K-major B operand of 128 rows per d chunk) and V as [key half][d chunk] (two N-major
// B operands of 64 k-rows).
namespace keys128 {
constexpr int kBN = 128;
constexpr int kStageK = 0, kStageV = 4 * kBox;
constexpr int kStageBytes = 8 * kBox;
// S, O and the packed P take 160 registers while the wgmmas run. ptxas gave a kernel of 384 threads (or 288) 168
// registers whatever setmaxnreg asked, and spilled; so no producer warpgroup: thread 128, of the warpgroup that issues
// second, refills each stage once both have released it, and 256 threads get up to 255 registers.
constexpr int kThreads = 256;
constexpr int kProducer = 128;
template <int kStages>
constexpr int smem_bytes() {
  return kOffStages + kStages * kStageBytes + (2 * kStages + 1) * 8 + 1024;
}
static_assert(smem_bytes<3>() <= 227 * 1024, "three 128-key stages and Q fit an SM's shared memory");

// The K and V tiles of step i into stage i % stages.
__device__ __forceinline__ void load_step(const TMaps& maps, const sm90k::Ring& ring, int stages,
                                          const sm90k::QueryTile& t, int S, int i) {
  const int st_i = i % stages;
  uint64_t* bar = &ring.full[st_i];
  sm90::mbar_arrive_expect_tx(bar, 8 * kBox);
  const uint32_t b32 = sm90::smem_u32(bar);
  const uint32_t st = ring.base + kOffStages + st_i * kStageBytes;
  for (int c = 0; c < 2; ++c)
    for (int half = 0; half < 2; ++half) {
      const int row = t.b * S + i * kBN + 64 * half;
      sm90::tma_load_2d(st + kStageK + (2 * c + half) * kBox, &maps.k, b32, t.kvh * kD + 64 * c, row);
      sm90::tma_load_2d(st + kStageV + (2 * half + c) * kBox, &maps.v, b32, t.kvh * kD + 64 * c, row);
    }
}

// S[64 x 128] = Q K^T over d = 128 (two 64-wide chunks of four k16 steps).
__device__ __forceinline__ void mma_scores(float (&sa)[64], uint32_t qa, uint32_t k) {
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90::wgmma_m64n128k16<0, 0>(sa, sm90::smem_desc(qa + c * kBox + kk * 32, 16, 1024),
                                   sm90::smem_desc(k + 2 * c * kBox + kk * 32, 16, 1024), (c | kk) != 0);
}

// O[64 x 128] += P V over 128 keys: P's eight k16 fragments from registers, V's two key halves N-major.
__device__ __forceinline__ void mma_pv(float (&o)[64], const uint32_t (&fp)[8][4], uint32_t v) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    sm90::wgmma_m64n128k16_rs<1>(o, fp[kk], sm90::smem_desc(v + (kk / 4) * 2 * kBox + (kk % 4) * 2048, kBox, 1024),
                                 1u);
}
}  // namespace keys128

template <int kStages>
__global__ void __launch_bounds__(keys128::kThreads, 1)
    attn_fwd_sm90_pp128_kernel(const __grid_constant__ TMaps maps, const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  using namespace keys128;
  static_assert(kStages >= 2, "a stage's V is released one step after its K is read");
  constexpr int kOffBar128 = kOffStages + kStages * keys128::kStageBytes;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring m = sm90k::ring_smem(smem_raw, kOffBar128, kStages);
  const int S = p.S;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int n_steps = (t.q0 + kBM) / keys128::kBN;
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(m.full, m.empty, kStages, m.once);
  __syncthreads();
  if (tid == kProducer) {
    load_q(maps, m, t, S);
    for (int i = 0; i < kStages && i < n_steps; ++i) load_step(maps, m, kStages, t, S, i);
  }

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int row0 = t.q0 + 64 * w + 16 * warp + g;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  const uint32_t qa = m.base + (2 * w) * kBox;
  auto stage = [&](int st_i) { return m.base + kOffStages + st_i * keys128::kStageBytes; };
  auto release = [&](int st_i) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&m.empty[st_i]);
  };
  mbar_wait(m.once, 0);

  // Turns as in attn_fwd_sm90_pp_kernel: each barrier completes once per step.
  if (w == 1) named_barrier_arrive(kTurnBar, 256);
  uint32_t fp[8][4];
  {
    mbar_wait(&m.full[0], 0);
    float sa[64];
    named_barrier_sync(kTurnBar + w, 256);
    wgmma_fence();
    keys128::mma_scores(sa, qa, stage(0) + keys128::kStageK);
    wgmma_commit();
    if (w == 0 || n_steps > 1) named_barrier_arrive(kTurnBar + 1 - w, 256);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(sa[i]);
    softmax_tile(sa, o, m_a, m_b, l_a, l_b, p.scale_log2, n_steps == 1, row0, 0, c4);
    sm90k::pack_a_frags(sa, fp);
  }
  int pending = 0;
  int s = 1;
  uint32_t phase = 0;
  for (int step = 1; step < n_steps; ++step) {
    mbar_wait(&m.full[s], phase);
    float sa[64];
    named_barrier_sync(kTurnBar + w, 256);
    wgmma_fence();
    keys128::mma_scores(sa, qa, stage(s) + keys128::kStageK);
    keys128::mma_pv(o, fp, stage(pending) + keys128::kStageV);
    wgmma_commit();
    if (w == 0 || step + 1 < n_steps) named_barrier_arrive(kTurnBar + 1 - w, 256);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(sa[i]);
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(o[i]);
    release(pending);
    // The warpgroup that issues second releases step - 1's stage last (the other did so a turn earlier).
    const int refill = step - 1 + kStages;
    if (tid == kProducer && refill < n_steps) {
      mbar_wait(&m.empty[pending], static_cast<uint32_t>((step - 1) / kStages) & 1u);
      load_step(maps, m, kStages, t, S, refill);
    }
    softmax_tile(sa, o, m_a, m_b, l_a, l_b, p.scale_log2, step + 1 == n_steps, row0, step * keys128::kBN, c4);
    sm90k::pack_a_frags(sa, fp);
    pending = s;
    if (++s == kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
  wgmma_fence();
  keys128::mma_pv(o, fp, stage(pending) + keys128::kStageV);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(o[i]);
  release(pending);
  store_out(o, l_a, l_b, m_a, m_b, p, t.b, t.h, row0, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

// Keys per step (MXTRAIN_ATTENTION_FWD_KEYS=64|128; unset: 128 for the ping-pong schedule, 64 for the serial one,
// which has no 128-key kernel) and, at 128, the depth of the K / V ring (MXTRAIN_ATTENTION_FWD_STAGES=2|3, default
// 2: 4% faster than 3 at 8x7B in session 37's bench_attention, equal at 8x1B). Read at every call, so tests can switch.
int env_keys(const char* op, bool pp) {
  const char* e = std::getenv("MXTRAIN_ATTENTION_FWD_KEYS");
  if (!e || !*e) return pp ? 128 : 64;
  if (!std::strcmp(e, "64")) return 64;
  if (!std::strcmp(e, "128")) return 128;
  fail(op, std::string("environment MXTRAIN_ATTENTION_FWD_KEYS=") + e + ": expected 64 or 128");
}
int env_stages(const char* op) {
  const char* e = std::getenv("MXTRAIN_ATTENTION_FWD_STAGES");
  if (!e || !*e || !std::strcmp(e, "2")) return 2;
  if (!std::strcmp(e, "3")) return 3;
  fail(op, std::string("environment MXTRAIN_ATTENTION_FWD_STAGES=") + e + ": expected 2 or 3");
}

}  // namespace

// The 128-key kernel with a ring of kS stages (its shared memory limit raised on the first launch).
template <int kS>
void launch_pp128(unsigned grid, const sm90k::TMaps& maps, const FwdParams& p, cudaStream_t stream, const char* op) {
  static std::atomic<bool> smem_set{false};
  constexpr int smem = keys128::smem_bytes<kS>();
  if (!smem_set.exchange(true)) set_smem(attn_fwd_sm90_pp128_kernel<kS>, static_cast<size_t>(smem), op);
  attn_fwd_sm90_pp128_kernel<kS><<<grid, keys128::kThreads, smem, stream>>>(maps, p);
}

bool try_fwd_sm90(const Geom& G, const FwdParams& p, int device, cudaStream_t stream) {
  const char* op = "attention_forward";
  const char* env = "MXTRAIN_ATTENTION_FWD";
  const sm90k::Mode mode = sm90k::env_mode(env, op);
  if (mode == sm90k::Mode::Off) return false;
  const bool pp = sm90k::env_schedule("MXTRAIN_ATTENTION_FWD_SCHED", op);
  const int keys = env_keys(op, pp), stages = keys == 128 ? env_stages(op) : kStages;
  if (keys == 128 && !pp)
    fail(op, "MXTRAIN_ATTENTION_FWD_KEYS=128 runs the ping-pong schedule only, but "
             "MXTRAIN_ATTENTION_FWD_SCHED=serial");
  static std::atomic<int> cache[64];
  static std::atomic<bool> smem_set{false}, pp_smem_set{false};
  const void* kernel = keys == 128   ? (stages == 2 ? reinterpret_cast<const void*>(attn_fwd_sm90_pp128_kernel<2>)
                                                    : reinterpret_cast<const void*>(attn_fwd_sm90_pp128_kernel<3>))
                       : pp ? reinterpret_cast<const void*>(attn_fwd_sm90_pp_kernel)
                            : reinterpret_cast<const void*>(attn_fwd_sm90_kernel);
  sm90k::TMaps maps{};
  std::string why;
  if (G.D != kD) why = "head_dim " + std::to_string(G.D) + " (needs 128)";
  else if (G.doc != nullptr) why = "a document mask";
  else if (G.S % kBM != 0) why = "seq " + std::to_string(G.S) + " (needs a multiple of 128)";
  else if (G.T * G.H * kD > INT32_MAX) why = "a tensor of 2^31 elements or more";
  else if (!sm90::device_runs_sm90a(device, kernel, cache)) why = "not an sm_90 device / binary";
  else if (!(sm90k::make_rows_map(maps.q, p.q, G.T, static_cast<int64_t>(G.H) * kD) &&
             sm90k::make_rows_map(maps.k, p.k, G.T, static_cast<int64_t>(G.KVH) * kD) &&
             sm90k::make_rows_map(maps.v, p.v, G.T, static_cast<int64_t>(G.KVH) * kD)))
    why = "a tensor map the driver rejects";
  if (!why.empty()) {
    if (mode == sm90k::Mode::Require)
      fail(op, std::string(env) + "=wgmma, but the sm90 forward kernel does not apply: " + why);
    return false;
  }
  maps.dout = maps.q;  // unused by the forward
  const unsigned grid = grid_1d(static_cast<int64_t>(G.S / kBM) * G.B * G.H, op);
  if (keys == 128) {
    (stages == 2 ? launch_pp128<2> : launch_pp128<3>)(grid, maps, p, stream, op);
  } else if (pp) {
    if (!pp_smem_set.exchange(true)) set_smem(attn_fwd_sm90_pp_kernel, static_cast<size_t>(kSmem), op);
    attn_fwd_sm90_pp_kernel<<<grid, kPpThreads, kSmem, stream>>>(maps, p);
  } else {
    if (!smem_set.exchange(true)) set_smem(attn_fwd_sm90_kernel, static_cast<size_t>(kSmem), op);
    attn_fwd_sm90_kernel<<<grid, kThreads, kSmem, stream>>>(maps, p);
  }
  check_launch(op);
  return true;
}

}  // namespace mxt::cuda::attn
