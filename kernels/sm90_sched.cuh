#pragma once
// Device pieces the Hopper grouped GEMMs (bf16 grouped_gemm_sm90.cu, MXFP8 mxfp8_grouped_gemm_sm90.cu) share:
// clamping the device-side expert offsets, the prefix over per-expert work items, and zeroing an output tail.
#include <cuda_runtime.h>

#include <cstdint>

namespace mxt::sm90 {

// An offset read from the device table, clamped into [0, hi]: a bad table cannot cause out-of-bounds accesses.
__device__ __forceinline__ int32_t clamp_to(int32_t v, int32_t hi) { return v < 0 ? 0 : (v > hi ? hi : v); }

// Warp-wide: cum[e + 1] holds expert e's work items on entry and their exclusive prefix on exit (cum[0] = 0),
// 32 experts at a time. Called by one whole warp.
__device__ __forceinline__ void warp_prefix_over_experts(int* cum, int E, int lane) {
  int carry = 0;
  for (int base = 0; base < E; base += 32) {
    const int e = base + lane;
    int v = e < E ? cum[e + 1] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    if (e < E) cum[e + 1] = carry + v;
    carry += __shfl_sync(0xffffffffu, v, 31);
  }
  if (lane == 0) cum[0] = 0;
}

// Zeroes n 16-byte words from base, spread over nthreads threads (t: this thread's index among them) of every
// CTA of the grid.
__device__ __forceinline__ void zero_words16(uint4* base, int64_t n, int t, int nthreads) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * nthreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * nthreads + t; i < n; i += stride)
    base[i] = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace mxt::sm90
