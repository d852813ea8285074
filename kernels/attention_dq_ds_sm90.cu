// Attention backward dQ on Hopper (sm_90a) from the dS tiles the dK/dV kernel stored (mxtrain/attention_ds.hpp):
// dQ = scale dS K, one m64n128 product per 64-key block. The recomputing dQ kernel (attention_dq_sm90.cu) forms S,
// P and dP again for every block, 3 products and an exponential per score where this takes 1 and none: with
// dK/dV's 4, the backward's tensor work goes from 7 products per block to 5. The tiles cost a write and a read of
// B * H * (S^2 / 2 + 64 S) bf16 values (0.55 GB at seq 4096 and 32 heads) and order dQ after dK/dV.
//
// CTA: a producer warpgroup (one thread issues the loads) and 2 consumer warpgroups, one CTA per (128-query tile,
// batch, head), the last query tiles (most keys) first. Per 64-key block a ring stage holds K (two [64][64] boxes)
// and the two warpgroups' dS^T tiles ([64 keys][64 queries]); each warpgroup accumulates its 64 queries' dQ over
// the blocks in registers: wgmma m64n128k16 with dS read M-major (queries contiguous) and K N-major. The block past
// the diagonal's 64 queries holds zeros (the dK/dV kernel's masked half), so both warpgroups take every block.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
constexpr int kBM = 128;  // queries per CTA: 2 warpgroups x 64
constexpr int kStages = 4;
constexpr int kThreads = 384;
// A stage for head_dim kDim: K's kDim / 64 boxes [d chunk], then the two warpgroups' dS tiles.
template <int kDim>
struct Layout {
  static constexpr int kStageDs = kDim / 64 * kBox;
  static constexpr int kStageBytes = kStageDs + 2 * kBox;
  static constexpr int kOffBar = kStages * kStageBytes;
  static constexpr int kSmem = kOffBar + (2 * kStages + 1) * 8 + 1024;  // + slack for 1024-byte alignment
};
constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;

struct DsMaps {
  CUtensorMap k;   // [B*S rows][KVH * 128] bf16, [64][64] boxes
  CUtensorMap ds;  // [tiles * 64 rows][64] bf16: one box per tile
};

template <int kDim>
__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_dq_ds_sm90_kernel(const __grid_constant__ DsMaps maps, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mxt::sm90;
  constexpr int kStageDs = Layout<kDim>::kStageDs, kStageBytes = Layout<kDim>::kStageBytes;
  constexpr int kOffBar = Layout<kDim>::kOffBar;
  extern __shared__ uint8_t smem_raw[];
  const sm90k::Ring ring = sm90k::ring_smem(smem_raw, kOffBar, kStages);
  const uint32_t smem = ring.base;
  uint64_t *full = ring.full, *empty = ring.empty;
  const int S = p.S, nb = S / 64;
  const sm90k::QueryTile t = sm90k::query_tile(p.B, S, p.H, p.KVH);
  const int tid = threadIdx.x;

  if (tid == 0) sm90k::init_ring(full, empty, kStages, ring.once);
  __syncthreads();
  if (tid >= 256) {  // the producer warpgroup (one thread works); no block-wide barrier follows
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 256) {
      const int64_t head_tiles = (static_cast<int64_t>(t.b) * p.H + t.h) * attention_ds_tiles_per_head(nb);
      const int qb = t.q0 / 64;
      for (int i = 0; i < t.n_steps; ++i) {
        const int st_i = i % kStages;
        if (i >= kStages) mbar_wait(&empty[st_i], static_cast<uint32_t>(i / kStages - 1) & 1u);
        const uint32_t st = smem + st_i * kStageBytes, bar = smem_u32(&full[st_i]);
        mbar_arrive_expect_tx(&full[st_i], kStageBytes);
        for (int c = 0; c < kDim / 64; ++c)
          tma_load_2d(st + c * kBox, &maps.k, bar, t.kvh * kDim + 64 * c, t.b * S + 64 * i);
        for (int w = 0; w < 2; ++w)
          tma_load_2d(st + kStageDs + w * kBox, &maps.ds, bar, 0,
                      static_cast<int32_t>((head_tiles + attention_ds_tile(nb, i, qb + w)) * 64));
      }
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int w = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c4 = lane % 4;
  constexpr int kAcc = kDim / 2;
  float dq[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dq[i] = 0.f;
  // One k16 step of the block is 16 keys: 16 rows of 128 bytes in both the dS tile and the K boxes.
  for (int i = 0; i < t.n_steps; ++i) {
    const int s = i % kStages;
    mbar_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1u);
    const uint32_t st = smem + s * kStageBytes, a = st + kStageDs + w * kBox;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t da = smem_desc(a + kk * 2048, kBox, 1024), db = smem_desc(st + kk * 2048, kBox, 1024);
      if constexpr (kDim == 128)
        wgmma_m64n128k16<1, 1>(dq, da, db, 1u);
      else
        wgmma_m64n64k16<1, 1>(dq, da, db, 1u);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous block's products are done: release its stage
    if (i > 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[(i - 1) % kStages]);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) fence_operand(dq[i]);

  sm90k::store_dq(p, t.b, t.h, t.q0 + 64 * w + 16 * warp + g, dq, c4);
#else
  __trap();  // built without sm_90a: the host never launches this
#endif
}

std::atomic<int> g_image[64];

// MXTRAIN_ATTENTION_DS: auto (default), on (required: an error where it does not apply), off. Read at every call.
sm90k::Mode ds_mode(const char* op) {
  const char* e = std::getenv("MXTRAIN_ATTENTION_DS");
  if (!e || !*e || !std::strcmp(e, "auto")) return sm90k::Mode::Auto;
  if (!std::strcmp(e, "on")) return sm90k::Mode::Require;
  if (!std::strcmp(e, "off")) return sm90k::Mode::Off;
  fail(op, std::string("environment MXTRAIN_ATTENTION_DS=") + e + ": expected auto, on or off");
}

bool env_is(const char* var, const char* value) {
  const char* e = std::getenv(var);
  return e != nullptr && !std::strcmp(e, value);
}

}  // namespace

int64_t bwd_ds_bytes(const Geom& G, const BwdParams& p, int device) {
  const char* op = "attention_backward";
  const sm90k::Mode mode = ds_mode(op);
  if (mode == sm90k::Mode::Off) return 0;
  // In auto, a dK/dV or dQ kernel named in the environment is what runs (the tests of those kernels).
  const bool named = env_is("MXTRAIN_ATTENTION_DKV", "mma") || env_is("MXTRAIN_ATTENTION_DQ", "mma") ||
                     env_is("MXTRAIN_ATTENTION_DQ", "wgmma");
  if (mode == sm90k::Mode::Auto && named) return 0;
  std::string why = attention_ds_why_not(G.B, G.S, G.H, G.D);
  if (env_is("MXTRAIN_ATTENTION_DKV", "mma"))
    why = "MXTRAIN_ATTENTION_DKV=mma (the tiles come from the wgmma dK/dV kernel)";
  else if (why.empty()) {
    sm90k::TMaps maps{};
    why = sm90k::check_applies(G, p, device, reinterpret_cast<const void*>(attn_bwd_dq_ds_sm90_kernel<kD>), g_image,
                               maps, true);
  }
  if (why.empty()) return attention_ds_bytes(G.B, G.S, G.H, G.D);
  if (mode == sm90k::Mode::Require) fail(op, "MXTRAIN_ATTENTION_DS=on, but dQ from dS tiles does not apply: " + why);
  return 0;
}

void launch_dq_ds_sm90(const Geom& G, const BwdParams& p, cudaStream_t stream) {
  const char* op = "attention_backward";
  DsMaps maps{};
  const int64_t tile_rows = static_cast<int64_t>(G.B) * G.H * attention_ds_tiles_per_head(G.S / 64) * 64;
  if (!(sm90k::make_rows_map(maps.k, p.k, G.T, static_cast<int64_t>(G.KVH) * G.D) &&
        sm90k::make_rows_map(maps.ds, p.ds, tile_rows, 64)))
    fail(op, "the dS tiles' tensor maps were rejected by the driver");
  const int64_t blocks = static_cast<int64_t>(G.S / kBM) * G.B * G.H;
  if (G.D == 64) {
    static std::atomic<bool> smem_set{false};
    if (!smem_set.exchange(true)) set_smem(attn_bwd_dq_ds_sm90_kernel<64>, static_cast<size_t>(Layout<64>::kSmem), op);
    attn_bwd_dq_ds_sm90_kernel<64><<<grid_1d(blocks, op), kThreads, Layout<64>::kSmem, stream>>>(maps, p);
  } else {
    static std::atomic<bool> smem_set{false};
    if (!smem_set.exchange(true)) set_smem(attn_bwd_dq_ds_sm90_kernel<kD>, static_cast<size_t>(Layout<kD>::kSmem), op);
    attn_bwd_dq_ds_sm90_kernel<kD><<<grid_1d(blocks, op), kThreads, Layout<kD>::kSmem, stream>>>(maps, p);
  }
  check_launch(op);
}

}  // namespace mxt::cuda::attn
