#pragma once
// Where the Hopper kernels' epilogues put values in their TMA store boxes, host and device: the kernels write with
// these, and a host test checks that the stmatrix form of the bf16 weight-gradient box puts every accumulator value
// where the per-word form does (tests/cuda/test_epi_layout.cpp).
#include <cuda_runtime.h>

#include <cstdint>

namespace mxt::sm90 {

// Byte offset of 4-byte word `col` of row `row` in a box of 64-byte rows as TMA's 64-byte swizzle lays it out: the
// 16-byte pieces of a row are XORed with bits 7-8 of the row's offset (row / 2 % 4).
__host__ __device__ __forceinline__ uint32_t sw64_offset(int row, int col) {
  return static_cast<uint32_t>(row * 64 + ((((col >> 2) ^ (row >> 1)) & 3) << 4) + (col & 3) * 4);
}
// The same in a box of 128-byte rows under the 128-byte swizzle: the pieces are XORed with row % 8.
__host__ __device__ __forceinline__ uint32_t sw128_offset(int row, int col) {
  return static_cast<uint32_t>(row * 128 + ((((col >> 2) ^ row) & 7) << 4) + (col & 3) * 4);
}

// The bf16 weight-gradient box (64 rows x 32 bf16, 64-byte swizzle) by stmatrix.m8n8.x2: a warp's 16 rows in four
// stores, store j the 16-byte piece j (the box's accumulator n8 block j). Its matrix i is rows 8i .. 8i + 7 of the
// warp's, whose row r lane 8i + r names (lanes 16-31 name none); its register i is the bf16 pair of accumulators
// 16 * box + stmatrix_acc(j, i), in the order the per-word form rounds them (the norm's squares add up in the same
// order). Store j's offsets are store 0's XOR 16 j (the swizzle is an XOR on the piece), so the kernel keeps one.
// (x4, two pieces per store, made ptxas spill in the weight-gradient kernels at 256 columns: its four registers
// must be consecutive and aligned while the 128 accumulators are live.)
__host__ __device__ __forceinline__ uint32_t stmatrix_box_offset(int warp, int lane, int j) {
  return sw64_offset(warp * 16 + (lane & 15), 4 * j);
}
__host__ __device__ constexpr int stmatrix_acc(int j, int i) { return 4 * j + 2 * i; }

}  // namespace mxt::sm90
