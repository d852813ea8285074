// Grouped expert GEMMs on Hopper (sm_90a): TMA loads into a multi-stage shared-memory ring, wgmma on two
// consumer warpgroups, one persistent CTA per SM walking (expert, m-tile, n-tile) work items.
//   forward  y[r,:]  = x[r,:] @ W[e]^T     A = x  [R,K] K-major,   B = W[e] [N,K] K-major   -> y  bf16
//   dgrad    dx[r,:] = dy[r,:] @ W[e]      A = dy [R,K] K-major,   B = W[e] [K,N] N-major   -> dx bf16
//   wgrad    dW[e]  += dy_e^T @ x_e        A = dy_e^T: [M=out, k=rows] M-major, B = x_e [k, N] N-major
//                                          -> dW f32 += (deterministic: one CTA per output tile)
//            optionally over several row sets (dy_s, x_s, offsets_s), e.g. micro-batches: each output tile
//            contracts expert e's rows of every set before its one read-add-write of dW[e] (or its one store:
//            dW = the sum, when the call overwrites; experts without rows then store zeros)
//   forward + SwiGLU (W = W13 [E, 2f, K]): each tile's B holds BN/2 gate rows [n0, n0 + BN/2) and the matching
//            BN/2 up rows [f + n0, ...), so every consumer thread holds the gate and the up value of the same
//            column (accumulator j and j + BN/16); the epilogue stores h13 = [gate | up] and
//            act = silu(gate) * up * wp[r] (of the bf16-rounded h13, as swiglu_forward computes it)
//   dgrad + SwiGLU backward (W = W2 [E, K, f]): the dgrad's dact tile never leaves the registers; the epilogue
//            reads h13 and wp, stores dh13 = [dgate | dup] (swiglu_backward's arithmetic on the bf16-rounded
//            dact) and one partial sum of dwp[r] per (row, n-tile), which a second small kernel adds up in
//            n-tile order (deterministic)
// (contract and offsets semantics: ops.hpp; the wmma kernels in grouped_gemm.cu are the fallback and reference.)
//
// CTA: 3 warpgroups. Warpgroup 0 is the producer: one thread issues the TMA loads of each k-block (BK = 64)
// into stage s after waiting for empty[s]; the loads complete on full[s] (transaction bytes). Its other warps
// zero the padding rows [offsets[E], R) of y / dx. Warpgroups 1 and 2 are consumers: each owns 64 rows of the
// 128 x BN block tile (wgmma m64nBNk16, fp32 accumulators in registers), waits for full[s], issues 4 wgmmas,
// keeps one k-block of wgmmas in flight and releases the previous stage (one arrival per consumer warp).
// Shared tiles are 128-byte swizzled by TMA and read by wgmma through matching descriptors (sm90_ptx.cuh).
//
// Work items (computed on the device from the offsets, never on the host): forward / dgrad: for each expert
// ceil(rows_e / 128) m-tiles x ceil(N / BN) n-tiles, m fastest; wgrad: for each expert with rows, ceil(M/128) x
// ceil(N/BN) output tiles, the fastest index along the smaller of M, N (so the CTAs in flight share operands in
// L2). CTA b takes items b, b + gridDim.x, ...; producer and consumers derive the same sequence.
//
// Clusters of 2 (kCl = 2, optional). Forward / dgrad: the two CTAs of a cluster take adjacent m-tiles of one
// expert with the same n-tile, so they share the weight tile B; each loads one half of it and multicasts it to
// both (32 KiB instead of 48 KiB from L2 per k-block and CTA at BN = 256, as cuBLASLt's 2x1 clusters do). An
// expert with an odd number of m-tiles pairs its last m-tile over n-tiles instead: the two CTAs take the same
// rows and adjacent n-tiles, each loading its own B tile (one such unit after each pair of n-tiles' m-tile pairs,
// so B stays in L2; sm90_row_units.hpp). Padding each expert to 256 rows instead cost an eighth of the slots at
// ~1,024 rows per expert (8x7B, 8x1B). With an odd number of n-tiles the second CTA of the last pair is left
// without rows: it still loads and multiplies (its peer needs its half of B) but stores nothing. Wgrad: the CTAs
// take adjacent n-tiles of one output tile row and share the A tile (dy's columns) the same way. A stage is then
// written by both CTAs' TMA, so its empty barrier counts the consumer warps of both CTAs (remote arrivals), and
// the CTAs sync as a cluster after initialising the barriers and before exiting.
//
// Expert boundaries: forward / dgrad load 128 rows from the tile's first row even past the expert's end (they
// belong to the next expert, or are zero-filled past R); each output row depends only on its own input row,
// and the epilogue stores only the expert's rows. Wgrad contracts over rows, so in each row set's last k-block
// of an expert only the k16 steps over its rows run, with its rows' k16 step completed by zeros (WgradTail).
//
// Wgrad epilogue: dW += acc is done by the TMA unit (cp.reduce.async.bulk.tensor .add.f32) from 64 x 16 fp32
// boxes that each consumer warpgroup writes into a small ring of shared buffers, so the read-add-write of the
// fp32 tile runs in L2 while the consumers start the next item's mainloop (short contractions, e.g. 1,024 rows
// per expert, made the synchronous read-add-write a third of the kernel's time). The direct alternative
// (MXTRAIN_GG_WGRAD_EPI=red) issues red.global.add.v2.f32 from the registers instead (st.global when storing).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "sm90_grouped_gemm.cuh"
#include "sm90_host.cuh"
#include "sm90_ptx.cuh"
#include "sm90_row_units.hpp"
#include "sm90_sched.cuh"
#include "sm90_wgmma.cuh"
#include "mxtrain/wgrad_tails.hpp"
#include "wgrad_tails.hpp"

namespace mxt::sm90 {

namespace {

using bf16 = __nv_bfloat16;

enum class Mode : int { kFwd = 0, kDgrad = 1, kWgrad = 2, kFwdSwiglu = 3, kDgradSwiglu = 4 };

// Wgrad: how a row set's last k-block of an expert, holding valid < BK of its rows, leaves the other rows out.
//   kTailSteps (default): only ceil(valid / 16) of the k-block's 4 k16 wgmmas run, and each warpgroup zeroes rows
//     [valid, 16 * steps) of its own A chunk (dy) and syncs alone (none of this when valid % 16 == 0). B's rows
//     there are other experts' rows of the same set, finite products of the step (were one not, that expert's own
//     dW would not be finite either); where they may be unwritten (past offsets_s[E]), both operands' rows are
//     zeroed, by both warpgroups together.
//   kTailZero: both warpgroups zero rows [valid, BK) of A and B, sync, and run all 4 wgmmas (before session 29).
//   kTailNone: nothing: wrong sums, timing only (MXTRAIN_GG_FAULT=tail).
enum WgradTail : int { kTailSteps = 0, kTailZero = 1, kTailNone = 2 };

// Output columns of one work item: the forward + SwiGLU tile makes BN/2 act columns from BN accumulators.
template <Mode kMode, int BN>
constexpr int kItemCols = kMode == Mode::kFwdSwiglu ? BN / 2 : BN;

constexpr int BM = 128;                  // block tile rows: 2 consumer warpgroups x 64
constexpr int BK = 64;                   // k-block: one 128-byte swizzle row of bf16
constexpr int kChunk = 64 * BK * 2;      // bytes of one 64 x 64 bf16 box (8 KiB)
constexpr int kThreads = 384;            // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kMaxExperts = 256;
constexpr int kMaxSets = 8;              // wgrad: row sets per launch (more: several launches)
constexpr int kSetRoom = kMaxSets + 1;   // wgrad: and the tail set gathered from them (wgrad_tails.hpp)
constexpr int kSetSlots = 448;           // wgrad: (sets - 1) x experts row ranges past the first set's
constexpr int kPrefetchLead = 8;         // wgrad: k-blocks before an item's end at which its dW tile is prefetched
constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;  // 128 x 56 + 256 x 224 = 168 x 384
constexpr int kEpiCols = 16;             // wgrad epilogue box: 64 rows x 16 fp32 (64-byte rows, 64-byte swizzle)
constexpr int kEpiBox = 64 * kEpiCols * 4;
constexpr int kEpiBufs = 3;              // boxes in flight per consumer warpgroup
constexpr int kLockstepSlots = 4096;     // wgrad lockstep: item ordinals gated (later ones run free)

template <int BN>
struct Cfg {
  static_assert(BN == 128 || BN == 256, "BN must be 128 or 256");
  static constexpr int kStageA = BM * BK * 2;
  static constexpr int kStageB = BN * BK * 2;
  static constexpr int kStages = BN == 256 ? 4 : 6;  // 192 KiB of operand ring either way
  static constexpr int kOffB = kStages * kStageA;
  static constexpr int kOffEpi = kOffB + kStages * kStageB;    // wgrad: 2 warpgroups x kEpiBufs boxes
  static constexpr int kOffBar = kOffEpi + 2 * kEpiBufs * kEpiBox;
  static constexpr int kOffSched = kOffBar + 2 * kStages * 8;
  static constexpr int kAcc = BN / 2;  // fp32 accumulators per consumer thread (64 x BN / 128)
};

struct Sched {
  int32_t lo[kMaxExperts], hi[kMaxExperts];  // expert rows (wgrad: of the first row set)
  int32_t mtiles[kMaxExperts];               // fwd / dgrad: m-tiles; wgrad: k-blocks over all row sets
  int32_t slo[kSetSlots], shi[kSetSlots];    // wgrad: expert e's rows of set s >= 1 at (s - 1) * E + e
  int32_t unk[kSetRoom];  // wgrad: set s's first row that may be unwritten: offsets_s[E] if below R_s, else
                          // INT32_MAX (none: TMA zero-fills rows past R_s)
  int32_t cum[kMaxExperts + 1];  // exclusive prefix of the experts' work items, in the order of `order`
  int32_t order[kMaxExperts];    // wgrad: the expert at each position of the schedule (Params::order_rows)
  int32_t split_last;            // fwd / dgrad: this CTA finished its split unit last (one split item per CTA)
};

template <int BN>
constexpr int smem_bytes() {
  return Cfg<BN>::kOffSched + static_cast<int>(sizeof(Sched)) + 1024;  // + slack for 1024-byte alignment
}
static_assert(smem_bytes<256>() <= 227 * 1024 && smem_bytes<128>() <= 227 * 1024, "shared memory budget");
static_assert(Cfg<256>::kOffB % 1024 == 0 && Cfg<128>::kOffB % 1024 == 0, "stage buffers 1024-byte aligned");
static_assert(Cfg<256>::kOffEpi % 1024 == 0 && Cfg<128>::kOffEpi % 1024 == 0, "epilogue boxes 1024-byte aligned");

struct Params {
  const int32_t* offsets;
  int32_t E, R;
  int32_t sets;                            // wgrad: row sets (>= 1); set 0 is (offsets, R)
  const int32_t* set_offsets[kSetRoom];    // wgrad: set s's expert offsets into its R_s rows (s >= 1)
  int32_t set_R[kSetRoom];
  int32_t tails_gathered;                  // wgrad: sets [0, sets - 1) run only their whole k-blocks of each
                                           // expert; the last set holds the rest (gather_wgrad_tails)
  int32_t overwrite;                       // wgrad: dW = the sum (TMA stores) instead of dW += it
  int32_t out_bf16;                        // wgrad storing: dW is bf16, each sum rounded to nearest even, left in
                                           // 64 x 32 boxes (the f32 boxes' 64-byte rows); the norm sums the rounded
                                           // values
  int32_t N;        // output columns (fwd: out, dgrad: in, wgrad: in)
  int32_t K;        // fwd / dgrad: contraction length; wgrad: M (= out, rows of dW[e])
  int32_t n_units;  // n-tiles per scheduling unit row: ceil(ceil(N / BN) / cluster size) (wgrad pair_m: n-tiles)
  int32_t m_tiles;  // wgrad: ceil(M / BM) (pair_m: pairs of m-tiles)
  int32_t m_fast;   // wgrad: item order, m-tile fastest
  int32_t group;    // wgrad: the fast index walks groups of this many units (wgrad_unit; 0: one group)
  int32_t order_rows;  // wgrad: the experts' items in decreasing order of their k-blocks (ties by index), so the
                       // last round is the cheapest expert's; else in index order
  int32_t hint_a, hint_b, hint_c;  // L2 eviction priorities (L2Priority) of the A and B loads and the TMA stores
  int32_t pair_m;   // wgrad, CTA pairs: the pair shares the x tile (rank r takes m-tile unit * 2 + r) instead of the
                    // dy tile (n-tile unit * 2 + r)
  int32_t prefetch; // wgrad: prefetch each dW tile into L2 (one tensor prefetch, SetMaps::pf) before adding to it
  int32_t* order_out;    // wgrad, tests: CTA 0 writes the schedule's expert order here (E entries), or null
  int32_t* lockstep;     // wgrad: per item ordinal, the CTAs past that item's middle (zeroed per launch), or null
  int32_t lockstep_len;  // its length: later ordinals run ungated
  int32_t fault;    // test-only fault injection (MXTRAIN_GG_FAULT): 1 = no row mask, 2 = no wgrad tail zeroing,
                    // 3 = no epilogue (timing only), 4 = wgrad pairs over m-tiles read the wrong x columns,
                    // 5 = the norm's slots leave out lanes 28-31 (rows 7 and 15 of each warp's 16),
                    // 7 = wgrad boxes never sent, 8 = a spin instead of the wgrad epilogue (both timing only),
                    // 9 = a bf16 dW's pairs stored with their two columns swapped
  int32_t tail;     // wgrad: a row set's last k-block of an expert (WgradTail)
  int32_t odd_tail;   // fwd / dgrad, CTA pairs: an odd last m-tile over two n-tiles (MXTRAIN_GG_ODD_TAIL=pair)
  int32_t epi_one_bar;  // wgrad storing bf16 through TMA boxes: one named barrier per box (else two)
  int32_t epi_stmatrix;  // wgrad storing bf16 through TMA boxes: each warp's rows of a box by stmatrix.x2
  int32_t tma_store;  // fwd / dgrad: 64-row halves inside the expert leave through TMA stores (tmC); wgrad: the
                      // tile leaves through TMA reduce-adds / stores, else red.global / st.global from registers
  void* out;        // y / dx (bf16, [R, N]) or dW (f32, [E, M, N]); forward + SwiGLU: h13 (bf16, [R, 2N])
  void* act;        // forward + SwiGLU: act (bf16, [R, N], N = f)
  const float* wp;  // forward + SwiGLU, dgrad + SwiGLU: the routing weight of each row [R]
  const bf16* h13;  // dgrad + SwiGLU: the forward's h13 [R, 2N] (out is then dh13 [R, 2N])
  float* part;      // dgrad + SwiGLU: dwp's partial sums [R, ceil(N / BN)]
  float* sumsq;     // wgrad storing: each warp's sum of squares of the tile it stores (norm_slot), or null
  int32_t split_max;  // fwd / dgrad: the last round's units split along K into at most this many parts (tail_split;
                      // < 2: off)
  float* split_ws;    // split parts' fp32 partial tiles: one per CTA of the grid, kConsumerThreads x kAcc floats
  int32_t* split_cnt; // per (split unit, rank): parts finished; zero between launches (the last part resets it)
};

// Wgrad storing with Params::sumsq: the slot of warp w (0..7 over both consumer warpgroups) of the tile at
// (e, m0, n0): one per warp, no atomics, so that summing the slots in order is reproducible.
// norm_slot(E, 0, 0, ...) is the call's slot count.
__host__ __device__ inline int64_t norm_slot(int64_t e, int32_t m0, int32_t n0, int64_t M, int64_t N, int bn, int w) {
  const int64_t all_m = (M + BM - 1) / BM, all_n = (N + bn - 1) / bn;
  return ((e * all_m + m0 / BM) * all_n + n0 / bn) * 8 + w;
}

// Two sums rounded to bf16 (nearest even) as one 32-bit word, a first; their rounded squares added to sq, so that
// the clipping norm sums what the optimizer will read.
__device__ __forceinline__ uint32_t bf16x2_norm(float a, float b, float& sq, bool norm) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  if (norm) {
    const float2 r = __bfloat1622float2(v);
    sq = fmaf(r.x, r.x, sq);
    sq = fmaf(r.y, r.y, sq);
  }
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Wgrad with Params::sumsq: this warp's sum of squares (each lane's sq) into its slot.
template <int BN>
__device__ __forceinline__ void store_norm_slot(const Params& p, int e, int32_t m0, int32_t n0, float sq, int w,
                                                int lane) {
  if (p.fault == 5 && lane >= 28) sq = 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  if (lane == 0 && m0 < p.K && n0 < p.N) p.sumsq[norm_slot(e, m0, n0, p.K, p.N, BN, w)] = sq;
}

// Wgrad: the operand maps of row sets 1.. (set 0's are tmA / tmB).
struct SetMaps {
  CUtensorMap a[kSetRoom - 1], b[kSetRoom - 1];  // forward + SwiGLU (TMA stores): a[0] h13's up half, a[1] act
  CUtensorMap pf;                                // wgrad: dW in BM x BN fp32 boxes, for the L2 prefetch
};

// Wgrad: expert e's rows [lo, hi) of row set s.
__device__ __forceinline__ void set_rows(const Sched& sc, int E, int s, int e, int32_t& lo, int32_t& hi) {
  if (s == 0) {
    lo = sc.lo[e];
    hi = sc.hi[e];
  } else {
    lo = sc.slo[(s - 1) * E + e];
    hi = sc.shi[(s - 1) * E + e];
  }
}

// Wgrad: walks an item's k-blocks over the row sets in order, skipping empty ones. next() gives the k-block's
// first row and how many of its BK rows belong to the expert (the rest must not count: see WgradTail); s is the
// k-block's row set.
struct SetCursor {
  int s = -1;
  int32_t row = 0, left = 0;
  __device__ __forceinline__ int32_t next(const Sched& sc, int E, int e, int& valid) {
    while (left <= 0) {
      int32_t lo, hi;
      set_rows(sc, E, ++s, e, lo, hi);
      row = lo;
      left = hi - lo;
    }
    const int32_t r0 = row;
    valid = left < BK ? left : BK;
    row += BK;
    left -= BK;
    return r0;
  }
};

__device__ __forceinline__ void st_bf16x2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}


__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Forward / dgrad: the k-blocks of a whole unit's contraction.
__device__ __forceinline__ int32_t row_kblocks(const Params& p) { return (p.K + BK - 1) / BK; }

// One work item, decoded identically by producer and consumers.
struct Item {
  int e;
  int32_t row0, row_hi;  // fwd / dgrad: rows [row0, min(row0 + BM, row_hi)) of the output
  int32_t m0;            // wgrad: first dW row
  int32_t n0;            // first output column
  int32_t kb0, nk;       // k-blocks [kb0, nk) (wgrad: over all row sets, kb0 = 0)
  bool shared_b;         // fwd / dgrad, clusters: B is the pair's shared tile (multicast halves), else its own
};

// kCl CTAs (cluster ranks) share a unit: wgrad: rank r takes n-tile unit * kCl + r (p.pair_m: m-tile); forward /
// dgrad: row_unit (sm90_row_units.hpp).
template <Mode kMode, int BN, int kCl>
// `pos` is the caller's cursor over the schedule's expert positions.
__device__ __forceinline__ Item decode(const Sched& sc, const Params& p, int item, int& pos, int rank) {
  while (item >= sc.cum[pos + 1]) ++pos;  // items of one CTA increase, so the position only moves forward
  static_assert(kCl == 1 || kCl == 2, "units pair CTAs at most");
  const int e = kMode == Mode::kWgrad ? sc.order[pos] : pos;
  Item it;
  it.e = e;
  it.shared_b = kCl > 1;
  const int local = item - sc.cum[pos];
  if constexpr (kMode == Mode::kWgrad) {
    const WgradUnit u = p.m_fast ? wgrad_unit(local, p.m_tiles, p.n_units, p.group)
                                 : wgrad_unit(local, p.n_units, p.m_tiles, p.group);
    const int mt = p.m_fast ? u.fast : u.slow, nu = p.m_fast ? u.slow : u.fast;
    const bool pm = kCl > 1 && p.pair_m;
    it.m0 = (pm ? mt * kCl + rank : mt) * BM;
    it.n0 = (pm ? nu : nu * kCl + rank) * BN;
    it.row0 = sc.lo[e];
    it.row_hi = sc.hi[e];
    it.kb0 = 0;
    it.nk = sc.mtiles[e];
  } else {
    const RowUnit u = row_unit(local, sc.mtiles[e], p.n_units, kCl, p.odd_tail != 0, rank);
    it.row0 = sc.lo[e] + u.m_tile * BM;
    it.row_hi = sc.hi[e];
    it.n0 = u.n_tile * kItemCols<kMode, BN>;
    it.shared_b = u.shared_b;
    it.m0 = 0;
    it.kb0 = 0;
    it.nk = row_kblocks(p);
  }
  return it;
}

// Wgrad: one warp fills the schedule's expert order and moves each expert's item count (cum[e + 1], before the
// prefix) to its position. by_work: decreasing k-blocks, ties by index, so that the static round-robin ends on the
// cheapest expert's items (session 60's schedule model: the W2 call's busiest CTA pair 0.25% nearer the mean).
// Else the index order. Every CTA computes the same order from the same table.
__device__ __forceinline__ void order_experts(Sched& sc, int E, bool by_work, int lane) {
  constexpr int kPer = kMaxExperts / 32;
  int32_t pos[kPer], units[kPer], work[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    pos[i] = by_work ? 0 : e;
    units[i] = e < E ? sc.cum[e + 1] : 0;
    work[i] = e < E ? sc.mtiles[e] : 0;
  }
  if (by_work) {  // one pass over the table (a broadcast read per expert), each lane ranking its experts
    for (int f = 0; f < E; ++f) {
      const int32_t v = sc.mtiles[f];
#pragma unroll
      for (int i = 0; i < kPer; ++i) pos[i] += v > work[i] || (v == work[i] && f < lane + 32 * i);
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      sc.order[pos[i]] = e;
      sc.cum[pos[i] + 1] = units[i];
    }
  }
  __syncwarp();
}

// The call's split of its last round (fwd / dgrad with Params::split_max >= 2; else none).
template <Mode kMode>
__device__ __forceinline__ TailSplit split_of(const Sched& sc, const Params& p, int units_stride) {
  const int units = sc.cum[p.E];
  if constexpr (kMode == Mode::kFwd || kMode == Mode::kDgrad) {
    if (p.split_max >= 2) return tail_split(units, units_stride, row_kblocks(p), p.split_max);
  }
  return {units, 1, units};
}

// Item `item` of the split schedule: a whole unit, or one part's k-block range of a split one.
template <Mode kMode, int BN, int kCl>
__device__ __forceinline__ Item decode_split(const Sched& sc, const Params& p, const TailSplit& ts, int item, int& e,
                                             int rank) {
  if (item < ts.full) return decode<kMode, BN, kCl>(sc, p, item, e, rank);
  const int slot = item - ts.full;
  Item it = decode<kMode, BN, kCl>(sc, p, ts.full + slot / ts.parts, e, rank);
  const int nk = it.nk;
  tail_part_range(nk, slot % ts.parts, ts.parts, it.kb0, it.nk);
  return it;
}

// Wgrad lockstep (MXTRAIN_GG_WGRAD_LOCKSTEP): a CTA starts its next item only once every CTA of the grid is past
// the middle of its current one, so the CTAs that share a dy or x strip through L2 stay within half an item of each
// other instead of drifting apart over hundreds of items. A scheduling hint only: after about 2 ms it goes on.
__device__ __forceinline__ void wgrad_lockstep_wait(const int32_t* passed) {
  const int want = static_cast<int>(gridDim.x);
  for (int t = 0; t < 20000; ++t) {
    if (*reinterpret_cast<const volatile int32_t*>(passed) >= want) return;
    __nanosleep(100);
  }
}

template <Mode kMode, int BN, int kCl>
__device__ __forceinline__ void produce(const CUtensorMap* mA, const CUtensorMap* mB, const SetMaps* sm,
                                        const Sched& sc, const Params& p, uint32_t smem, uint64_t* full,
                                        uint64_t* empty, int rank, int unit0, int units_stride) {
  using C = Cfg<BN>;
  tma_prefetch_desc(mA);
  tma_prefetch_desc(mB);
  if constexpr (kMode == Mode::kWgrad) {
    for (int s = 1; s < p.sets; ++s) {
      tma_prefetch_desc(&sm->a[s - 1]);
      tma_prefetch_desc(&sm->b[s - 1]);
    }
    if (p.prefetch) tma_prefetch_desc(&sm->pf);
  }
  const L2Hint ha = l2_hint(p.hint_a), hb = l2_hint(p.hint_b);
  const TailSplit ts = split_of<kMode>(sc, p, units_stride);
  int s = 0, e = 0;
  uint32_t phase = 0;
  for (int item = unit0; item < ts.items; item += units_stride) {
    const Item it = decode_split<kMode, BN, kCl>(sc, p, ts, item, e, rank);
    SetCursor cur;
    if constexpr (kMode == Mode::kWgrad) {
      if (p.lockstep) {  // this CTA's item ordinal (recomputed where needed: the producer has few registers)
        const int ordinal = (item - unit0) / units_stride;
        if (ordinal > 0 && ordinal <= p.lockstep_len) wgrad_lockstep_wait(p.lockstep + ordinal - 1);
        if (ordinal < p.lockstep_len && it.nk <= it.kb0) atomicAdd(p.lockstep + ordinal, 1);
      }
    }
    for (int kb = it.kb0; kb < it.nk; ++kb) {
      if constexpr (kMode == Mode::kWgrad) {
        if (p.lockstep && kb == (it.kb0 + it.nk) / 2) {
          const int ordinal = (item - unit0) / units_stride;
          if (ordinal < p.lockstep_len) atomicAdd(p.lockstep + ordinal, 1);
        }
      }
      mbar_wait(&empty[s], phase ^ 1u);
      mbar_arrive_expect_tx(&full[s], C::kStageA + C::kStageB);
      const uint32_t a = smem + s * C::kStageA, b = smem + C::kOffB + s * C::kStageB;
      const uint32_t bar = smem_u32(&full[s]);
      const int32_t k0 = kb * BK;
      if constexpr (kMode == Mode::kFwd) {
        tma_load_2d(a, mA, bar, k0, it.row0, ha);  // x rows [row0, row0 + 128), k [k0, +64)
        if constexpr (kCl == 1) {
          tma_load_3d(b, mB, bar, k0, it.n0, it.e, hb);  // W[e] rows [n0, n0 + BN), k [k0, k0 + 64)
        } else if (it.shared_b) {  // this CTA's BN/2 rows of the shared W tile, to the same offset in both CTAs
          constexpr int kHalf = BN / 2;
          tma_load_3d_multicast(b + rank * kHalf * BK * 2, mB, bar, k0, it.n0 + rank * kHalf, it.e, 0x3, hb);
        } else {  // its own tile, in the two BN/2-row boxes of the cluster map
          constexpr int kHalf = BN / 2;
          tma_load_3d(b, mB, bar, k0, it.n0, it.e, hb);
          tma_load_3d(b + kHalf * BK * 2, mB, bar, k0, it.n0 + kHalf, it.e, hb);
        }
      } else if constexpr (kMode == Mode::kFwdSwiglu) {
        // Gate rows [n0, n0 + BN/2) then up rows [f + n0, ...) (f = p.N): the two halves of one BN-row tile,
        // laid out as a single BN-row box would be (the swizzle repeats every 8 rows). Gate rows past f are up
        // rows and up rows past 2f are zero-filled; their columns are never stored.
        tma_load_2d(a, mA, bar, k0, it.row0, ha);
        tma_load_3d(b, mB, bar, k0, it.n0, it.e, hb);
        tma_load_3d(b + (BN / 2) * BK * 2, mB, bar, k0, p.N + it.n0, it.e, hb);
      } else if constexpr (kMode == Mode::kDgrad || kMode == Mode::kDgradSwiglu) {
        tma_load_2d(a, mA, bar, k0, it.row0, ha);  // dy rows [row0, row0 + 128), k [k0, +64)
        if (kCl == 1 || !it.shared_b) {
#pragma unroll
          for (int c = 0; c < BN / 64; ++c)  // W[e] k-rows [k0, k0 + 64), columns n0 + 64c ...
            tma_load_3d(b + c * kChunk, mB, bar, it.n0 + 64 * c, k0, it.e, hb);
        } else {  // this CTA's half of the shared W boxes, to the same offsets in both CTAs
          constexpr int kHalf = BN / 128;
#pragma unroll
          for (int c = rank * kHalf; c < (rank + 1) * kHalf; ++c)
            tma_load_3d_multicast(b + c * kChunk, mB, bar, it.n0 + 64 * c, k0, it.e, 0x3, hb);
        }
      } else {
        int valid;
        const int32_t r0 = cur.next(sc, p.E, it.e, valid);  // expert rows [r0, r0 + 64) of row set cur.s
        const CUtensorMap* ma = cur.s == 0 ? mA : &sm->a[cur.s - 1];
        const CUtensorMap* mb = cur.s == 0 ? mB : &sm->b[cur.s - 1];
        if (kCl > 1 && p.pair_m) {  // its own dy tile; its half of the pair's x tile, to both CTAs
          constexpr int kHalf = BN / 128;
#pragma unroll
          for (int c = 0; c < BM / 64; ++c) tma_load_2d(a + c * kChunk, ma, bar, it.m0 + 64 * c, r0, ha);
#pragma unroll
          for (int c = rank * kHalf; c < (rank + 1) * kHalf; ++c)
            tma_load_2d_multicast(b + c * kChunk, mb, bar, it.n0 + 64 * c + (p.fault == 4 ? 64 : 0), r0, 0x3, hb);
        } else {
          if (kCl > 1) {
            tma_load_2d_multicast(a + rank * kChunk, ma, bar, it.m0 + 64 * rank, r0, 0x3, ha);
          } else {
#pragma unroll
            for (int c = 0; c < BM / 64; ++c) tma_load_2d(a + c * kChunk, ma, bar, it.m0 + 64 * c, r0, ha);
          }
#pragma unroll
          for (int c = 0; c < BN / 64; ++c) tma_load_2d(b + c * kChunk, mb, bar, it.n0 + 64 * c, r0, hb);
        }
      }
      if constexpr (kMode == Mode::kWgrad) {
        // A few k-blocks before the mainloop ends, pull this item's dW tile into L2 so the epilogue's add waits
        // on L2, not DRAM: one tensor prefetch of the whole tile. (One bulk prefetch per row, 128 producer
        // instructions, made the producer the wgrad's bottleneck: 0.63 of cuBLASLt against 0.74, session 25.)
        if (p.prefetch && it.n0 < p.N && kb == (it.nk > kPrefetchLead ? it.nk - kPrefetchLead : 0))
          tma_prefetch_l2_3d(&sm->pf, it.n0, it.m0, it.e);
      }
      if (++s == C::kStages) {
        s = 0;
        phase ^= 1u;
      }
    }
  }
}

// Wgrad: zero k-rows [from, to) of the 64-row chunks [c0, c1) of stage `s` (A: chunks 0, 1; B: 2..) with
// `threads` threads from t, then make the writes visible to wgmma and sync those threads on barrier `bar`. The
// 128-byte swizzle permutes 16-byte pieces within a row only, so a whole row is zeroed wherever its pieces are.
template <int BN>
__device__ __forceinline__ void zero_rows(uint8_t* smem, int s, int from, int to, int c0, int c1, int t,
                                          int threads, uint32_t bar) {
  using C = Cfg<BN>;
  const int per_chunk = (to - from) * 8;  // 16-byte pieces
  for (int i = t; i < (c1 - c0) * per_chunk; i += threads) {
    const int c = c0 + i / per_chunk, rem = i % per_chunk;
    uint8_t* base = c < BM / 64 ? smem + s * C::kStageA + c * kChunk
                                : smem + C::kOffB + s * C::kStageB + (c - BM / 64) * kChunk;
    *reinterpret_cast<uint4*>(base + (from + rem / 8) * 128 + (rem % 8) * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_proxy_async_smem();  // generic writes -> the wgmma's async-proxy reads
  named_barrier_sync(bar, threads);
}

// Wgrad: prepares a tail k-block (valid < BK rows of the expert, starting at row r0 of set `set`) as `tail` says;
// returns how many of its 4 k16 wgmmas to run. Both warpgroups take the same branches (same item, same k-block).
template <int BN>
__device__ __forceinline__ int wgrad_tail(uint8_t* smem, const Sched& sc, int tail, int s, int set, int32_t r0,
                                          int valid, int ct, int cw) {
  constexpr int kAll = BM / 64 + BN / 64;
  if (tail == kTailNone) return BK / 16;
  if (tail == kTailZero) {
    zero_rows<BN>(smem, s, valid, BK, 0, kAll, ct, kConsumerThreads, 1);  // both warpgroups read all of B
    return BK / 16;
  }
  const int steps = (valid + 15) / 16;
  if (valid % 16 != 0) {
    if (r0 + 16 * steps <= sc.unk[set])
      zero_rows<BN>(smem, s, valid, 16 * steps, cw, cw + 1, ct % 128, 128, 4 + cw);  // this warpgroup's A only
    else
      zero_rows<BN>(smem, s, valid, 16 * steps, 0, kAll, ct, kConsumerThreads, 1);
  }
  return steps;
}

// The k-block's first kSteps k16 wgmmas (all 4 but in a wgrad tail k-block).
template <int BN, int kTA, int kTB, int kSteps = BK / 16>
__device__ __forceinline__ void mma_kblock(float (&acc)[BN / 2], uint32_t a, uint32_t b) {
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    // K-major: the next 16 k are 32 bytes further along each 128-byte row; M/N-major: 16 rows of 128 bytes.
    const uint64_t da = kTA ? smem_desc(a + k * 2048, kChunk, 1024) : smem_desc(a + k * 32, 16, 1024);
    const uint64_t db = kTB ? smem_desc(b + k * 2048, kChunk, 1024) : smem_desc(b + k * 32, 16, 1024);
    if constexpr (BN == 256)
      wgmma_m64n256k16<kTA, kTB>(acc, da, db, 1u);
    else
      wgmma_m64n128k16<kTA, kTB>(acc, da, db, 1u);
  }
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// act from the accumulators of a gate and an up element: both rounded to h13's bf16 first, then exactly
// swiglu_forward's arithmetic (silu(g) * u * wp), so the fused and the separate forward agree bit for bit.
__device__ __forceinline__ float swiglu_act(float g_acc, float u_acc, float w) {
  const float g = round_bf16(g_acc), u = round_bf16(u_acc);
  return g * (1.f / (1.f + expf(-g))) * u * w;
}

// SwiGLU backward of two adjacent columns of one row from their dgrad accumulators (rounded to bf16 first, as the
// separate dgrad stores dact), swiglu_backward's arithmetic: dgate = d*wp*u*silu'(g), dup = d*wp*silu(g), and
// d*silu(g)*u added to the row's partial dwp sum.
__device__ __forceinline__ void swiglu_bwd_pair(float acc0, float acc1, const bf16* gate, int64_t f, float w,
                                                bf16* dgate, float& sum) {
  const __nv_bfloat162 g2 = *reinterpret_cast<const __nv_bfloat162*>(gate);
  const __nv_bfloat162 u2 = *reinterpret_cast<const __nv_bfloat162*>(gate + f);
  const float d[2] = {round_bf16(acc0), round_bf16(acc1)};
  const float g[2] = {__low2float(g2), __high2float(g2)}, u[2] = {__low2float(u2), __high2float(u2)};
  float dg[2], du[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float sg = 1.f / (1.f + expf(-g[k])), silu = g[k] * sg;
    sum += d[k] * silu * u[k];
    dg[k] = d[k] * w * u[k] * sg * (1.f + g[k] * (1.f - sg));
    du[k] = d[k] * w * silu;
  }
  st_bf16x2(dgate, dg[0], dg[1]);
  st_bf16x2(dgate + f, du[0], du[1]);
}

// A split unit's part (tail_split): stores this CTA's fp32 partial tile in its workspace slot (in fragment order:
// float4 i of consumer thread t at (i * kConsumerThreads + t), coalesced) and counts itself done. The last part of
// the unit to finish (per cluster rank) adds all parts' partials in part order into acc (0 + part 0 + part 1 ...:
// deterministic whichever finishes last), resets the count for the next launch and returns true: it runs the
// epilogue. The others return false.
template <int BN, int kCl>
__device__ __forceinline__ bool split_sum(const Params& p, Sched& sc, const TailSplit& ts, int item,
                                          float (&acc)[BN / 2], int rank, int ct) {
  const int slot = item - ts.full, part = slot % ts.parts, unit = slot / ts.parts;
  constexpr int kVec = BN / 8;  // float4s per thread
  constexpr size_t kSlot = static_cast<size_t>(kConsumerThreads) * (BN / 2);
  // (Opaque, so the compiler keeps these addresses out of the item loop, where they would be live across the
  // mainloop and spill, as in the epilogues below.)
  float* ws = p.split_ws;
  asm volatile("" : "+l"(ws), "+r"(ct));
  float4* mine = reinterpret_cast<float4*>(ws + (static_cast<size_t>(slot) * kCl + rank) * kSlot);
#pragma unroll
  for (int i = 0; i < kVec; ++i)
    __stcg(mine + i * kConsumerThreads + ct, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  __threadfence();  // the partial is visible device-wide before the count says so
  named_barrier_sync(6, kConsumerThreads);
  int32_t* count = p.split_cnt + unit * kCl + rank;
  if (ct == 0) {
    const int done = atomicAdd(count, 1);
    sc.split_last = done == ts.parts - 1;
    if (done == ts.parts - 1) *count = 0;
  }
  named_barrier_sync(6, kConsumerThreads);
  if (!sc.split_last) return false;
  __threadfence();
  // Every part from the workspace, this one's too: acc is dead until the sum lands in it.
  const size_t first = static_cast<size_t>(slot - part) * kCl + rank;  // part 0's slot
  const int q0 = p.fault == 6 ? part : 0, q1 = p.fault == 6 ? part + 1 : ts.parts;  // fault: the others left out
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  for (int q = q0; q < q1; ++q) {
    const float4* src = reinterpret_cast<const float4*>(ws + (first + static_cast<size_t>(q) * kCl) * kSlot) + ct;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float4 v = __ldcg(src + i * kConsumerThreads);
      acc[4 * i] += v.x;
      acc[4 * i + 1] += v.y;
      acc[4 * i + 2] += v.z;
      acc[4 * i + 3] += v.w;
    }
  }
  return true;
}

#ifdef MXTRAIN_GG_CLOCKS
// Diagnostic build only: the weight gradient's consumer cycles, summed over CTAs per warpgroup: [wg][0] waiting for
// an item's first k-block, [1] the rest of its mainloop, [2] of which waiting for later k-blocks, [3] the epilogue,
// [4] items, [5] of the epilogue, thread 0's waits for the TMA to have read a box, [6] of [0], the part before the
// wait (decoding the item, zeroing the accumulators).
__device__ unsigned long long g_gg_clocks[2][7];
#define CK_TIMED(stmt)                         \
  do {                                         \
    const unsigned long long ck_a = clock64(); \
    stmt;                                      \
    ck_bwait += clock64() - ck_a;              \
  } while (0)
#else
#define CK_TIMED(stmt) stmt
#endif

template <Mode kMode, int BN, int kCl>
__device__ __forceinline__ void consume(const CUtensorMap* mC, const SetMaps* sm, Sched& sc, const Params& p,
                                        uint8_t* smem_ptr, uint32_t smem, uint64_t* full, uint64_t* empty, int rank,
                                        int unit0, int units_stride) {
  using C = Cfg<BN>;
  constexpr int kTA = kMode == Mode::kWgrad ? 1 : 0;
  constexpr int kTB = kMode == Mode::kFwd || kMode == Mode::kFwdSwiglu ? 0 : 1;
  const int ct = threadIdx.x - 128;           // 0..255 over both consumer warpgroups
  const int cw = ct / 128;                    // which 64-row half of the block tile
  const int warp = (ct % 128) / 32, lane = ct % 32;
  const TailSplit ts = split_of<kMode>(sc, p, units_stride);
  const L2Hint hc = l2_hint(p.hint_c);
  float acc[C::kAcc];
  int s = 0, e = 0, epi_box = 0;
  uint32_t phase = 0;
  // Releases a stage: one arrival per consumer warp on the empty barrier of every CTA that writes into it.
  auto release = [&](int stage) {
    if (lane != 0) return;
    if constexpr (kCl == 1) {
      mbar_arrive(&empty[stage]);
    } else {
#pragma unroll
      for (int r = 0; r < kCl; ++r) mbar_arrive_remote(map_to_cta(smem_u32(&empty[stage]), r));
    }
  };
#ifdef MXTRAIN_GG_CLOCKS
  unsigned long long ck_ramp = 0, ck_main = 0, ck_wait = 0, ck_epi = 0, ck_items = 0, ck_t2 = 0, ck_bwait = 0;
  unsigned long long ck_pre = 0;
#endif
  for (int item = unit0; item < ts.items; item += units_stride) {
#ifdef MXTRAIN_GG_CLOCKS
    unsigned long long ck_t0 = clock64(), ck_t1 = ck_t0;
    if (ck_items > 0) ck_epi += ck_t0 - ck_t2;
    ++ck_items;
#endif
    const Item it = decode_split<kMode, BN, kCl>(sc, p, ts, item, e, rank);
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.f;
    int prev = 0;
    SetCursor cur;  // wgrad: each row set's last k-block may hold fewer than BK of the expert's rows
    for (int kb = it.kb0; kb < it.nk; ++kb) {
#ifdef MXTRAIN_GG_CLOCKS
      const unsigned long long ck_w0 = clock64();
#endif
      mbar_wait(&full[s], phase);
#ifdef MXTRAIN_GG_CLOCKS
      const unsigned long long ck_w1 = clock64();
      if (kb == it.kb0) {
        ck_t1 = ck_w1;
        ck_ramp += ck_w1 - ck_t0;
        ck_pre += ck_w0 - ck_t0;
      } else {
        ck_wait += ck_w1 - ck_w0;
      }
#endif
      int steps = BK / 16;
      if constexpr (kMode == Mode::kWgrad) {
        int valid;
        const int32_t r0 = cur.next(sc, p.E, it.e, valid);
        if (valid < BK) steps = wgrad_tail<BN>(smem_ptr, sc, p.tail, s, cur.s, r0, valid, ct, cw);
      }
      // This warpgroup's 64 rows of A: rows 64cw.. of the K-major box, or the cw-th 64-wide M chunk.
      const uint32_t a = smem + s * C::kStageA + cw * kChunk;
      const uint32_t b = smem + C::kOffB + s * C::kStageB;
      switch (steps) {  // uniform over the warpgroup; each case one whole fenced and committed group
        case 1: wgmma_fence(); mma_kblock<BN, kTA, kTB, 1>(acc, a, b); wgmma_commit(); break;
        case 2: wgmma_fence(); mma_kblock<BN, kTA, kTB, 2>(acc, a, b); wgmma_commit(); break;
        case 3: wgmma_fence(); mma_kblock<BN, kTA, kTB, 3>(acc, a, b); wgmma_commit(); break;
        default: wgmma_fence(); mma_kblock<BN, kTA, kTB>(acc, a, b); wgmma_commit();
      }
      wgmma_wait<1>();  // the previous k-block's wgmmas are done: its stage can be refilled
      if (kb > it.kb0) release(prev);
      prev = s;
      if (++s == C::kStages) {
        s = 0;
        phase ^= 1u;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) fence_operand(acc[i]);
#ifdef MXTRAIN_GG_CLOCKS
    ck_t2 = clock64();
    ck_main += ck_t2 - ck_t1;
#endif
    if (it.nk > it.kb0) release(prev);
    if (p.fault == 3) continue;  // timing only (MXTRAIN_GG_FAULT=noepi): the epilogue's cost by difference
    if (kMode == Mode::kWgrad && p.fault == 8) {  // timing only (epispin): an epilogue's time without its traffic
      const long long t_end = clock64() + 7000;
      while (clock64() < t_end) {
      }
      continue;
    }
    if constexpr (kMode == Mode::kFwd || kMode == Mode::kDgrad) {
      if (item >= ts.full && !split_sum<BN, kCl>(p, sc, ts, item, acc, rank, ct)) continue;  // another part ends it
    }
    // Wgrad with Params::sumsq: the clipping norm's share of this tile, summed as the values leave the registers
    // (dW is not read back); a warp's values out of the tile (rows >= M, columns >= N) are zeros.
    [[maybe_unused]] const bool norm = kMode == Mode::kWgrad && p.sumsq != nullptr;
    [[maybe_unused]] float sq = 0.f;
    if (kMode == Mode::kWgrad && p.out_bf16 && p.fault == 9) {  // test-only (bf16swap): each pair's columns swapped
#pragma unroll
      for (int q = 0; q < C::kAcc; q += 2) {
        const float t = acc[q];
        acc[q] = acc[q + 1];
        acc[q + 1] = t;
      }
    }

    // Epilogue straight from the accumulator fragments (layout: sm90_wgmma.cuh).
    const int r_local = cw * 64 + warp * 16 + lane / 4;
    const int col_l = 2 * (lane % 4);
    if (kMode == Mode::kWgrad && !p.tma_store) {
      // Straight from the registers: fire-and-forget L2 reductions (or stores when overwriting), so the next
      // item's mainloop starts at once. Each element of dW gets one add per launch: deterministic.
      const int64_t M = p.K, N = p.N;
      float* base = static_cast<float*>(p.out) + static_cast<int64_t>(it.e) * M * N;
      const int64_t ra = it.m0 + r_local, rb = ra + 8;
      if (p.out_bf16) {  // storing only (try_grouped_wgrad)
        uint32_t* wbase = reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.out) + static_cast<int64_t>(it.e) * M * N);
#pragma unroll
        for (int j = 0; j < C::kAcc / 4; ++j) {
          const int64_t n = it.n0 + 8 * j + col_l;
          const uint32_t va = bf16x2_norm(acc[4 * j], acc[4 * j + 1], sq, norm);
          const uint32_t vb = bf16x2_norm(acc[4 * j + 2], acc[4 * j + 3], sq, norm);
          if (n >= N) continue;
          if (ra < M) wbase[(ra * N + n) / 2] = va;
          if (rb < M) wbase[(rb * N + n) / 2] = vb;
        }
        if (norm) store_norm_slot<BN>(p, it.e, it.m0, it.n0, sq, cw * 4 + warp, lane);
        continue;
      }
#pragma unroll
      for (int j = 0; j < C::kAcc / 4; ++j) {
        const int64_t n = it.n0 + 8 * j + col_l;
        if (norm) {
#pragma unroll
          for (int k = 0; k < 4; ++k) sq = fmaf(acc[4 * j + k], acc[4 * j + k], sq);
        }
        if (n >= N) continue;
        if (ra < M) {
          if (p.overwrite) *reinterpret_cast<float2*>(base + ra * N + n) = make_float2(acc[4 * j], acc[4 * j + 1]);
          else red_add_f32x2(base + ra * N + n, acc[4 * j], acc[4 * j + 1]);
        }
        if (rb < M) {
          if (p.overwrite) *reinterpret_cast<float2*>(base + rb * N + n) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
          else red_add_f32x2(base + rb * N + n, acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
      if (norm) store_norm_slot<BN>(p, it.e, it.m0, it.n0, sq, cw * 4 + warp, lane);
    } else if constexpr (kMode == Mode::kWgrad) {
      // Box after box of this warpgroup's 64 rows: wait until the TMA has read the box written kEpiBufs ago,
      // write the fragments, make them visible to the async proxy, and hand the box to the TMA.
      // (The opaque copy keeps the compiler from hoisting the box addressing out of the item loop, where its
      // registers would be live across the mainloop and spill.)
      int r0 = warp * 16 + lane / 4;
      uint32_t boxes = smem + C::kOffEpi + cw * kEpiBufs * kEpiBox;
      asm volatile("" : "+r"(r0), "+r"(boxes));
      const int wt = ct % 128;
      const uint32_t bar_id = 2 + cw;
      if (p.out_bf16) {  // storing only: 64 x 32 bf16 boxes, the same 64-byte rows and swizzle as the f32 boxes
        // With Params::epi_one_bar, one barrier per box: before it, the issuing thread also waits until the box
        // after this one is free (its use kEpiBufs ago read by the TMA), so after it every thread may write that
        // box; the first box of a CTA was never used. Else two (session 58's form): free box, then written box.
        // The norm's squares are a compile-time branch, so a call without the norm issues none of them.
        // With Params::epi_stmatrix, a warp writes its 16 rows of a box in four stmatrix.x2 instead of eight
        // st.shared.b32 (sm90_epi_layout.hpp: the same bytes, the same rounding and norm order).
        auto store_boxes = [&](auto with_norm, auto with_stm) {
          constexpr bool kNorm = decltype(with_norm)::value, kStm = decltype(with_stm)::value;
          static_assert(!kStm || kEpiCols == 16, "stmatrix form: a box row is 32 bf16, four 16-byte pieces");
          uint32_t so = 0;
          if constexpr (kStm) {
            so = stmatrix_box_offset(warp, lane, 0);
            asm volatile("" : "+r"(so));
          }
#pragma unroll
          for (int c = 0; c < BN / (2 * kEpiCols); ++c) {
            const int b = epi_box;
            epi_box = epi_box + 1 == kEpiBufs ? 0 : epi_box + 1;
            if (!p.epi_one_bar) {
              if (wt == 0) CK_TIMED(bulk_wait_group_read<kEpiBufs - 1>());
              named_barrier_sync(bar_id, 128);
            }
            const uint32_t box = boxes + b * kEpiBox;
            if constexpr (kStm) {
              __syncwarp();  // stmatrix is .aligned: the warp converged after thread 0's TMA issue above
#pragma unroll
              for (int jj = 0; jj < kEpiCols / 4; ++jj) {
                const int ia = 4 * c * (kEpiCols / 4) + stmatrix_acc(jj, 0);
                const int ib = 4 * c * (kEpiCols / 4) + stmatrix_acc(jj, 1);
                const uint32_t va = bf16x2_norm(acc[ia], acc[ia + 1], sq, kNorm);
                const uint32_t vb = bf16x2_norm(acc[ib], acc[ib + 1], sq, kNorm);
                stmatrix_x2((box + so) ^ (16u * jj), va, vb);
              }
            } else {
#pragma unroll
              for (int jj = 0; jj < kEpiCols / 4; ++jj) {
                const int q = 4 * (c * (kEpiCols / 4) + jj), word = 4 * jj + lane % 4;
                st_shared_b32(box + sw64_offset(r0, word), bf16x2_norm(acc[q], acc[q + 1], sq, kNorm));
                st_shared_b32(box + sw64_offset(r0 + 8, word), bf16x2_norm(acc[q + 2], acc[q + 3], sq, kNorm));
              }
            }
            fence_proxy_async_smem();
            if (p.epi_one_bar && wt == 0) CK_TIMED(bulk_wait_group_read<kEpiBufs - 2>());
            named_barrier_sync(bar_id, 128);
            if (wt == 0) {
              tma_store_3d(mC, boxes + b * kEpiBox, it.n0 + 2 * kEpiCols * c, it.m0 + 64 * cw, it.e);
              bulk_commit_group();
            }
          }
        };
        if (norm) {
          if (p.epi_stmatrix)
            store_boxes(std::true_type{}, std::true_type{});
          else
            store_boxes(std::true_type{}, std::false_type{});
          store_norm_slot<BN>(p, it.e, it.m0, it.n0, sq, cw * 4 + warp, lane);
        } else if (p.epi_stmatrix) {
          store_boxes(std::false_type{}, std::true_type{});
        } else {
          store_boxes(std::false_type{}, std::false_type{});
        }
        continue;
      }
#pragma unroll
      for (int c = 0; c < BN / kEpiCols; ++c) {
        const int b = epi_box;
        epi_box = epi_box + 1 == kEpiBufs ? 0 : epi_box + 1;
        if (wt == 0) CK_TIMED(bulk_wait_group_read<kEpiBufs - 1>());
        named_barrier_sync(bar_id, 128);
        const uint32_t box = boxes + b * kEpiBox;
#pragma unroll
        for (int jj = 0; jj < kEpiCols / 8; ++jj) {
          const int q = 4 * (c * (kEpiCols / 8) + jj), col = 8 * jj + col_l;
          st_shared_f32x2(box + sw64_offset(r0, col), acc[q], acc[q + 1]);
          st_shared_f32x2(box + sw64_offset(r0 + 8, col), acc[q + 2], acc[q + 3]);
          if (norm) {
#pragma unroll
            for (int k = 0; k < 4; ++k) sq = fmaf(acc[q + k], acc[q + k], sq);
          }
        }
        fence_proxy_async_smem();
        named_barrier_sync(bar_id, 128);
        if (wt == 0 && p.fault != 7) {  // fault 7 (epiboxes): the boxes never leave, timing only
          if (p.overwrite)
            tma_store_3d(mC, boxes + b * kEpiBox, it.n0 + kEpiCols * c, it.m0 + 64 * cw, it.e);
          else
            tma_reduce_add_3d(mC, boxes + b * kEpiBox, it.n0 + kEpiCols * c, it.m0 + 64 * cw, it.e);
          bulk_commit_group();
        }
      }
      if (norm) store_norm_slot<BN>(p, it.e, it.m0, it.n0, sq, cw * 4 + warp, lane);
    } else if constexpr (kMode == Mode::kFwdSwiglu) {
      constexpr int kUp = BN / 4;  // accumulator offset of a gate element's up partner (BN/2 columns on)
      const int64_t f = p.N;
      if (p.tma_store && it.row0 + 64 * cw + 64 <= it.row_hi) {
        // Per 32 act columns, three 64 x 32 bf16 boxes through the ring: h13's gate part, its up part, act.
        int r0 = warp * 16 + lane / 4;
        uint32_t boxes = smem + C::kOffEpi + cw * kEpiBufs * kEpiBox;
        asm volatile("" : "+r"(r0), "+r"(boxes));
        const int wt = ct % 128;
        const uint32_t bar_id = 2 + cw;
        const int32_t row = it.row0 + 64 * cw;
        const float wa = p.wp[row + r0], wb = p.wp[row + r0 + 8];
#pragma unroll
        for (int c = 0; c < BN / 64; ++c) {
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            const int b = epi_box;
            epi_box = epi_box + 1 == kEpiBufs ? 0 : epi_box + 1;
            if (wt == 0) bulk_wait_group_read<kEpiBufs - 1>();
            named_barrier_sync(bar_id, 128);
            const uint32_t box = boxes + b * kEpiBox;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
              const int q = 4 * (4 * c + jj), col = 4 * jj + lane % 4;
              uint32_t va, vb;
              if (part == 0) {
                va = pack_bf16x2(acc[q], acc[q + 1]);
                vb = pack_bf16x2(acc[q + 2], acc[q + 3]);
              } else if (part == 1) {
                va = pack_bf16x2(acc[q + kUp], acc[q + kUp + 1]);
                vb = pack_bf16x2(acc[q + kUp + 2], acc[q + kUp + 3]);
              } else {
                va = pack_bf16x2(swiglu_act(acc[q], acc[q + kUp], wa), swiglu_act(acc[q + 1], acc[q + kUp + 1], wa));
                vb = pack_bf16x2(swiglu_act(acc[q + 2], acc[q + kUp + 2], wb),
                                 swiglu_act(acc[q + 3], acc[q + kUp + 3], wb));
              }
              st_shared_b32(box + sw64_offset(r0, col), va);
              st_shared_b32(box + sw64_offset(r0 + 8, col), vb);
            }
            fence_proxy_async_smem();
            named_barrier_sync(bar_id, 128);
            if (wt == 0) {
              const CUtensorMap* m = part == 0 ? mC : &sm->a[part - 1];
              tma_store_2d(m, boxes + b * kEpiBox, it.n0 + 32 * c, row);
              bulk_commit_group();
            }
          }
        }
      } else {
        bf16* h13 = static_cast<bf16*>(p.out);
        bf16* act = static_cast<bf16*>(p.act);
        const int64_t ra = static_cast<int64_t>(it.row0) + r_local, rb = ra + 8;
        const bool va = ra < it.row_hi, vb = rb < it.row_hi;  // only this expert's rows
        const float wa = va ? p.wp[ra] : 0.f, wb = vb ? p.wp[rb] : 0.f;
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
          const int64_t n = it.n0 + 8 * j + col_l;
          const int q = 4 * j;
          if (n >= f) continue;
          if (va) {
            st_bf16x2(h13 + ra * 2 * f + n, acc[q], acc[q + 1]);
            st_bf16x2(h13 + ra * 2 * f + f + n, acc[q + kUp], acc[q + kUp + 1]);
            st_bf16x2(act + ra * f + n, swiglu_act(acc[q], acc[q + kUp], wa), swiglu_act(acc[q + 1], acc[q + kUp + 1], wa));
          }
          if (vb) {
            st_bf16x2(h13 + rb * 2 * f + n, acc[q + 2], acc[q + 3]);
            st_bf16x2(h13 + rb * 2 * f + f + n, acc[q + kUp + 2], acc[q + kUp + 3]);
            st_bf16x2(act + rb * f + n, swiglu_act(acc[q + 2], acc[q + kUp + 2], wb),
                      swiglu_act(acc[q + 3], acc[q + kUp + 3], wb));
          }
        }
      }
    } else if constexpr (kMode == Mode::kDgradSwiglu) {
      const int64_t f = p.N;
      bf16* dh13 = static_cast<bf16*>(p.out);
      const int64_t ra = static_cast<int64_t>(it.row0) + r_local, rb = ra + 8;
      const bool va = ra < it.row_hi, vb = rb < it.row_hi;  // only this expert's rows
      const float wa = va ? p.wp[ra] : 0.f, wb = vb ? p.wp[rb] : 0.f;
      float sa = 0.f, sb = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t n = it.n0 + 8 * j + col_l;
        if (n >= f) continue;
        if (va) swiglu_bwd_pair(acc[4 * j], acc[4 * j + 1], p.h13 + ra * 2 * f + n, f, wa, dh13 + ra * 2 * f + n, sa);
        if (vb)
          swiglu_bwd_pair(acc[4 * j + 2], acc[4 * j + 3], p.h13 + rb * 2 * f + n, f, wb, dh13 + rb * 2 * f + n, sb);
      }
      // The 4 lanes of a quad hold the same two rows: their sums, then one partial per row and n-tile.
      sa += __shfl_xor_sync(0xffffffffu, sa, 1);
      sa += __shfl_xor_sync(0xffffffffu, sa, 2);
      sb += __shfl_xor_sync(0xffffffffu, sb, 1);
      sb += __shfl_xor_sync(0xffffffffu, sb, 2);
      const int64_t tiles = (f + BN - 1) / BN, t = it.n0 / BN;
      if (lane % 4 == 0) {
        if (va) p.part[ra * tiles + t] = sa;
        if (vb) p.part[rb * tiles + t] = sb;
      }
    } else if (p.tma_store && it.row0 + 64 * cw + 64 <= it.row_hi) {
      // The warpgroup's 64 rows all belong to the expert: 64 x 32 bf16 boxes through the same ring, stored by
      // the TMA (columns past N clipped), so the consumers start the next item while the stores drain.
      int r0 = warp * 16 + lane / 4;
      uint32_t boxes = smem + C::kOffEpi + cw * kEpiBufs * kEpiBox;
      asm volatile("" : "+r"(r0), "+r"(boxes));
      const int wt = ct % 128;
      const uint32_t bar_id = 2 + cw;
#pragma unroll
      for (int c = 0; c < BN / 32; ++c) {
        const int b = epi_box;
        epi_box = epi_box + 1 == kEpiBufs ? 0 : epi_box + 1;
        if (wt == 0) bulk_wait_group_read<kEpiBufs - 1>();
        named_barrier_sync(bar_id, 128);
        const uint32_t box = boxes + b * kEpiBox;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          // bf16 pairs: 4-byte words at the fp32 box's word positions (64-byte rows either way).
          const int q = 4 * (4 * c + jj), col = 4 * jj + lane % 4;
          st_shared_b32(box + sw64_offset(r0, col), pack_bf16x2(acc[q], acc[q + 1]));
          st_shared_b32(box + sw64_offset(r0 + 8, col), pack_bf16x2(acc[q + 2], acc[q + 3]));
        }
        fence_proxy_async_smem();
        named_barrier_sync(bar_id, 128);
        if (wt == 0) {
          tma_store_2d(mC, boxes + b * kEpiBox, it.n0 + 32 * c, it.row0 + 64 * cw, hc);
          bulk_commit_group();
        }
      }
    } else {
      const int64_t N = p.N;
      bf16* out = static_cast<bf16*>(p.out);
      const int64_t ra = static_cast<int64_t>(it.row0) + r_local, rb = ra + 8;
      const int32_t hi = p.fault == 1 ? p.R : it.row_hi;
      const bool va = ra < hi, vb = rb < hi;  // only this expert's rows
#pragma unroll
      for (int j = 0; j < C::kAcc / 4; ++j) {
        const int64_t n = it.n0 + 8 * j + col_l;
        if (n < N) {
          if (va) st_bf16x2(out + ra * N + n, acc[4 * j], acc[4 * j + 1]);
          if (vb) st_bf16x2(out + rb * N + n, acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
  }
#ifdef MXTRAIN_GG_CLOCKS
  if (kMode == Mode::kWgrad && ck_items > 0 && ct % 128 == 0) {
    ck_epi += clock64() - ck_t2;
    unsigned long long* g = g_gg_clocks[cw];
    atomicAdd(g + 0, ck_ramp);
    atomicAdd(g + 1, ck_main);
    atomicAdd(g + 2, ck_wait);
    atomicAdd(g + 3, ck_epi);
    atomicAdd(g + 4, ck_items);
    atomicAdd(g + 5, ck_bwait);
    atomicAdd(g + 6, ck_pre);
  }
#endif
}

// Zeroes rows [used, R) of out [R, cols] (bf16, cols a multiple of 8, 16-byte aligned) with 16-byte stores,
// spread over the producer warpgroup's idle warps of every CTA.
__device__ __forceinline__ void zero_padding(const Params& p, void* out, int64_t cols, int32_t used, int t,
                                             int nthreads) {
  zero_words16(reinterpret_cast<uint4*>(static_cast<bf16*>(out) + static_cast<int64_t>(used) * cols),
               static_cast<int64_t>(p.R - used) * (cols / 8), t, nthreads);
}

template <Mode kMode, int BN, int kCl>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_sm90_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                        const __grid_constant__ CUtensorMap tmC, const __grid_constant__ SetMaps sets,
                        const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<BN>;
  extern __shared__ uint8_t smem_raw[];
  // Swizzled TMA destinations and wgmma descriptors (base offset 0) need 1024-byte-aligned buffers.
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* smem_ptr = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t smem = smem_u32(smem_ptr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_ptr + C::kOffBar);
  uint64_t* empty = full + C::kStages;
  Sched& sc = *reinterpret_cast<Sched*>(smem_ptr + C::kOffSched);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Work items per expert from the device offsets (clamped into [0, R], non-decreasing: a bad table cannot
  // cause out-of-bounds accesses).
  if (kMode == Mode::kWgrad && tid < p.sets) {
    const int32_t R_s = tid == 0 ? p.R : p.set_R[tid];
    const int32_t end = clamp_to(tid == 0 ? p.offsets[p.E] : p.set_offsets[tid][p.E], R_s);
    sc.unk[tid] = end < R_s ? end : INT32_MAX;
  }
  for (int e = tid; e < p.E; e += kThreads) {
    const int32_t lo = clamp_to(p.offsets[e], p.R);
    int32_t hi = clamp_to(p.offsets[e + 1], p.R);
    if (hi < lo) hi = lo;
    // Gathered tails: the sets before the last keep their whole k-blocks (the rest is in the last set).
    if (kMode == Mode::kWgrad && p.tails_gathered && p.sets > 1) hi = lo + (hi - lo) / BK * BK;
    sc.lo[e] = lo;
    sc.hi[e] = hi;
    if constexpr (kMode == Mode::kWgrad) {
      int32_t nk = (hi - lo + BK - 1) / BK;
      for (int s = 1; s < p.sets; ++s) {
        const int32_t ls = clamp_to(p.set_offsets[s][e], p.set_R[s]);
        int32_t hs = clamp_to(p.set_offsets[s][e + 1], p.set_R[s]);
        if (hs < ls) hs = ls;
        if (p.tails_gathered && s < p.sets - 1) hs = ls + (hs - ls) / BK * BK;
        sc.slo[(s - 1) * p.E + e] = ls;
        sc.shi[(s - 1) * p.E + e] = hs;
        nk += (hs - ls + BK - 1) / BK;
      }
      sc.mtiles[e] = nk;
      // Overwriting: every dW[e] is stored, zeros where the expert has no rows.
      sc.cum[e + 1] = nk > 0 || p.overwrite ? p.m_tiles * p.n_units : 0;
    } else {
      const int32_t mt = (hi - lo + BM - 1) / BM;
      sc.mtiles[e] = mt;
      sc.cum[e + 1] = row_units_of_expert(mt, p.n_units, kCl, p.odd_tail != 0);
    }
  }
  if (tid == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      mbar_init(&full[i], 1);       // the producer's arrive.expect_tx (+ the TMA bytes)
      mbar_init(&empty[i], 8 * kCl);  // one arrival per consumer warp of each CTA writing the stage
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    if constexpr (kMode == Mode::kWgrad) {
      order_experts(sc, p.E, p.order_rows != 0, lane);
      if (p.order_out != nullptr && blockIdx.x == 0)
        for (int i = lane; i < p.E; i += 32) p.order_out[i] = sc.order[i];
    }
    warp_prefix_over_experts(sc.cum, p.E, lane);
  }
  __syncthreads();
  // Units: clusters walk the work items; both CTAs of a cluster take the same item.
  const int rank = kCl > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  const int unit0 = static_cast<int>(blockIdx.x) / kCl, units_stride = static_cast<int>(gridDim.x) / kCl;
  if constexpr (kCl > 1) cluster_sync();  // the peer's barriers are initialised before any remote arrival

  if (warp < 4) {  // producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0) {
      if (lane == 0)
        produce<kMode, BN, kCl>(&tmA, &tmB, &sets, sc, p, smem, full, empty, rank, unit0, units_stride);
    } else if constexpr (kMode == Mode::kFwdSwiglu) {
      const int32_t used = clamp_to(p.offsets[p.E], p.R);
      zero_padding(p, p.out, 2 * static_cast<int64_t>(p.N), used, tid - 32, 96);
      zero_padding(p, p.act, p.N, used, tid - 32, 96);
    } else if constexpr (kMode == Mode::kDgradSwiglu) {
      zero_padding(p, p.out, 2 * static_cast<int64_t>(p.N), clamp_to(p.offsets[p.E], p.R), tid - 32, 96);
    } else if constexpr (kMode != Mode::kWgrad) {
      zero_padding(p, p.out, p.N, clamp_to(p.offsets[p.E], p.R), tid - 32, 96);
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    consume<kMode, BN, kCl>(&tmC, &sets, sc, p, smem_ptr, smem, full, empty, rank, unit0, units_stride);
    // The epilogue boxes stay allocated until the TMA has read them (as CUTLASS's TMA store epilogue).
    if (tid % 128 == 0) bulk_wait_group_read<0>();
  }
  // No CTA may exit while its peer can still arrive on its barriers. Every thread gets here (no early return).
  if constexpr (kCl > 1) cluster_sync();
#else
  __trap();  // built without sm_90a: the host never launches this (see device_ok)
#endif
}

// dwp[r] = the sum of row r's partials in n-tile order (rows past offsets[E]: 0).
__global__ void dwp_from_partials(const float* __restrict__ part, int64_t tiles, const int32_t* offsets, int32_t E,
                                  int32_t R, float* __restrict__ dwp) {
  const int32_t used = clamp_to(offsets[E], R);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < R;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.f;
    if (r < used)
      for (int64_t t = 0; t < tiles; ++t) s += part[r * tiles + t];
    dwp[r] = s;
  }
}

// ---- host side -------------------------------------------------------------------------------------------

std::atomic<int> g_impl_override{static_cast<int>(GroupedImpl::Auto)};
std::atomic<int> g_tile_n{0};
std::atomic<int> g_cluster{0};
std::atomic<int> g_store{0};  // 0: env, 1: TMA stores, 2: direct stores
std::atomic<int> g_wgrad_tma{0};  // 0: env, 1: TMA reduce-adds, 2: red.global
std::atomic<int> g_swiglu{0};     // 0: env, 1: SwiGLU fused into the expert GEMMs, 2: separate kernels
std::atomic<int> g_wgrad_tail{-1};  // -1: env, else a WgradTail
std::atomic<int> g_wgrad_pair{-1};  // -1: env, 0: pairs over n-tiles (share dy), 1: over m-tiles (share x)
std::atomic<int> g_tail_split{-1};  // -1: env, else the most parts of a split unit (< 2: off)
std::atomic<int> g_wgrad_group{-1};  // -1: env, else fast units per raster group (0: one group)
std::atomic<int> g_wgrad_epi_bars{-1};  // -1: env, else barriers per bf16 epilogue box (1 or 2)
std::atomic<int> g_wgrad_epi_stm{-1};   // -1: env, 0: st.shared words, 1: stmatrix (bf16 epilogue boxes)
std::atomic<int> g_wgrad_order{-1};  // -1: env, 0: experts in index order, 1: by decreasing k-blocks
std::atomic<bool> g_record_order{false};  // tests: the wgrad launches write their expert order to g_dev_order
__device__ int32_t g_dev_order[kMaxExperts];
std::atomic<int> g_wgrad_gather{-1};  // -1: env, else 1 = gather the row sets' tails, 0 = leave them in place
std::atomic<int> g_wgrad_lockstep{-1};  // -1: env, else 1 = gate each item on the grid's progress, 0 = off
std::atomic<int> g_l2_hints{-1};    // -1: env, else a mask of the directions with hints (l2_hints)
thread_local const char* g_last_impl = "none";

// The index in `choices` of environment variable `var`'s value, read once per call site (unset or empty: 0); an
// error naming the variable, its value and the choices for anything else.
int env_choice(const char* var, std::initializer_list<const char*> choices) {
  const char* s = std::getenv(var);
  if (s == nullptr || *s == 0) return 0;
  int i = 0;
  std::string list;
  for (const char* c : choices) {
    if (!std::strcmp(s, c)) return i;
    list += (i++ ? ", " : "") + std::string(c);
  }
  cuda::fail("grouped_gemm", std::string(var) + " must be one of " + list + ", got '" + s + "'");
}

GroupedImpl env_impl() {
  static const GroupedImpl v = [] {
    const int i = env_choice("MXTRAIN_GROUPED_GEMM", {"auto", "sm90", "tma", "wmma"});
    return i == 0 ? GroupedImpl::Auto : i == 3 ? GroupedImpl::Wmma : GroupedImpl::Sm90;
  }();
  return v;
}

int tile_n() {
  const int o = g_tile_n.load();
  if (o != 0) return o;
  static const int v = env_choice("MXTRAIN_GG_BN", {"256", "128"}) == 0 ? 256 : 128;
  return v;
}

// CTA pairs by default: under the H200's power cap the trainer runs faster with the pair's shared tile (8x7B
// layers +1.9%, 8x1B and MXFP8 equal, the same losses bit for bit; docs/perf.md, session 24), though a lone call
// is no faster (session 22).
int cluster_size() {
  const int o = g_cluster.load();
  if (o != 0) return o;
  static const int v = env_choice("MXTRAIN_GG_CLUSTER", {"2", "1"}) == 0 ? 2 : 1;
  return v;
}

// One direction's cluster size (0 forward, 1 dgrad, 2 wgrad): MXTRAIN_GG_CLUSTER_FWD / _DGRAD / _WGRAD = 2|1
// override MXTRAIN_GG_CLUSTER there. An experiment's knob: in the bench's short calls one CTA runs the forward
// faster (654 against 582 TFLOP/s at 8x7B W13), in the trainer's step the pairs are faster overall (+1.4%;
// session 29).
int cluster_size(int dir) {
  const int o = g_cluster.load();
  if (o != 0) return o;
  static const int per[3] = {env_choice("MXTRAIN_GG_CLUSTER_FWD", {"", "2", "1"}),
                             env_choice("MXTRAIN_GG_CLUSTER_DGRAD", {"", "2", "1"}),
                             env_choice("MXTRAIN_GG_CLUSTER_WGRAD", {"", "2", "1"})};
  return per[dir] == 0 ? cluster_size() : per[dir] == 1 ? 2 : 1;
}

// Forward / dgrad epilogue: TMA stores (default; env MXTRAIN_GG_STORE=tma) or direct register stores (direct).
bool store_epilogue() {
  const int o = g_store.load();
  if (o != 0) return o == 1;
  static const bool v = env_choice("MXTRAIN_GG_STORE", {"tma", "direct"}) == 0;
  return v;
}

// CTA pairs, forward / dgrad: an expert's odd last m-tile runs over two n-tiles (default; env
// MXTRAIN_GG_ODD_TAIL=pair) or as a pair whose second CTA has no rows (pad: the kernel before session 27).
int odd_tail_pairs() {
  static const int v = env_choice("MXTRAIN_GG_ODD_TAIL", {"pair", "pad"});
  return v == 0 ? 1 : 0;
}

// Whether the wgrad pulls each dW tile into L2 before adding to it (env MXTRAIN_GG_WGRAD_PREFETCH=tensor|off).
int wgrad_prefetch() {
  static const int v = env_choice("MXTRAIN_GG_WGRAD_PREFETCH", {"tensor", "off"});
  return v == 0 ? 1 : 0;
}

// Weight-gradient epilogue: TMA reduce-adds (default; env MXTRAIN_GG_WGRAD_EPI=tma) or red.global (red).
bool wgrad_tma_epilogue() {
  const int o = g_wgrad_tma.load();
  if (o != 0) return o == 1;
  static const bool v = env_choice("MXTRAIN_GG_WGRAD_EPI", {"tma", "red"}) == 0;
  return v;
}

// SwiGLU in the expert GEMMs' epilogues (env MXTRAIN_GG_SWIGLU=fused) or the separate kernels (default: faster on
// H200, docs/perf.md, session 21).
bool swiglu_fused() {
  const int o = g_swiglu.load();
  if (o != 0) return o == 1;
  static const bool v = env_choice("MXTRAIN_GG_SWIGLU", {"separate", "fused"}) == 1;
  return v;
}

// Wgrad tail k-blocks (WgradTail): env MXTRAIN_GG_WGRAD_TAIL=steps (default) | zero.
int wgrad_tail_mode() {
  const int o = g_wgrad_tail.load();
  if (o >= 0) return o;
  static const int v = env_choice("MXTRAIN_GG_WGRAD_TAIL", {"steps", "zero"}) == 0 ? kTailSteps : kTailZero;
  return v;
}

// Wgrad over several row sets: each set's partial last k-block of an expert moves into one gathered tail set
// (gather_wgrad_tails; default, env MXTRAIN_GG_WGRAD_GATHER=on) or stays in place (off). Session 45: with every
// micro-batch's expert loads a multiple of 64 rows (forced balance) the 8x7B weight gradient took 4 ms less per step.
bool wgrad_gather() {
  const int o = g_wgrad_gather.load();
  if (o >= 0) return o == 1;
  static const bool v = env_choice("MXTRAIN_GG_WGRAD_GATHER", {"on", "off"}) == 0;
  return v;
}

// Wgrad lockstep (wgrad_lockstep_wait): env MXTRAIN_GG_WGRAD_LOCKSTEP=auto (default: on for calls over several row
// sets, the trainer's expert_wgrad_micro_batches call, where it was measured) | on | off. Session 51's ncu: that
// W13 call read about 60 GB from DRAM for the 4.3 GB it needs, its CTAs' shared strips leaving L2 as the CTAs drift
// apart; with lockstep the call ran 3-6% faster and the 8x7B step 1.35-1.6%. One row set: not measured, off. Beside
// an exchange (expert parallelism's overlapped combine) a CTA may wait for an SM the collective holds: off there.
bool wgrad_lockstep(int nsets, bool exchange_alongside) {
  const int o = g_wgrad_lockstep.load();
  if (o >= 0) return o == 1;
  static const int v = env_choice("MXTRAIN_GG_WGRAD_LOCKSTEP", {"auto", "on", "off"});
  return v == 1 || (v == 0 && nsets >= 2 && !exchange_alongside);
}

// Wgrad CTA pairs: over two m-tiles sharing the x tile (default; env MXTRAIN_GG_WGRAD_PAIR=m) or over two n-tiles
// sharing the dy tile (n). Session 30's ncu: the 8x7B trainer-shape W13 wgrad moved 60 GB from DRAM in n-pairs,
// 103 GB in single CTAs, for 8 GB of operands and output; each tile loads 2 MB of dy and 4 MB of x, so sharing x
// halves the larger part. Measured: W13 +2% (trainer shape) and +4.5% (one call), W2 -0.8% / +2.7%, the 8x7B step
// +0.3% in both of two alternating pairs (within the run-to-run noise), the same sums bit for bit.
int wgrad_pair_m() {
  const int o = g_wgrad_pair.load();
  if (o >= 0) return o;
  static const int v = env_choice("MXTRAIN_GG_WGRAD_PAIR", {"m", "n"}) == 0 ? 1 : 0;
  return v;
}

// An integer env var in [lo, hi] (unset or empty: fallback); anything else fails, naming the variable.
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == 0) return fallback;
  char* end = nullptr;
  const long n = std::strtol(s, &end, 10);
  if (*end != 0 || n < lo || n > hi)
    cuda::fail("grouped_gemm", std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " +
                                   std::to_string(hi) + "], got '" + s + "'");
  return static_cast<int>(n);
}

// Wgrad raster: the fast index (n-tiles at W13's shape, m-tiles at W2's) walks groups of this many units
// (wgrad_unit), env MXTRAIN_GG_WGRAD_GROUP=g (0: one group, the plain raster). Unset: groups of 8 for calls over
// several row sets (the trainer's expert_wgrad_micro_batches call), else the plain raster. Session 31 (fp32 dW):
// groups of 4 or 8 made the 8x7B step 0.1-0.3% faster, within noise. Session 59, with the bf16 dW: groups of 8
// +0.31% at 8x7B over four alternating rounds (each round at or above the plain raster), +0.13% at 8x1B over three;
// the single call storing bf16 ran the same either way. The sums are the same bit for bit.
int wgrad_group(int nsets) {
  const int o = g_wgrad_group.load();
  if (o >= 0) return o;
  static const int v = env_int("MXTRAIN_GG_WGRAD_GROUP", -1, 0, 4096);
  return v >= 0 ? v : nsets >= 2 ? 8 : 0;
}

// Wgrad storing bf16 through the TMA: named barriers per 64 x 32 box (env MXTRAIN_GG_WGRAD_EPI_BARS=1|2; default 1).
// Session 61's ncu of the single W13 call (H100): the epilogue is 10.5% of its cycles, its barrier waits the largest
// part of that. The same bits either way.
int wgrad_epi_bars() {
  const int o = g_wgrad_epi_bars.load();
  if (o >= 0) return o;
  static const int v = env_choice("MXTRAIN_GG_WGRAD_EPI_BARS", {"1", "2"}) + 1;
  return v;
}

// Wgrad storing bf16 through the TMA: a warp's 16 rows of a 64 x 32 box by four stmatrix.x2 (the default; env
// MXTRAIN_GG_WGRAD_EPI_STORE=stmatrix) or by eight st.shared.b32 (words). Half the epilogue's shared-store
// instructions, for the W2 call whose epilogue ncu puts at 9.5% of its cycles; the same bits either way. Session 73
// (H100, two bench runs): the single W2 call +0.5% / +0.6%, W13 +0.7% / +0.5%, the 8x7B step +0.3% over 3 rounds.
bool wgrad_epi_stmatrix() {
  const int o = g_wgrad_epi_stm.load();
  if (o >= 0) return o == 1;
  static const bool v = env_choice("MXTRAIN_GG_WGRAD_EPI_STORE", {"stmatrix", "words"}) == 0;
  return v;
}

// Wgrad schedule: the experts in decreasing order of their k-blocks (order_experts; env MXTRAIN_GG_WGRAD_ORDER=rows)
// or in index order (index, the default until measured). The same sums bit for bit.
bool wgrad_order_rows() {
  const int o = g_wgrad_order.load();
  if (o >= 0) return o == 1;
  static const int v = env_choice("MXTRAIN_GG_WGRAD_ORDER", {"index", "rows"});
  return v == 1;
}

// Forward / dgrad: the last round's units split along K into at most this many parts (tail_split; env
// MXTRAIN_GG_TAIL_SPLIT=n, 0 or 1 off; default 8).
int tail_split_max() {
  const int o = g_tail_split.load();
  if (o >= 0) return o;
  static const int v = env_int("MXTRAIN_GG_TAIL_SPLIT", 8, 0, 64);
  return v;
}

// L2 eviction priorities on the operand loads and output stores, per direction (env MXTRAIN_GG_L2_HINTS=off|on|
// fwd|dgrad|wgrad; default off): forward: x (read again for every n-tile) evict_last, W (read by the m-tiles of one
// n-tile at once) and y evict_first; dgrad: W and dx evict_first; wgrad in raster groups: the grouped operand's
// strips (read again by every slow unit) evict_last, the other evict_first. Session 31: all three made the 8x7B
// step 1.4% slower, the dgrad's alone 0.1-0.3% (in the bench's short bursts that dgrad ran 1-9% faster).
bool l2_hints(int dir) {
  const int o = g_l2_hints.load();
  static const int env = [] {
    const int i = env_choice("MXTRAIN_GG_L2_HINTS", {"off", "on", "fwd", "dgrad", "wgrad"});
    return i == 0 ? 0 : i == 1 ? kL2HintsAll : 1 << (i - 2);
  }();
  return ((o >= 0 ? o : env) >> dir) & 1;
}

// MXTRAIN_GG_FAULT=mask|tail|pairm|norm|split|bf16swap breaks the kernels on purpose, so a GPU run can check that
// the tests catch it. noepi, epiboxes and epispin are timing only (wrong sums): the weight gradient without its
// epilogue, with its boxes written but never sent, with a 7,000-cycle spin in its place (session 43's in-GEMM
// clocks).
int fault_injection() {
  static const int v = env_choice("MXTRAIN_GG_FAULT", {"none", "mask", "tail", "noepi", "pairm", "norm", "split",
                                                      "epiboxes", "epispin", "bf16swap"});
  return v;
}

bool wants_sm90() {
  const auto o = static_cast<GroupedImpl>(g_impl_override.load());
  const GroupedImpl impl = o != GroupedImpl::Auto ? o : env_impl();
  return impl != GroupedImpl::Wmma;
}

bool device_ok(int device) {
  static std::atomic<int> cache[64];
  return device_runs_sm90a(device, reinterpret_cast<const void*>(grouped_sm90_kernel<Mode::kFwd, 256, 1>), cache);
}

// A bf16 tensor map with 128-byte swizzle; dims innermost first, strides in bytes (rank - 1 of them). On failure
// (a geometry the driver rejects) says so once on stderr and returns false: the caller falls back to wmma, and
// the sm90 tests, which assert the path taken, report it.
bool make_map(CUtensorMap& m, const char* op, const char* what, const void* ptr, int rank, const cuuint64_t* dims,
              const cuuint64_t* strides, const cuuint32_t* box,
              CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const auto encode = tensor_map_encoder("grouped_gemm");
  const CUresult r = encode(&m, type, static_cast<cuuint32_t>(rank), const_cast<void*>(ptr), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return true;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    std::string d, b;
    for (int i = 0; i < rank; ++i) {
      d += (i ? "x" : "") + std::to_string(dims[i]);
      b += (i ? "x" : "") + std::to_string(box[i]);
    }
    std::fprintf(stderr, "%s: cuTensorMapEncodeTiled failed (error %d) for %s (dims %s, box %s): using the wmma "
                 "kernels for such shapes\n", op, static_cast<int>(r), what, d.c_str(), b.c_str());
  }
  return false;
}

// Shapes every mode shares: sizes in range, 16-byte row strides for TMA.
bool shapes_ok(int64_t E, int64_t R, int64_t out, int64_t in) {
  if (E < 1 || E > kMaxExperts || R < 1 || R > INT32_MAX) return false;
  if (out < 8 || in < 8 || out % 8 || in % 8 || out > INT32_MAX || in > INT32_MAX) return false;
  return true;
}

// Launches kernel<kMode, BN, kCl> persistently: at most one cluster per co-resident slot, at most one per unit.
template <Mode kMode, int BN, int kCl>
void launch(const char* op, const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& c, const SetMaps& sets,
            const Params& p, int64_t max_units, CudaContext& ctx) {
  auto kernel = grouped_sm90_kernel<kMode, BN, kCl>;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCl;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes<BN>();
  cfg.stream = ctx.stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // Per instantiation, once: the shared-memory opt-in and how many clusters fit on the device at once.
  static std::atomic<int> slots{0};
  if (slots.load() == 0) {
    cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<BN>()), op,
                "cudaFuncSetAttribute(shared memory)");
    int n = 0;
    if (kCl > 1) {
      cfg.gridDim = dim3(kCl * 64);
      cuda::check(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg), op, "cudaOccupancyMaxActiveClusters");
    } else {
      n = ctx.num_sms;
    }
    if (n < 1)
      cuda::fail(op, "no cluster of " + std::to_string(kCl) + " CTAs fits on the device" +
                         (kCl > 1 ? std::string(" (MXTRAIN_GG_CLUSTER=1 runs the 1-CTA kernels)") : std::string()));
    if (std::getenv("MXTRAIN_GG_VERBOSE") != nullptr)
      std::fprintf(stderr, "%s: sm90 kernel mode %d, tile 128 x %d, cluster %d: %d co-resident, %d B shared\n", op,
                   static_cast<int>(kMode), BN, kCl, n, smem_bytes<BN>());
    slots.store(n);
  }
  // Clusters scale down with the SMs left to a concurrent collective.
  const int64_t n = std::max<int64_t>(1, slots.load() * ctx.gemm_sms() / ctx.num_sms);
  cfg.gridDim = dim3(static_cast<unsigned>(kCl * (max_units < 1 ? 1 : (max_units < n ? max_units : n))));
  cuda::check(cudaLaunchKernelEx(&cfg, kernel, a, b, c, sets, p), op, "kernel launch");
  stage_mark(op);
}

template <Mode kMode>
void launch_cfg(const char* op, const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& c, const Params& p,
                int64_t max_units, CudaContext& ctx, int bn, int cl, const SetMaps& sets = SetMaps{}) {
  if constexpr (kMode == Mode::kFwdSwiglu || kMode == Mode::kDgradSwiglu) {  // no cluster variants
    if (bn == 128) launch<kMode, 128, 1>(op, a, b, c, sets, p, max_units, ctx);
    else launch<kMode, 256, 1>(op, a, b, c, sets, p, max_units, ctx);
    return;
  }
  if (bn == 128 && cl == 1) launch<kMode, 128, 1>(op, a, b, c, sets, p, max_units, ctx);
  else if (bn == 128) launch<kMode, 128, 2>(op, a, b, c, sets, p, max_units, ctx);
  else if (cl == 1) launch<kMode, 256, 1>(op, a, b, c, sets, p, max_units, ctx);
  else launch<kMode, 256, 2>(op, a, b, c, sets, p, max_units, ctx);
}

// The host-side pieces the three row modes (forward, dgrad, their SwiGLU variants) share.

// An upper bound on sum_e ceil(rows_e / BM) * n_units for R rows over E experts.
int64_t row_units(int64_t R, int64_t E, int64_t n_units) { return ((R + BM - 1) / BM + E) * n_units; }

// A row operand [R, K] bf16 (x or dy), read as boxes of 64 k x box_rows rows.
bool rows_map(CUtensorMap& m, const char* op, const char* what, const bf16* p, int64_t K, int64_t R,
              int64_t box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(R)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * 2};
  const cuuint32_t box[2] = {BK, static_cast<cuuint32_t>(box_rows)};
  return make_map(m, op, what, p, 2, dims, strides, box);
}

// Expert weights W [E, rows, cols] row-major (dims innermost first), read as boxes of 64 columns x box_rows rows.
bool weight_map(CUtensorMap& m, const char* op, const char* what, const bf16* W, int64_t E, int64_t rows,
                int64_t cols, int64_t box_rows) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(E)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * 2, static_cast<cuuint64_t>(cols * rows) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(BK), static_cast<cuuint32_t>(box_rows), 1};
  return make_map(m, op, what, W, 3, dims, strides, box);
}

// A bf16 output of R rows x cols columns, row_stride elements apart, stored in 32-column x 64-row boxes
// (64-byte rows, 64-byte swizzle).
bool store_map(CUtensorMap& m, const char* op, const char* what, bf16* p, int64_t cols, int64_t R,
               int64_t row_stride) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(R)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {32, 64};
  return make_map(m, op, what, p, 2, dims, strides, box, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                  CU_TENSOR_MAP_SWIZZLE_64B);
}

Params row_params(const int32_t* off, int64_t E, int64_t R, int64_t N, int64_t K, int64_t n_units, void* out) {
  Params p{};
  p.offsets = off;
  p.E = static_cast<int32_t>(E);
  p.R = static_cast<int32_t>(R);
  p.N = static_cast<int32_t>(N);
  p.K = static_cast<int32_t>(K);
  p.n_units = static_cast<int32_t>(n_units);
  p.out = out;
  p.fault = fault_injection();
  p.odd_tail = odd_tail_pairs();
  return p;
}

// The split parts' workspace (tail_split): a partial tile per CTA (at most one CTA per SM) and a count per CTA,
// zeroed once (each launch leaves the counts at zero).
void split_workspace(Params& p, CudaContext& ctx) {
  p.split_max = tail_split_max();
  if (p.split_max < 2) return;
  const size_t ctas = static_cast<size_t>(ctx.num_sms);
  p.split_ws = static_cast<float*>(ctx.scratch("gg_split_partials", ctas * kConsumerThreads * Cfg<256>::kAcc * 4));
  p.split_cnt = static_cast<int32_t*>(ctx.scratch("gg_split_counts", ctas * sizeof(int32_t)));
  if (ctx.split_counts_zeroed != p.split_cnt) {
    cuda::check(cudaMemsetAsync(p.split_cnt, 0, ctas * sizeof(int32_t), ctx.stream), "grouped_gemm",
                "zeroing the split counts");
    ctx.split_counts_zeroed = p.split_cnt;
  }
}

// The forward's and dgrad's L2 priorities (l2_hints).
void row_hints(Params& p, bool forward) {
  if (!l2_hints(forward ? 0 : 1)) return;
  p.hint_a = forward ? kL2EvictLast : kL2None;
  p.hint_b = kL2EvictFirst;
  p.hint_c = kL2EvictFirst;
}

// Forward and dgrad share everything but B's layout: out [R, N] from in [R, K].
template <Mode kMode>
bool try_rows(const char* op, const bf16* in, const bf16* W, const int32_t* off, int64_t E, int64_t R,
              int64_t w_out, int64_t w_in, bf16* out, CudaContext& ctx) {
  if (!wants_sm90() || !shapes_ok(E, R, w_out, w_in) || !device_ok(ctx.device)) return false;
  if (!aligned(in, 16) || !aligned(W, 16) || !aligned(out, 16)) return false;  // TMA bases, 16-byte stores
  const int bn = tile_n(), cl = cluster_size(kMode == Mode::kFwd ? 0 : 1);
  const int64_t N = kMode == Mode::kFwd ? w_out : w_in, K = kMode == Mode::kFwd ? w_in : w_out;
  const int64_t n_units = (N + bn - 1) / bn;
  const int64_t max_units = row_units(R, E, n_units);  // clusters: at most this many pairs of m-tiles
  if (max_units > INT32_MAX) return false;

  CUtensorMap ma, mb;
  if (!rows_map(ma, op, kMode == Mode::kFwd ? "x" : "dy", in, K, R, BM)) return false;
  // Forward: boxes of BN W rows x 64 k (K-major; clusters: each CTA loads BN/2 of them). Dgrad: 64 k-rows x 64
  // columns, BN/64 boxes per stage.
  if (!weight_map(mb, op, "W", W, E, w_out, w_in, kMode == Mode::kFwd ? bn / cl : BK)) return false;

  Params p = row_params(off, E, R, N, K, n_units, out);
  row_hints(p, kMode == Mode::kFwd);
  split_workspace(p, ctx);
  CUtensorMap mc = ma;
  p.tma_store = store_epilogue() && store_map(mc, op, kMode == Mode::kFwd ? "y" : "dx", out, N, R, N);
  launch_cfg<kMode>(op, ma, mb, mc, p, max_units, ctx, bn, cl);
  note_grouped_impl("sm90");
  return true;
}

// Forward + SwiGLU: x [R, K] and W13 [E, 2f, K] -> h13 [R, 2f], act [R, f].
bool try_fwd_swiglu(const bf16* x, const bf16* W, const int32_t* off, int64_t E, int64_t R, int64_t f, int64_t K,
                    const float* wp, bf16* h13, bf16* act, CudaContext& ctx) {
  const char* op = "grouped_gemm_swiglu";
  if (!swiglu_fused() || !wants_sm90() || !shapes_ok(E, R, 2 * f, K) || f % 8 || !device_ok(ctx.device)) return false;
  if (!aligned(x, 16) || !aligned(W, 16) || !aligned(h13, 16) || !aligned(act, 16)) return false;
  const int bn = tile_n();
  const int64_t n_units = (f + bn / 2 - 1) / (bn / 2);
  const int64_t max_units = row_units(R, E, n_units);
  if (max_units > INT32_MAX) return false;

  CUtensorMap ma, mb;
  if (!rows_map(ma, op, "x", x, K, R, BM)) return false;
  // W13: boxes of BN/2 rows x 64 k, two per stage (gate rows, up rows).
  if (!weight_map(mb, op, "W13", W, E, 2 * f, K, bn / 2)) return false;

  Params p = row_params(off, E, R, f, K, n_units, h13);
  p.act = act;
  p.wp = wp;
  // h13's gate and up halves as two [R, f] views of its rows (so neither box spills into the other half), and act.
  CUtensorMap mc = ma;
  SetMaps sets{};
  p.tma_store = store_epilogue() && store_map(mc, op, "h13 (gate)", h13, f, R, 2 * f) &&
                store_map(sets.a[0], op, "h13 (up)", h13 + f, f, R, 2 * f) &&
                store_map(sets.a[1], op, "act", act, f, R, f);
  launch_cfg<Mode::kFwdSwiglu>(op, ma, mb, mc, p, max_units, ctx, bn, 1, sets);
  note_grouped_impl("sm90");
  return true;
}

// Dgrad + SwiGLU backward: dy [R, K] and W2 [E, K, f] -> dh13 [R, 2f], dwp [R]; part: room for R x
// ceil(f / BN) floats.
bool try_dgrad_swiglu(const bf16* dy, const bf16* W, const int32_t* off, int64_t E, int64_t R, int64_t K, int64_t f,
                      const bf16* h13, const float* wp, bf16* dh13, float* dwp, float* part, int64_t part_floats,
                      CudaContext& ctx) {
  const char* op = "grouped_gemm_dgrad_swiglu";
  if (!swiglu_fused() || !wants_sm90() || !shapes_ok(E, R, K, 2 * f) || f % 8 || !device_ok(ctx.device)) return false;
  if (!aligned(dy, 16) || !aligned(W, 16) || !aligned(h13, 16) || !aligned(dh13, 16)) return false;
  const int bn = tile_n();
  const int64_t tiles = (f + bn - 1) / bn;
  const int64_t max_units = row_units(R, E, tiles);
  if (max_units > INT32_MAX || R * tiles > part_floats) return false;

  CUtensorMap ma, mb;
  if (!rows_map(ma, op, "dy", dy, K, R, BM)) return false;
  // W2 [E, K, f]: 64 k-rows x 64 columns per box, as the dgrad.
  if (!weight_map(mb, op, "W2", W, E, K, f, BK)) return false;

  Params p = row_params(off, E, R, f, K, tiles, dh13);
  p.wp = wp;
  p.h13 = h13;
  p.part = part;
  launch_cfg<Mode::kDgradSwiglu>(op, ma, mb, ma, p, max_units, ctx, bn, 1);
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((R + threads - 1) / threads, 4096));
  dwp_from_partials<<<blocks, threads, 0, ctx.stream>>>(part, tiles, off, static_cast<int32_t>(E),
                                                        static_cast<int32_t>(R), dwp);
  cuda::check_launch(op);
  note_grouped_impl("sm90");
  return true;
}

}  // namespace

void set_grouped_impl(GroupedImpl impl) { g_impl_override.store(static_cast<int>(impl)); }
void set_grouped_tile_n(int bn) {
  if (bn != 0 && bn != 128 && bn != 256)
    cuda::fail("grouped_gemm", "tile N must be 128 or 256, got " + std::to_string(bn));
  g_tile_n.store(bn);
}
void set_grouped_cluster(int ctas) {
  if (ctas != 0 && ctas != 1 && ctas != 2)
    cuda::fail("grouped_gemm", "cluster size must be 1 or 2, got " + std::to_string(ctas));
  g_cluster.store(ctas);
}
void set_grouped_tma_store(int on) { g_store.store(on < 0 ? 0 : on ? 1 : 2); }
void set_grouped_wgrad_tma(int on) { g_wgrad_tma.store(on < 0 ? 0 : on ? 1 : 2); }
void set_grouped_swiglu_fusion(int on) { g_swiglu.store(on < 0 ? 0 : on ? 1 : 2); }
void set_grouped_wgrad_tail(int mode) {
  if (mode < -1 || mode > 2)
    cuda::fail("grouped_gemm_wgrad", "tail mode must be -1, 0, 1 or 2, got " + std::to_string(mode));
  g_wgrad_tail.store(mode);
}
void set_grouped_wgrad_lockstep(int on) { g_wgrad_lockstep.store(on < 0 ? -1 : on ? 1 : 0); }
void set_grouped_wgrad_gather(int on) { g_wgrad_gather.store(on < 0 ? -1 : on ? 1 : 0); }
void set_grouped_wgrad_pair(int mode) {
  if (mode < -1 || mode > 1)
    cuda::fail("grouped_gemm_wgrad", "pair mode must be -1, 0 or 1, got " + std::to_string(mode));
  g_wgrad_pair.store(mode);
}
void set_grouped_l2_hints(int mask) {
  if (mask < -1 || mask > kL2HintsAll)
    cuda::fail("grouped_gemm", "L2 hints must be -1 or a mask in [0, 7], got " + std::to_string(mask));
  g_l2_hints.store(mask);
}
void set_grouped_tail_split(int max_parts) { g_tail_split.store(max_parts < 0 ? -1 : max_parts); }
void set_grouped_wgrad_epi_bars(int bars) {
  if (bars != -1 && bars != 1 && bars != 2)
    cuda::fail("grouped_gemm_wgrad", "epilogue barriers per box must be -1 (env), 1 or 2, got " + std::to_string(bars));
  g_wgrad_epi_bars.store(bars);
}
void set_grouped_wgrad_epi_stmatrix(int on) {
  if (on < -1 || on > 1)
    cuda::fail("grouped_gemm_wgrad", "epilogue stmatrix must be -1 (env), 0 (words) or 1 (stmatrix), got " +
                                         std::to_string(on));
  g_wgrad_epi_stm.store(on);
}
void set_grouped_wgrad_order(int by_rows) {
  if (by_rows < -1 || by_rows > 1)
    cuda::fail("grouped_gemm_wgrad", "expert order must be -1 (env), 0 (index) or 1 (rows), got " +
                                         std::to_string(by_rows));
  g_wgrad_order.store(by_rows);
}
void record_wgrad_order(bool on) { g_record_order.store(on); }
std::vector<int32_t> recorded_wgrad_order(int E) {
  if (E < 1 || E > kMaxExperts) cuda::fail("grouped_gemm_wgrad", "recorded order of " + std::to_string(E) + " experts");
  std::vector<int32_t> order(static_cast<size_t>(E));
  cuda::check(cudaDeviceSynchronize(), "grouped_gemm_wgrad", "recorded order");
  cuda::check(cudaMemcpyFromSymbol(order.data(), g_dev_order, sizeof(int32_t) * E), "grouped_gemm_wgrad",
              "recorded order");
  return order;
}
void set_grouped_wgrad_group(int units) {
  if (units < -1)
    cuda::fail("grouped_gemm_wgrad", "raster group must be -1 (env) or >= 0 units, got " + std::to_string(units));
  g_wgrad_group.store(units);
}
const char* last_grouped_impl() { return g_last_impl; }
void note_grouped_impl(const char* impl) { g_last_impl = impl; }

bool try_grouped_fwd(const bf16* x, const bf16* W, const int32_t* off, int64_t E, int64_t R, int64_t out,
                     int64_t in, bf16* y, CudaContext& ctx) {
  return try_rows<Mode::kFwd>("grouped_gemm", x, W, off, E, R, out, in, y, ctx);
}

bool try_grouped_fwd_swiglu(const bf16* x, const bf16* W13, const int32_t* off, int64_t E, int64_t R, int64_t f,
                            int64_t in, const float* wp, bf16* h13, bf16* act, CudaContext& ctx) {
  return try_fwd_swiglu(x, W13, off, E, R, f, in, wp, h13, act, ctx);
}

bool try_grouped_dgrad_swiglu(const bf16* dy, const bf16* W2, const int32_t* off, int64_t E, int64_t R, int64_t out,
                              int64_t f, const bf16* h13, const float* wp, bf16* dh13, float* dwp, float* part,
                              int64_t part_floats, CudaContext& ctx) {
  return try_dgrad_swiglu(dy, W2, off, E, R, out, f, h13, wp, dh13, dwp, part, part_floats, ctx);
}

bool try_grouped_dgrad(const bf16* dy, const bf16* W, const int32_t* off, int64_t E, int64_t R, int64_t out,
                       int64_t in, bf16* dx, CudaContext& ctx) {
  return try_rows<Mode::kDgrad>("grouped_gemm_dgrad", dy, W, off, E, R, out, in, dx, ctx);
}

int64_t wgrad_norm_slots(int64_t E, int64_t out, int64_t in) { return norm_slot(E, 0, 0, out, in, tile_n(), 0); }

bool grouped_clocks_take(unsigned long long out[14]) {
#ifdef MXTRAIN_GG_CLOCKS
  unsigned long long zero[14] = {};
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  if (cudaMemcpyFromSymbol(out, g_gg_clocks, sizeof(zero)) != cudaSuccess) return false;
  return cudaMemcpyToSymbol(g_gg_clocks, zero, sizeof(zero)) == cudaSuccess;
#else
  (void)out;
  return false;
#endif
}

bool try_grouped_wgrad(const WgradRows* given, int ngiven, int64_t E, int64_t out, int64_t in, void* dW,
                       CudaContext& ctx, bool accumulate, float* sumsq, int64_t sumsq_slots, bool dW_bf16) {
  const char* op = "grouped_gemm_wgrad";
  if (ngiven < 1 || !wants_sm90() || !device_ok(ctx.device)) return false;
  // A bf16 dW is stored, never added to (one rounding of the whole sum), in rows of whole 16-byte pieces.
  if (dW_bf16 && (accumulate || in % 8 != 0)) return false;
  // The norm's partials come from one storing launch's epilogue, and fill every slot (dW's every tile is stored).
  const int fault = fault_injection();  // the timing-only faults leave dW wrong
  if (sumsq && (accumulate || sumsq_slots < wgrad_norm_slots(E, out, in) || fault == 3 || fault == 7 || fault == 8))
    return false;
  for (int i = 0; i < ngiven; ++i) {
    const WgradRows& r = given[i];
    if (!shapes_ok(E, r.R, out, in) || !aligned(r.dy, 16) || !aligned(r.x, 16)) return false;  // TMA bases
  }
  if (!aligned(dW, 16)) return false;
  const int bn = tile_n(), cl = cluster_size(2);
  const int64_t M = out, N = in;
  // Pairs over m-tiles where they divide evenly (else over n-tiles): m_tiles and n_units count the units' m and n.
  const int64_t all_m = (M + BM - 1) / BM, all_n = (N + bn - 1) / bn;
  const bool pair_m = cl == 2 && all_m % 2 == 0 && wgrad_pair_m() == 1;
  const int64_t m_tiles = pair_m ? all_m / 2 : all_m, n_units = pair_m ? all_n : (all_n + cl - 1) / cl;
  const int64_t max_units = E * m_tiles * n_units;
  if (max_units > INT32_MAX) return false;

  // dy [R, M] and x [R, N], both read as 64 (M or N) x 64 (rows) boxes: M/N-major operands.
  static_assert(BK == 64, "the wgrad operand boxes are BK wide along M / N");
  auto operand_maps = [&](const WgradRows& r, CUtensorMap& ma, CUtensorMap& mb) {
    return rows_map(ma, op, "dy", r.dy, M, r.R, BK) && rows_map(mb, op, "x", r.x, N, r.R, BK);
  };
  // dW [E, M, N] fp32, added to (or stored) in 16-column x 64-row boxes; bf16: stored in 32-column boxes.
  const cuuint64_t es = dW_bf16 ? 2 : 4;
  const cuuint64_t c_dims[3] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t c_strides[2] = {static_cast<cuuint64_t>(N) * es, static_cast<cuuint64_t>(N * M) * es};
  const cuuint32_t c_box[3] = {dW_bf16 ? 2u * kEpiCols : kEpiCols, 64, 1};
  CUtensorMap mc, pf;
  if (!make_map(mc, op, "dW", dW, 3, c_dims, c_strides, c_box,
                dW_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                CU_TENSOR_MAP_SWIZZLE_64B))
    return false;
  const cuuint32_t pf_box[3] = {static_cast<cuuint32_t>(bn), BM, 1};  // one output tile
  if (!make_map(pf, op, "dW (prefetch)", dW, 3, c_dims, c_strides, pf_box,
                dW_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                CU_TENSOR_MAP_SWIZZLE_NONE))
    return false;

  // Sets per launch: the kernel's map slots, and (sets - 1) x E row ranges in its schedule. Every map is built
  // before the first launch, so a geometry the driver rejects leaves dW untouched for the fallback.
  const int per_launch = static_cast<int>(std::min<int64_t>(kMaxSets, 1 + kSetSlots / E));
  // Several sets in one launch: their tails gathered into one more set (scratch; the copy is queued just before
  // the launch, once every map is built).
  std::vector<WgradRows> all(given, given + ngiven);
  const bool gather = ngiven >= 2 && ngiven <= per_launch && ngiven * E <= kSetSlots && ngiven <= kMaxTailSets &&
                      wgrad_gather() && fault != 2;
  __nv_bfloat16 *tdy = nullptr, *tx = nullptr;
  int32_t *toff = nullptr, *plan = nullptr;
  if (gather) {
    const int64_t cap = wgrad_tail_capacity(ngiven, E);
    const size_t dy_bytes = static_cast<size_t>(cap * M) * 2, x_bytes = static_cast<size_t>(cap * N) * 2;
    auto* base = static_cast<char*>(
        ctx.scratch("wgrad_tails", static_cast<size_t>(wgrad_tail_bytes(ngiven, E, M + N))));
    tdy = reinterpret_cast<__nv_bfloat16*>(base);
    tx = reinterpret_cast<__nv_bfloat16*>(base + dy_bytes);
    toff = reinterpret_cast<int32_t*>(base + dy_bytes + x_bytes);
    plan = toff + wgrad_tail_offset_ints(E);
    all.push_back({tdy, tx, toff, cap});
  }
  const WgradRows* sets = all.data();
  const int nsets = static_cast<int>(all.size());
  struct Launch {
    CUtensorMap ma, mb;
    SetMaps rest;
    Params p;
  };
  const int launch_sets = gather ? nsets : per_launch;  // the tail set rides in the sets' one launch
  if ((sumsq || dW_bf16) && nsets > launch_sets) return false;  // one storing launch
  std::vector<Launch> launches;
  for (int first = 0; first < nsets; first += launch_sets) {
    const int n = std::min(launch_sets, nsets - first);
    Launch L{};
    L.rest.pf = pf;
    if (!operand_maps(sets[first], L.ma, L.mb)) return false;
    for (int i = 1; i < n; ++i)
      if (!operand_maps(sets[first + i], L.rest.a[i - 1], L.rest.b[i - 1])) return false;
    Params& p = L.p;
    p.offsets = sets[first].offsets;
    p.E = static_cast<int32_t>(E);
    p.R = static_cast<int32_t>(sets[first].R);
    p.sets = n;
    p.tails_gathered = gather ? 1 : 0;
    for (int i = 0; i < n; ++i) {
      p.set_offsets[i] = sets[first + i].offsets;
      p.set_R[i] = static_cast<int32_t>(sets[first + i].R);
    }
    p.overwrite = first == 0 && !accumulate ? 1 : 0;
    p.out_bf16 = dW_bf16 ? 1 : 0;
    p.N = static_cast<int32_t>(N);
    p.K = static_cast<int32_t>(M);
    p.n_units = static_cast<int32_t>(n_units);
    p.m_tiles = static_cast<int32_t>(m_tiles);
    p.m_fast = M <= N ? 1 : 0;
    p.group = wgrad_group(ngiven);
    p.order_rows = wgrad_order_rows() ? 1 : 0;
    if (g_record_order.load()) {
      void* rec = nullptr;
      cuda::check(cudaGetSymbolAddress(&rec, g_dev_order), op, "order record");
      p.order_out = static_cast<int32_t*>(rec);
    }
    if (l2_hints(2) && p.group > 0) {  // the grouped operand: dy's m-tiles when m is fastest, else x's n-tiles
      p.hint_a = p.m_fast ? kL2EvictLast : kL2EvictFirst;
      p.hint_b = p.m_fast ? kL2EvictFirst : kL2EvictLast;
    }
    p.pair_m = pair_m ? 1 : 0;
    p.prefetch = p.overwrite ? 0 : wgrad_prefetch();  // nothing to read when storing
    if (wgrad_lockstep(ngiven, ctx.exchange_alongside)) {  // an item ordinal per slot: enough for any CTA's items (more run ungated)
      p.lockstep_len = static_cast<int32_t>(std::min<int64_t>(kLockstepSlots, max_units));
      p.lockstep = static_cast<int32_t*>(ctx.scratch("gg_wgrad_lockstep", sizeof(int32_t) * kLockstepSlots));
    }
    p.tma_store = wgrad_tma_epilogue() ? 1 : 0;
    p.epi_one_bar = wgrad_epi_bars() == 1 ? 1 : 0;
    p.epi_stmatrix = wgrad_epi_stmatrix() ? 1 : 0;
    p.fault = fault_injection();
    p.tail = p.fault == 2 ? kTailNone : wgrad_tail_mode();
    p.out = dW;
    p.sumsq = sumsq;
    launches.push_back(L);
  }
  if (gather) gather_wgrad_tails(given, ngiven, E, M, N, tdy, tx, toff, plan, ctx.stream);
  for (const Launch& L : launches) {
    if (L.p.lockstep)
      cuda::check(cudaMemsetAsync(L.p.lockstep, 0, sizeof(int32_t) * L.p.lockstep_len, ctx.stream), op,
                  "lockstep memset");
    launch_cfg<Mode::kWgrad>(op, L.ma, L.mb, mc, L.p, max_units, ctx, bn, cl, L.rest);
  }
  note_grouped_impl("sm90");
  return true;
}

}  // namespace mxt::sm90
