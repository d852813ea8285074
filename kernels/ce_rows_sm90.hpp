#pragma once
// The cross-entropy pass over [rows, V] bf16 logits as 4-CTA clusters, each row read once (ce_rows_sm90.cu).
// Host-only: tests include it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mxt::cuda {

// ce_rows_vec_kernel's contract (row losses, and with grad the logits overwritten by grad_scale * (softmax -
// onehot)); false, with nothing launched, where it does not apply (V % 8, alignment, a row too long for the
// segments' shared memory, not an sm_90a device).
bool try_ce_rows_sm90(__nv_bfloat16* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale,
                      bool grad, float* row_loss, int device, cudaStream_t stream);

// The form of the cross-entropy pass that lm_head_loss's last chunk ran (lm_head_loss.cu): "cluster", "row"
// (one block per row, 16-byte accesses), "scalar", or "none" before the first call.
const char* last_ce_rows_impl();

}  // namespace mxt::cuda
