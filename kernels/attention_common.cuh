#pragma once
// Shared by attention_forward.cu and attention_backward.cu: argument checks, tensor-core (mma.sync m16n8k16
// bf16 -> fp32) fragment helpers and tile loaders.
//
// Fragment layouts of mma.sync.m16n8k16 (bf16 in, fp32 accumulate), lane = 4 * g + c (g = lane / 4, c = lane % 4):
//   A (16x16, row-major):  a0 = A[g][2c..2c+1]   a1 = A[g+8][2c..2c+1]   a2 = A[g][2c+8..+9]   a3 = A[g+8][2c+8..+9]
//   B (16x8, k x n):       b0 = B[2c..2c+1][g]   b1 = B[2c+8..2c+9][g]
//   C (16x8 fp32):         c0,c1 = C[g][2c..2c+1]                          c2,c3 = C[g+8][2c..2c+1]
// Each 32-bit register holds two bf16, the lower column / k index in the low half.
// So the accumulators of two adjacent n8 tiles (16 columns) are exactly the A fragment of those 16 columns,
// which lets a softmax computed in registers feed the next product without going through shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda_common.cuh"
#include "mxtrain/ops.hpp"

namespace mxt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Validated geometry of one attention call.
struct Geom {
  int B, S, H, KVH, D, group;
  int64_t T;
};

inline bool supported_head_dim(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

inline Geom check_geom(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                       const Tensor& lse, const char* op) {
  if (s.batch < 0 || s.seq < 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 ||
      s.n_heads % s.n_kv_heads)
    fail(op, "bad AttnShape (batch " + std::to_string(s.batch) + ", seq " + std::to_string(s.seq) + ", heads " +
                 std::to_string(s.n_heads) + ", kv heads " + std::to_string(s.n_kv_heads) + ", head_dim " +
                 std::to_string(s.head_dim) + ")");
  if (!supported_head_dim(s.head_dim))
    fail(op, "unsupported head_dim " + std::to_string(s.head_dim) + " (supported: 16, 32, 64, 128)");
  if (s.seq > (1LL << 30) || s.batch > 65535 || s.n_heads > 65535)
    fail(op, "shape too large (batch " + std::to_string(s.batch) + " <= 65535, seq " + std::to_string(s.seq) +
                 " <= 2^30, heads " + std::to_string(s.n_heads) + " <= 65535)");
  const int64_t T = s.batch * s.seq;
  expect_numel(q, T * s.n_heads * s.head_dim, op, "q");
  expect_numel(k, T * s.n_kv_heads * s.head_dim, op, "k");
  expect_numel(v, T * s.n_kv_heads * s.head_dim, op, "v");
  expect_numel(o, T * s.n_heads * s.head_dim, op, "out");
  expect_numel(lse, s.batch * s.n_heads * s.seq, op, "lse");
  Geom g;
  g.B = static_cast<int>(s.batch);
  g.S = static_cast<int>(s.seq);
  g.H = static_cast<int>(s.n_heads);
  g.KVH = static_cast<int>(s.n_kv_heads);
  g.D = static_cast<int>(s.head_dim);
  g.group = g.H / g.KVH;
  g.T = T;
  return g;
}

// The kernels move rows with 16-byte vector loads: every bf16 tensor must start 16-byte aligned (rows then
// are too, since head_dim is a multiple of 8).
inline void expect_aligned16(const void* p, const char* op, const char* arg) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail(op, std::string(arg) + " must be 16-byte aligned");
}

// Opts a kernel into more than 48 KB of dynamic shared memory when it needs it.
template <typename Kernel>
inline void set_smem(Kernel kernel, size_t bytes, const char* op) {
  if (bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op,
          "cudaFuncSetAttribute(max dynamic shared memory)");
}

// ---- device helpers -------------------------------------------------------------------------------------

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (lo in the low half), round to nearest.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
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
// with leading dimension LD; rows at or past S are zero-filled (so masked products never meet garbage/NaN).
// All threads of the block take part (nthreads of them).
template <int D, int LD>
__device__ __forceinline__ void load_tile(uint16_t* dst, const bf16* src, int64_t stride, int r0, int rows, int S,
                                          int tid, int nthreads) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = tid; i < rows * kChunks; i += nthreads) {
    const int r = i / kChunks, ch = i % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < S) val = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r0 + r) * stride + ch * 8);
    *reinterpret_cast<uint4*>(dst + r * LD + ch * 8) = val;
  }
}

}  // namespace mxt::cuda::attn
