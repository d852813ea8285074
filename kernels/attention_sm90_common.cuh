#pragma once
// Shared by the Hopper wgmma attention kernels (attention_fwd_sm90.cu, attention_dkv_sm90.cu, attention_dq_sm90.cu):
// when they apply, their tensor maps, the environment switches that force or disable them, the launch, the
// query-tile kernels' K / V stream, and the epilogue store of an m64n128 accumulator.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention_common.cuh"
#include "attention_flash_bwd.cuh"
#include "sm90_host.cuh"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

namespace mxt::cuda::attn::sm90k {

constexpr int kD = 128;
constexpr int kBox = 64 * 64 * 2;  // one [64][64] bf16 box, 128-byte swizzle

// q / k / v / dout as [rows = B*S][heads * 128] bf16, read in [64][64] boxes.
struct TMaps {
  CUtensorMap q, k, v, dout;
};

// An environment switch (MXTRAIN_ATTENTION_DKV, MXTRAIN_ATTENTION_DQ): auto (default: the wgmma kernel wherever it
// applies), wgmma (required: an error where it does not apply, for tests), mma (never).
enum class Mode { Auto, Require, Off };

inline Mode env_mode(const char* var, const char* op) {
  const char* e = std::getenv(var);
  if (!e || !*e || !std::strcmp(e, "auto")) return Mode::Auto;
  if (!std::strcmp(e, "wgmma")) return Mode::Require;
  if (!std::strcmp(e, "mma")) return Mode::Off;
  fail(op, std::string("environment ") + var + "=" + e + ": expected auto, wgmma or mma");
}

// A wgmma kernel's schedule from environment variable `var`: "serial" (false) or "pingpong" (true, also when
// unset or empty: measured faster in session 28); anything else is an error naming the variable. Read at every
// call, so tests can switch.
inline bool env_schedule(const char* var, const char* op) {
  const char* e = std::getenv(var);
  if (!e || !*e || !std::strcmp(e, "pingpong")) return true;
  if (!std::strcmp(e, "serial")) return false;
  fail(op, std::string("environment ") + var + "=" + e + ": expected serial or pingpong");
}

inline bool make_rows_map(CUtensorMap& m, const void* ptr, int64_t rows, int64_t cols) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem[2] = {1, 1};
  const auto encode = sm90::tensor_map_encoder("attention_backward");
  return encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Empty when a wgmma backward kernel (`kernel`, `cache` its per-device sm_90a check) applies to G, with `maps`
// filled; else why not: head_dim 128 (or 64 where `d64`), no document mask, seq a multiple of 128, an sm_90a
// device and binary.
inline std::string check_applies(const Geom& G, const BwdParams& p, int device, const void* kernel,
                                 std::atomic<int> (&cache)[64], TMaps& maps, bool d64 = false) {
  if (G.D != kD && !(d64 && G.D == 64))
    return "head_dim " + std::to_string(G.D) + (d64 ? " (needs 64 or 128)" : " (needs 128)");
  if (G.doc != nullptr) return "a document mask";
  if (G.S % 128 != 0) return "seq " + std::to_string(G.S) + " (needs a multiple of 128)";
  if (G.T * G.H * G.D > INT32_MAX) return "a tensor of 2^31 elements or more";
  if (!sm90::device_runs_sm90a(device, kernel, cache)) return "not an sm_90 device / binary";
  if (!(make_rows_map(maps.q, p.q, G.T, static_cast<int64_t>(G.H) * G.D) &&
        make_rows_map(maps.k, p.k, G.T, static_cast<int64_t>(G.KVH) * G.D) &&
        make_rows_map(maps.v, p.v, G.T, static_cast<int64_t>(G.KVH) * G.D) &&
        make_rows_map(maps.dout, p.dout, G.T, static_cast<int64_t>(G.H) * G.D)))
    return "a tensor map the driver rejects";
  return "";
}

// Launches kernel<<<blocks, threads, smem>>>(maps, p) on `stream` where it applies and returns true; false
// (nothing launched) where it does not or `env` says mma; an error where it does not and `env` says wgmma.
// `smem_set` and `cache` are the kernel's own (one-time shared-memory opt-in, per-device sm_90a check).
inline bool try_launch(void (*kernel)(TMaps, BwdParams), const char* env, const char* what, const Geom& G,
                       const BwdParams& p, int device, cudaStream_t stream, std::atomic<int> (&cache)[64],
                       std::atomic<bool>& smem_set, int64_t blocks, int threads, int smem, bool d64 = false) {
  const char* op = "attention_backward";
  const Mode mode = env_mode(env, op);
  if (mode == Mode::Off) return false;
  TMaps maps{};
  const std::string why = check_applies(G, p, device, reinterpret_cast<const void*>(kernel), cache, maps, d64);
  if (!why.empty()) {
    if (mode == Mode::Require)
      fail(op, std::string(env) + "=wgmma, but the sm90 " + what + " kernel does not apply: " + why);
    return false;
  }
  if (!smem_set.exchange(true)) set_smem(kernel, static_cast<size_t>(smem), op);
  kernel<<<grid_1d(blocks, op), threads, smem, stream>>>(maps, p);
  check_launch(op);
  return true;
}

// acc[64 x 64] = A B^T with A and B both [64 rows][kDim d] as kDim / 64 [64][64] boxes at shared addresses a and b
// (K-major, contracted over d): S = Q K^T, dP = dO V^T and their transposes.
template <int kDim = kD>
__device__ __forceinline__ void mma_rows_d(float (&acc)[32], uint32_t a, uint32_t b) {
#pragma unroll
  for (int c = 0; c < kDim / 64; ++c)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      sm90::wgmma_m64n64k16<0, 0>(acc, sm90::smem_desc(a + c * kBox + k * 32, 16, 1024),
                                  sm90::smem_desc(b + c * kBox + k * 32, 16, 1024), (c | k) != 0);
}

// The register A operands of the k16 steps from a 64 x (kN / 2) accumulator (four from m64n64, eight from
// m64n128): step kk takes its n8 blocks 2kk and 2kk + 1, packed to bf16 pairs (the accumulator layout is the A
// fragment layout).
template <int kN>
__device__ __forceinline__ void pack_a_frags(const float (&acc)[kN], uint32_t (&f)[kN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 8; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) f[kk][r] = pack_bf16(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

// acc[64 x 128] += A B over 64 k-rows: A from registers (four k16 fragments, e.g. P or dS), B at shared address b
// as [64 k][128 n] read N-major (two [64][64] boxes): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
__device__ __forceinline__ void mma_regs_k64(float (&acc)[64], const uint32_t (&f)[4][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90::wgmma_m64n128k16_rs<1>(acc, f[kk], sm90::smem_desc(b + kk * 2048, kBox, 1024), 1u);
}

// A kernel's shared memory, aligned up to 1024 bytes: `base`, and at off_bar the ring's full and empty barriers
// (`stages` each) and one for the tiles loaded once.
struct Ring {
  uint32_t base;
  uint64_t *full, *empty, *once;
};
__device__ __forceinline__ Ring ring_smem(uint8_t* raw_ptr, int off_bar, int stages) {
  const uint32_t raw = sm90::smem_u32(raw_ptr);
  uint8_t* ptr = raw_ptr + ((1024u - (raw & 1023u)) & 1023u);
  Ring r;
  r.base = sm90::smem_u32(ptr);
  r.full = reinterpret_cast<uint64_t*>(ptr + off_bar);
  r.empty = r.full + stages;
  r.once = r.empty + stages;
  return r;
}

// The query-tile kernels (forward, dQ): a CTA takes 128 queries of one (batch, head), the last query tiles (most
// keys) first, and walks the 64-key tiles up to its last query.
struct QueryTile {
  int b, h, kvh, q0, n_steps;
};
__device__ __forceinline__ QueryTile query_tile(int B, int S, int H, int KVH) {
  constexpr int kBM = 128, kBN = 64;
  const int n_bh = B * H;
  const int qt = S / kBM - 1 - static_cast<int>(blockIdx.x) / n_bh;
  const int bh = static_cast<int>(blockIdx.x) % n_bh;
  QueryTile t;
  t.b = bh / H;
  t.h = bh % H;
  t.kvh = t.h / (H / KVH);
  t.q0 = qt * kBM;
  t.n_steps = (t.q0 + kBM) / kBN;
  return t;
}

// Thread 0 of a query-tile kernel: the K and V tiles of 64 keys at key `key0` into the stage at `st` (K, then V
// `v_off` bytes further, each two [64][64] boxes), completing on `bar`.
__device__ __forceinline__ void load_kv_tile(const TMaps& maps, uint64_t* bar, uint32_t st, uint32_t v_off,
                                             const QueryTile& t, int S, int key0) {
  sm90::mbar_arrive_expect_tx(bar, 4 * kBox);
  const uint32_t b32 = sm90::smem_u32(bar);
  for (int c = 0; c < 2; ++c) {
    sm90::tma_load_2d(st + c * kBox, &maps.k, b32, t.kvh * kD + 64 * c, t.b * S + key0);
    sm90::tma_load_2d(st + v_off + c * kBox, &maps.v, b32, t.kvh * kD + 64 * c, t.b * S + key0);
  }
}

// A ping-pong kernel's producer thread: the K and V tiles of every step through the ring (stage i % stages at
// ring.base + off_stages + stage * stage_bytes, K then V 2 boxes further), each stage refilled once both
// warpgroups have released it.
__device__ __forceinline__ void produce_kv(const TMaps& maps, const Ring& ring, int stages, int off_stages,
                                           int stage_bytes, const QueryTile& t, int S) {
  for (int i = 0; i < t.n_steps; ++i) {
    const int st_i = i % stages;
    if (i >= stages) sm90::mbar_wait(&ring.empty[st_i], static_cast<uint32_t>(i / stages - 1) & 1u);
    load_kv_tile(maps, &ring.full[st_i], ring.base + off_stages + st_i * stage_bytes, 2 * kBox, t, S, i * 64);
  }
}

// Barriers of a ring of `stages` stages filled by one thread (full: its arrive.expect_tx) and drained by the 8
// warps of two warpgroups (empty), plus one for the tiles loaded once; by thread 0, before a __syncthreads.
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int stages, uint64_t* once) {
  for (int i = 0; i < stages; ++i) {
    sm90::mbar_init(&full[i], 1);
    sm90::mbar_init(&empty[i], 8);
  }
  sm90::mbar_init(once, 1);
  sm90::fence_barrier_init();
}

// Rows r0 and r0 + 8 (element offsets) of a bf16 output from this thread's part of an m64nN wgmma accumulator
// (N / 2 floats), times `scale` (c4 = lane % 4).
template <int kAcc>
__device__ __forceinline__ void store_acc_bf16(uint16_t* out, int64_t r0, int64_t r1, const float (&acc)[kAcc],
                                               float scale, int c4) {
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) {
    const int col = 8 * j + 2 * c4;
    *reinterpret_cast<uint32_t*>(out + r0 + col) = pack_bf16(acc[4 * j] * scale, acc[4 * j + 1] * scale);
    *reinterpret_cast<uint32_t*>(out + r1 + col) = pack_bf16(acc[4 * j + 2] * scale, acc[4 * j + 3] * scale);
  }
}

// The dQ kernels' end: dQ = scale * acc for this thread's queries row0 and row0 + 8 of (batch row b, head h), from
// an m64n(head_dim) accumulator.
template <int kAcc>
__device__ __forceinline__ void store_dq(const BwdParams& p, int b, int h, int row0, const float (&acc)[kAcc], int c4) {
  constexpr int kDim = 2 * kAcc;
  const int64_t q_stride = static_cast<int64_t>(p.H) * kDim;
  const int64_t r0 = (static_cast<int64_t>(b) * p.S + row0) * q_stride + static_cast<int64_t>(h) * kDim;
  store_acc_bf16(p.dq, r0, r0 + 8 * q_stride, acc, p.scale, c4);
}

}  // namespace mxt::cuda::attn::sm90k
