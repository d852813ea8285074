#pragma once
// Host side shared by the Hopper wgmma attention backward kernels (attention_dkv_sm90.cu, attention_dq_sm90.cu):
// when they apply, their tensor maps, and the environment switches that force or disable them.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention_common.cuh"
#include "attention_flash_bwd.cuh"
#include "sm90_host.cuh"

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
// filled; else why not: head_dim 128, no document mask, seq a multiple of 128, an sm_90a device and binary.
inline std::string check_applies(const Geom& G, const BwdParams& p, int device, const void* kernel,
                                 std::atomic<int> (&cache)[64], TMaps& maps) {
  if (G.D != kD) return "head_dim " + std::to_string(G.D) + " (needs 128)";
  if (G.doc != nullptr) return "a document mask";
  if (G.S % 128 != 0) return "seq " + std::to_string(G.S) + " (needs a multiple of 128)";
  if (G.T * G.H * kD > INT32_MAX) return "a tensor of 2^31 elements or more";
  if (!sm90::device_runs_sm90a(device, kernel, cache)) return "not an sm_90 device / binary";
  if (!(make_rows_map(maps.q, p.q, G.T, static_cast<int64_t>(G.H) * kD) &&
        make_rows_map(maps.k, p.k, G.T, static_cast<int64_t>(G.KVH) * kD) &&
        make_rows_map(maps.v, p.v, G.T, static_cast<int64_t>(G.KVH) * kD) &&
        make_rows_map(maps.dout, p.dout, G.T, static_cast<int64_t>(G.H) * kD)))
    return "a tensor map the driver rejects";
  return "";
}

}  // namespace mxt::cuda::attn::sm90k
