#pragma once
// Host interface of the weight gradient's tail gather (wgrad_tails.cu; the layout: mxtrain/wgrad_tails.hpp).
// try_grouped_wgrad runs it before a launch over several row sets; tests call it directly.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sm90_grouped_gemm.cuh"

namespace mxt::sm90 {

constexpr int kMaxTailSets = 8, kMaxTailExperts = 256;

// Copies every (set, expert)'s rows past its last whole 64-row k-block into the tail set: dy rows into tdy [cap, M],
// x rows into tx [cap, N] (cap = wgrad_tail_capacity(nsets, E)), its expert offsets into toff [E + 1]; plan holds
// 3 x nsets x E ints of scratch. Offsets are read as the GEMM reads them (clamped into [0, R], non-decreasing).
// Rows of tdy / tx past toff[E] are left as they were. Queued on `stream`; nothing is read back.
void gather_wgrad_tails(const WgradRows* sets, int nsets, int64_t E, int64_t M, int64_t N, __nv_bfloat16* tdy,
                        __nv_bfloat16* tx, int32_t* toff, int32_t* plan, cudaStream_t stream);

}  // namespace mxt::sm90
