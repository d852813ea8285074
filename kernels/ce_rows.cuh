#pragma once
// The cross-entropy pass's per-vector arithmetic, shared by the per-row kernel (lm_head_loss.cu) and the cluster
// kernel (ce_rows_sm90.cu): base-2 exponentials of logits scaled by log2(e), one FFMA and one MUFU.EX2 each.
#include <cmath>
#include <cstdint>

#include "attention_device.cuh"

namespace mxt::cuda {

// The label of a row that counts for nothing (zero loss, zero gradient row), as HF's ignore_index.
constexpr int32_t kCeIgnore = -100;

// The running max m (base-2 units: max(x) log2(e)) and sum s = sum 2^(x log2(e) - m) over 8 more logits; the max
// moves once per 8.
__device__ __forceinline__ void ce_accumulate8(const float (&x)[8], float& m, float& s) {
  float mx = x[0];
#pragma unroll
  for (int k = 1; k < 8; ++k) mx = fmaxf(mx, x[k]);
  mx *= attn::kLog2e;
  if (mx > m) {
    s = m == -INFINITY ? 0.f : s * attn::fast_exp2(m - mx);
    m = mx;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) s += attn::fast_exp2(fmaf(x[k], attn::kLog2e, -m));
}

// x <- grad_scale * softmax(x), given the row's base-2 log-sum-exp lse2 (the label's -1 is the caller's).
__device__ __forceinline__ void ce_softmax8(float (&x)[8], float lse2, float grad_scale) {
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = grad_scale * attn::fast_exp2(fmaf(x[k], attn::kLog2e, -lse2));
}

}  // namespace mxt::cuda
