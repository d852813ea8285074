#pragma once
// FP8 wgmma wrapper for the MXFP8 grouped GEMM (kernels/mxfp8_grouped_gemm_sm90.cu): D[64 x 128] (+)= A[64 x 32] *
// B[32 x 128], A and B FP8 (E4M3 or E5M2 each) K-major in shared memory (descriptors), fp32 accumulators: 64 per
// thread, in the layout of sm90_wgmma.cuh. scale_d = 0 ignores D (a fresh product per 32-wide MX block).
// FP8 wgmma has no transpose immediates: both operands must be K-major. Generated: one asm statement per format
// pair (the macro below), every accumulator register an in/out operand so it stays in registers across the
// async issue.
#include <cstdint>

#include "sm90_wgmma.cuh"

namespace mxt::sm90 {

template <int kFa, int kFb>  // 0 = E4M3, 1 = E5M2
__device__ __forceinline__ void wgmma_m64n128k32_fp8(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                     uint32_t scale_d);

#define MXT_WGMMA_FP8(FA, FB, TA, TB)                                                                      \
  template <>                                                                                              \
  __device__ __forceinline__ void wgmma_m64n128k32_fp8<FA, FB>(float (&d)[64], uint64_t desc_a,           \
                                                               uint64_t desc_b, uint32_t scale_d) {       \
    asm volatile(                                                                                          \
        "{\n\t.reg .pred p;\n\t"                                                                          \
        "setp.ne.b32 p, %66, 0;\n\t"                                                                        \
        "wgmma.mma_async.sync.aligned.m64n128k32.f32." TA "." TB " " MXT_WGMMA_ACC_REGS_64 ", "               \
        "%64, %65, p, 1, 1;\n\t}"                                                                           \
        : MXT_WGMMA_ACC_OUTS_64(d)                                                                         \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                                         \
  }
MXT_WGMMA_FP8(0, 0, "e4m3", "e4m3")
MXT_WGMMA_FP8(0, 1, "e4m3", "e5m2")
MXT_WGMMA_FP8(1, 0, "e5m2", "e4m3")
MXT_WGMMA_FP8(1, 1, "e5m2", "e5m2")
#undef MXT_WGMMA_FP8

}  // namespace mxt::sm90
