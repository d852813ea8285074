#pragma once
// Shared by the fp32 backend's kernels (kernels/fp32): launch geometry of the row kernels. Their block sums are
// cuda::block_sum_f64 (fp64, as the CPU twin sums) and cuda::block_max.
#include "cuda_common.cuh"

namespace mxt::cuda::f32k {

constexpr int kRowThreads = 256;

inline unsigned row_grid(int64_t rows) { return static_cast<unsigned>(rows < 65535 * 16 ? (rows < 1 ? 1 : rows) : 65535 * 16); }

}  // namespace mxt::cuda::f32k
