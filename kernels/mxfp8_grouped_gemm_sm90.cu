// MXFP8 grouped GEMMs on Hopper (sm_90a): TMA loads of both K-major FP8 operands into a shared-memory ring,
// FP8 wgmma (m64n128k32) per 32-wide MX block into a temporary fp32 tile, and the block-scale promotion
// acc += (scale_a[row] * scale_b[col]) * tmp on the CUDA cores. Same contract as the baseline kernels
// (mxfp8_grouped_gemm.cu, mxfp8_cuda.hpp); the entry points there try this path first.
//
// Why the promotion dominates: one m64n128k32 wgmma is 64 tensor-core cycles of an SM at the FP8 rate, and
// its promotion is 64 x 128 elements x 2 FP32 ops (the scale product differs per element: rows and columns
// both have their own block scale) = 128 cycles of the SM's 128 FP32 lanes. So even perfectly overlapped this
// kernel is bound by the CUDA cores, at best about half the FP8 tensor rate. Arranged to keep those lanes busy:
//   - two consumer warpgroups (64 rows each of a 128 x 128 tile) share the SM's FP32 lanes and tensor core;
//   - each issues the next MX block's wgmma into a second temporary before promoting the previous one
//     (commit_group / wait_group<1>), so its own promotion can overlap its own tensor-core work (kVar 0; the
//     single-temporary variant is kept for measurement);
//   - the scales arrive as fp32 tables in shared memory, laid out so a thread's 32 column scales are 8
//     LDS.128 (the conversion from E8M0 is done once per stage by the producer warpgroup).
// Measured (H200, Mixtral-8x7B expert shapes, bench_mxfp8_gemm, docs/perf.md): the tile pipeline alone (TMA +
// wgmma, no scale loads, no promotion) runs at 783-923 TFLOP/s forward / dgrad; adding the promotion halves
// that (377-398 without scale loads, 338-381 with them: the kernel); a promotion of one FP32 add per element
// (no scales) already costs as much (410-430), i.e. here the CUDA-core work on the accumulators adds to the
// tensor-core time instead of hiding under it. Wgrad (228 TFLOP/s) also pays the group-boundary masking and the
// f32 read-add-write of dW per tile (tile pipeline alone: 357-363).
//
// CTA: 3 warpgroups, one persistent CTA per SM walking (expert, m-tile, n-tile) work items (m fastest).
//   warps 0-3, the producers: warp g % 4 fills stage g of the ring: its lanes load the stage's scale bytes from
//     global memory, lane 0 issues the TMA loads of the A and B tiles (128-byte K stage = 4 MX blocks), and the
//     lanes write the scales as fp32 tables into the stage's slot (A: [row][4 blocks]; B: [block][lane % 4][32
//     + 4 pad], the order of a consumer thread's accumulator columns); the full barrier counts the TMA bytes and
//     the warp's 32 lanes. Afterwards (forward / dgrad) they zero C's padding rows [off[E], M).
//   warps 4-11: two consumer warpgroups (setmaxnreg 232 registers: accumulator 64 + two temporaries 2 x 64).
//
// Grouped along M (forward, dgrad): A [M][K], B [E][N][K]; tiles start at an expert's first row and may read
// rows of the next expert (each output row depends only on its own A row; only the expert's rows are stored).
// Grouped along K (wgrad): A [M][K], B [N][K]; an expert's K range [lo, hi) is walked from the MX block holding
// lo; in the first and last stage the bytes outside [lo, hi) are zeroed in shared memory (A and B, so a NaN or
// Inf of the neighbouring group cannot leak through 0 x NaN), and blocks past the group's last multiply those
// zeros with scale 1.0 (their own scales, which may be NaN, are never read). A straddling block keeps its own
// scale, as in the reference.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"
#include "sm90_fp8_wgmma.cuh"
#include "sm90_host.cuh"
#include "sm90_ptx.cuh"
#include "sm90_sched.cuh"

namespace mxt::mxfp8 {

namespace {

using sm90::clamp_to;
using sm90::fence_operand;
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;
using sm90::smem_desc;
using sm90::smem_u32;
using sm90::warp_prefix_over_experts;
using sm90::zero_words16;

enum class Mode : int { kRows = 0, kWgrad = 1 };

constexpr int kBM = 128, kBN = 128;      // block tile: 2 consumer warpgroups x 64 rows, 128 columns
constexpr int kBK = 128;                 // K bytes per stage: one 128-byte swizzle row = 4 MX blocks
constexpr int kKB = kBK / kBlock;        // MX blocks per stage
constexpr int kStages = 6;
constexpr int kThreads = 384, kConsumerThreads = 256;
constexpr int kProducerWarps = 4;
constexpr int kMaxExperts = 256;
constexpr int kStageA = kBM * kBK, kStageB = kBN * kBK;
constexpr int kSbRow = 36;                         // floats per (block, lane%4) row of the B table: 32 + pad
constexpr int kScaleA = kBM * kKB * 4;             // fp32 [row][block]
constexpr int kScaleB = kKB * 4 * kSbRow * 4;      // fp32 [block][lane % 4][32 + 4]
constexpr int kOffB = kStages * kStageA;
constexpr int kOffSA = kOffB + kStages * kStageB;
constexpr int kOffSB = kOffSA + kStages * kScaleA;
constexpr int kOffBar = kOffSB + kStages * kScaleB;
constexpr int kOffSched = kOffBar + 2 * kStages * 8;
constexpr int kPrefetchLead = 8;  // wgrad: stages before an item's end at which its dW tile is prefetched
constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 = 168 x 384

struct Sched {
  int32_t lo[kMaxExperts], hi[kMaxExperts], mtiles[kMaxExperts];
  int32_t cum[kMaxExperts + 1];  // exclusive prefix of the experts' work items
};
constexpr int kSmemBytes = kOffSched + static_cast<int>(sizeof(Sched)) + 1024;  // + 1024-byte alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
static_assert(kOffB % 1024 == 0 && kOffSA % 16 == 0 && kOffSB % 16 == 0, "buffer alignment");

struct Params {
  const int32_t* offsets;
  const uint8_t* sa;  // A scales [M][K/32]
  const uint8_t* sb;  // B scales [E (rows mode) or 1][N][K/32]
  void* out;          // rows mode: C [M, N] (bf16 / f32); wgrad: C [E, M, N] f32
  int32_t E, M, N, K, kbt;  // kbt = K / 32
  int32_t n_tiles, m_tiles, m_fast, prefetch;
  int32_t no_scale_loads;  // measurement variant 4 only: every scale 1.0, no global scale loads
};

struct Item {
  int e;
  int32_t m0, n0;    // first A row, first B row (= first output column)
  int32_t row_hi;    // rows mode: the expert's end row (rows past it are not stored)
  int32_t kb0;       // first MX block
  int32_t nsteps;    // MX blocks to multiply
  int32_t nk;        // stages
  int32_t klo, khi;  // wgrad: the group's K range
};

template <Mode kMode>
__device__ __forceinline__ Item decode(const Sched& sc, const Params& p, int item, int& e) {
  while (item >= sc.cum[e + 1]) ++e;  // a CTA's items increase, so the expert only moves forward
  Item it;
  it.e = e;
  const int local = item - sc.cum[e];
  if constexpr (kMode == Mode::kWgrad) {
    const int mt = p.m_fast ? local % p.m_tiles : local / p.n_tiles;
    const int nt = p.m_fast ? local / p.m_tiles : local % p.n_tiles;
    it.m0 = mt * kBM;
    it.n0 = nt * kBN;
    it.row_hi = 0;
    it.klo = sc.lo[e];
    it.khi = sc.hi[e];
    it.kb0 = it.klo / kBlock;
    it.nsteps = (it.khi + kBlock - 1) / kBlock - it.kb0;
  } else {
    const int mte = sc.mtiles[e];
    it.m0 = sc.lo[e] + (local % mte) * kBM;
    it.n0 = (local / mte) * kBN;
    it.row_hi = sc.hi[e];
    it.klo = 0;
    it.khi = p.K;
    it.kb0 = 0;
    it.nsteps = p.kbt;
  }
  it.nk = (it.nsteps + kKB - 1) / kKB;
  return it;
}

// Adds `bytes` to the transaction count of the barrier's current phase without arriving.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// The producer warpgroup: warp w fills the stages g with g % 4 == w. For its stage, each lane first issues the
// global loads of its 8 scale-table rows (4 of A, 4 of B, 4 blocks each: a stage's scales are 256 scattered
// 4-byte pieces, so latency, not work, is the cost, and four warps keep four stages in flight), then the warp
// waits for the slot, lane 0 issues the TMA loads of the A and B tiles, and every lane writes its fp32 table
// rows and arrives (the full barrier counts 32 arrivals and the TMA bytes). Rows past the operand and blocks
// past the item's last get scale 1.0 (never promoted, or multiplying zero-filled data).
template <Mode kMode>
__device__ __forceinline__ void produce(const CUtensorMap* mA, const CUtensorMap* mB, const CUtensorMap* mP,
                                        const Sched& sc, const Params& p, uint8_t* smem_ptr, uint32_t smem,
                                        uint64_t* full, uint64_t* empty, int pw, int lane) {
  if (lane == 0) {
    sm90::tma_prefetch_desc(mA);
    sm90::tma_prefetch_desc(mB);
    if (kMode == Mode::kWgrad && p.prefetch) sm90::tma_prefetch_desc(mP);
  }
  const int total = sc.cum[p.E];
  int s = 0, e = 0, g = 0;
  uint32_t phase = 0;
  for (int item = blockIdx.x; item < total; item += gridDim.x) {
    const Item it = decode<kMode>(sc, p, item, e);
    const int kb_end = it.kb0 + it.nsteps;
    for (int i = 0; i < it.nk; ++i, ++g) {
      if (g % kProducerWarps == pw) {
        const int kb = it.kb0 + i * kKB;
        // A row's 4 scale bytes: two aligned words and a funnel shift where the scale rows are word-aligned
        // and all 4 blocks exist in the tensor (then in bounds even past kb_end), single bytes otherwise.
        const bool words = (p.kbt % 4) == 0 && kb + kKB <= p.kbt;
        const int sh = 8 * (kb % 4);
        const int64_t step = 32 * static_cast<int64_t>(p.kbt);
        const uint8_t* pa = p.sa + static_cast<int64_t>(it.m0 + lane) * p.kbt + kb;
        const uint8_t* pb =
            p.sb + ((kMode == Mode::kWgrad ? 0 : static_cast<int64_t>(it.e) * p.N) + it.n0 + lane) * p.kbt + kb;
        uint32_t w[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const bool is_b = q >= 4;
          const int rl = lane + 32 * (q % 4);
          const bool valid = (is_b ? it.n0 : it.m0) + rl < (is_b ? p.N : p.M);
          const uint8_t* base = (is_b ? pb : pa) + (q % 4) * step;
          w[q] = p.no_scale_loads ? 0x7F7F7F7Fu : 0u;
          if (p.no_scale_loads) {
          } else if (valid && words) {
            const uint32_t* a = reinterpret_cast<const uint32_t*>(base - kb % 4);
            w[q] = sh ? __funnelshift_r(__ldg(a), __ldg(a + 1), sh) : __ldg(a);
          } else if (valid) {
#pragma unroll
            for (int c = 0; c < kKB; ++c)
              if (kb + c < kb_end) w[q] |= static_cast<uint32_t>(__ldg(base + c)) << (8 * c);
          }
        }
        mbar_wait(&empty[s], phase ^ 1u);
        if (lane == 0) {
          mbar_expect_tx(&full[s], kStageA + kStageB);
          const uint32_t bar = smem_u32(&full[s]);
          const int32_t k0 = kb * kBlock;
          sm90::tma_load_2d(smem + s * kStageA, mA, bar, k0, it.m0);
          if constexpr (kMode == Mode::kWgrad) {
            sm90::tma_load_2d(smem + kOffB + s * kStageB, mB, bar, k0, it.n0);
            // Pull this item's dW tile into L2 a few stages before the epilogue's read-add-write: one tensor
            // prefetch of the tile (one bulk prefetch per row kept the producer busy, as in the bf16 wgrad).
            if (p.prefetch && i == (it.nk > kPrefetchLead ? it.nk - kPrefetchLead : 0))
              sm90::tma_prefetch_l2_3d(mP, it.n0, it.m0, it.e);
          } else {
            sm90::tma_load_3d(smem + kOffB + s * kStageB, mB, bar, k0, it.n0, it.e);
          }
        }
        float* saf = reinterpret_cast<float*>(smem_ptr + kOffSA + s * kScaleA);
        float* sbf = reinterpret_cast<float*>(smem_ptr + kOffSB + s * kScaleB);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const bool is_b = q >= 4;
          const int rl = lane + 32 * (q % 4);
          const bool valid = (is_b ? it.n0 : it.m0) + rl < (is_b ? p.N : p.M);
          float v[kKB];
#pragma unroll
          for (int c = 0; c < kKB; ++c)
            v[c] = (valid && kb + c < kb_end) ? scale_value(static_cast<uint8_t>(w[q] >> (8 * c))) : 1.0f;
          if (!is_b) {
            *reinterpret_cast<float4*>(saf + rl * kKB) = make_float4(v[0], v[1], v[2], v[3]);
          } else {
            // Column rl = 8j + 2t + h is element 2j + h of the row for lane % 4 == t.
            const int j = rl / 8, t = (rl % 8) / 2, h = rl % 2;
#pragma unroll
            for (int c = 0; c < kKB; ++c) sbf[(c * 4 + t) * kSbRow + 2 * j + h] = v[c];
          }
        }
        mbar_arrive(&full[s]);  // every lane: its own table writes are released to the consumers
      }
      if (++s == kStages) {
        s = 0;
        phase ^= 1u;
      }
    }
  }
}

// Wgrad: zero the bytes of stage s outside [vlo, vhi) (stage-relative K bytes) in the A and B tiles. TMA's
// 128-byte swizzle moves 16-byte chunk c of row r to position c ^ (r % 8) within the row.
__device__ __forceinline__ void mask_stage(uint8_t* smem_ptr, int s, int vlo, int vhi, int ct) {
  for (int i = ct; i < (kBM + kBN) * 8; i += kConsumerThreads) {
    const int row = i / 8, c = i % 8, lo = 16 * c;
    if (lo >= vlo && lo + 16 <= vhi) continue;
    uint8_t* rowp = row < kBM ? smem_ptr + s * kStageA + row * kBK : smem_ptr + kOffB + s * kStageB + (row - kBM) * kBK;
    uint4* ptr = reinterpret_cast<uint4*>(rowp + ((c ^ (row & 7)) * 16));
    if (lo + 16 <= vlo || lo >= vhi) {
      *ptr = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    uint4 v = *ptr;
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int x = 0; x < 16; ++x)
      if (lo + x < vlo || lo + x >= vhi) w[x / 4] &= ~(0xFFu << (8 * (x % 4)));
    *ptr = make_uint4(w[0], w[1], w[2], w[3]);
  }
  sm90::fence_proxy_async_smem();                     // generic writes -> the wgmma's async-proxy reads
  sm90::named_barrier_sync(1, kConsumerThreads);      // both warpgroups read all of B
}

__device__ __forceinline__ void st_pair(cuda::bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void st_pair(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

template <int kFa, int kFb>
__device__ __forceinline__ void issue(float (&t)[64], uint32_t a, uint32_t b, int j) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(t[i]);
  sm90::wgmma_fence();  // t was read by the previous promotion
  // K-major, 128-byte swizzle: the j-th 32-byte MX block of each row (as the bf16 kernel's 16-element steps).
  sm90::wgmma_m64n128k32_fp8<kFa, kFb>(t, smem_desc(a + j * 32, 16, 1024), smem_desc(b + j * 32, 16, 1024), 0u);
  sm90::wgmma_commit();
}

// acc += (sa[row] * sb[col]) * t for this thread's fragment (layout: sm90_wgmma.cuh), block q of stage `stage`.
// kPromo (measurement variants only, wrong results): 1 = acc += t (one FP32 op per element, no scales);
// 2 = no promotion at all (the tensor-core and pipeline ceiling).
template <int kPromo>
__device__ __forceinline__ void promote(float (&acc)[64], float (&t)[64], const uint8_t* smem_ptr, int stage, int q,
                                        int r_a, int tq) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(t[i]);
  if constexpr (kPromo == 2) return;
  if constexpr (kPromo == 1) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] += t[i];
    return;
  }
  const float* saf = reinterpret_cast<const float*>(smem_ptr + kOffSA + stage * kScaleA);
  const float sa0 = saf[r_a * kKB + q], sa1 = saf[(r_a + 8) * kKB + q];
  const float4* sbv =
      reinterpret_cast<const float4*>(smem_ptr + kOffSB + stage * kScaleB) + (q * 4 + tq) * (kSbRow / 4);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const float4 b = sbv[jj];  // columns 16jj + 2tq + {0, 1} (x, y) and 16jj + 8 + 2tq + {0, 1} (z, w)
    float* a = acc + 8 * jj;
    const float* d = t + 8 * jj;
    a[0] = fmaf(d[0], sa0 * b.x, a[0]);
    a[1] = fmaf(d[1], sa0 * b.y, a[1]);
    a[2] = fmaf(d[2], sa1 * b.x, a[2]);
    a[3] = fmaf(d[3], sa1 * b.y, a[3]);
    a[4] = fmaf(d[4], sa0 * b.z, a[4]);
    a[5] = fmaf(d[5], sa0 * b.w, a[5]);
    a[6] = fmaf(d[6], sa1 * b.z, a[6]);
    a[7] = fmaf(d[7], sa1 * b.w, a[7]);
  }
}

// kVar: 0 = two temporaries (the default), 1 = one temporary, 2 / 3 = two temporaries with promote<1> / <2>.
template <Mode kMode, int kFa, int kFb, int kVar, typename TC>
__device__ __forceinline__ void consume(const Sched& sc, const Params& p, uint8_t* smem_ptr, uint32_t smem,
                                        uint64_t* full, uint64_t* empty) {
  const int ct = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  const int cw = ct / 128, warp = (ct % 128) / 32, lane = ct % 32;
  const int r_a = cw * 64 + warp * 16 + lane / 4;  // this thread's tile rows: r_a and r_a + 8
  const int tq = lane % 4;
  const int total = sc.cum[p.E];
  constexpr bool kDbl = kVar != 1;
  constexpr int kP = kVar == 2 ? 1 : (kVar == 3 ? 2 : 0);
  float acc[64], t0[64], t1[64];
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[stage]);
  };
  int s = 0, e = 0;
  uint32_t phase = 0;
  for (int item = blockIdx.x; item < total; item += gridDim.x) {
    const Item it = decode<kMode>(sc, p, item, e);
    // The temporaries are zeroed too (wgmma ignores them: scale_d = 0), so that they are dead, not carried into the
    // next item, during the epilogue.
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = t0[i] = t1[i] = 0.f;
    // Every stage issues and promotes all 4 blocks, also the item's last (partial) stage: its blocks past the
    // item's end multiply zeros (zero-filled past K, or zeroed by mask_stage past the group) with scale 1.0 and
    // add exactly 0. No wgmma and no read of its registers sits in a data-dependent branch: ptxas would then
    // serialise every wgmma (C7518, "WG.DP in divergent path"), which costs the whole overlap.
    auto stage_in = [&](int i) {
      mbar_wait(&full[s], phase);
      if constexpr (kMode == Mode::kWgrad) {
        const int base = (it.kb0 + i * kKB) * kBlock;
        const int vlo = it.klo - base, vhi = it.khi - base;
        if (vlo > 0 || vhi < kBK) mask_stage(smem_ptr, s, vlo, vhi, ct);
      }
    };
    auto next_slot = [&] {
      if (++s == kStages) {
        s = 0;
        phase ^= 1u;
      }
    };
    const uint32_t a_off = cw * (64 * kBK);
    if constexpr (kDbl) {
      // Block j goes into t[j % 2]; after issuing it, block j - 1 is waited for (wait_group<1>) and promoted
      // while block j runs on the tensor cores. Each stage drains its last block before the next stage, so no
      // wgmma is in flight across the loop's back edge (ptxas serialises all wgmmas otherwise, C7514); the
      // other warpgroup's work covers that one unoverlapped promotion.
      for (int i = 0; i < it.nk; ++i) {
        stage_in(i);
        const uint32_t a = smem + s * kStageA + a_off, b = smem + kOffB + s * kStageB;
        issue<kFa, kFb>(t0, a, b, 0);
        issue<kFa, kFb>(t1, a, b, 1);
        sm90::wgmma_wait<1>();
        promote<kP>(acc, t0, smem_ptr, s, 0, r_a, tq);
        issue<kFa, kFb>(t0, a, b, 2);
        sm90::wgmma_wait<1>();
        promote<kP>(acc, t1, smem_ptr, s, 1, r_a, tq);
        issue<kFa, kFb>(t1, a, b, 3);
        sm90::wgmma_wait<1>();
        promote<kP>(acc, t0, smem_ptr, s, 2, r_a, tq);
        sm90::wgmma_wait<0>();
        promote<kP>(acc, t1, smem_ptr, s, 3, r_a, tq);
        release(s);
        next_slot();
      }
    } else {
      for (int i = 0; i < it.nk; ++i) {
        stage_in(i);
        const uint32_t a = smem + s * kStageA + a_off, b = smem + kOffB + s * kStageB;
#pragma unroll
        for (int j = 0; j < kKB; ++j) {
          issue<kFa, kFb>(t0, a, b, j);
          sm90::wgmma_wait<0>();
          promote<kP>(acc, t0, smem_ptr, s, j, r_a, tq);
        }
        release(s);
        next_slot();
      }
    }

    // Epilogue straight from the accumulator fragments.
    const int col_l = 2 * tq;
    if constexpr (kMode == Mode::kWgrad) {
      const int64_t M = p.M, N = p.N;
      float* dW = static_cast<float*>(p.out) + static_cast<int64_t>(it.e) * M * N;
      const int64_t ma = it.m0 + r_a, mb = ma + 8;
      constexpr int kJ = 4;  // column groups per batch: 2 x 4 float2 loads in flight
#pragma unroll
      for (int j0 = 0; j0 < 16; j0 += kJ) {
        float2 va[kJ], vb[kJ];
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const int64_t n = it.n0 + 8 * (j0 + j) + col_l;
          va[j] = (ma < M && n < N) ? *reinterpret_cast<const float2*>(dW + ma * N + n) : make_float2(0.f, 0.f);
          vb[j] = (mb < M && n < N) ? *reinterpret_cast<const float2*>(dW + mb * N + n) : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const int64_t n = it.n0 + 8 * (j0 + j) + col_l;
          const int q = 4 * (j0 + j);
          if (ma < M && n < N) st_pair(dW + ma * N + n, va[j].x + acc[q], va[j].y + acc[q + 1]);
          if (mb < M && n < N) st_pair(dW + mb * N + n, vb[j].x + acc[q + 2], vb[j].y + acc[q + 3]);
        }
      }
    } else {
      const int64_t N = p.N;
      TC* out = static_cast<TC*>(p.out);
      const int64_t ra = static_cast<int64_t>(it.m0) + r_a, rb = ra + 8;
      const bool va = ra < it.row_hi, vb = rb < it.row_hi;  // only this expert's rows
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t n = it.n0 + 8 * j + col_l;  // N % 8 == 0: n < N implies n + 1 < N
        if (n < N) {
          if (va) st_pair(out + ra * N + n, acc[4 * j], acc[4 * j + 1]);
          if (vb) st_pair(out + rb * N + n, acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
  }
}

// Zeroes rows [used, M) of C [M, N] with 16-byte stores (N x sizeof(TC) a multiple of 16, C 16-byte aligned).
template <typename TC>
__device__ __forceinline__ void zero_padding(const Params& p, int32_t used, int t, int nthreads) {
  zero_words16(reinterpret_cast<uint4*>(static_cast<TC*>(p.out) + static_cast<int64_t>(used) * p.N),
               static_cast<int64_t>(p.M - used) * p.N * static_cast<int64_t>(sizeof(TC)) / 16, t, nthreads);
}

template <Mode kMode, int kFa, int kFb, int kVar, typename TC>
__global__ void __launch_bounds__(kThreads, 1)
    mxfp8_sm90_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                      const __grid_constant__ CUtensorMap tmP, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Swizzled TMA destinations and wgmma descriptors (base offset 0) need 1024-byte-aligned buffers.
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* smem_ptr = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t smem = smem_u32(smem_ptr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_ptr + kOffBar);
  uint64_t* empty = full + kStages;
  Sched& sc = *reinterpret_cast<Sched*>(smem_ptr + kOffSched);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Work items per expert from the device offsets, clamped into [0, extent] and non-decreasing (a bad table
  // cannot cause out-of-bounds accesses). Extent: M rows (rows mode) or K (wgrad).
  const int32_t extent = kMode == Mode::kWgrad ? p.K : p.M;
  for (int e = tid; e < p.E; e += kThreads) {
    const int32_t lo = clamp_to(p.offsets[e], extent);
    int32_t hi = clamp_to(p.offsets[e + 1], extent);
    if (hi < lo) hi = lo;
    const int32_t mt = (hi - lo + kBM - 1) / kBM;
    sc.lo[e] = lo;
    sc.hi[e] = hi;
    sc.mtiles[e] = mt;
    sc.cum[e + 1] = kMode == Mode::kWgrad ? (hi > lo ? p.m_tiles * p.n_tiles : 0) : mt * p.n_tiles;
  }
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      sm90::mbar_init(&full[i], 32);  // the 32 lanes of the producer warp of the stage (+ the TMA bytes)
      sm90::mbar_init(&empty[i], 8);      // one arrival per consumer warp
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0) warp_prefix_over_experts(sc.cum, p.E, lane);
  __syncthreads();

  if (warp < 4) {  // producer warpgroup
    sm90::setmaxnreg_dec<kProducerRegs>();
    produce<kMode>(&tmA, &tmB, &tmP, sc, p, smem_ptr, smem, full, empty, warp, lane);
    if constexpr (kMode == Mode::kRows) zero_padding<TC>(p, clamp_to(p.offsets[p.E], p.M), tid, 128);
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    consume<kMode, kFa, kFb, kVar, TC>(sc, p, smem_ptr, smem, full, empty);
  }
#else
  __trap();  // built without sm_90a: the host never launches this (see device_ok)
#endif
}

// ---- host side -------------------------------------------------------------------------------------------

std::atomic<int> g_impl{static_cast<int>(GemmImpl::Auto)};
std::atomic<int> g_variant{0};
thread_local const char* g_last = "none";

GemmImpl env_impl() {
  static const GemmImpl v = [] {
    const char* s = std::getenv("MXTRAIN_MXFP8_GEMM");
    if (s == nullptr || *s == 0 || !std::strcmp(s, "auto")) return GemmImpl::Auto;
    if (!std::strcmp(s, "sm90")) return GemmImpl::Sm90;
    if (!std::strcmp(s, "baseline")) return GemmImpl::Baseline;
    cuda::fail("mxfp8 grouped gemm", std::string("MXTRAIN_MXFP8_GEMM must be auto, sm90 or baseline, got '") + s +
                                         "'");
  }();
  return v;
}

bool wants_sm90() {
  const auto o = static_cast<GemmImpl>(g_impl.load());
  return (o != GemmImpl::Auto ? o : env_impl()) != GemmImpl::Baseline;
}

bool device_ok(int device) {
  static std::atomic<int> cache[64];
  return sm90::device_runs_sm90a(
      device, reinterpret_cast<const void*>(mxfp8_sm90_kernel<Mode::kRows, 0, 0, 0, cuda::bf16>), cache);
}

// A byte tensor map (K innermost), 128 x 128 boxes, 128-byte swizzle. False (said once on stderr) when the
// driver rejects the geometry: the caller falls back to the baseline kernel.
bool make_map(CUtensorMap& m, const char* op, const uint8_t* ptr, int rank, const cuuint64_t* dims,
              const cuuint64_t* strides) {
  const cuuint32_t box[3] = {kBK, 128, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const auto encode = sm90::tensor_map_encoder("mxfp8 grouped gemm");
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, static_cast<cuuint32_t>(rank),
                            const_cast<uint8_t*>(ptr), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return true;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr, "%s: cuTensorMapEncodeTiled failed (error %d): using the baseline kernel\n", op,
                 static_cast<int>(r));
  return false;
}

using sm90::aligned;

template <Mode kMode, int kFa, int kFb, int kVar, typename TC>
void launch(const char* op, const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& pf, const Params& p,
            int64_t max_items, CudaContext& ctx) {
  auto kernel = mxfp8_sm90_kernel<kMode, kFa, kFb, kVar, TC>;
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load()) {
    cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), op,
                "cudaFuncSetAttribute(shared memory)");
    attr_set.store(true);
  }
  const int64_t grid = max_items < ctx.gemm_sms() ? (max_items < 1 ? 1 : max_items) : ctx.gemm_sms();
  kernel<<<static_cast<unsigned>(grid), kThreads, kSmemBytes, ctx.stream>>>(a, b, pf, p);
}

template <Mode kMode, typename TC>
void launch_formats(const char* op, Format fa, Format fb, const CUtensorMap& a, const CUtensorMap& b,
                    const CUtensorMap& pf, const Params& p, int64_t max_items, CudaContext& ctx) {
  const bool e4a = fa == Format::E4M3, e4b = fb == Format::E4M3;
  const int v = g_variant.load();
  constexpr bool kBench = kMode == Mode::kWgrad || std::is_same<TC, cuda::bf16>::value;
  if ((v == 4 || v == 5) && e4a && e4b) {  // measurement: no scale loads (all scales 1.0); 5: no promotion either
    Params q = p;
    q.no_scale_loads = 1;
    if (kBench && v == 5) launch<kMode, 0, 0, kBench ? 3 : 0, TC>(op, a, b, pf, q, max_items, ctx);
    else launch<kMode, 0, 0, 0, TC>(op, a, b, pf, q, max_items, ctx);
  } else if (e4a && e4b) {
    // Measurement variants: E4M3 x E4M3 only, and only the output type each mode benchmarks.
    if (v == 1) launch<kMode, 0, 0, 1, TC>(op, a, b, pf, p, max_items, ctx);
    else if (kBench && v == 2) launch<kMode, 0, 0, kBench ? 2 : 0, TC>(op, a, b, pf, p, max_items, ctx);
    else if (kBench && v == 3) launch<kMode, 0, 0, kBench ? 3 : 0, TC>(op, a, b, pf, p, max_items, ctx);
    else launch<kMode, 0, 0, 0, TC>(op, a, b, pf, p, max_items, ctx);
  } else if (e4a) {
    launch<kMode, 0, 1, 0, TC>(op, a, b, pf, p, max_items, ctx);
  } else if (e4b) {
    launch<kMode, 1, 0, 0, TC>(op, a, b, pf, p, max_items, ctx);
  } else {
    launch<kMode, 1, 1, 0, TC>(op, a, b, pf, p, max_items, ctx);
  }
}

// Sizes and alignments the sm90 kernels take (the rest goes to the baseline).
bool common_ok(CudaOps& ops, const MxView& A, const MxView& B, int64_t E, int64_t N, int64_t K) {
  if (!wants_sm90() || !device_ok(ops.ctx().device)) return false;
  if (E < 1 || E > kMaxExperts || K < kBlock || K > INT32_MAX / 2 || N % 8 != 0 || N > INT32_MAX / 2) return false;
  if (A.op_rows() > INT32_MAX / 2) return false;
  return aligned(A.data, 16) && aligned(B.data, 16);
}

}  // namespace

void set_gemm_impl(GemmImpl impl) { g_impl.store(static_cast<int>(impl)); }
bool baseline_forced() { return !wants_sm90(); }
void set_gemm_variant(int v) {
  if (v < 0 || v > 5) cuda::fail("mxfp8 grouped gemm", "variant must be 0 to 5, got " + std::to_string(v));
  g_variant.store(v);
}
const char* last_gemm_impl() { return g_last; }
void note_gemm_impl(const char* impl) { g_last = impl; }

// What both modes' kernels read: operands, scales, output and the problem's extents.
static Params base_params(const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C, int64_t E,
                          int64_t M, int64_t N, int64_t K, int64_t n_tiles) {
  Params p{};
  p.offsets = static_cast<const int32_t*>(offsets.data);
  p.sa = A.scales;
  p.sb = B.scales;
  p.out = C.data;
  p.E = static_cast<int32_t>(E);
  p.M = static_cast<int32_t>(M);
  p.N = static_cast<int32_t>(N);
  p.K = static_cast<int32_t>(K);
  p.kbt = static_cast<int32_t>(K / kBlock);
  p.n_tiles = static_cast<int32_t>(n_tiles);
  return p;
}

bool grouped_gemm_sm90(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  const char* op = "mxfp8::grouped_gemm_cuda";
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = B.batch;
  if (!common_ok(ops, A, B, E, N, K) || !aligned(C.data, 16)) return false;
  const int64_t n_tiles = (N + kBN - 1) / kBN;
  const int64_t max_items = ((M + kBM - 1) / kBM + E) * n_tiles;  // >= sum_e ceil(rows_e / 128) * n_tiles
  if (max_items > INT32_MAX) return false;
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(M)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(K)};
  const cuuint64_t b_dims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(E)};
  const cuuint64_t b_strides[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(K * N)};
  CUtensorMap ma, mb;
  if (!make_map(ma, op, A.data, 2, a_dims, a_strides) || !make_map(mb, op, B.data, 3, b_dims, b_strides)) return false;
  Params p = base_params(A, B, offsets, C, E, M, N, K, n_tiles);
  CudaContext& ctx = ops.ctx();
  if (C.dtype == DType::BF16)
    launch_formats<Mode::kRows, cuda::bf16>(op, A.format, B.format, ma, mb, ma, p, max_items, ctx);  // no prefetch
  else
    launch_formats<Mode::kRows, float>(op, A.format, B.format, ma, mb, ma, p, max_items, ctx);
  cuda::check_launch(op);
  note_gemm_impl("sm90");
  return true;
}

bool grouped_gemm_wgrad_sm90(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                             const Tensor& C) {
  const char* op = "mxfp8::grouped_gemm_wgrad_cuda";
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = offsets.numel() - 1;
  if (!common_ok(ops, A, B, E, N, K) || !aligned(C.data, 8)) return false;
  const int64_t m_tiles = (M + kBM - 1) / kBM, n_tiles = (N + kBN - 1) / kBN;
  if (E * m_tiles * n_tiles > INT32_MAX) return false;
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(M)};
  const cuuint64_t b_dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K)};
  CUtensorMap ma, mb;
  if (!make_map(ma, op, A.data, 2, a_dims, strides) || !make_map(mb, op, B.data, 2, b_dims, strides)) return false;
  Params p = base_params(A, B, offsets, C, E, M, N, K, n_tiles);
  p.m_tiles = static_cast<int32_t>(m_tiles);
  p.m_fast = M <= N ? 1 : 0;  // the CTAs in flight share the larger operand's tiles in L2
  // dW [E, M, N] fp32 in one-tile boxes, for the L2 prefetch (none when the driver rejects the map).
  CUtensorMap pf = ma;
  const cuuint64_t c_dims[3] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t c_strides[2] = {static_cast<cuuint64_t>(N) * 4, static_cast<cuuint64_t>(N * M) * 4};
  const cuuint32_t c_box[3] = {kBN, kBM, 1}, elem_strides[3] = {1, 1, 1};
  p.prefetch = aligned(C.data, 16) &&
                       sm90::tensor_map_encoder(op)(&pf, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, C.data, c_dims, c_strides,
                                                    c_box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                    CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
                   ? 1
                   : 0;
  launch_formats<Mode::kWgrad, float>(op, A.format, B.format, ma, mb, pf, p, E * m_tiles * n_tiles, ops.ctx());
  cuda::check_launch(op);
  note_gemm_impl("sm90");
  return true;
}

}  // namespace mxt::mxfp8
