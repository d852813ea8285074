#pragma once
// Host side shared by attention_forward.cu and attention_backward.cu: argument checks, the choice of kernels
// (flash or reference, tile variant), shared-memory opt-in.
//
// Kernels: attention_flash_fwd.cuh / attention_flash_bwd.cuh (head_dim 64 and 128, the default) and
// attention_reference.cuh (the first, simple kernels; every supported head_dim). Environment:
//   MXTRAIN_ATTENTION=flash|reference      default flash; reference forces the simple kernels (to compare or
//                                          fall back on a new GPU)
//   MXTRAIN_ATTENTION_VARIANT=0|1          tile shapes of the flash kernels (attention_forward.cu and
//                                          attention_backward.cu list them); default 0
//   MXTRAIN_ATTENTION_BWD_CONCURRENT=0|1   backward dQ kernel beside the dK/dV kernel on a second stream
//                                          (default 1) or after it
// Document masks (AttnShape::doc_ids, I32 [T]): query t sees key s only if s <= t and doc_ids[s] == doc_ids[t].
// The flash kernels skip tiles outside the document run of their rows, so each document must be one contiguous
// run of a batch row (packing makes it so); ids may repeat across batch rows.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention_device.cuh"
#include "cuda_common.cuh"
#include "mxtrain/ops.hpp"

namespace mxt::cuda::attn {

// Validated geometry of one attention call.
struct Geom {
  int B, S, H, KVH, D, group;
  int64_t T;
  const int32_t* doc;  // device [T] or null
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
  if (s.seq > (1LL << 30) || s.batch > 65535 || s.n_heads > 65535 ||
      s.batch * s.n_heads * ((s.seq + 15) / 16) > 0x7fffffffLL)
    fail(op, "shape too large (batch " + std::to_string(s.batch) + " <= 65535, seq " + std::to_string(s.seq) +
                 " <= 2^30, heads " + std::to_string(s.n_heads) + " <= 65535, batch * heads * seq / 16 < 2^31)");
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
  g.doc = nullptr;
  if (s.doc_ids.numel() > 0) {  // empty: plain causal
    expect_numel(s.doc_ids, T, op, "doc_ids");
    g.doc = i32(s.doc_ids, op, "doc_ids");
  }
  return g;
}

// The kernels move rows with 16-byte vector loads: every bf16 tensor must start 16-byte aligned (rows then
// are too, since head_dim is a multiple of 8).
inline void expect_aligned16(const void* p, const char* op, const char* arg) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail(op, std::string(arg) + " must be 16-byte aligned");
}

// Opts a kernel into more than 48 KB of dynamic shared memory.
template <typename Kernel>
inline void set_smem(Kernel kernel, size_t bytes, const char* op) {
  if (bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op,
          "cudaFuncSetAttribute(max dynamic shared memory)");
}

// True: the flash kernels (default); false: the reference kernels. Read at every call, so a test or a
// benchmark can switch between them.
inline bool use_flash(int head_dim, const char* op) {
  const char* e = std::getenv("MXTRAIN_ATTENTION");
  bool flash = true;
  if (e && *e) {
    if (std::strcmp(e, "reference") == 0) flash = false;
    else if (std::strcmp(e, "flash") != 0)
      fail(op, std::string("environment MXTRAIN_ATTENTION=") + e + ": expected flash or reference");
  }
  return flash && (head_dim == 64 || head_dim == 128);
}

inline int flash_variant(const char* op) {
  const char* e = std::getenv("MXTRAIN_ATTENTION_VARIANT");
  if (!e || !*e || std::strcmp(e, "0") == 0) return 0;
  if (std::strcmp(e, "1") == 0) return 1;
  fail(op, std::string("environment MXTRAIN_ATTENTION_VARIANT=") + e + ": expected 0 or 1");
}

// Backward: dQ beside dK/dV on a second stream (default) or after it (MXTRAIN_ATTENTION_BWD_CONCURRENT=0).
inline bool bwd_concurrent(const char* op) {
  const char* e = std::getenv("MXTRAIN_ATTENTION_BWD_CONCURRENT");
  if (!e || !*e || std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  fail(op, std::string("environment MXTRAIN_ATTENTION_BWD_CONCURRENT=") + e + ": expected 0 or 1");
}

inline unsigned grid_1d(int64_t blocks, const char* op) {
  if (blocks <= 0 || blocks > 0x7fffffffLL) fail(op, "grid of " + std::to_string(blocks) + " blocks out of range");
  return static_cast<unsigned>(blocks);
}

}  // namespace mxt::cuda::attn
